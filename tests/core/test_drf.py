"""The resource endpoints on DRF (``gateway.core.drf``): the exception handler, the OpenAI-list pagination,
principal authentication and owner filtering, the method rules, and requests side by side."""

from __future__ import annotations

import ast
import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from asgiref.sync import sync_to_async
from django.core.signals import request_finished
from django.db.backends.utils import CursorWrapper
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework.test import APIRequestFactory

from gateway.asgi import RequestThreads
from gateway.core import drf, errors
from responses_app.models import Response
from tests.servers import LiveServer
from tests.upstream import ScriptedUpstream

ROOT = Path(__file__).resolve().parents[2]


# -- the exception handler -------------------------------------------------------------------------


def _handled(exc: Exception, path: str = "/v1/conversations") -> tuple[int, dict[str, Any]]:
    request = APIRequestFactory().get(path)
    response = drf.exception_handler(exc, {"request": request})
    assert response is not None
    assert response["Content-Type"] == "application/json"
    return response.status_code, orjson.loads(response.content)


@pytest.mark.parametrize(
    ("exc", "status", "type_", "code"),
    [
        (
            errors.BadRequest("bad", param="limit", code="invalid_value"),
            400,
            "invalid_request_error",
            "invalid_value",
        ),
        (drf_exceptions.ParseError(), 400, "invalid_request_error", "invalid_json"),
        (
            drf_exceptions.UnsupportedMediaType("text/plain"),
            415,
            "invalid_request_error",
            "unsupported_media_type",
        ),
        (drf_exceptions.MethodNotAllowed("PUT"), 405, "invalid_request_error", "method_not_allowed"),
        (drf_exceptions.NotAuthenticated(), 401, "authentication_error", "missing_bearer_token"),
        (drf_exceptions.AuthenticationFailed(), 401, "authentication_error", "missing_bearer_token"),
        (drf_exceptions.NotFound(), 404, "invalid_request_error", "not_found"),
        (Http404("gone"), 404, "invalid_request_error", "not_found"),
        (drf_exceptions.Throttled(), 429, "rate_limit_error", "rate_limit_exceeded"),
        (drf_exceptions.PermissionDenied(), 403, "permission_error", "permission_denied"),
    ],
)
def test_handler_renders_every_refusal_through_gateway_errors(
    exc: Exception, status: int, type_: str, code: str
) -> None:
    got_status, body = _handled(exc)
    assert got_status == status
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert (body["error"]["type"], body["error"]["code"]) == (type_, code)


def test_handler_body_is_exactly_what_gateway_errors_renders() -> None:
    exc = errors.NotFound("Conversation with id 'conv_x' not found.", param="conversation_id")
    status, body = _handled(exc)
    expected_status, expected_body, _ = errors.render(exc, "/v1/conversations", None)
    assert (status, body) == (expected_status, orjson.loads(expected_body))


def test_handler_leaves_other_exceptions_to_django() -> None:
    request = APIRequestFactory().get("/v1/conversations")
    assert drf.exception_handler(RuntimeError("boom"), {"request": request}) is None


def test_drf_module_reaches_into_no_private_attributes() -> None:
    """``gateway/core/drf.py`` uses DRF's and Django's documented extension points only."""
    tree = ast.parse((ROOT / "gateway" / "core" / "drf.py").read_text())
    private = [
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
    ]
    assert private == []


# -- pagination ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "param", "code"),
    [
        ({"limit": "0"}, "limit", "integer_below_min_value"),
        ({"limit": "101"}, "limit", "integer_above_max_value"),
        ({"limit": "ten"}, "limit", "invalid_type"),
        ({"limit": ""}, "limit", "invalid_type"),
        ({"order": "up"}, "order", "invalid_value"),
        ({"after": "msg_\x00"}, "after", "invalid_value"),
    ],
)
def test_list_params_refusals(query: dict[str, str], param: str, code: str) -> None:
    with pytest.raises(errors.BadRequest) as refused:
        drf.parse_list_params(query)
    assert (refused.value.param, refused.value.code) == (param, code)


