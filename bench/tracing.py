"""Tracing bench: the gateway with tracing off, on with a local collector, and on with the exporter
pointed at a dead collector (nothing listening), side by side in one run.

Three gateways (``manage.py serve``, one server process each, SQLite each) in front of one instant
upstream (``bench/responses.py``'s, plus a chat-completions route); for pass-through chat JSON and
stored Responses JSON, every target runs in rounds, interleaved (off, collector, dead, then reversed)
so drift on a shared machine hits all alike. Printed: req/s, p50 and p99 latency, the server's CPU per
request, errors, and each target's req/s and p99 over tracing off (the median over rounds). Tracing
costs what its spans cost; a dead collector must cost no more than a live one, and fail nothing:
the batch processor drops spans when its queue is full and never blocks a request. Last, each
gateway is stopped and the time it took is printed (the exporter's flush at exit is bounded).

    .venv/bin/python bench/tracing.py [--requests 2000] [--concurrency 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.responses import Failed, _client, cpu_seconds, one, start_upstream  # noqa: E402
from tests.otlp_collector import OtlpCollector  # noqa: E402
from tests.servers import GatewayProcess, free_port  # noqa: E402
from tests.upstream import chat_completion  # noqa: E402

CHAT = orjson.dumps(chat_completion("Hello!"))
CHAT_BODY = orjson.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "Hello"}]})
RESPONSES_BODY = {"model": "bench-model", "input": "Hello", "store": True}
_JSON = {"content-type": "application/json"}


async def _chat(request: web.Request) -> web.StreamResponse:
    await request.read()
    return web.Response(body=CHAT, content_type="application/json")


async def _passthrough(client: aiohttp.ClientSession, base: str) -> float:
    started = time.perf_counter()
    async with client.post(f"{base}/v1/chat/completions", data=CHAT_BODY, headers=_JSON) as r:
        raw = await r.read()
    if r.status != 200 or b'"choices"' not in raw:
        raise Failed(f"chat {r.status}: {raw[:300]!r}")
    return time.perf_counter() - started


async def _responses(client: aiohttp.ClientSession, base: str) -> float:
    latency, _ = await one(client, base, RESPONSES_BODY)
    return latency


WORKLOADS = {"pass-through chat JSON": _passthrough, "stored Responses JSON": _responses}


async def cell(workload: str, base: str, pid: int, concurrency: int, total: int) -> dict[str, Any]:
    call = WORKLOADS[workload]
    latencies: list[float] = []
    failures: list[str] = []
    async with _client(concurrency) as client:
        await asyncio.gather(*(call(client, base) for _ in range(concurrency)), return_exceptions=True)
        left = [total]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                try:
                    latencies.append(await call(client, base))
                except Exception as exc:  # counted: a run with errors is a failing result
                    failures.append(f"{type(exc).__name__}: {exc}")

        cpu = cpu_seconds(pid)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu_ms = (cpu_seconds(pid) - cpu) * 1000 / total
    latencies.sort()
    pick = (
        (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000) if latencies else None
    )
    return {
        "rps": total / elapsed,
        "p50": pick(0.50) if pick else float("nan"),
        "p99": pick(0.99) if pick else float("nan"),
        "cpu_ms": cpu_ms,
        "errors": len(failures),
        "first_error": failures[0] if failures else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000, help="requests a cell after the warm-up")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    upstream = start_upstream({"/v1/chat/completions": _chat})
    collector = OtlpCollector(keep=False).start()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    tmp = tempfile.mkdtemp(prefix="bench-tracing-")
    common = {
        "LLM_API_BASE": upstream,
        "UPSTREAM_API": "responses",
        "LOG_LEVEL": "WARNING",
        "GATEWAY_SERVER_WORKERS": "1",
        "GATEWAY_SERVER_ACCESS_LOG": "false",
    }
    variants = {
        "off": {},
        "collector": {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint},
        "dead collector": {"OTEL_EXPORTER_OTLP_ENDPOINT": dead},
    }
    gateways: dict[str, GatewayProcess] = {}
    try:
        for name, extra in variants.items():
            env = {**common, **extra, "GATEWAY_SERVER_DATA_DIR": f"{tmp}/{name.replace(' ', '-')}"}
            gateways[name] = GatewayProcess(env, log=os.devnull).wait(60)
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        order = list(gateways)
        for round_ in range(args.rounds):
            for workload in WORKLOADS:
                for name in order if round_ % 2 == 0 else order[::-1]:
                    gw = gateways[name]
                    result = asyncio.run(cell(workload, gw.url, gw.proc.pid, args.concurrency, args.requests))
                    results.setdefault((workload, name), []).append(result)
        print(
            f"concurrency {args.concurrency}, {args.requests} requests a cell, {args.rounds} rounds (medians)"
        )
        print()
        print(
            "| workload | tracing | req/s | p50 ms | p99 ms | CPU ms/req | errors | req/s ÷ off | p99 ÷ off |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        failed = 0
        for workload in WORKLOADS:
            base = results[(workload, "off")]
            for name in order:
                runs = results[(workload, name)]
                med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99", "cpu_ms")}
                errors = sum(r["errors"] for r in runs)
                failed += errors
                rps_ratio = statistics.median(r["rps"] / b["rps"] for r, b in zip(runs, base, strict=True))
                p99_ratio = statistics.median(r["p99"] / b["p99"] for r, b in zip(runs, base, strict=True))
                print(
                    f"| {workload} | {name} | {med['rps']:.0f} | {med['p50']:.1f} | {med['p99']:.1f} | "
                    f"{med['cpu_ms']:.2f} | {errors} | {rps_ratio:.2f} | {p99_ratio:.2f} |"
                )
                for run in runs:
                    if run["first_error"]:
                        print(f"  first error ({name}): {run['first_error']}")
        print()
        print(f"collector: {collector.received} spans in {collector.requests} export requests")
    finally:
        for name, gw in gateways.items():
            started = time.monotonic()
            gw.stop()
            print(f"stop ({name}): {time.monotonic() - started:.1f}s")
        collector.stop()
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
