"""Ingestion in process (files_app.ingest): chunking under both token counts, embeddings,
failures that publish nothing, cancel and detach, the store's chunk limit, scheduling and the sweep.
Rows are made with the ORM; the scripted upstream speaks vLLM's /tokenize and /v1/embeddings."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from django.utils import timezone

from files_app import chunking, embeddings, ingest
from files_app.models import Chunk, VectorStore, VectorStoreFile
from gateway.core import runner
from gateway.core.config import Config
from tests.files.ingest_helpers import make_attachment, make_store, static, wait_status
from tests.upstream import MAX_MODEL_LEN, Gate, Recorded, hang, json_answer, vllm_error

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")

EMBED = "embed-model"


@pytest.fixture
def config(upstream: Any, gateway_config: Callable[..., Config]) -> Iterator[Callable[..., Config]]:
    """The gateway's config pointing at the scripted upstream, without a broker (in process)."""

    def apply(**changes: Any) -> Config:
        return gateway_config(llm_api_base=upstream.url, redis_url="", **changes)

    apply()
    yield apply


def run(pk: int) -> str | None:
    return asyncio.run(closing(ingest.ingest_one(pk)))


async def closing(work: Awaitable[T]) -> T:
    """``work``, then this event loop's upstream connections closed (as the Celery task does)."""
    from inference_app.upstream.http import close_upstreams

    try:
        return await work
    finally:
        await close_upstreams()


def chunks_of(row: VectorStoreFile) -> list[Chunk]:
    return list(Chunk.objects.filter(store_file_id=row.pk).order_by("position"))


# --- chunking ------------------------------------------------------------------------------------
WORDS = ["".join(p) for p in itertools.product("aäoöuü", repeat=2)]  # each " xy" one token either way


def word_text(count: int) -> tuple[str, list[str]]:
    words = [WORDS[i % len(WORDS)] for i in range(count)]
    return " ".join(words), words


def window(words: list[str], begin: int, end: int) -> str:
    return (" " if begin else "") + " ".join(words[begin:end])


def expected_windows(words: list[str], size: int, overlap: int) -> list[tuple[str, int]]:
    out, begin = [], 0
    while True:
        end = min(begin + size, len(words))
        out.append((window(words, begin, end), end - begin))
        if end == len(words):
            return out
        begin = end - overlap


@pytest.mark.parametrize("counting", ["tokenize", "approximate"])
def test_static_windows_and_overlap_under_both_token_counts(
    counting: str, upstream: Any, config: Callable[..., Config]
) -> None:
    """The tokenizer's offsets (scripted vLLM /tokenize, byte-level BPE token_strs with two-byte
    characters) and the approximation (no /tokenize: 404) cut the same windows of this text."""
    if counting == "approximate":
        upstream.script("/tokenize", json_answer(vllm_error("Not Found", "NotFoundError", 404), 404))
    text, words = word_text(1030)
    row = make_attachment(text.encode(), chunking_strategy=static(200, 60))
    assert run(row.pk) == "completed"
    got = [(c.text, c.tokens) for c in chunks_of(row)]
    assert got == expected_windows(words, 200, 60)
    asked = [r for r in upstream.requests if r.path == "/tokenize"]
    assert len(asked) == 1  # one request for the file, never one per window
    assert asked[0].json() == {"prompt": text, "add_special_tokens": False, "return_token_strs": True}
    if counting == "approximate":  # an upstream without /tokenize is not asked again for a while
        assert run(make_attachment(b"another file").pk) == "completed"
        assert sum(1 for r in upstream.requests if r.path == "/tokenize") == 1


