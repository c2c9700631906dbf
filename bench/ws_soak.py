"""Soak benchmark: does the server give back what closed connections and long traffic held?

Side by side in one run, against one instant upstream (vLLM's ``/v1/responses`` SSE and chat
completions): our gateway on its default server (``manage.py serve``: uvicorn, one process a
core), our gateway on daphne, and the reference gateway (``agentic-api`` 0.9.0).

* **WebSocket cycles**: ``--cycles`` times, ``--connections`` connections to ``WS /v1/responses``
  are opened (all held open at once), then closed; ``idle`` sends nothing, ``response`` runs one
  response on each (``store`` alternating true/false). The RSS of the server's whole process tree
  is read with every connection open (``held``) and ``--settle`` seconds after the last close
  (``closed``). Pass: after the first cycle, ``closed`` stays within 5 % of the first cycle's.
* **HTTP traffic** (``--http-minutes``): stored SSE Responses and pass-through SSE chat
  completions, ``--concurrency`` clients each, for the whole time; RSS sampled every
  ``--sample`` seconds. Pass: after the first ``--warmup`` minutes (the bounded caches filling),
  within 5 % of the first sample after it.

A connection or request that fails is an error; a run with errors is a failing result (exit 1).

    .venv/bin/python bench/ws_soak.py [--reference /work/ref-venv/bin/agentic-server]
        [--targets ours,daphne,reference] [--cycles 11] [--connections 2000] [--http-minutes 10]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres] [--env NAME=value ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import websockets
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fast_upstream import chat_events  # noqa: E402
from bench.responses import postgres_url, start_reference, start_upstream  # noqa: E402
from tests.servers import GatewayProcess  # noqa: E402

TOLERANCE = 0.05
CHAT_SSE = b"".join(chat_events(16))


def rss_mib(pid: int) -> float:
    """RSS of ``pid`` and every process below it, in MiB (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, p in parents.items() if p == parent and child not in tree]
        tree.update(children)
        frontier += children
    total = 0
    for member in tree:
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


# --- the upstream ------------------------------------------------------------------------------


async def _chat(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)
    await response.write(CHAT_SSE)
    await response.write_eof()
    return response


# --- WebSocket cycles --------------------------------------------------------------------------


def _create(index: int) -> str:
    body = {
        "type": "response.create",
        "model": "test-model",
        "input": "Tell me about the fox.",
        "store": bool(index % 2),
    }
    return orjson.dumps(body).decode()


async def ws_cycle(url: str, connections: int, respond: bool, pid: int) -> tuple[float, int]:
    """Open ``connections`` at once (200 handshakes at a time), optionally one response each, then
    read the RSS while all are open and close them. Answers (held RSS, errors)."""
    opened: list[Any] = []
    errors = 0
    handshakes = asyncio.Semaphore(200)

    async def open_one(index: int) -> None:
        nonlocal errors
        try:
            async with handshakes:
                ws = await websockets.connect(url, max_size=None, open_timeout=60)
            opened.append(ws)
            if respond:
                await ws.send(_create(index))
                async with asyncio.timeout(60):
                    while True:
                        event = orjson.loads(await ws.recv())
                        if event["type"] == "response.completed":
                            break
                        if event["type"] in ("error", "response.failed", "response.incomplete"):
                            raise RuntimeError(event)
        except Exception:
            errors += 1

    await asyncio.gather(*(open_one(index) for index in range(connections)))
    held = rss_mib(pid)
    await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)
    return held, errors


def run_ws(name: str, base: str, pid: int, args: argparse.Namespace, respond: bool) -> dict[str, Any]:
    url = base.replace("http://", "ws://") + "/v1/responses"
    closed: list[float] = []
    held: list[float] = []
    errors = 0
    kind = "response" if respond else "idle"
    print(f"  {name} {kind}: start {rss_mib(pid):.0f} MiB", flush=True)
    for cycle in range(args.cycles):
        peak, failed = asyncio.run(ws_cycle(url, args.connections, respond, pid))
        time.sleep(args.settle)
        held.append(peak)
        closed.append(rss_mib(pid))
        errors += failed
        print(
            f"    cycle {cycle + 1:2}: held {peak:6.0f}  closed {closed[-1]:6.0f} MiB  errors {failed}",
            flush=True,
        )
    first, later = closed[0], closed[1:]
    drift = max((abs(value - first) / first for value in later), default=0.0)
    return {"held": max(held), "first": first, "last": closed[-1], "drift": drift, "errors": errors}


# --- HTTP traffic ------------------------------------------------------------------------------


