"""The usage ledger on the pass-through and Anthropic Messages routes (docs/operations.md, "Usage ledger").

One row per upstream call, read from the answer as it passes (the bytes untouched): the JSON
``usage``, the last SSE chunk's ``usage``, Anthropic's ``message_start`` / ``message_delta``; null
tokens when the upstream reports none; 499 when the client left, 502 when the upstream failed. Rows
are written in batches within about a second, and a SIGTERM loses none. The Prometheus counters
``gateway_model_requests_total`` and ``gateway_tokens_total`` count the same calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.core.auth import apikeys
from gateway.core.principal import DEFAULT_PRINCIPAL
from tests.passthrough.test_audio import WAV
from tests.responses.test_faults import leg_database, query  # noqa: F401  (a fixture)
from tests.servers import GatewayProcess, LiveServer, free_port
from tests.tools.tools_servers import SearchProvider
from tests.upstream import (
    Gate,
    ScriptedUpstream,
    anthropic_error,
    anthropic_events,
    anthropic_message,
    anthropic_tool_events,
    anthropic_tool_message,
    chat_chunks,
    chat_completion,
    completion,
    completion_chunks,
    embeddings,
    json_answer,
    sse,
    vllm_error,
)
from usage_app import ledger, writer
from usage_app.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"
SEARCH = {"type": "web_search_20250305", "name": "web_search"}
USER = [{"role": "user", "content": "What is new?"}]


@pytest.fixture
def gw(
    live_gateway: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider, gateway_config: Any
) -> LiveServer:
    gateway_config(llm_api_base=upstream.url, web_search__base_url=provider.url)
    return live_gateway


def rows(count: int, timeout: float = 10.0) -> list[UsageRecord]:
    """The ledger's rows once there are ``count`` (flushed as they come), oldest first; exactly ``count``."""
    deadline = time.monotonic() + timeout
    while True:
        writer.flush_now()
        found = list(UsageRecord.objects.order_by("id"))
        if len(found) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert len(found) == count, [(r.route, r.status) for r in found]
    return found


def tokens(row: UsageRecord) -> tuple[int | None, int | None, int | None, int | None]:
    return row.input_tokens, row.output_tokens, row.cached_tokens, row.reasoning_tokens