def test_chunks_follow_the_tokenizers_own_tokens(
    upstream: Any, config: Callable[..., Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the tokenizer and the approximation disagree (" abcdefghij01": four scripted BPE
    tokens, three approximate ones), the windows are the tokenizer's; a text longer than one /tokenize
    request is sent in pieces and its offsets still line up."""
    from tests.upstream import byte_level_tokens, bytes_to_unicode

    monkeypatch.setattr(chunking, "SEGMENT_CHARS", 1000)
    text = " ".join(f"abcdefghij{n:02d}" for n in range(250))  # 3,249 characters: four requests
    decode = {c: b for b, c in bytes_to_unicode().items()}
    pieces = [bytes(decode[c] for c in t).decode() for t in byte_level_tokens(text)]
    assert len(pieces) == 999 and len(chunking.approximate_starts(text)) == 750
    row = make_attachment(text.encode(), chunking_strategy=static(100, 30))
    assert run(row.pk) == "completed"
    assert sum(1 for r in upstream.requests if r.path == "/tokenize") == 4
    wanted, begin = [], 0
    while True:
        end = min(begin + 100, len(pieces))
        wanted.append(("".join(pieces[begin:end]), end - begin))
        if end == len(pieces):
            break
        begin = end - 30
    assert [(c.text, c.tokens) for c in chunks_of(row)] == wanted


def test_auto_is_800_and_400_and_counts_come_from_the_tokenizer(config: Callable[..., Config]) -> None:
    text, words = word_text(2100)
    row = make_attachment(text.encode(), chunking_strategy={"type": "auto"})
    assert run(row.pk) == "completed"
    assert [(c.text, c.tokens) for c in chunks_of(row)] == expected_windows(words, 800, 400)


def test_a_tokenizer_without_token_strings_calibrates_the_approximation(
    upstream: Any, config: Callable[..., Config]
) -> None:
    """An older vLLM answers the count only: that file's approximate tokens are scaled to it (here
    two real tokens per word), so a 200-token window holds 100 words."""

    async def count_only(request: Any, rec: Recorded) -> Any:
        prompt = rec.json()["prompt"]
        n = 2 * len(prompt.split())
        return await json_answer({"count": n, "max_model_len": MAX_MODEL_LEN, "tokens": [7] * n})(
            request, rec
        )

    upstream.script("/tokenize", count_only)
    text, words = word_text(450)
    row = make_attachment(text.encode(), chunking_strategy=static(200, 60))
    assert run(row.pk) == "completed"
    got = [(c.text, c.tokens) for c in chunks_of(row)]
    assert got == [(t, 2 * n) for t, n in expected_windows(words, 100, 30)]


# --- embeddings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("created_with", [EMBED, ""])
def test_chunks_are_embedded_and_the_store_records_its_embedding_space(
    created_with: str, upstream: Any, config: Callable[..., Config]
) -> None:
    """A store is created with the configured model and no dimensions (or, made before a model was
    configured, with none): its first embedded file records both."""
    config(file_search__embedding_model=EMBED)
    text, _ = word_text(700)
    store = make_store(embedding_model=created_with, expires_after={"anchor": "last_active_at", "days": 2})
    created = store.last_active_at
    row = make_attachment(text.encode(), store=store, chunking_strategy=static(100, 0))
    assert run(row.pk) == "completed"
    chunks = chunks_of(row)
    assert len(chunks) == 7
    for chunk in chunks:
        assert chunk.embedding is not None and len(chunk.embedding) == 4 * 4
        assert len(embeddings.unpack(chunk.embedding)) == 4
    sent = [r.json() for r in upstream.requests if r.path == "/v1/embeddings"]
    assert [t for body in sent for t in body["input"]] == [c.text for c in chunks]
    assert {body["model"] for body in sent} == {EMBED}
    store.refresh_from_db()
    assert (store.embedding_model, store.embedding_dimensions, store.revision) == (EMBED, 4, 1)
    assert store.last_active_at > created and store.expires_at == store.last_active_at + datetime.timedelta(
        days=2
    )
    row.refresh_from_db()
    assert row.usage_bytes == sum(len(c.text.encode()) + 16 for c in chunks)
    assert row.last_error is None and row.lease_owner == "" and row.lease_expires_at is None


def test_a_store_of_another_embedding_space_gets_keyword_chunks(
    upstream: Any, config: Callable[..., Config]
) -> None:
    config(file_search__embedding_model=EMBED)
    store = make_store(embedding_model="older-model", embedding_dimensions=3)
    row = make_attachment(b"some words to search", store=store)
    assert run(row.pk) == "completed"
    assert [c.embedding for c in chunks_of(row)] == [None]
    assert not any(r.path == "/v1/embeddings" for r in upstream.requests)
    store.refresh_from_db()
    assert (store.embedding_model, store.embedding_dimensions) == ("older-model", 3)


def test_an_embedding_server_of_its_own_gets_no_gateway_credential(
    upstream: Any, config: Callable[..., Config]
) -> None:
    """``embedding_base_url`` (here with ``/v1``): the embeddings go there without the upstream's
    key; the token count still asks the upstream, with it."""
    from tests.upstream import ScriptedUpstream

    embedder = ScriptedUpstream().start()
    try:
        config(
            openai_api_key="sk-upstream",
            file_search__embedding_model=EMBED,
            file_search__embedding_base_url=f"{embedder.url}/v1",
        )
        row = make_attachment(b"embedded elsewhere")
        assert run(row.pk) == "completed"
        sent = embedder.last("/v1/embeddings")
        assert sent.json()["input"] == ["embedded elsewhere"] and "authorization" not in sent.headers
        assert not any(r.path == "/v1/embeddings" for r in upstream.requests)
        assert upstream.last("/tokenize").headers["authorization"] == "Bearer sk-upstream"
    finally:
        embedder.stop()


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"object": "list", "data": [{"index": 0, "embedding": [1.0]}]}, "one float vector per input"),
        (
            {
                "object": "list",
                "data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}],
            },
            "vectors of different sizes",
        ),
        (b"<html>bad gateway</html>", "one float vector per input"),
    ],
)
def test_embed_refuses_answers_that_are_not_one_vector_per_input(
    answer: Any, says: str, upstream: Any, config: Callable[..., Config]
) -> None:
    from gateway.core import errors

    settings = config(file_search__embedding_model=EMBED)
    upstream.script("/v1/embeddings", json_answer(answer))
    with pytest.raises(errors.UpstreamError) as caught:
        asyncio.run(closing(embeddings.embed(["a", "b"], settings)))
    assert says in caught.value.message and EMBED in caught.value.message


def test_embed_keeps_the_order_of_its_inputs_across_batches(
    upstream: Any, config: Callable[..., Config]
) -> None:
    settings = config(file_search__embedding_model=EMBED)

    async def by_text(request: Any, rec: Recorded) -> Any:
        texts = rec.json()["input"]
        data = [{"index": i, "embedding": [float(t)]} for i, t in reversed(list(enumerate(texts)))]
        return await json_answer({"object": "list", "data": data, "model": EMBED})(request, rec)

    for _ in range(3):
        upstream.script("/v1/embeddings", by_text)
    texts = [str(n) for n in range(2 * embeddings.BATCH_SIZE + 5)]
    vectors = asyncio.run(closing(embeddings.embed(texts, settings)))
    assert vectors == [[float(n)] for n in range(len(texts))]
    assert sorted(len(r.json()["input"]) for r in upstream.requests) == [5, 64, 64]


# --- failures publish nothing -------------------------------------------------------------------
def test_an_unreadable_file_fails_with_its_reason_and_no_chunks(config: Callable[..., Config]) -> None:
    binary = make_attachment(b"\x00\x00\x00\x01", "data.txt")
    office = make_attachment(b"PK\x03\x04", "report.docx")
    assert run(binary.pk) == "failed" and run(office.pk) == "failed"
    failed = wait_status(binary.pk, "failed")
    assert failed.last_error == {"code": "invalid_file", "message": "data.txt is binary, not text."}
    assert failed.lease_owner == "" and failed.usage_bytes == 0
    assert wait_status(office.pk, "failed").last_error["code"] == "unsupported_file"
    assert not Chunk.objects.exists()
    assert VectorStore.objects.get(pk=binary.vector_store_id).revision == 0


def test_a_failing_embedding_model_fails_the_file(upstream: Any, config: Callable[..., Config]) -> None:
    config(file_search__embedding_model=EMBED)
    upstream.script(
        "/v1/embeddings", json_answer(vllm_error("model not loaded", "BadRequestError", 400), 400)
    )
    row = make_attachment(b"text to embed")
    assert run(row.pk) == "failed"
    error = wait_status(row.pk, "failed").last_error
    assert error["code"] == "server_error" and "model not loaded" in error["message"]
    assert EMBED in error["message"] and not Chunk.objects.exists()


def test_the_store_chunk_limit_fails_the_file_that_passes_it(
    upstream: Any, config: Callable[..., Config]
) -> None:
    config(file_search__max_chunks_per_store=5, file_search__embedding_model=EMBED)
    store = make_store()
    first = make_attachment(word_text(300)[0].encode(), store=store, chunking_strategy=static(100, 0))
    assert run(first.pk) == "completed"  # 3 chunks
    embedded = sum(1 for r in upstream.requests if r.path == "/v1/embeddings")
    second = make_attachment(word_text(300)[0].encode(), store=store, chunking_strategy=static(100, 0))
    assert run(second.pk) == "failed"
    assert sum(1 for r in upstream.requests if r.path == "/v1/embeddings") == embedded  # refused first
    error = wait_status(second.pk, "failed").last_error
    assert error["code"] == "invalid_file" and "max_chunks_per_store" in error["message"]
    assert "5 chunks" in error["message"]
    assert Chunk.objects.filter(vector_store=store).count() == 3
    # The same limit holds when it is passed between the check and the publication.
    third = make_attachment(b"one chunk", store=store)
    claimed = ingest.claim(third.pk, "me/1/x", 30)
    assert claimed is not None
    pieces = [chunking.Chunk("a", 1)] * 3
    assert ingest.publish(claimed, "me/1/x", pieces, None, "", 5) == "failed"
    assert wait_status(third.pk, "failed").last_error["code"] == "invalid_file"
    assert Chunk.objects.filter(vector_store=store).count() == 3
    assert VectorStore.objects.get(pk=store.pk).revision == 1


# --- a cancel or detach meanwhile wins ----------------------------------------------------------
@pytest.mark.parametrize("change", ["cancel", "detach"])
def test_a_cancel_or_detach_during_ingestion_publishes_nothing(
    change: str, upstream: Any, config: Callable[..., Config]
) -> None:
    config(file_search__embedding_model=EMBED)
    gate = Gate()

    async def held(request: Any, rec: Recorded) -> Any:
        await gate.wait()
        return await json_answer({"object": "list", "data": [{"index": 0, "embedding": [1.0]}]})(request, rec)

    upstream.script("/v1/embeddings", held)
    row = make_attachment(b"words")

    async def scenario() -> str | None:
        work = asyncio.ensure_future(ingest.ingest_one(row.pk))
        while not any(r.path == "/v1/embeddings" for r in upstream.requests):
            await asyncio.sleep(0.01)
        if change == "cancel":
            await asyncio.to_thread(VectorStoreFile.objects.filter(pk=row.pk).update, status="cancelled")
        else:
            await asyncio.to_thread(VectorStoreFile.objects.filter(pk=row.pk).delete)
        gate.open()
        return await work

    assert asyncio.run(closing(scenario())) == "gone"
    assert not Chunk.objects.exists()
    assert VectorStore.objects.get(pk=row.vector_store_id).revision == 0
    if change == "cancel":
        assert VectorStoreFile.objects.get(pk=row.pk).status == "cancelled"


def test_a_lost_lease_stops_the_work_at_the_next_renewal(
    upstream: Any, config: Callable[..., Config]
) -> None:
    """The embedding server never answers; the file is cancelled: the renewal finds the row no
    longer ours and the work ends there, not when the server answers."""
    config(file_search__embedding_model=EMBED, file_search__ingestion_lease_s=0.4)
    upstream.script("/v1/embeddings", hang())
    row = make_attachment(b"words")

    async def scenario() -> str | None:
        work = asyncio.ensure_future(ingest.ingest_one(row.pk))
        while not any(r.path == "/v1/embeddings" for r in upstream.requests):
            await asyncio.sleep(0.01)
        await asyncio.to_thread(VectorStoreFile.objects.filter(pk=row.pk).update, status="cancelled")
        await asyncio.wait({work}, timeout=3)  # renewals every 0.1 s; the server never answers
        assert work.done(), "the work went on after its lease was lost"
        return work.result()

    assert asyncio.run(closing(scenario())) == "gone"
    assert not Chunk.objects.exists()


def test_a_second_delivery_does_not_ingest_twice(config: Callable[..., Config]) -> None:
    row = make_attachment(b"hello there")

    async def both() -> list[str | None]:
        return list(await asyncio.gather(ingest.ingest_one(row.pk), ingest.ingest_one(row.pk)))

    assert sorted(asyncio.run(closing(both())), key=str) == [None, "completed"]
    assert Chunk.objects.filter(store_file_id=row.pk).count() == 1
    assert run(row.pk) is None  # completed: never claimed again


# --- scheduling and the sweep -------------------------------------------------------------------
def test_schedule_without_a_broker_ingests_in_this_process(config: Callable[..., Config]) -> None:
    rows = [make_attachment(f"file number {n}".encode()) for n in range(3)]
    ingest.schedule([r.pk for r in rows])
    for r in rows:
        done = wait_status(r.pk, "completed")
        assert done.usage_bytes == len(f"file number {rows.index(r)}")
    assert [c.text for c in Chunk.objects.filter(store_file_id=rows[2].pk)] == ["file number 2"]


def _dead_pid() -> int:
    pid = os.fork()  # a child that exits at once
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_the_sweep_fails_lost_workers_and_sends_unclaimed_files_again(config: Callable[..., Config]) -> None:
    from responses_app import tasks

    config(file_search__ingestion_lease_s=30.0)
    now = timezone.now()
    ago = datetime.timedelta

    def attached(lease_owner: str = "", expires_in: float | None = None, age_s: float = 0) -> VectorStoreFile:
        row = make_attachment(b"swept words")
        expires = None if expires_in is None else now + ago(seconds=expires_in)
        VectorStoreFile.objects.filter(pk=row.pk).update(
            lease_owner=lease_owner, lease_expires_at=expires, created_at=now - ago(seconds=age_s)
        )
        return row

    expired = attached("elsewhere/12/ab", expires_in=-1, age_s=60)
    dead = attached(f"{runner.HOST}/{_dead_pid()}/cd", expires_in=20, age_s=60)
    live = attached("elsewhere/13/ab", expires_in=20, age_s=60)
    fresh = attached(age_s=1)  # just attached: its task is on its way
    stale = attached(age_s=45)  # nobody claimed it for a lease period: sent again
    abandoned = attached(age_s=30 * ingest.UNCLAIMED_PERIODS + 1)

    assert tasks.sweep_once() == 0  # the responses' count; the files' sweep runs in the same pass
    lost = {"code": "server_error", "message": ingest.WORKER_LOST}
    assert wait_status(expired.pk, "failed").last_error == lost
    assert wait_status(dead.pk, "failed").last_error == lost
    assert (
        "No ingestion worker picked this file up" in wait_status(abandoned.pk, "failed").last_error["message"]
    )
    assert VectorStoreFile.objects.get(pk=live.pk).status == "in_progress"
    assert VectorStoreFile.objects.get(pk=fresh.pk).lease_expires_at is None
    assert wait_status(stale.pk, "completed").chunks.count() == 1
    assert VectorStoreFile.objects.get(pk=fresh.pk).status == "in_progress"  # not sent twice
    assert ingest.sweep() == 0  # nothing twice
