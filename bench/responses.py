"""Responses benchmark: this gateway side by side with the reference gateway (agentic-api 0.9.0),
on a SQLite file and on PostgreSQL, in one run.

Both talk to the same scripted upstream (vLLM's /v1/responses SSE format, instant answers), so the
figures are the gateways' own overhead: stored JSON and SSE responses at concurrency 16 and 64
(req/s, median latency, gateway CPU per request: the server's process tree, from /proc, the warm-up left out), and a
``previous_response_id`` chain (per-turn latency must stay flat). Every request must end as a
stored, completed response; errors are counted per cell and any error fails the run (exit 1).

    .venv/bin/python bench/responses.py [--reference /work/ref-venv/bin/agentic-server]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres] [--quick] [--requests 4000]
        [--concurrency 16,64] [--rounds 3]

The gateway runs as ``manage.py serve`` in its default configuration (as ``make run`` starts it);
the reference as ``agentic-server --llm-api-base … --skip-llm-ready-check``, each on its own SQLite
file, then each on a fresh PostgreSQL database (``<prefix>_gateway``, ``<prefix>_reference``;
``--db-prefix``, default ``bench``). ``--before <checkout>`` runs an earlier commit's gateway beside
both, from that checkout, in the same configuration. ``--rounds N`` measures each cell N times, the
targets' order reversed every other round (cells move by 20-30 % from run to run on a shared
2-core machine), and adds a table of medians with each target's req/s over the reference's, round
by round.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
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


def start_upstream(posts: dict[str, Any] | None = None) -> str:
    """The instant upstream, in a thread; ``posts``: more POST routes (path: aiohttp handler)."""
    port = free_port()

    def run() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/responses", _responses)
        for path, handler in (posts or {}).items():
            app.router.add_post(path, handler)
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


def start_gateway(
    upstream: str,
    database_url: str,
    data_dir: str,
    workers: int = 0,
    root: Path = ROOT,
    *,
    wrapper: Sequence[str] = (),
    start_timeout: float = 60,
    settings: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[Any], str]:
    """Our gateway as ``make run`` starts it (``wrapper``: a command it runs under, such as valgrind;
    ``settings``: more environment settings, such as ``GATEWAY_USAGE_LEDGER``)."""
    env = {"LLM_API_BASE": upstream, "LOG_LEVEL": "WARNING", "GATEWAY_SERVER_DATA_DIR": data_dir}
    env.update(settings or {})
    if database_url:
        env["DATABASE_URL"] = database_url
    if workers:
        env["GATEWAY_SERVER_WORKERS"] = str(workers)
    gateway = GatewayProcess(env, log=os.devnull, root=root, wrapper=wrapper).wait(start_timeout)
    return gateway.proc, gateway.url


def start_reference(
    binary: str,
    upstream: str,
    home: str,
    database_url: str = "",
    *,
    wrapper: Sequence[str] = (),
    start_timeout: float = 60,
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ, HOME=home, AGENTIC_HOME=home)
    env.pop("DATABASE_URL", None)
    proc = subprocess.Popen(
        [
            *wrapper,
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
    wait_port(port, start_timeout)
    return proc, f"http://127.0.0.1:{port}"


# --- load --------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` and every process below it (server workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(times.get(p, 0.0) for p in tree)


async def one(
    client: aiohttp.ClientSession, base: str, body: dict[str, Any]
) -> tuple[float, dict[str, Any] | None]:
    """One request; raises :class:`Failed` unless it ended as a stored, completed response."""
    started = time.perf_counter()
    async with client.post(f"{base}/v1/responses", data=orjson.dumps(body), headers=_JSON) as r:
        raw = await r.read()
    latency = time.perf_counter() - started
    if body.get("stream"):
        if r.status != 200 or b"event: response.completed" not in raw:
            raise Failed(f"SSE {r.status}: {raw[-300:]!r}")
        return latency, None
    answer = orjson.loads(raw) if r.status == 200 else None
    if not isinstance(answer, dict) or answer.get("status") != "completed":
        raise Failed(f"JSON {r.status}: {raw[:300]!r}")
    return latency, answer


_JSON = {"content-type": "application/json"}


def _client(concurrency: int) -> aiohttp.ClientSession:
    """The load generator's client: aiohttp, whose per-request cost stays flat with the number of
    connections (httpx's pool, used before, held every gateway to ~100-140 req/s at c=64 on this
    machine: the client, not the servers, was the limit)."""
    connector = aiohttp.TCPConnector(limit=concurrency + 4, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))


class Failed(Exception):
    pass


async def load(
    base: str, body: dict[str, Any], concurrency: int, total: int, pid: int | None = None
) -> dict[str, Any]:
    """``total`` requests after a warm-up; ``cpu_ms``: the server's (``pid``'s tree) CPU per
    request over those ``total`` only, the warm-up left out."""
    latencies: list[float] = []
    failures: list[str] = []
    async with _client(concurrency) as client:
        for _ in range(2):  # warm-up, on every connection (so every server process warms up too)
            await asyncio.gather(
                *(one(client, base, body) for _ in range(concurrency)), return_exceptions=True
            )
        queue = list(range(total))

        async def worker() -> None:
            while queue:
                queue.pop()
                try:
                    latency, _ = await one(client, base, body)
                except Exception as exc:  # counted: a run with errors is a failing result
                    failures.append(f"{type(exc).__name__}: {exc}")
                else:
                    latencies.append(latency)

        cpu = cpu_seconds(pid) if pid is not None else 0.0
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu_ms = (cpu_seconds(pid) - cpu) * 1000 / total if pid is not None else float("nan")
    return {
        "rps": total / elapsed,
        "cpu_ms": cpu_ms,
        "p50_ms": statistics.median(latencies) * 1000 if latencies else float("nan"),
        "errors": len(failures),
        "first_error": failures[0] if failures else "",
    }


async def chain(base: str, turns: int, store_body: dict[str, Any]) -> tuple[list[float], int]:
    per_turn: list[float] = []
    errors = 0
    async with _client(1) as client:
        previous = None
        for turn in range(turns):
            body = dict(store_body, input=f"turn {turn}: tell me more")
            if previous:
                body["previous_response_id"] = previous
            try:
                latency, answer = await one(client, base, body)
            except Failed:
                errors += 1
                continue
            assert answer is not None
            previous = answer["id"]
            per_turn.append(latency * 1000)
    return per_turn, errors


def postgres_url(base: str, name: str) -> str:
    """A fresh, empty database ``name`` on the server of ``base`` (a PostgreSQL URL)."""
    import psycopg

    server = base.rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


def _medians(store: str, mode: str, concurrency: int, cell: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The median row of each target of one cell, with its req/s over the reference's, round by round."""
    reference = cell.get("reference")
    rows = []
    for name, runs in cell.items():
        rps = statistics.median(run["rps"] for run in runs)
        cpu = statistics.median(run["cpu_ms"] for run in runs)
        ratios = (
            [run["rps"] / ref["rps"] for run, ref in zip(runs, reference, strict=True)] if reference else []
        )
        by_round = " ".join(f"{ratio:.2f}" for ratio in ratios) or "-"
        median = f"{statistics.median(ratios):.2f}" if ratios else "-"
        rows.append(
            f"| {store} | {mode} | {concurrency} | {name} | {rps:.0f} | {cpu:.2f} | {by_round} | {median} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", default="/work/ref-venv/bin/agentic-server")
    parser.add_argument(
        "--postgres",
        default="postgres://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL server URL; fresh bench_* databases are created on it ('' : SQLite only)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument(
        "--requests",
        type=int,
        default=0,
        help="requests a cell after the warm-up (default 4000, a few seconds a cell: cells of under a "
        "second scattered by 20-30 %% from round to round on a 2-core machine)",
    )
    parser.add_argument("--concurrency", default="16,64", help="comma-separated levels")
    parser.add_argument("--chain-turns", type=int, default=50)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds a cell, the targets' order reversed every other round; more than one adds a "
        "table of medians",
    )
    parser.add_argument("--workers", type=int, default=0, help="our server processes (0: the default)")
    parser.add_argument("--modes", default="json,sse")
    parser.add_argument("--stores", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument(
        "--before",
        default="",
        help="another checkout of this gateway (an earlier commit), run side by side as 'before'",
    )
    parser.add_argument(
        "--before-workers", type=int, default=None, help="the 'before' server processes (default: --workers)"
    )
    parser.add_argument(
        "--db-prefix", default="bench", help="prefix of the PostgreSQL databases the run creates"
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    per_level = args.requests or (200 if args.quick else 4000)

    upstream = start_upstream()
    tmp = tempfile.mkdtemp(prefix="bench-responses-")
    reference = args.reference if args.reference and Path(args.reference).exists() else ""
    if not reference:
        print(f"(no reference at {args.reference!r}: ours only)")
    stores = [s for s in args.stores.split(",") if s == "sqlite" or (s == "postgres" and args.postgres)]
    total_errors = 0
    print("| store | mode | concurrency | target | req/s | p50 ms | CPU ms/req | errors |")
    print("|---|---|---|---|---|---|---|---|")
    chains: list[str] = []
    medians: list[str] = []
    for store in stores:
        procs: list[subprocess.Popen[Any]] = []
        targets: dict[str, tuple[str, int]] = {}
        try:
            db = args.db_prefix
            ours_db = postgres_url(args.postgres, f"{db}_gateway") if store == "postgres" else ""
            proc, url = start_gateway(upstream, ours_db, f"{tmp}/gw-{store}", args.workers)
            procs.append(proc)
            targets["gateway"] = (url, proc.pid)
            if args.before:
                before_db = postgres_url(args.postgres, f"{db}_before") if store == "postgres" else ""
                workers = args.workers if args.before_workers is None else args.before_workers
                proc, url = start_gateway(
                    upstream, before_db, f"{tmp}/before-{store}", workers, Path(args.before)
                )
                procs.append(proc)
                targets["before"] = (url, proc.pid)
            if reference:
                home = f"{tmp}/ref-{store}"
                os.makedirs(home, exist_ok=True)
                ref_db = postgres_url(args.postgres, f"{db}_reference") if store == "postgres" else ""
                ref_proc, url = start_reference(reference, upstream, home, ref_db)
                procs.append(ref_proc)
                targets["reference"] = (url, ref_proc.pid)
            for stream in [mode == "sse" for mode in args.modes.split(",")]:
                mode = "SSE" if stream else "JSON"
                body = {"model": "test-model", "input": "Hello there", "stream": stream, "store": True}
                for concurrency in levels:
                    cell: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
                    for round_ in range(args.rounds):
                        # Every other round in reverse: no target always runs first (or last).
                        order = list(targets.items())
                        for name, (base, pid) in order if round_ % 2 == 0 else order[::-1]:
                            stats = asyncio.run(load(base, body, concurrency, per_level, pid))
                            cell[name].append(stats)
                            total_errors += stats["errors"]
                            print(
                                f"| {store} | {mode} | {concurrency} | {name} | {stats['rps']:.0f} | "
                                f"{stats['p50_ms']:.1f} | {stats['cpu_ms']:.2f} | {stats['errors']} |",
                                flush=True,
                            )
                            if stats["errors"]:
                                print(f"  first error: {stats['first_error']}", flush=True)
                    if args.rounds > 1:
                        medians.extend(_medians(store, mode, concurrency, cell))
            for name, (base, _) in targets.items():
                per_turn, errors = asyncio.run(
                    chain(base, args.chain_turns, {"model": "test-model", "store": True})
                )
                total_errors += errors
                thirds = [per_turn[: len(per_turn) // 3], per_turn[-(len(per_turn) // 3) :]]
                means = [statistics.mean(t) if t else float("nan") for t in thirds]
                chains.append(f"| {store} | {name} | {means[0]:.1f} | {means[1]:.1f} | {errors} |")
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
    if medians:
        print()
        print(
            f"| store | mode | concurrency | target | median req/s ({args.rounds} rounds) | median CPU ms/req | "
            "/ reference by round | median |"
        )
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(medians))
    print()
    print(
        f"| store | target | chain first third mean ms | last third mean ms | errors ({args.chain_turns} turns) |"
    )
    print("|---|---|---|---|---|")
    print("\n".join(chains))
    print()
    print(f"total errors: {total_errors}" + ("  (a failing result)" if total_errors else ""))
    sys.exit(1 if total_errors else 0)


if __name__ == "__main__":
    main()
