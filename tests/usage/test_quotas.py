"""Quotas per principal and API key (``usage_app.quotas``): the 429 on every wire, the rate-limit
headers, per-key overrides, token charging, concurrency slots (streams, background responses), both
stores (the database, Redis) and exactness across two server processes."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.core.auth import apikeys
from gateway.core.config import ConfigError, load_config
from gateway.core.principal import Limits, Principal
from responses_app import tasks
from responses_app.models import Response
from tests.celery_rebind import responses_worker
from tests.responses.conftest import Gateway
from tests.responses.scripts import Script, handler, text
from tests.responses.wsutil import Client, connect, create
from tests.servers import GatewayProcess, LiveServer, process_database
from tests.upstream import Gate, chat_chunks, sse
from usage_app import ledger, quotas
from usage_app.models import QuotaState

pytestmark = pytest.mark.django_db(transaction=True)

# Redis databases no other test module uses (flushed by the tests that use them): they hold the
# default principal's counters, so each xdist worker of `make test-quick` has its own, or two tests
# side by side would move each other's counts (and one's FLUSHDB would empty the other's broker).
_WORKER_DB = {"gw0": 1, "gw1": 2, "gw2": 3, "gw3": 8}
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
QUOTA_REDIS_URL = f"redis://127.0.0.1:6379/{_WORKER_DB.get(_worker, 6)}"
# The broker (and so the quota store) of the background-response test's Celery worker.
BROKER_REDIS_URL = QUOTA_REDIS_URL if _worker in _WORKER_DB else "redis://127.0.0.1:6379/14"

OPENAI_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
)
DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)$")
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
MESSAGE = {"model": "test-model", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest, gateway_config: Callable[..., Any]) -> Iterator[str]:
    """Each test that takes it runs on the database store and on Redis."""
    if request.param == "redis":
        client = redis.Redis.from_url(QUOTA_REDIS_URL)
        client.flushdb()
        gateway_config(redis_url=QUOTA_REDIS_URL)
        yield "redis"
        client.flushdb()
        client.close()
    else:
        yield "database"


@pytest.fixture
def gw(live_gateway: LiveServer, upstream: Any, gateway_config: Callable[..., Any]) -> Iterator[Gateway]:
    from openai import OpenAI

    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    client = OpenAI(base_url=f"{live_gateway.url}/v1", api_key="sk-test", max_retries=0, timeout=30)
    yield Gateway(live_gateway.url, upstream, "responses", client)
    client.close()


def limits(gateway_config: Callable[..., Any], **quotas_: int | None) -> None:
    gateway_config(**{f"quotas__{k}": v for k, v in quotas_.items()})


def post(gw: Gateway, path: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{gw.url}{path}", json=body, timeout=30, **kwargs)


def upstream_calls(gw: Gateway, path: str) -> int:
    return sum(1 for r in gw.upstream.requests if r.path == path)


def assert_openai_429(response: httpx.Response, kind: str = "requests") -> None:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind and error["code"] == "rate_limit_exceeded" and error["param"] is None
    assert error["message"].startswith("Rate limit reached on ")
    assert 1 <= int(response.headers["retry-after"]) <= 86_400


def seconds(duration: str) -> float:
    """An OpenAI reset duration (``1m0.5s``, ``59ms``) in seconds."""
    if duration.endswith("ms"):
        return int(duration[:-2]) / 1000
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?([\d.]+)s", duration)
    assert match, duration
    hours, minutes, secs = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(secs)


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.02)


# --- every wire: the refusal and the headers -----------------------------------------------------


def test_chat_completions_429_after_the_limit_with_openai_headers(
    gw: Gateway, gateway_config: Callable[..., Any], store: str
) -> None:
    limits(gateway_config, requests_per_minute=2)
    first = post(gw, "/v1/chat/completions", CHAT)
    time.sleep(1.2)  # the window resets 60 s after its newest request, not its oldest
    second = post(gw, "/v1/chat/completions", {**CHAT, "stream": True})  # a stream: in its head
    assert first.status_code == second.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    assert second.headers["content-type"].startswith("text/event-stream")
    for answer in (first, second):
        assert DURATION.match(answer.headers["x-ratelimit-reset-requests"]), answer.headers
        # Back to its initial state once this request leaves the window (the database: its second).
        assert 59.9 < seconds(answer.headers["x-ratelimit-reset-requests"]) <= 61
        assert "x-ratelimit-limit-tokens" not in answer.headers  # no token limit set

    refused = post(gw, "/v1/chat/completions", CHAT)
    assert_openai_429(refused)
    assert refused.json()["error"]["message"].startswith(
        "Rate limit reached on requests per min (RPM): Limit 2, Used 2, Requested 1."
    )
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(refused.headers["retry-after"]) <= 61  # the database store: per-second buckets
    assert upstream_calls(gw, "/v1/chat/completions") == 2  # no upstream call for the refusal


def test_messages_429_in_anthropics_form(gw: Gateway, gateway_config: Callable[..., Any], store: str) -> None:
    limits(gateway_config, requests_per_minute=1, tokens_per_minute=1000)
    admitted = post(gw, "/v1/messages", MESSAGE)
    assert admitted.status_code == 200, admitted.text
    assert admitted.headers["anthropic-ratelimit-requests-limit"] == "1"
    assert admitted.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert RFC3339.match(admitted.headers["anthropic-ratelimit-requests-reset"])
    assert admitted.headers["anthropic-ratelimit-tokens-limit"] == "1000"
    assert admitted.headers["anthropic-ratelimit-tokens-remaining"] == "1000"
    assert RFC3339.match(admitted.headers["anthropic-ratelimit-tokens-reset"])
    assert not any(name.startswith("x-ratelimit") for name in admitted.headers)

    refused = post(gw, "/v1/messages", {**MESSAGE, "stream": True})
    assert refused.status_code == 429
    body = refused.json()
    assert body["type"] == "error" and body["request_id"].startswith("req_")
    assert body["error"]["type"] == "rate_limit_error"
    assert body["error"]["message"].startswith("Rate limit reached on requests per min (RPM)")
    assert refused.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert 1 <= int(refused.headers["retry-after"]) <= 61
    assert upstream_calls(gw, "/v1/messages") == 1


def test_responses_json_and_sse_refused_before_anything_is_stored(
    gw: Gateway, gateway_config: Callable[..., Any], store: str
) -> None:
    limits(gateway_config, requests_per_minute=2)
    gw.script(text("Hello"))
    gw.script(text("Hello"))
    stored = post(gw, "/v1/responses", {"model": "m", "input": "x"})
    assert stored.status_code == 200
    assert stored.headers["x-ratelimit-remaining-requests"] == "1"
    streamed = post(gw, "/v1/responses", {"model": "m", "input": "x", "stream": True})
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.headers["x-ratelimit-remaining-requests"] == "0"
    rows = Response.objects.count()

    for body in ({"model": "m", "input": "x"}, {"model": "m", "input": "x", "stream": True}):
        refused = post(gw, "/v1/responses", body)
        assert_openai_429(refused)
        assert refused.headers["content-type"] == "application/json"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert Response.objects.count() == rows
    assert upstream_calls(gw, "/v1/responses") == 2


def test_compact_is_metered(gw: Gateway, gateway_config: Callable[..., Any]) -> None:
    limits(gateway_config, requests_per_minute=1)
    gw.script(text("a summary"))
    history = [{"role": "user", "content": "hello"}]
    first = post(gw, "/v1/responses/compact", {"model": "m", "input": history})
    assert first.status_code == 200, first.text
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    rows = Response.objects.count()
    refused = post(gw, "/v1/responses/compact", {"model": "m", "input": history})
    assert_openai_429(refused)
    assert Response.objects.count() == rows
    assert upstream_calls(gw, "/v1/responses") == 1


def test_websocket_429_event_keeps_the_connection(
    gw: Gateway, gateway_config: Callable[..., Any], store: str
) -> None:
    limits(gateway_config, max_concurrent_requests=1)
    gate = Gate()
    gw.upstream.script("/v1/responses", _gated(Script([text("one")]), gate))
    gw.script(text("two"))

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False, stream_id="a"))
            await _until_upstream(gw, 1)
            await c.send(create(store=False, stream_id="b"))  # the slot is taken
            got = [await c.recv()]
            while got[-1]["type"] != "error":
                got.append(await c.recv())
            refusal = got.pop()
            gate.open()
            first = got + await c.until_terminal()
            await asyncio.sleep(0.3)  # the slot's release is written off the answer's path
            await c.send(create(store=False))
            return first, refusal, await c.until_terminal()

    first, refusal, after = asyncio.run(scenario())
    assert refusal == {
        "type": "error",
        "stream_id": "b",
        "status": 429,
        "error": {
            "message": refusal["error"]["message"],
            "type": "requests",
            "code": "rate_limit_exceeded",
            "param": None,
        },
    }
    assert refusal["error"]["message"].startswith("Rate limit reached on concurrent requests: Limit 1")
    assert first[-1]["type"] == "response.completed"
    assert after[-1]["type"] == "response.completed"  # the connection was kept and still serves
    assert upstream_calls(gw, "/v1/responses") == 2


def test_websocket_requests_per_minute(gw: Gateway, gateway_config: Callable[..., Any]) -> None:
    limits(gateway_config, requests_per_minute=1)
    gw.script(text("one"))

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False))
            done = await c.until_terminal()
            await c.send(create(store=False))
            return done, await c.recv()

    done, refusal = asyncio.run(scenario())
    assert done[-1]["type"] == "response.completed"
    assert refusal["status"] == 429 and refusal["error"]["type"] == "requests"
    assert upstream_calls(gw, "/v1/responses") == 1


# --- who is limited ------------------------------------------------------------------------------


def _key(**overrides: int) -> str:
    key, secret = apikeys.apikey_create(name=f"k{time.monotonic_ns()}")
    for name, value in overrides.items():
        setattr(key, name, value)
    key.save()
    apikeys.reset()
    return secret


def test_an_api_keys_overrides_beat_the_defaults(gw: Gateway, gateway_config: Callable[..., Any]) -> None:
    limits(gateway_config, requests_per_minute=1)
    generous = {"authorization": f"Bearer {_key(requests_per_minute=3)}"}
    default = {"authorization": f"Bearer {_key()}"}
    answers = [post(gw, "/v1/chat/completions", CHAT, headers=generous) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert answers[0].headers["x-ratelimit-limit-requests"] == "3"
    # Another key has its own window, with the default limit.
    own = [post(gw, "/v1/chat/completions", CHAT, headers=default) for _ in range(2)]
    assert [a.status_code for a in own] == [200, 429]
    assert own[0].headers["x-ratelimit-limit-requests"] == "1"


def test_an_unlimited_principal_pays_nothing(gw: Gateway) -> None:
    answer = post(gw, "/v1/chat/completions", CHAT)
    assert answer.status_code == 200
    assert not any(name.startswith("x-ratelimit") for name in answer.headers)
    assert QuotaState.objects.count() == 0  # never looked up


# --- tokens ----------------------------------------------------------------------------------------


def _charge(owner: str, tokens: int) -> None:
    """The ledger reports a model call's usage (as every model call's accounting does)."""
    entry = ledger.UsageEntry(
        principal=Principal(owner=owner),
        route="/v1/chat/completions",
        model="test-model",
        status=200,
        started_at=time.time(),
        latency_ms=1,
        input_tokens=tokens - 10,
        output_tokens=10,
    )
    ledger.observe(entry)


def _clear_of_the_minutes_end(margin: float = 8.0) -> None:
    """Token windows are clock minutes: start a test that fills one well before its end."""
    left = 60 - time.time() % 60
    if left < margin:
        time.sleep(left + 0.1)


@pytest.mark.parametrize("window", ["tokens_per_minute", "tokens_per_day"])
def test_tokens_charged_from_usage_then_refused(
    gw: Gateway, gateway_config: Callable[..., Any], store: str, window: str
) -> None:
    _clear_of_the_minutes_end()
    limits(gateway_config, **{window: 50})
    first = post(gw, "/v1/chat/completions", CHAT)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-tokens"] == "50"
    assert DURATION.match(first.headers["x-ratelimit-reset-tokens"])
    usage = first.json()["usage"]
    spent = usage["prompt_tokens"] + usage["completion_tokens"]  # charged from the ledger's row
    assert 0 < spent < 50
    _charge("default", 50 - spent)  # used up: the window has no budget left
    eventually(lambda: post(gw, "/v1/chat/completions", CHAT).status_code == 429)
    refused = post(gw, "/v1/chat/completions", CHAT)
    assert_openai_429(refused, "tokens")
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    what = "tokens per min (TPM)" if window == "tokens_per_minute" else "tokens per day (TPD)"
    # Used: at least the 50 charged (a probe admitted before the last charge landed adds its own).
    said = re.match(
        rf"Rate limit reached on {re.escape(what)}: Limit 50, Used (\d+), Requested 1\.",
        refused.json()["error"]["message"],
    )
    assert said is not None and int(said.group(1)) >= 50, refused.json()


def test_a_request_is_admitted_while_the_window_has_budget(
    gw: Gateway, gateway_config: Callable[..., Any]
) -> None:
    _clear_of_the_minutes_end()
    limits(gateway_config, tokens_per_minute=50)
    _charge("default", 49)
    eventually(lambda: QuotaState.objects.filter(minute_tokens=49).exists())
    admitted = post(gw, "/v1/chat/completions", CHAT)
    assert admitted.status_code == 200
    assert admitted.headers["x-ratelimit-remaining-tokens"] == "1"


# --- concurrency -----------------------------------------------------------------------------------


def _gated(script: Script, gate: Gate) -> Any:
    inner = handler(script, "responses")

    async def held(request: Any, rec: Any) -> Any:
        await gate.wait()
        return await inner(request, rec)

    return held


async def _until_upstream(gw: Gateway, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(gw.upstream.requests) < count:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


def test_a_held_stream_holds_its_slot_until_it_ends(
    gw: Gateway, gateway_config: Callable[..., Any], store: str
) -> None:
    limits(gateway_config, max_concurrent_requests=1)
    gate = Gate()
    gw.upstream.script("/v1/chat/completions", sse(chat_chunks(["a", "b"]), gate=gate, gate_after=1))
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}) as held:
        assert held.status_code == 200
        assert "x-ratelimit-limit-requests" not in held.headers  # only the limits that are set
        refused = post(gw, "/v1/chat/completions", CHAT)
        assert_openai_429(refused)
        assert refused.json()["error"]["message"].startswith(
            "Rate limit reached on concurrent requests: Limit 1, Used 1"
        )
        gate.open()
        held.read()
    eventually(lambda: post(gw, "/v1/chat/completions", CHAT).status_code == 200)


def test_a_cancelled_stream_frees_its_slot(gw: Gateway, gateway_config: Callable[..., Any]) -> None:
    limits(gateway_config, max_concurrent_requests=1)
    gate = Gate()
    gw.upstream.script("/v1/chat/completions", sse(chat_chunks(["a", "b"]), gate=gate, gate_after=1))
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}) as held:
        assert held.status_code == 200
        assert post(gw, "/v1/chat/completions", CHAT).status_code == 429
    # The client left mid-stream: its slot is free although the upstream never finished.
    eventually(lambda: post(gw, "/v1/chat/completions", CHAT).status_code == 200)
    gate.open()


@pytest.mark.parametrize("runner", ["in-process", "broker"])
@pytest.mark.parametrize("ending", ["completed", "cancelled"])
def test_a_background_response_holds_its_slot_until_it_ends(
    gw: Gateway, gateway_config: Callable[..., Any], ending: str, runner: str
) -> None:
    """In process the slot follows the response's task; with a broker (a Celery worker runs it) the
    creating gateway follows its stored status."""
    limits(gateway_config, max_concurrent_requests=1)
    gate = Gate()
    gw.upstream.script("/v1/responses", _gated(Script([text("slow")]), gate))
    with ExitStack() as stack:
        if runner == "broker":
            stack.enter_context(responses_worker(gateway_config, BROKER_REDIS_URL))
        stack.callback(gate.open)  # before the worker stops: it waits for its task
        created = post(gw, "/v1/responses", {"model": "m", "input": "x", "background": True})
        assert created.status_code == 200, created.text
        assert created.json()["status"] == "queued"
        rid = created.json()["id"]
        gw.upstream.wait_requests(1)
        time.sleep(0.2)  # the HTTP answer is over; the work is not
        refused = post(gw, "/v1/chat/completions", CHAT)
        assert_openai_429(refused)
        assert refused.json()["error"]["message"].startswith(
            "Rate limit reached on concurrent requests: Limit 1, Used 1"
        )
        if runner == "broker":
            time.sleep(tasks.FINISHED_POLL_S + 0.2)  # past a poll of the stored status: still held
            assert post(gw, "/v1/chat/completions", CHAT).status_code == 429
        if ending == "cancelled":
            assert httpx.post(f"{gw.url}/v1/responses/{rid}/cancel", timeout=30).status_code == 200
        else:
            gate.open()
        eventually(lambda: Response.objects.get(id=rid).status == ending)
        eventually(lambda: post(gw, "/v1/chat/completions", CHAT).status_code == 200)


def test_a_crashed_holders_slot_lapses(gw: Gateway, gateway_config: Callable[..., Any], store: str) -> None:
    """A slot nobody renews (its process died) expires; a live holder's renewal keeps it."""
    limits(gateway_config, max_concurrent_requests=1)
    where = quotas.store()

    async def orphan() -> None:
        counts = await where.admit("default", Limits(max_concurrent=1), "orphan")
        assert counts.refused == ""

    original = quotas.SLOT_TTL_S
    quotas.SLOT_TTL_S = 0.5
    try:
        asyncio.run(orphan())
        assert post(gw, "/v1/chat/completions", CHAT).status_code == 429
        time.sleep(0.6)
        assert post(gw, "/v1/chat/completions", CHAT).status_code == 200
    finally:
        quotas.SLOT_TTL_S = original