def post(gw: LiveServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{gw.url}{path}", json=body, timeout=30, **kwargs)


def streamed(gw: LiveServer, path: str, body: Any) -> bytes:
    with httpx.stream("POST", f"{gw.url}{path}", json=body, timeout=30) as r:
        assert r.status_code == 200
        return r.read()


# --- chat/completions, completions, embeddings ----------------------------------------------------


def test_chat_json_row_with_the_key_and_every_token_count(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    key, secret = apikeys.apikey_create(name="ledger")
    answer = chat_completion("Hi", prompt_tokens=21, completion_tokens=8)
    answer["usage"]["prompt_tokens_details"] = {"cached_tokens": 16}
    answer["usage"]["completion_tokens_details"] = {"reasoning_tokens": 5}
    payload = orjson.dumps(answer)
    upstream.script(CHAT, json_answer(payload))
    sent = b'{"model": "test-model", "messages": [{"role": "user", "content": "Hi"}], "top_k": 3}'
    r = httpx.post(
        f"{gw.url}{CHAT}",
        content=sent,
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {secret}",
            "x-request-id": "rq-1",
        },
    )
    assert r.status_code == 200
    assert r.content == payload  # the answer relayed byte for byte
    assert upstream.last(CHAT).body == sent
    [row] = rows(1)
    assert (row.route, row.kind, row.model, row.status) == (CHAT, "completions", "test-model", 200)
    assert (row.owner, row.api_key_id) == (f"key:{key.id}", key.id)
    assert tokens(row) == (21, 8, 16, 5)
    assert row.request_id == r.headers["x-request-id"]
    assert row.response_id == ""
    assert 0 <= row.latency_ms < 10_000


def test_chat_stream_usage_from_the_last_chunk_even_split_across_reads(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    events = chat_chunks(["Hel", "lo", "!"], include_usage=True, prompt_tokens=11)
    usage_event = events[-2]
    cut = usage_event.index(b'"usage"') + 3  # the key itself arrives in two reads
    pieces = [*events[:-2], usage_event[:cut], usage_event[cut:], events[-1]]
    upstream.script(CHAT, sse(pieces, delay=0.05))
    body = streamed(gw, CHAT, {"model": "test-model", "messages": [], "stream": True})
    assert body == b"".join(events)
    [row] = rows(1)
    assert (row.route, row.model, row.status) == (CHAT, "test-model", 200)
    assert tokens(row) == (11, 4, None, None)


def test_chat_stream_without_usage_counts_the_request_with_null_tokens(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    upstream.script(CHAT, sse(chat_chunks(["a", "b"])))
    streamed(gw, CHAT, {"model": "test-model", "messages": [], "stream": True})
    answer = chat_completion("x")
    del answer["usage"]
    upstream.script(CHAT, json_answer(answer))
    assert post(gw, CHAT, {"model": "test-model", "messages": []}).status_code == 200
    first, second = rows(2)
    assert (first.status, tokens(first)) == (200, (None, None, None, None))
    assert (second.status, tokens(second)) == (200, (None, None, None, None))


def test_a_count_no_column_holds_is_null_and_the_batch_is_still_written(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    """An upstream's nonsense counts (past the BIGINT columns, negative) are null: the batch writer's
    insert is never refused for them, and no other row of the batch is lost."""
    nonsense = chat_completion("x", prompt_tokens=2**63, completion_tokens=8)
    nonsense["usage"]["prompt_tokens_details"] = {"cached_tokens": -1}
    upstream.script(CHAT, json_answer(nonsense))
    upstream.script(CHAT, json_answer(chat_completion("y", prompt_tokens=3, completion_tokens=4)))
    for _ in range(2):
        assert post(gw, CHAT, {"model": "test-model", "messages": []}).status_code == 200
    first, second = rows(2)
    assert tokens(first) == (None, 8, None, None)
    assert tokens(second) == (3, 4, None, None)


def test_completions_and_embeddings(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    upstream.script("/v1/completions", json_answer(completion(" there")))
    assert post(gw, "/v1/completions", {"model": "test-model", "prompt": "x"}).status_code == 200
    upstream.script("/v1/completions", sse(completion_chunks([" a", " b"])))
    streamed(gw, "/v1/completions", {"model": "test-model", "prompt": "x", "stream": True})
    upstream.script("/v1/embeddings", json_answer(embeddings(2)))
    assert post(gw, "/v1/embeddings", {"model": "test-model", "input": ["a", "b"]}).status_code == 200
    json_row, stream_row, embed_row = rows(3)
    assert (json_row.route, json_row.kind, tokens(json_row)) == (
        "/v1/completions",
        "completions",
        (2, 3, None, None),
    )
    assert tokens(stream_row) == (None, None, None, None)
    assert (embed_row.route, embed_row.kind, embed_row.model) == (
        "/v1/embeddings",
        "embeddings",
        "test-model",
    )
    assert tokens(embed_row) == (6, 0, None, None)


def test_the_model_is_the_top_level_one(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    """A nested ``model`` key (in metadata, before the real one) does not name the call's model."""
    upstream.script(CHAT, json_answer(chat_completion("x")))
    sent = b'{"metadata": {"model": "decoy"}, "messages": [], "model": "test-model"}'
    r = httpx.post(f"{gw.url}{CHAT}", content=sent, headers={"content-type": "application/json"})
    assert r.status_code == 200
    [row] = rows(1)
    assert row.model == "test-model"
    assert row.owner == DEFAULT_PRINCIPAL.owner and row.api_key_id is None


def test_audio_upload_row_reads_the_form_model(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="sk-x", max_retries=0)
    result = client.audio.transcriptions.create(model="test-model", file=("a.wav", WAV, "audio/wav"))
    assert result.text == "Hello world"
    assert upstream.last("/v1/audio/transcriptions").extra["form"]["file"] == ("a.wav", WAV)
    [row] = rows(1)
    assert (row.route, row.kind, row.model, row.status) == (
        "/v1/audio/transcriptions",
        "other",
        "test-model",
        200,
    )
    assert tokens(row) == (None, None, None, None)  # vLLM reports the audio's duration, no tokens


# --- failures ---------------------------------------------------------------------------------------


def test_an_unreachable_upstream_is_a_502_row(gw: LiveServer, gateway_config: Any) -> None:
    gateway_config(llm_api_base=f"http://127.0.0.1:{free_port()}")
    r = post(gw, CHAT, {"model": "test-model", "messages": []})
    assert r.status_code == 502
    [row] = rows(1)
    assert (row.route, row.model, row.status) == (CHAT, "test-model", 502)
    assert tokens(row) == (None, None, None, None)


def test_a_stream_the_upstream_stalls_is_a_504_row_with_the_usage_seen(
    gw: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(upstream__stall_timeout_s=0.5)
    upstream.script("/v1/messages", sse(anthropic_events(["a", "b"]), stall_after=3))
    body = streamed(
        gw, "/v1/messages", {"model": "test-model", "max_tokens": 8, "messages": USER, "stream": True}
    )
    assert body.endswith(b"\n\n") and b"event: error" in body
    [row] = rows(1)
    assert (row.route, row.status) == ("/v1/messages", 504)
    assert tokens(row) == (13, 0, None, None)  # message_start's, the stream broke off before message_delta


def test_upstream_error_status_is_the_rows_status(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    upstream.script("/v1/messages", json_answer(anthropic_error("too long"), status=400))
    r = post(gw, "/v1/messages", {"model": "test-model", "max_tokens": 8, "messages": USER})
    assert r.status_code == 400
    [row] = rows(1)
    assert (row.route, row.status, tokens(row)) == ("/v1/messages", 400, (None, None, None, None))


def test_a_client_that_leaves_mid_stream_is_a_499_row(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    gate = Gate()
    upstream.script(CHAT, sse(chat_chunks(["one", "two"], include_usage=True), gate=gate, gate_after=2))
    with httpx.stream(
        "POST", f"{gw.url}{CHAT}", json={"model": "test-model", "messages": [], "stream": True}, timeout=30
    ) as r:
        next(r.iter_raw())  # the first event arrived; the client leaves
    assert upstream.wait_disconnected(upstream.last(CHAT))
    gate.open()
    [row] = rows(1)
    assert (row.route, row.status) == (CHAT, 499)
    assert tokens(row) == (None, None, None, None)


# --- Anthropic Messages -------------------------------------------------------------------------------


def test_messages_json_and_stream(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    answer = anthropic_message("Hi")
    answer["usage"] = {"input_tokens": 30, "output_tokens": 4, "cache_read_input_tokens": 12}
    payload = orjson.dumps(answer)
    upstream.script("/v1/messages", json_answer(payload))
    client = anthropic.Anthropic(base_url=gw.url, api_key="sk-ant", max_retries=0)
    raw = client.messages.with_raw_response.create(model="test-model", max_tokens=8, messages=USER)  # type: ignore[arg-type]
    assert raw.http_response.content == payload
    events = anthropic_events(["a", "b", "c"])
    upstream.script("/v1/messages", sse(events))
    assert streamed(
        gw, "/v1/messages", {"model": "test-model", "max_tokens": 8, "messages": USER, "stream": True}
    ) == (b"".join(events))
    json_row, stream_row = rows(2)
    assert (json_row.route, json_row.kind, json_row.model) == ("/v1/messages", "completions", "test-model")
    assert tokens(json_row) == (30, 4, 12, None)
    assert tokens(stream_row) == (13, 3, None, None)  # message_start's input, message_delta's output


def test_count_tokens_relayed_and_diverted(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    upstream.script("/v1/messages/count_tokens", json_answer(b'{"input_tokens": 42}'))
    upstream.script("/v1/messages/count_tokens", json_answer(b'{"input_tokens": 57}'))
    plain = post(gw, "/v1/messages/count_tokens", {"model": "test-model", "messages": USER})
    diverted = post(
        gw, "/v1/messages/count_tokens", {"model": "test-model", "messages": USER, "tools": [SEARCH]}
    )
    assert (plain.json(), diverted.json()) == ({"input_tokens": 42}, {"input_tokens": 57})
    for row in rows(2):
        assert (row.route, row.kind, row.model, row.status) == (
            "/v1/messages/count_tokens",
            "other",
            "test-model",
            200,
        )
        assert tokens(row) == (None, None, None, None)  # counting is not a model's work


def test_server_tool_loop_a_row_per_round_json_and_stream(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    round_usage = {"input_tokens": 20, "output_tokens": 6}
    upstream.script(
        "/v1/messages",
        json_answer(anthropic_tool_message([("call_1", "web_search", {"query": "q"})], usage=round_usage)),
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("Done.")))
    r = post(
        gw, "/v1/messages", {"model": "test-model", "max_tokens": 64, "messages": USER, "tools": [SEARCH]}
    )
    assert r.status_code == 200
    assert r.json()["usage"]["input_tokens"] == 33
    upstream.script("/v1/messages", sse(anthropic_tool_events([("call_2", "web_search", {"query": "q"})])))
    upstream.script("/v1/messages", sse(anthropic_events(["The ", "answer."])))
    streamed(
        gw,
        "/v1/messages",
        {"model": "test-model", "max_tokens": 64, "messages": USER, "tools": [SEARCH], "stream": True},
    )
    found = rows(4)
    assert [(row.route, row.model, row.status) for row in found] == [("/v1/messages", "test-model", 200)] * 4
    assert [tokens(row) for row in found] == [
        (20, 6, None, None),
        (13, 3, None, None),
        (13, 5, None, None),
        (13, 2, None, None),
    ]


def test_server_tool_loop_upstream_refusal_is_the_rounds_status(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        "/v1/messages", json_answer(anthropic_tool_message([("call_1", "web_search", {"query": "q"})]))
    )
    upstream.script(
        "/v1/messages", json_answer(anthropic_error("overloaded", "overloaded_error"), status=529)
    )
    r = post(
        gw, "/v1/messages", {"model": "test-model", "max_tokens": 64, "messages": USER, "tools": [SEARCH]}
    )
    assert r.status_code == 529
    assert [row.status for row in rows(2)] == [200, 529]


# --- metrics --------------------------------------------------------------------------------------------


def samples(gw: LiveServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_count_requests_and_tokens_with_bounded_model_labels(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    """Models of this test's own: a call an earlier test left running (counted whenever it ends)
    never carries them, so their labels' deltas are this test's; ``other`` is shared by design,
    so its deltas are at least this test's."""
    upstream.models = ["metrics-listed", "second-model"]
    assert httpx.get(f"{gw.url}/v1/models", timeout=10).status_code == 200  # the labels the upstream lists
    before = samples(gw)
    answer = chat_completion("x", prompt_tokens=21, completion_tokens=8)
    answer["usage"]["prompt_tokens_details"] = {"cached_tokens": 16}
    upstream.script(CHAT, json_answer(answer))
    upstream.script(CHAT, json_answer(chat_completion("y", prompt_tokens=5, completion_tokens=2)))
    upstream.script(
        CHAT,
        json_answer(
            vllm_error("The model `metrics-unlisted-2` does not exist.", "NotFoundError", 404), status=404
        ),
    )
    ours = ["metrics-listed", "metrics-unlisted-1", "metrics-unlisted-2"]
    assert post(gw, CHAT, {"model": ours[0], "messages": []}).status_code == 200
    assert post(gw, CHAT, {"model": ours[1], "messages": []}).status_code == 200
    assert post(gw, CHAT, {"model": ours[2], "messages": []}).status_code == 404
    deadline = time.monotonic() + 10
    while UsageRecord.objects.filter(model__in=ours).count() < 3 and time.monotonic() < deadline:
        writer.flush_now()  # a row is queued when its call is counted: then the metrics have it
        time.sleep(0.02)
    after = samples(gw)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    requests = "gateway_model_requests_total"
    assert delta(requests, route=CHAT, model="metrics-listed", status="200") == 1
    assert delta(requests, route=CHAT, model="other", status="200") >= 1
    assert delta(requests, route=CHAT, model="other", status="404") >= 1
    assert not any(dict(labels).get("model", "").startswith("metrics-unlisted") for _, labels in after)
    assert delta("gateway_tokens_total", model="metrics-listed", kind="input") == 21
    assert delta("gateway_tokens_total", model="metrics-listed", kind="output") == 8
    assert delta("gateway_tokens_total", model="metrics-listed", kind="cached") == 16
    assert delta("gateway_tokens_total", model="other", kind="input") >= 5
    assert delta("gateway_tokens_total", model="other", kind="output") >= 2


def test_the_hosted_engines_model_is_a_label_before_any_list(
    gateway_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.apps import apps

    from usage_app import metrics

    monkeypatch.setattr(metrics, "_known", frozenset())
    gateway_config(llm_api_base="", inference__served_model_name="served-here")
    apps.get_app_config("inference_app").ready()
    assert (metrics.model_label("served-here"), metrics.model_label("else")) == ("served-here", "other")


# --- [usage] ledger = false ---------------------------------------------------------------------------


def test_ledger_off_no_row_no_metrics_no_tap_and_the_bytes_unchanged(
    gw: LiveServer, upstream: ScriptedUpstream, gateway_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off, a chat/completions call (JSON, and SSE with usage) is relayed as it is, with no row, no
    model metrics and no chunk fed to the usage tap."""
    from usage_app.tap import UsageTap

    gateway_config(usage__ledger=False)
    fed: list[bytes] = []
    monkeypatch.setattr(UsageTap, "feed", lambda self, chunk: fed.append(chunk))
    payload = orjson.dumps(chat_completion("Hi", prompt_tokens=21, completion_tokens=8))
    upstream.script(CHAT, json_answer(payload))
    events = chat_chunks(["Hel", "lo"], include_usage=True)
    upstream.script(CHAT, sse(events))
    before = samples(gw)
    assert post(gw, CHAT, {"model": "test-model", "messages": []}).content == payload
    body = {"model": "test-model", "messages": [], "stream": True, "stream_options": {"include_usage": True}}
    assert streamed(gw, CHAT, body) == b"".join(events)
    after = samples(gw)
    writer.flush_now()
    assert (writer.writer.pending, UsageRecord.objects.count()) == (0, 0)
    counted = {
        k: v - before.get(k, 0.0) for k, v in after.items() if k[0].startswith("gateway_model_requests")
    }
    assert not any(counted.values()), counted
    assert fed == []


def test_ledger_off_record_observe_and_rows_do_nothing(
    gateway_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored-response path's ``observe`` and ``rows`` are off with ``record``: nothing counted
    (metrics, token quotas), queued or written."""
    from usage_app import accounting

    counted: list[ledger.UsageEntry] = []
    monkeypatch.setattr(accounting, "count", counted.append)
    gateway_config(usage__ledger=False)
    one = entry("off", 1)
    ledger.record(one)
    ledger.observe(one)
    assert (counted, writer.writer.pending, ledger.rows([one])) == ([], 0, [])
    gateway_config(usage__ledger=True)
    ledger.observe(one)
    assert counted == [one] and len(ledger.rows([one])) == 1


# --- the batch writer ---------------------------------------------------------------------------------


def entry(model: str, tokens_in: int) -> ledger.UsageEntry:
    return ledger.UsageEntry(
        principal=DEFAULT_PRINCIPAL,
        route=CHAT,
        model=model,
        status=200,
        started_at=time.time(),
        latency_ms=1,
        input_tokens=tokens_in,
        output_tokens=1,
    )


def test_rows_are_written_in_batches_within_about_a_second_from_any_thread() -> None:
    """Recorded from an event loop and from a thread without one (a Celery task, sync code): the
    writer's own thread writes them, no flush asked for."""

    async def from_a_loop() -> None:
        for n in range(3):
            ledger.record(entry("loop", n))

    started = time.monotonic()
    asyncio.run(from_a_loop())
    thread = threading.Thread(target=lambda: [ledger.record(entry("thread", 10 + n)) for n in range(2)])
    thread.start()
    thread.join()
    found: list[UsageRecord] = []
    while len(found) < 5 and time.monotonic() - started < 5:
        found = list(UsageRecord.objects.order_by("id"))
        time.sleep(0.02)
    assert time.monotonic() - started < 2.5
    assert sorted((r.model, r.input_tokens) for r in found) == [
        ("loop", 0),
        ("loop", 1),
        ("loop", 2),
        ("thread", 10),
        ("thread", 11),
    ]
    assert writer.writer.pending == 0


def test_pending_rows_are_bounded_oldest_dropped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    bounded = writer.BatchWriter(interval_s=60, max_pending=3)
    with caplog.at_level(logging.WARNING, logger="gateway.usage"):
        for n in range(6):
            bounded.queue(entry("bounded", n))
    assert (bounded.pending, bounded.dropped) == (3, 3)
    assert len([r for r in caplog.records if "dropping the oldest" in r.getMessage()]) == 1
    assert bounded.flush_now() == 3
    assert sorted(UsageRecord.objects.values_list("input_tokens", flat=True)) == [3, 4, 5]


def test_a_failed_write_is_logged_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    failing = writer.BatchWriter(interval_s=60)
    bad = entry("x", 1)
    bad.status = -1  # violates the column's constraint
    failing.queue(bad)
    with caplog.at_level(logging.ERROR, logger="gateway.usage"):
        assert failing.flush_now() == 0
    assert any("could not be written" in r.getMessage() for r in caplog.records)
    failing.queue(entry("after", 2))
    assert failing.flush_now() == 1  # the writer goes on


# --- SIGTERM --------------------------------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.timeout(120)
def test_sigterm_loses_no_row(upstream: ScriptedUpstream, leg_database: dict[str, str]) -> None:  # noqa: F811
    """Answers complete, then SIGTERM at once (before the writer's second is up): every row is in the
    database after the process exits."""
    count = 12
    for n in range(count):
        upstream.script(CHAT, json_answer(chat_completion("x", prompt_tokens=10 + n, completion_tokens=n)))
    upstream.script("/v1/messages", sse(anthropic_events(["a", "b"])))
    env = {**leg_database, "LLM_API_BASE": upstream.url, "GATEWAY_SERVER_ACCESS_LOG": "false"}
    gw = GatewayProcess(env).wait()
    try:

        async def traffic() -> None:
            async with httpx.AsyncClient(timeout=30) as client:
                answers = await asyncio.gather(
                    *[
                        client.post(f"{gw.url}{CHAT}", json={"model": "test-model", "messages": []})
                        for _ in range(count)
                    ],
                    client.post(
                        f"{gw.url}/v1/messages",
                        json={"model": "test-model", "max_tokens": 8, "messages": USER, "stream": True},
                    ),
                )
                assert [a.status_code for a in answers] == [200] * (count + 1)

        asyncio.run(traffic())
        os.kill(gw.proc.pid, signal.SIGTERM)
        assert gw.proc.wait(timeout=30) == 0
    finally:
        gw.stop()
    found = query(
        env,
        "SELECT count(*), sum(input_tokens), sum(output_tokens) FROM usage_app_usagerecord WHERE route = %s",
        CHAT,
    )
    assert tuple(found[0]) == (count, sum(10 + n for n in range(count)), sum(range(count)))
    messages = query(
        env, "SELECT input_tokens, output_tokens FROM usage_app_usagerecord WHERE route = %s", "/v1/messages"
    )
    assert [tuple(r) for r in messages] == [(13, 2)]