def test_list_params_defaults_and_bounds() -> None:
    assert drf.parse_list_params({}) == drf.ListParams(after=None, limit=20, order="desc")
    assert drf.parse_list_params({"limit": "1", "order": "asc", "after": ""}) == drf.ListParams(
        after=None, limit=1, order="asc"
    )
    assert drf.parse_list_params({"limit": "100", "after": "msg_1"}).limit == 100


def _items(base: str, conversation_id: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{base}/v1/conversations/{conversation_id}/items", params=params, timeout=30)


def test_conversation_item_pages(live_gateway: LiveServer) -> None:
    base = live_gateway.url
    items = [{"type": "message", "role": "user", "content": f"m{i}"} for i in range(5)]
    conversation = httpx.post(f"{base}/v1/conversations", json={"items": items}, timeout=30).json()
    cid = conversation["id"]
    ids = [i["id"] for i in _items(base, cid, order="asc").json()["data"]]
    assert len(ids) == 5

    page = _items(base, cid, order="asc", limit=2).json()
    assert page == {
        "object": "list",
        "data": page["data"],
        "first_id": ids[0],
        "last_id": ids[1],
        "has_more": True,
    }
    page = _items(base, cid, order="asc", limit=2, after=ids[3]).json()
    assert ([i["id"] for i in page["data"]], page["has_more"]) == ([ids[4]], False)
    page = _items(base, cid, order="desc", limit=3, after=ids[3]).json()  # desc: before it
    assert [i["id"] for i in page["data"]] == [ids[2], ids[1], ids[0]]
    assert page["has_more"] is False
    page = _items(base, cid, order="asc", after=ids[4]).json()  # past the end: empty
    assert page == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    page = _items(base, cid).json()  # default: newest first, 20
    assert [i["id"] for i in page["data"]] == ids[::-1]

    r = _items(base, cid, after="msg_unknown")
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "after"
    r = _items(base, cid, limit=0)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "integer_below_min_value")


@pytest.fixture
def stored(live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Callable[..., Any]) -> Any:
    gateway_config(llm_api_base=upstream.url, upstream_api="chat_completions")
    body = {"model": "m", "input": [{"role": "user", "content": f"q{i}"} for i in range(3)]}
    r = httpx.post(f"{live_gateway.url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_input_item_pages(live_gateway: LiveServer, stored: dict[str, Any]) -> None:
    url = f"{live_gateway.url}/v1/responses/{stored['id']}/input_items"
    everything = httpx.get(url, params={"order": "asc"}, timeout=30).json()
    ids = [item["id"] for item in everything["data"]]
    assert len(ids) == 3 and everything["has_more"] is False
    page = httpx.get(url, params={"order": "asc", "limit": 1, "after": ids[0]}, timeout=30).json()
    assert (page["first_id"], page["last_id"], page["has_more"]) == (ids[1], ids[1], True)
    page = httpx.get(url, params={"limit": 2}, timeout=30).json()  # desc by default
    assert [item["id"] for item in page["data"]] == [ids[2], ids[1]]
    for params, code in (({"limit": "x"}, "invalid_type"), ({"order": "sideways"}, "invalid_value")):
        r = httpx.get(url, params=params, timeout=30)
        assert (r.status_code, r.json()["error"]["code"]) == (400, code)
    r = httpx.get(url, params={"after": "msg_nope"}, timeout=30)
    assert (r.status_code, r.json()["error"]["param"]) == (404, "after")


# -- principal, owner filtering, methods, negotiation ----------------------------------------------


@pytest.mark.parametrize(
    ("method", "suffix"), [("GET", ""), ("DELETE", ""), ("GET", "/input_items"), ("POST", "/cancel")]
)
def test_another_owners_response_is_a_404(
    live_gateway: LiveServer, stored: dict[str, Any], method: str, suffix: str
) -> None:
    Response.objects.filter(id=stored["id"]).update(owner="key:someone-else")
    r = httpx.request(method, f"{live_gateway.url}/v1/responses/{stored['id']}{suffix}", timeout=30)
    assert r.status_code == 404
    assert r.json()["error"]["message"] == f"Response with id '{stored['id']}' not found."
    assert Response.objects.filter(id=stored["id"]).exists()


def test_retrieve_delete_and_cancel(live_gateway: LiveServer, stored: dict[str, Any]) -> None:
    url = f"{live_gateway.url}/v1/responses/{stored['id']}"
    assert httpx.get(url, timeout=30).json() == stored
    r = httpx.post(f"{url}/cancel", timeout=30)  # not a background response
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_request")
    r = httpx.get(url, params={"stream": "true"}, timeout=30)
    assert (r.status_code, r.json()["error"]["param"]) == (400, "stream")
    r = httpx.delete(url, timeout=30)
    assert r.json() == {"id": stored["id"], "object": "response", "deleted": True}
    assert httpx.get(url, timeout=30).status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/conversations", "POST"),
        ("HEAD", "/v1/conversations/conv_x", "DELETE, GET, POST"),
        ("OPTIONS", "/v1/conversations/conv_x/items/msg_x", "DELETE, GET"),
        ("PATCH", "/v1/responses/resp_x", "DELETE, GET"),
        ("GET", "/v1/responses/resp_x/cancel", "POST"),
    ],
)
def test_other_methods_are_405_with_allow(
    live_gateway: LiveServer, method: str, path: str, allow: str
) -> None:
    r = httpx.request(method, f"{live_gateway.url}{path}", timeout=30)
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    if method != "HEAD":
        assert r.json()["error"]["code"] == "method_not_allowed"