STORED_SSE = {"model": "test-model", "input": "Tell me about the fox.", "stream": True, "store": True}
CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def http_traffic(base: str, pid: int, args: argparse.Namespace) -> tuple[list[float], int, int]:
    samples: list[float] = []
    counts = {"ok": 0, "errors": 0}
    deadline = time.monotonic() + args.http_minutes * 60
    connector = aiohttp.TCPConnector(limit=2 * args.concurrency + 4)

    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:

        async def worker(path: str, body: dict[str, Any], done: bytes) -> None:
            payload = orjson.dumps(body)
            while time.monotonic() < deadline:
                try:
                    async with client.post(
                        base + path, data=payload, headers={"content-type": "application/json"}
                    ) as answer:
                        raw = await answer.read()
                    ok = answer.status == 200 and done in raw
                except Exception:
                    ok = False
                counts["ok" if ok else "errors"] += 1

        async def sampler() -> None:
            while time.monotonic() < deadline:
                await asyncio.sleep(args.sample)
                samples.append(rss_mib(pid))
                print(
                    f"    {len(samples) * args.sample:5.0f} s: {samples[-1]:6.0f} MiB, {counts['ok']} requests",
                    flush=True,
                )

        workers = [
            worker("/v1/responses", STORED_SSE, b"response.completed") for _ in range(args.concurrency)
        ]
        workers += [worker("/v1/chat/completions", CHAT, b"[DONE]") for _ in range(args.concurrency)]
        await asyncio.gather(sampler(), *workers)
    return samples, counts["ok"], counts["errors"]


def run_http(name: str, base: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    print(f"  {name} http: start {rss_mib(pid):.0f} MiB", flush=True)
    samples, ok, errors = asyncio.run(http_traffic(base, pid, args))
    after = samples[int(args.warmup * 60 / args.sample) :] or samples[-1:]
    first = after[0]
    drift = max(abs(value - first) / first for value in after)
    return {"first": first, "last": samples[-1], "drift": drift, "requests": ok, "errors": errors}


# --- the run -----------------------------------------------------------------------------------


def start(target: str, upstream: str, args: argparse.Namespace, tmp: Path) -> tuple[Any, str]:
    if target == "reference":
        home = tmp / "reference"
        home.mkdir(exist_ok=True)
        return start_reference(args.reference, upstream, str(home))
    env = {"LLM_API_BASE": upstream, "LOG_LEVEL": "WARNING", "GATEWAY_SERVER_DATA_DIR": str(tmp / target)}
    if args.postgres:
        env["DATABASE_URL"] = postgres_url(args.postgres, f"bench_soak_{target}")
    env.update(item.split("=", 1) for item in args.env)
    if target == "daphne":
        env["GATEWAY_SERVER_ASGI_SERVER"] = "daphne"
    gateway = GatewayProcess(env, log=os.devnull).wait(60)
    return gateway.proc, gateway.url


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reference", default="/work/ref-venv/bin/agentic-server")
    parser.add_argument("--targets", default="ours,daphne,reference")
    parser.add_argument("--parts", default="idle,response,http")
    parser.add_argument("--cycles", type=int, default=11)
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds between the last close and the reading"
    )
    parser.add_argument("--http-minutes", type=float, default=10.0)
    parser.add_argument(
        "--warmup",
        type=float,
        default=3.0,
        help="minutes of HTTP traffic left out while the bounded caches fill (the history cache: up to "
        "64 MiB a process; SQLite's page cache: up to 2 MiB a database connection)",
    )
    parser.add_argument("--sample", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--postgres",
        default="",
        help="a PostgreSQL server URL: our gateway on a fresh database there (default SQLite)",
    )
    parser.add_argument("--env", action="append", default=[], help="NAME=value for our gateway (repeatable)")
    args = parser.parse_args()
    parts = args.parts.split(",")

    upstream = start_upstream({"/v1/chat/completions": _chat})
    results: dict[tuple[str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ws-soak-") as tmp:
        for target in args.targets.split(","):
            for part in parts:  # a fresh server for each part: no part inherits another's heap
                proc, base = start(target, upstream, args, Path(tmp))
                try:
                    if part == "http":
                        results[target, part] = run_http(target, base, proc.pid, args)
                    else:
                        results[target, part] = run_ws(target, base, proc.pid, args, part == "response")
                finally:
                    proc.terminate()
                    proc.wait(60)

    failed = False
    print(
        "\n| target | part | first (MiB) | last (MiB) | largest drift after the first | held (MiB) | errors |"
    )
    print("|---|---|---|---|---|---|---|")
    for (target, part), r in results.items():
        within = r["drift"] <= TOLERANCE
        failed |= bool(r["errors"]) or (target != "reference" and not within)
        held = f"{r['held']:.0f}" if "held" in r else "-"
        print(
            f"| {target} | {part} | {r['first']:.0f} | {r['last']:.0f} | {100 * r['drift']:.1f} %"
            f"{'' if within else ' (over 5 %)'} | {held} | {r['errors']} |"
        )
    for part in parts:
        ours, reference = results.get(("ours", part)), results.get(("reference", part))
        if ours and reference:
            print(f"{part}: ours / reference, last RSS {ours['last'] / reference['last']:.2f}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
