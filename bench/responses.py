"""Responses benchmark: direct upstream vs this gateway vs the reference gateway (agentic-api 0.9.0).

All three talk to the same scripted upstream (vLLM's /v1/responses SSE format, instant answers), so
the figures are the gateways' own overhead: stored JSON and SSE responses at concurrency 1/16/64,
and a 50-turn ``previous_response_id`` chain (per-turn latency must stay flat).

    .venv/bin/python bench/responses.py [--reference /work/ref-venv/bin/agentic-server]
        [--database-url postgres://postgres@127.0.0.1:5432/bench_responses] [--quick] [--chain-runs N]
        [--reference-database-url postgres://postgres@127.0.0.1:5432/bench_reference]

The gateway runs as ``manage.py serve`` (uvicorn, one worker); the reference as
``agentic-server --llm-api-base … --skip-llm-ready-check``.

``--chain-runs N`` runs the chain N times per target, alternating targets, and reports each turn's
median over the runs (a 2-core machine shared with other work makes single chains noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.responses.scripts import Script, responses_events, text  # noqa: E402
from tests.servers import GatewayProcess, free_port, wait_port  # noqa: E402
from tests.upstream import models_body  # noqa: E402

ANSWER = Script([text("The", " quick", " brown", " fox", " jumps", ".")])


# --- the upstream ------------------------------------------------------------------------------


async def _responses(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    events = responses_events(ANSWER, body)
    if not body.get("stream"):
        return web.json_response(events[-1][1]["response"])
    frames = b"".join(
        b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n" for kind, data in events
    )
    response = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)
    await response.write(frames)
    await response.write_eof()
    return response


async def _models(request: web.Request) -> web.StreamResponse:
    return web.json_response(models_body())


async def _health(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200)


def start_upstream() -> str:
    port = free_port()

    def run() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/responses", _responses)
        app.router.add_get("/v1/models", _models)
        app.router.add_get("/health", _health)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    wait_port(port)
    return f"http://127.0.0.1:{port}"


# --- the servers under test --------------------------------------------------------------------


def start_gateway(upstream: str, database_url: str, data_dir: str) -> tuple[subprocess.Popen[Any], str]:
    env = {"LLM_API_BASE": upstream, "LOG_LEVEL": "WARNING", "GATEWAY_SERVER_DATA_DIR": data_dir}
    if database_url:
        env["DATABASE_URL"] = database_url
    gateway = GatewayProcess(env, log=os.devnull).wait(60)
    return gateway.proc, gateway.url


def ensure_postgres_database(url: str) -> None:
    """Create the (empty) database ``url`` names if it does not exist yet (PostgreSQL URLs only)."""
    if not url.startswith(("postgres://", "postgresql://")):
        return
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def start_reference(
    binary: str, upstream: str, home: str, database_url: str = ""
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ, HOME=home, AGENTIC_HOME=home)
    env.pop("DATABASE_URL", None)
    proc = subprocess.Popen(
        [
            binary,
            "--llm-api-base",
            upstream,
            "--skip-llm-ready-check",
            "--gateway-host",
            "127.0.0.1",
            "--gateway-port",
            str(port),
            "--db-url",
            database_url or f"sqlite://{home}/agentic.db?mode=rwc",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, 60)
    return proc, f"http://127.0.0.1:{port}"


# --- load --------------------------------------------------------------------------------------


async def one(
    client: httpx.AsyncClient, base: str, body: dict[str, Any]
) -> tuple[float, dict[str, Any] | None]:
    started = time.perf_counter()
    if body.get("stream"):
        completed = False
        async with client.stream("POST", f"{base}/v1/responses", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if line.startswith("data: ") and '"response.completed"' in line:
                    completed = True
        assert completed
        return time.perf_counter() - started, None
    r = await client.post(f"{base}/v1/responses", json=body)
    assert r.status_code == 200, r.text
    return time.perf_counter() - started, r.json()


async def load(base: str, body: dict[str, Any], concurrency: int, total: int) -> dict[str, float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for _ in range(min(concurrency, 8)):  # warm-up
            await one(client, base, body)
        queue = list(range(total))

        async def worker() -> None:
            while queue:
                queue.pop()
                latency, _ = await one(client, base, body)
                latencies.append(latency)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "rps": total / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p95_ms": latencies[int(len(latencies) * 0.95) - 1] * 1000,
    }


async def chain(base: str, turns: int, store_body: dict[str, Any]) -> list[float]:
    per_turn: list[float] = []
    async with httpx.AsyncClient(timeout=120) as client:
        previous = None
        for turn in range(turns):
            body = dict(store_body, input=f"turn {turn}: tell me more")
            if previous:
                body["previous_response_id"] = previous
            latency, answer = await one(client, base, body)
            assert answer is not None
            previous = answer["id"]
            per_turn.append(latency * 1000)
    return per_turn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", default="/work/ref-venv/bin/agentic-server")
    parser.add_argument("--database-url", default="")
    parser.add_argument(
        "--reference-database-url",
        default="",
        help="the reference's store (default: its SQLite file); e.g. postgres://…/bench_ref to compare on PostgreSQL",
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests (CI smoke)")
    parser.add_argument("--chain-runs", type=int, default=1, help="chains per target (per-turn median)")
    args = parser.parse_args()

    upstream = start_upstream()
    tmp = tempfile.mkdtemp(prefix="bench-responses-")
    procs = []
    targets: dict[str, str] = {"direct": upstream}
    ensure_postgres_database(args.database_url)
    proc, url = start_gateway(upstream, args.database_url, tmp + "/gw")
    procs.append(proc)
    targets["gateway"] = url
    if args.reference and Path(args.reference).exists():
        os.makedirs(tmp + "/ref", exist_ok=True)
        ensure_postgres_database(args.reference_database_url)
        proc, url = start_reference(args.reference, upstream, tmp + "/ref", args.reference_database_url)
        procs.append(proc)
        targets["reference"] = url
    try:
        scale = 1 if args.quick else 4
        plan = [(1, 25 * scale), (16, 50 * scale), (64, 64 * scale)]
        print("| mode | concurrency | target | req/s | p50 ms | p95 ms |")
        print("|---|---|---|---|---|---|")
        for stream in (False, True):
            for concurrency, total in plan:
                for name, base in targets.items():
                    body: dict[str, Any] = {"model": "test-model", "input": "Hello there", "stream": stream}
                    if name != "direct":
                        body["store"] = True
                    stats = asyncio.run(load(base, body, concurrency, total))
                    mode = "SSE" if stream else "JSON"
                    print(
                        f"| {mode} | {concurrency} | {name} | {stats['rps']:.0f} | "
                        f"{stats['p50_ms']:.1f} | {stats['p95_ms']:.1f} |",
                        flush=True,
                    )
        turns = 50
        print()
        print("| target | turns 1-10 mean ms | turns 21-30 mean ms | turns 41-50 mean ms |")
        print("|---|---|---|---|")
        runs: dict[str, list[list[float]]] = {name: [] for name in targets if name != "direct"}
        for _ in range(max(1, args.chain_runs)):
            for name in runs:  # alternating, so both see the same machine
                runs[name].append(
                    asyncio.run(chain(targets[name], turns, {"model": "test-model", "store": True}))
                )
        for name, chains in runs.items():
            per_turn = [statistics.median(run[t] for run in chains) for t in range(turns)]
            means = [statistics.mean(per_turn[a:b]) for a, b in ((0, 10), (20, 30), (40, 50))]
            print(f"| {name} | {means[0]:.1f} | {means[1]:.1f} | {means[2]:.1f} |", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
