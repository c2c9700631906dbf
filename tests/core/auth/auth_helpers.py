"""Small helpers shared by the auth tests (the ``idp`` and ``oidc`` fixtures live in tests/conftest.py)."""

from __future__ import annotations

from typing import Any

from django.test import AsyncClient

from conversations_app.models import Item

# The test route that answers the request's principal (tests/core/auth/urls_auth_testing.py).
WHOAMI = "/v1/test/whoami"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def envelope(code: str) -> dict[str, Any]:
    return {
        "error": {
            "message": "invalid bearer token",
            "type": "authentication_error",
            "param": None,
            "code": code,
        }
    }


def assert_refused(response: Any, code: str) -> None:
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.json() == envelope(code)


async def get(path: str, headers: dict[str, str] | None = None) -> Any:
    return await AsyncClient().get(path, headers=headers or {})


async def make_item(owner: str = "default") -> Item:
    return await Item.objects.acreate(id=f"msg_{owner}_1", owner=owner, type="message", data={"n": 1})
