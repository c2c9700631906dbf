"""Small helpers shared by the auth tests (the ``idp`` and ``oidc`` fixtures live in tests/conftest.py)."""

from __future__ import annotations


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
