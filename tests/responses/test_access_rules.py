"""Who may read, delete and cancel stored responses, on the production application and its routes.

The ``OPENAI_API_KEY`` rule (an open gateway with that key set serves stored state only to a caller
presenting it) and the owner check (another owner's response is "not found"), on every route that
touches a stored response: retrieve, delete, ``input_items`` and ``cancel``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from conversations_app.models import Item
from responses_app.models import Response
from tests.responses.conftest import Gateway

KEY = "upstream-secret"


@pytest.fixture
def wire() -> str:
    return "responses"


def refusal(code: str) -> dict[str, Any]:
    return {
        "error": {
            "message": "invalid bearer token",
            "type": "authentication_error",
            "param": None,
            "code": code,
        }
    }


def not_found(response_id: str) -> dict[str, Any]:
    return {
        "error": {
            "message": f"Response with id '{response_id}' not found.",
            "type": "invalid_request_error",
            "param": "response_id",
            "code": "not_found",
        }
    }


def stored(rid: str, owner: str, *, background: bool = False, status: str = "completed") -> Response:
    """A stored response with one input item, as the executor leaves it."""
    item = Item.objects.create(
        id=f"msg_{rid}",
        owner=owner,
        type="message",
        data={
            "id": f"msg_{rid}",
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "hi"}],
        },
    )
    snapshot = {"id": rid, "object": "response", "status": status, "background": background, "output": []}
    return Response.objects.create(
        id=rid,
        owner=owner,
        status=status,
        model="m",
        background=background,
        snapshot=snapshot,
        history_item_ids=[item.id],
        input_item_count=1,
    )


ROUTES: list[tuple[str, Callable[[str], str]]] = [
    ("GET", lambda rid: f"/v1/responses/{rid}"),
    ("GET", lambda rid: f"/v1/responses/{rid}/input_items"),
    ("POST", lambda rid: f"/v1/responses/{rid}/cancel"),
    ("DELETE", lambda rid: f"/v1/responses/{rid}"),  # last: it removes the row
]


def test_openai_api_key_guards_every_stored_response_route(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api="responses", openai_api_key=KEY)
    stored("resp_guarded", "default", background=True, status="in_progress")
    for method, path in ROUTES:
        url = f"{gw.url}{path('resp_guarded')}"
        for headers, code in (
            ({}, "missing_bearer_token"),
            ({"authorization": "Bearer nope"}, "invalid_token"),
        ):
            r = httpx.request(method, url, headers=headers)
            assert r.status_code == 401, (method, url, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json() == refusal(code)
        # Refused: nothing read, nothing cancelled, nothing deleted.
        row = Response.objects.get(id="resp_guarded")
        assert row.status == "in_progress" and row.snapshot is not None
        assert row.snapshot["status"] == "in_progress"

    allowed = {"authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{gw.url}/v1/responses/resp_guarded", headers=allowed).json()["id"] == "resp_guarded"
    items = httpx.get(f"{gw.url}/v1/responses/resp_guarded/input_items", headers=allowed).json()
    assert [i["id"] for i in items["data"]] == ["msg_resp_guarded"]
    cancelled = httpx.post(f"{gw.url}/v1/responses/resp_guarded/cancel", headers=allowed)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert httpx.delete(f"{gw.url}/v1/responses/resp_guarded", headers=allowed).status_code == 200
    assert not Response.objects.filter(id="resp_guarded").exists()
    assert gw.upstream_bodies() == []


def test_another_owners_response_is_not_found_on_every_route(gw: Gateway) -> None:
    stored("resp_theirs", "oidc:someone-else", background=True, status="in_progress")
    for method, path in ROUTES:
        r = httpx.request(method, f"{gw.url}{path('resp_theirs')}")
        assert r.status_code == 404, (method, path("resp_theirs"), r.text)
        # Exactly the answer for an id that does not exist: nothing to probe.
        assert r.json() == not_found("resp_theirs")
        missing = httpx.request(method, f"{gw.url}{path('resp_missing')}")
        assert (missing.status_code, missing.json()) == (404, not_found("resp_missing"))
    row = Response.objects.get(id="resp_theirs")  # not cancelled, not deleted
    assert row.status == "in_progress" and row.completed_at is None
    assert row.snapshot is not None and row.snapshot["status"] == "in_progress"
