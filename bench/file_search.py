"""File search bench: ingestion throughput, search throughput and latency per mode, recall@5, and the
cost of exact search per store, on SQLite and on PostgreSQL in one run.

A generated corpus (``--files`` text files of about 2 KB, 2 MB for 1,000; seeded, so every run is the
same) holds a labelled set: every 20th file has a topic of three invented words found in no other
file, and its query names two of them among everyday words, so the right file is known. Embeddings
come from a tiny deterministic embeddings server the bench runs itself (``tests/upstream.py``'s
scripted upstream with ``word_vectors``: each word hashed into a signed bucket of a
``--dims``-dimensional vector, OpenAI's ``/v1/embeddings`` in vLLM's format): semantic search here is
bag-of-words similarity, so its recall says nothing of a real embedding model's, only that the path
works end to end; its latency includes one real HTTP call per search.

Per database: the gateway as ``make run`` starts it (``manage.py serve``, ``[file_search]
embedding_model`` set), the corpus ingested through the API (``POST /v1/files``, a vector store,
``file_batches`` of 500, polled until every file is ``completed``): files/s from the first upload to
the last completion. Then ``POST /v1/vector_stores/{id}/search`` at C=1 and C=16 for keyword
(``hybrid_search`` weights 0/1), semantic (1/0) and hybrid (the default): req/s, p50 and p99
latency; recall@5 of the labelled queries per mode; and the first search's latency (the index
build). Last, in process on SQLite: one store of ``--scale`` chunks, the index build time and size,
and a keyword and a semantic ranking's time, the cost that ``[file_search] max_chunks_per_store``
bounds. Any failed request fails the run (exit 1).

    .venv/bin/python bench/file_search.py [--stores sqlite,postgres]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres] [--files 1000] [--requests 200]
        [--concurrency 1,16] [--dims 512] [--scale 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.responses import postgres_url, start_gateway  # noqa: E402
from tests.upstream import ScriptedUpstream, word_vector  # noqa: E402

EMBEDDING_MODEL = "bench-embedder"
MODES: dict[str, dict[str, Any]] = {
    "keyword": {"ranking_options": {"hybrid_search": {"embedding_weight": 0, "text_weight": 1}}},
    "semantic": {"ranking_options": {"hybrid_search": {"embedding_weight": 1, "text_weight": 0}}},
    "hybrid": {},
}
LABEL_EVERY = 20
BATCH = 500  # file ids per file batch (OpenAI's limit)
INGEST_TIMEOUT_S = 300
COMMON = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "or",
    "an",
    "have",
    "not",
    "which",
    "but",
    "all",
    "were",
    "when",
    "we",
    "there",
    "can",
    "more",
    "if",
    "has",
    "one",
    "their",
    "will",
    "would",
    "about",
    "so",
    "what",
    "out",
    "up",
    "into",
]


# --- the corpus --------------------------------------------------------------------------------
def _word(rng: random.Random) -> str:
    syllables = ["ka", "lo", "mi", "ren", "tas", "vo", "dri", "pel", "sun", "gar", "fe", "ni", "bor", "qua"]
    return "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))


def corpus(files: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``files`` (name, text) pairs of about 2 KB, and the labelled (query, name) pairs."""
    rng = random.Random(59)
    vocabulary = sorted({_word(rng) for _ in range(4000)})
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]  # Zipf
    used = set(vocabulary)
    documents, labelled = [], []
    for n in range(files):
        name = f"doc-{n:04d}.txt"
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < 1900:
            words.extend(rng.choices(COMMON, k=3))
            words.extend(rng.choices(vocabulary, weights=weights, k=4))
        if n % LABEL_EVERY == 0:
            keys = []
            while len(keys) < 3:
                candidate = _word(rng) + _word(rng)
                if candidate not in used:
                    used.add(candidate)
                    keys.append(candidate)
            topic = f"This note is about {keys[0]} and {keys[1]}, and how {keys[2]} relates to {keys[0]}."
            words.insert(rng.randrange(len(words)), f"{topic} {keys[1]} {keys[2]}.")
            labelled.append((f"what is said about {keys[1]} and {keys[0]}", name))
        documents.append((name, " ".join(words)))
    return documents, labelled


# --- ingestion ---------------------------------------------------------------------------------
class Failed(Exception):
    pass


async def _json(response: aiohttp.ClientResponse, expected: int = 200) -> Any:
    raw = await response.read()
    if response.status != expected:
        raise Failed(f"{response.method} {response.url.path} {response.status}: {raw[:300]!r}")
    return orjson.loads(raw)