# --- configuration and formats -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "0"])
def test_a_limit_that_is_not_positive_stops_start_up(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config({"GATEWAY_QUOTAS_TOKENS_PER_DAY": value})
    assert str(refused.value) == "quotas.tokens_per_day: must be positive"


def test_a_limit_that_is_not_an_integer_stops_start_up() -> None:
    with pytest.raises(ConfigError) as refused:
        load_config({"GATEWAY_QUOTAS_MAX_CONCURRENT_REQUESTS": "2.5"})
    assert str(refused.value) == "GATEWAY_QUOTAS_MAX_CONCURRENT_REQUESTS: must be an integer, got '2.5'"


def test_openai_durations_and_anthropic_times() -> None:
    assert [quotas.duration(ms) for ms in (59, 1000, 1500, 360_000, 3_723_000)] == [
        "59ms",
        "1s",
        "1.5s",
        "6m0s",
        "1h2m3s",
    ]
    assert quotas.rfc3339(1_796_597_999_500) == "2026-12-06T23:00:00Z"


# --- exactness across processes ------------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize("shared", ["database", "redis"])
def test_two_processes_admit_exactly_the_limit(upstream: Any, shared: str) -> None:
    limit, attempts = 50, 150
    data_dir = Path(tempfile.mkdtemp(prefix="quotas-"))
    env, database = process_database(data_dir)
    env.update(
        LLM_API_BASE=upstream.url,
        LOG_LEVEL="WARNING",
        OPENAI_API_KEY="",
        GATEWAY_QUOTAS_REQUESTS_PER_MINUTE=str(limit),
    )
    if shared == "redis":
        redis.Redis.from_url(QUOTA_REDIS_URL).flushdb()
        env["REDIS_URL"] = QUOTA_REDIS_URL
    first = GatewayProcess(env, log="/dev/null")
    second = GatewayProcess(env, migrate=False, log="/dev/null")  # the same database
    try:
        first.wait(60)
        second.wait(60)
        urls = [first.url, second.url]
        barrier = threading.Barrier(attempts)

        def one(i: int) -> int:
            with httpx.Client(timeout=30) as client:
                barrier.wait()
                return client.post(f"{urls[i % 2]}/v1/chat/completions", json=CHAT).status_code

        with ThreadPoolExecutor(attempts) as pool:
            statuses = list(pool.map(one, range(attempts)))
    finally:
        first.stop()
        second.stop()
        if database is not None:
            database.drop()
    assert statuses.count(200) == limit, statuses
    assert statuses.count(429) == attempts - limit
    assert upstream_calls_total(upstream) == limit


def upstream_calls_total(upstream: Any) -> int:
    return sum(1 for r in upstream.requests if r.path == "/v1/chat/completions")