def test_any_accept_header_gets_json(live_gateway: LiveServer) -> None:
    r = httpx.post(
        f"{live_gateway.url}/v1/conversations", json={}, headers={"Accept": "text/html"}, timeout=30
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"


def test_principal_authentication_hands_drf_the_request_principal() -> None:
    from gateway.core.principal import Principal

    principal = Principal(owner="key:k1", kind="api_key")
    request = APIRequestFactory().get("/v1/conversations/conv_x")
    request.principal = principal  # type: ignore[attr-defined]  # as gateway.core.auth's middleware sets it
    user, auth = drf.PrincipalAuthentication().authenticate(drf.Request(request))
    assert (user, auth) == (principal, None)
    assert drf.PrincipalAuthentication().authenticate_header(drf.Request(request)) == "Bearer"


# -- side by side ----------------------------------------------------------------------------------

REQUESTS = 4
MEET_BOUND_S = 5.0


class Meeting:
    """Each held database call waits until every request's call is in flight (or a bound passes)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.in_flight = 0
        self.peak = 0
        self.met = False
        self.active = False
        self.threads: set[str] = set()

    def hold(self) -> None:
        with self.lock:
            self.threads.add(threading.current_thread().name)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.met = self.met or self.in_flight >= REQUESTS
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.met, timeout=MEET_BOUND_S)
            self.in_flight -= 1


@pytest.fixture
def held_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Meeting]:
    execute = CursorWrapper.execute
    meetings: dict[str, Meeting] = {}

    def held_execute(self: CursorWrapper, sql: str, params: Any = None) -> Any:
        for table, meeting in meetings.items():
            if meeting.active and sql.lstrip().upper().startswith("SELECT") and f'"{table}"' in sql:
                meeting.hold()
                break
        return execute(self, sql, params)

    monkeypatch.setattr(CursorWrapper, "execute", held_execute)

    def meet(table: str) -> Meeting:
        meetings[table] = Meeting()
        return meetings[table]

    return meet


async def _get_all(urls: list[str]) -> list[int]:
    async with httpx.AsyncClient(timeout=30) as client:
        answers = await asyncio.gather(*(client.get(url) for url in urls))
        return [a.status_code for a in answers]


def test_item_lists_overlap_their_database_calls(
    live_gateway: LiveServer, held_reads: Callable[[str], Meeting]
) -> None:
    from conversations_app.models import ConversationItem

    base = live_gateway.url
    ids = [
        httpx.post(f"{base}/v1/conversations", json={"items": [{"role": "user", "content": "x"}]}).json()[
            "id"
        ]
        for _ in range(REQUESTS)
    ]
    meeting = held_reads(ConversationItem._meta.db_table)
    meeting.active = True
    assert asyncio.run(_get_all([f"{base}/v1/conversations/{i}/items" for i in ids])) == [200] * REQUESTS
    assert meeting.peak == REQUESTS  # serialized on one thread: 1
    assert {name.rsplit("_", 1)[0] for name in meeting.threads} == {"orm"}  # run_orm's pool


def test_response_retrievals_overlap_their_database_calls(
    live_gateway: LiveServer,
    upstream: ScriptedUpstream,
    gateway_config: Callable[..., Any],
    held_reads: Callable[[str], Meeting],
) -> None:
    gateway_config(llm_api_base=upstream.url, upstream_api="chat_completions")
    base = live_gateway.url
    ids = [
        httpx.post(f"{base}/v1/responses", json={"model": "m", "input": "hi"}, timeout=30).json()["id"]
        for _ in range(REQUESTS)
    ]
    meeting = held_reads(Response._meta.db_table)
    meeting.active = True
    assert asyncio.run(_get_all([f"{base}/v1/responses/{i}" for i in ids])) == [200] * REQUESTS
    assert meeting.peak == REQUESTS
    assert {name.rsplit("_", 1)[0] for name in meeting.threads} == {"orm"}


# -- each request's thread for Django's thread-sensitive work (gateway.asgi.RequestThreads) ---------


async def _thread_sensitive_ident(scope: Any, receive: Any, send: Any) -> None:
    scope["ident"] = await sync_to_async(threading.get_native_id)()  # thread_sensitive, as Django's are
    if scope.get("hold"):
        await scope["hold"].wait()
    if scope.get("fail"):
        raise RuntimeError("the app failed")


async def test_request_threads_reuse_a_thread_and_never_share_one() -> None:
    threads = RequestThreads()
    first: dict[str, Any] = {}
    await threads.serve(_thread_sensitive_ident, first, None, None)
    later: dict[str, Any] = {}
    await threads.serve(_thread_sensitive_ident, later, None, None)
    assert later["ident"] == first["ident"]  # the same thread again: no thread started per request
    assert first["ident"] != threading.get_native_id()

    # Two requests at once each have a thread of their own (never queued on one).
    hold = asyncio.Event()
    scopes: list[dict[str, Any]] = [{"hold": hold}, {"hold": hold}]
    tasks = [asyncio.create_task(threads.serve(_thread_sensitive_ident, s, None, None)) for s in scopes]
    while not all("ident" in s for s in scopes):
        await asyncio.sleep(0.01)
    hold.set()
    await asyncio.gather(*tasks)
    assert scopes[0]["ident"] != scopes[1]["ident"]
    assert len(threads.idle) == 2


async def test_request_threads_drop_a_failed_requests_thread() -> None:
    threads = RequestThreads()
    with pytest.raises(RuntimeError, match="the app failed"):
        await threads.serve(_thread_sensitive_ident, {"fail": True}, None, None)
    assert threads.idle == []


def test_api_requests_run_djangos_thread_sensitive_work_on_pooled_threads(live_gateway: LiveServer) -> None:
    threads: list[tuple[int, str]] = []

    def finished(**kwargs: Any) -> None:
        threads.append((threading.get_native_id(), threading.current_thread().name))

    def wait_finished(count: int) -> None:
        # Django closes a response (and sends request_finished) after the client has it; the
        # request's thread goes back to the pool just after.
        deadline = time.monotonic() + 5
        while len(threads) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)

    request_finished.connect(finished)
    try:
        conversation = httpx.post(f"{live_gateway.url}/v1/conversations", json={}).json()["id"]
        wait_finished(1)
        for n in range(5):
            assert httpx.get(f"{live_gateway.url}/v1/conversations/{conversation}").status_code == 200
            wait_finished(n + 2)
    finally:
        request_finished.disconnect(finished)
    assert len(threads) == 6
    assert len({ident for ident, _ in threads}) == 1  # one after another: the same thread, none started
    assert threads[0][1].startswith("request")


def test_the_renderer_writes_integers_beyond_64_bits() -> None:
    """PostgreSQL's jsonb gives a stored 1e+23 back as an integer orjson cannot write; the list and
    retrieve routes still answer it (a 500 was found by the schema fuzz)."""
    import json

    from gateway.core.drf import JSONRenderer

    data = {"data": [{"n": 10**23, "text": "é"}], "small": 1}
    assert json.loads(JSONRenderer().render(data)) == data
    assert JSONRenderer().render({"small": 1}) == b'{"small":1}'