async def ingest_api(base: str, documents: list[tuple[str, str]]) -> tuple[str, float, float]:
    """The corpus through the Files and vector stores APIs: (store id, upload s, total s)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as client:
        started = time.perf_counter()
        ids: list[str] = []
        queue = list(documents)

        async def upload() -> None:
            while queue:
                name, text = queue.pop()
                form = aiohttp.FormData()
                form.add_field("purpose", "assistants")
                form.add_field("file", text.encode(), filename=name, content_type="text/plain")
                async with client.post(f"{base}/v1/files", data=form) as r:
                    ids.append((await _json(r))["id"])

        await asyncio.gather(*(upload() for _ in range(16)))
        uploaded = time.perf_counter() - started
        async with client.post(f"{base}/v1/vector_stores", json={"name": "bench"}) as r:
            store = (await _json(r))["id"]
        for i in range(0, len(ids), BATCH):
            async with client.post(
                f"{base}/v1/vector_stores/{store}/file_batches", json={"file_ids": ids[i : i + BATCH]}
            ) as r:
                await _json(r)
        deadline = time.monotonic() + INGEST_TIMEOUT_S
        while True:
            async with client.get(f"{base}/v1/vector_stores/{store}") as r:
                counts = (await _json(r))["file_counts"]
            if counts["in_progress"] == 0:
                break
            if time.monotonic() > deadline:
                raise Failed(f"ingestion still in progress after {INGEST_TIMEOUT_S} s: {counts}")
            await asyncio.sleep(0.2)
        total = time.perf_counter() - started
        if counts["completed"] != len(documents):
            async with client.get(f"{base}/v1/vector_stores/{store}/files?filter=failed&limit=1") as r:
                failed = (await _json(r))["data"]
            raise Failed(f"ingestion ended with {counts}; {failed[0]['last_error'] if failed else ''}")
        return store, uploaded, total


def _django(env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    import django

    django.setup()


def orm_rows(documents: list[tuple[str, str]], dims: int, owner: str = "default") -> str:
    import numpy as np
    from django.db import transaction

    from files_app.models import Chunk, File, VectorStore, VectorStoreFile
    from gateway.core.ids import new_id

    with transaction.atomic():
        store = VectorStore.objects.create(
            id=new_id("vs"),
            owner=owner,
            name="bench",
            embedding_model=EMBEDDING_MODEL,
            embedding_dimensions=dims,
        )
        files = File.objects.bulk_create(
            [
                File(
                    id=new_id("file"),
                    owner=owner,
                    filename=name,
                    purpose="assistants",
                    bytes=len(text),
                    storage_name=name,
                )
                for name, text in documents
            ],
            batch_size=1000,
        )
        attached = VectorStoreFile.objects.bulk_create(
            [VectorStoreFile(vector_store=store, file=file, status="completed") for file in files],
            batch_size=1000,
        )
        Chunk.objects.bulk_create(
            [
                Chunk(
                    store_file=row,
                    vector_store=store,
                    file_id=row.file_id,
                    position=0,
                    text=text,
                    tokens=len(text.split()),
                    embedding=np.asarray(word_vector(text, dims), dtype="<f4").tobytes(),
                )
                for row, (_, text) in zip(attached, documents, strict=True)
            ],
            batch_size=1000,
        )
        store.revision = 1
        store.save(update_fields=["revision"])
    return store.id


def scale_cell(chunks: int, dims: int) -> dict[str, float]:
    """Index build and ranking cost for one store of ``chunks`` chunks (in process)."""
    import numpy as np

    from files_app import retrieval
    from files_app.models import VectorStore

    rng = random.Random(7)
    documents, _ = corpus(200)
    texts = [d[1] for d in documents]
    rows = [(f"s-{i:06d}.txt", rng.choice(texts)) for i in range(chunks)]
    store_id = orm_rows(rows, dims)
    store = VectorStore.objects.get(id=store_id)
    retrieval.cache.clear()
    started = time.perf_counter()
    index = retrieval.cache.get(store)
    build = time.perf_counter() - started
    query = "what is said about the garsun and kalo"
    runs = 20
    started = time.perf_counter()
    for _ in range(runs):
        index.keyword_scores(query)
    keyword = (time.perf_counter() - started) / runs
    vector = np.asarray(word_vector(query, dims), dtype=np.float32)
    started = time.perf_counter()
    for _ in range(runs):
        index.semantic_scores(vector)
    semantic = (time.perf_counter() - started) / runs
    return {
        "chunks": chunks,
        "build_s": build,
        "index_mb": index.nbytes / 2**20,
        "keyword_ms": keyword * 1000,
        "semantic_ms": semantic * 1000,
    }


# --- searching ---------------------------------------------------------------------------------
async def search_load(
    base: str, store: str, mode: str, queries: list[tuple[str, str]], concurrency: int, total: int
) -> dict[str, Any]:
    latencies: list[float] = []
    failures: list[str] = []
    found = 0
    asked = 0
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as client:

        async def warm(n: int) -> None:
            body = {"query": queries[n % len(queries)][0], **MODES[mode]}
            async with client.post(f"{base}/v1/vector_stores/{store}/search", json=body) as r:
                await r.read()

        for _ in range(2):  # warm-up, at once on every connection (and the server's threads behind them)
            await asyncio.gather(*(warm(n) for n in range(concurrency)))
        counter = iter(range(total))

        async def worker() -> None:
            nonlocal found, asked
            for n in counter:
                query, right = queries[n % len(queries)]
                body = {"query": query, "max_num_results": 5, **MODES[mode]}
                started = time.perf_counter()
                try:
                    async with client.post(f"{base}/v1/vector_stores/{store}/search", json=body) as r:
                        page = await _json(r)
                except Exception as exc:  # counted: a run with errors is a failing result
                    failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                latencies.append(time.perf_counter() - started)
                asked += 1
                found += any(hit["filename"] == right for hit in page["data"])

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000 if latencies else float("nan"),
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
        if latencies
        else float("nan"),
        "recall": found / asked if asked else float("nan"),
        "errors": len(failures),
        "first_error": failures[0] if failures else "",
    }


async def first_search(base: str, store: str) -> float:
    async with aiohttp.ClientSession() as client:
        started = time.perf_counter()
        async with client.post(f"{base}/v1/vector_stores/{store}/search", json={"query": "warm up"}) as r:
            await _json(r)
        return time.perf_counter() - started


def run_store(
    kind: str, args: argparse.Namespace, upstream: str, documents: list[Any], labelled: list[Any]
) -> int:
    data_dir = tempfile.mkdtemp(prefix=f"bench-fs-{kind}-")
    database = postgres_url(args.postgres, "bench_file_search") if kind == "postgres" else ""
    settings = {"GATEWAY_FILE_SEARCH_EMBEDDING_MODEL": EMBEDDING_MODEL}
    proc, base = start_gateway(upstream, database, data_dir, settings=settings)
    errors = 0
    try:
        store, uploaded, total = asyncio.run(ingest_api(base, documents))
        print(
            f"\n[{kind}] ingestion: {len(documents)} files, {sum(len(t) for _, t in documents) / 1e6:.1f} MB: "
            f"uploads {len(documents) / uploaded:.0f} files/s, uploads to all completed {len(documents) / total:.1f} files/s"
        )
        print(
            f"[{kind}] first search (builds the store's index): {asyncio.run(first_search(base, store)) * 1000:.0f} ms"
        )
        print(f"{'mode':<9} {'C':>3} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'recall@5':>9} {'errors':>7}")
        for mode in MODES:
            for concurrency in args.concurrency:
                cell = asyncio.run(search_load(base, store, mode, labelled, concurrency, args.requests))
                errors += cell["errors"]
                print(
                    f"{mode:<9} {concurrency:>3} {cell['rps']:>8.1f} {cell['p50_ms']:>8.1f} {cell['p99_ms']:>8.1f} "
                    f"{cell['recall']:>9.2f} {cell['errors']:>7}"
                    + (f"  {cell['first_error']}" if cell["errors"] else "")
                )
    except Failed as exc:
        print(f"[{kind}] FAILED: {exc}")
        errors += 1
    finally:
        proc.terminate()
        proc.wait(30)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=200, help="searches per cell")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--dims", type=int, default=512)
    parser.add_argument(
        "--scale", type=int, default=20000, help="chunks in the exact-search cost cell (0: none)"
    )
    parser.add_argument("--scale-cell", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scale_cell:
        _django(
            {
                "GATEWAY_SERVER_DATA_DIR": args.scale_cell,
                "GATEWAY_FILE_SEARCH_MAX_CHUNKS_PER_STORE": "1000000",
            }
        )
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        print(json.dumps(scale_cell(args.scale, args.dims)))
        return
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    documents, labelled = corpus(args.files)
    upstream = ScriptedUpstream().start()
    upstream.word_vectors = args.dims
    print(
        f"corpus: {len(documents)} files, {sum(len(t) for _, t in documents) / 1e6:.2f} MB, {len(labelled)} labelled "
        f"queries; embeddings: hashed bag of words, {args.dims} dimensions (bench's own server)"
    )
    errors = 0
    try:
        for kind in args.stores.split(","):
            errors += run_store(kind, args, upstream.url, documents, labelled)
    finally:
        upstream.stop()
    if args.scale:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--scale-cell",
                tempfile.mkdtemp(prefix="bench-fs-scale-"),
                "--scale",
                str(args.scale),
                "--dims",
                str(args.dims),
            ],
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)},
            check=True,
            capture_output=True,
            text=True,
        )
        cell = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"\nexact search, one store of {cell['chunks']} chunks ({args.dims} dimensions, SQLite, in process): "
            f"index build {cell['build_s']:.1f} s, {cell['index_mb']:.0f} MB; keyword ranking "
            f"{cell['keyword_ms']:.1f} ms, semantic ranking {cell['semantic_ms']:.1f} ms per query"
        )
    if errors:
        print(f"FAILED: {errors} errors")
        sys.exit(1)


if __name__ == "__main__":
    main()
