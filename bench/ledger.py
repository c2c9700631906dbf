"""Usage ledger bench: what accounting costs, with the ledger on and off side by side in one run.

Targets, alternated round by round: ``direct`` (the client straight to the upstream), ``on`` (our
gateway as ``make run`` starts it: a ledger row per model call), ``off`` (the same with
``GATEWAY_USAGE_LEDGER=false``) and ``reference`` (``agentic-api`` 0.9.0). Ours run one server
process each, so their CPU per request compares process for process. One upstream serves them all:
``bench/realistic.py``'s paced upstream (vLLM's formats; ``--interval-ms`` between tokens, so a
stream arrives in chunks as from vLLM).

Cells: pass-through ``/v1/chat/completions`` JSON and SSE with ``stream_options.include_usage``
(``bench/passthrough.py``'s keep-alive client and cells), and stored Responses SSE
(``bench/responses.py``'s load, every answer a stored, completed response). Per cell, the median
round's req/s, p50 latency and server CPU per request (the server's process tree, from ``/proc``),
then on over off. After each store, the ``on`` database must hold rows and the ``off`` one none. Any
error fails the run (exit 1).

    .venv/bin/python bench/ledger.py [--reference /work/ref-venv/bin/agentic-server]
        [--stores sqlite,postgres] [--postgres postgres://postgres@127.0.0.1:5432/postgres]
        [--rounds 3] [--seconds 1.5] [--requests 400] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.passthrough import PIDS, run_cell  # noqa: E402
from bench.realistic import Upstream  # noqa: E402
from bench.responses import load, postgres_url, start_gateway, start_reference  # noqa: E402
from tests.upstream import MODEL  # noqa: E402

CELLS = [("pass-through", "JSON"), ("pass-through", "SSE"), ("Responses", "SSE")]
MESSAGES = [{"role": "user", "content": "Hello"}]


def chat_request(port: int, stream: bool) -> bytes:
    body: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 16}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    raw = orjson.dumps(body)
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (port, len(raw), raw)
    )


def measure(part: str, mode: str, url: str, pid: int | None, args: argparse.Namespace) -> dict[str, Any]:
    """One cell of one target: req/s, p50 ms, server CPU µs a request (nan: not a server we started)."""
    port = int(url.rsplit(":", 1)[1])
    if part == "pass-through":
        if pid is not None:
            PIDS[port] = pid
        stream = mode == "SSE"
        cell = uvloop.run(
            run_cell(port, stream, args.concurrency, args.seconds, args.warmup, chat_request(port, stream))
        )
        errors = cell.errors + (0 if cell.latencies else 1)
        return {"rps": cell.rps, "p50": cell.pct(cell.latencies, 0.5), "cpu": cell.cpu_us, "errors": errors}
    body = {"model": MODEL, "input": "Hello there", "stream": True, "store": True}
    stats = asyncio.run(load(url, body, args.concurrency, args.requests, pid))
    if stats["errors"]:
        print(f"  first error: {stats['first_error']}", flush=True)
    return {
        "rps": stats["rps"],
        "p50": stats["p50_ms"],
        "cpu": stats["cpu_ms"] * 1000,
        "errors": stats["errors"],
    }


def ledger_rows(database_url: str, data_dir: str) -> int:
    """Rows in a gateway's ledger (its PostgreSQL database, or the SQLite file in its data dir)."""
    query = "SELECT count(*) FROM usage_app_usagerecord"
    if database_url:
        import psycopg

        with psycopg.connect(database_url) as conn:
            row = conn.execute(query).fetchone()
    else:
        with sqlite3.connect(f"{data_dir}/gateway.sqlite3") as conn:
            row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def run_store(
    store: str, upstream: Upstream, tmp: str, args: argparse.Namespace
) -> tuple[dict[tuple[str, str, str], list[dict[str, Any]]], int]:
    """Every round of every cell on one store; the results by (part, mode, target), and the errors."""
    procs: list[subprocess.Popen[Any]] = []
    targets: dict[str, tuple[str, int | None]] = {"direct": (upstream.url, None)}
    databases: dict[str, tuple[str, str]] = {}
    errors = 0
    try:
        for name, ledger in (("on", "true"), ("off", "false")):
            db = postgres_url(args.postgres, f"{args.db_prefix}_{name}") if store == "postgres" else ""
            data_dir = f"{tmp}/{store}-{name}"
            proc, url = start_gateway(
                upstream.url, db, data_dir, workers=1, settings={"GATEWAY_USAGE_LEDGER": ledger}
            )
            procs.append(proc)
            targets[name] = (url, proc.pid)
            databases[name] = (db, data_dir)
        if args.reference:
            home = f"{tmp}/ref-{store}"
            Path(home).mkdir()
            db = postgres_url(args.postgres, f"{args.db_prefix}_reference") if store == "postgres" else ""
            ref_proc, url = start_reference(args.reference, upstream.url, home, db)
            procs.append(ref_proc)
            targets["reference"] = (url, ref_proc.pid)
        results: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        names = list(targets)
        for round_ in range(args.rounds):
            # direct first, the others rotated every round: none always runs right after another
            shift = round_ % (len(names) - 1)
            order = names[:1] + names[1:][shift:] + names[1:][:shift]
            for part, mode in CELLS:
                for name in order:
                    url, pid = targets[name]
                    cell = measure(part, mode, url, pid, args)
                    results.setdefault((part, mode, name), []).append(cell)
                    errors += cell["errors"]
                    print(
                        f"{store} round {round_ + 1} {part:12} {mode:4} {name:9} {cell['rps']:7.0f} req/s "
                        f"p50 {cell['p50']:6.2f} ms cpu {cell['cpu']:7.1f} µs/req errors {cell['errors']}",
                        flush=True,
                    )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    # The servers are stopped (the writer flushed at shutdown): the switch did what it says.
    on, off = ledger_rows(*databases["on"]), ledger_rows(*databases["off"])
    print(f"{store}: ledger rows with the ledger on {on}, off {off}", flush=True)
    if on == 0 or off != 0:
        errors += 1
    return results, errors


def report(
    store: str, results: dict[tuple[str, str, str], list[dict[str, Any]]]
) -> tuple[list[str], list[str]]:
    """Rows per cell and target (medians over rounds), and a row per cell of on against off."""
    lines, ratios = [], []
    for part, mode in CELLS:
        cell = {
            name: {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "cpu")}
            for (p, m, name), runs in results.items()
            if (p, m) == (part, mode)
        }
        direct, ref, on, off = cell["direct"], cell.get("reference"), cell["on"], cell["off"]
        for name, c in cell.items():
            cpu = f"{c['cpu']:.0f}" if name != "direct" else "-"
            vs_ref = f"{c['cpu'] / ref['cpu']:.2f}" if ref and name in ("on", "off") else "-"
            lines.append(
                f"| {store} | {part} | {mode} | {name} | {c['rps']:.0f} | {c['rps'] / direct['rps']:.2f} | "
                f"{c['p50']:.2f} | {c['p50'] - direct['p50']:+.2f} | {cpu} | {vs_ref} |"
            )
        ratios.append(
            f"| {store} | {part} | {mode} | {on['cpu']:.0f} / {off['cpu']:.0f} | {on['cpu'] - off['cpu']:+.0f} | "
            f"{on['cpu'] / off['cpu']:.2f} | {on['p50']:.2f} / {off['p50']:.2f} | {on['rps'] / off['rps']:.2f} |"
        )
    return lines, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", default="/work/ref-venv/bin/agentic-server")
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--stores", default="sqlite", help="comma-separated: sqlite, postgres")
    parser.add_argument("--db-prefix", default="bench_ledger")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=1.5, help="a pass-through cell, after its warm-up")
    parser.add_argument("--warmup", type=float, default=0.3)
    parser.add_argument("--requests", type=int, default=400, help="a Responses cell, after its warm-up")
    parser.add_argument("--tokens", type=int, default=16, help="tokens an answer")
    parser.add_argument("--first-ms", type=float, default=0.0, help="the upstream's wait for the first token")
    parser.add_argument("--interval-ms", type=float, default=2.0, help="the upstream's time between tokens")
    args = parser.parse_args()
    if args.reference and not Path(args.reference).exists():
        print(f"(no reference at {args.reference!r}: ours and direct only)")
        args.reference = ""
    upstream = Upstream(1, args)
    tmp = tempfile.mkdtemp(prefix="bench-ledger-")
    lines: list[str] = []
    ratios: list[str] = []
    errors = 0
    for store in args.stores.split(","):
        results, store_errors = run_store(store, upstream, tmp, args)
        errors += store_errors
        store_lines, store_ratios = report(store, results)
        lines += store_lines
        ratios += store_ratios
    print(
        f"\nc={args.concurrency}, medians of {args.rounds} rounds, {args.tokens} tokens every "
        f"{args.interval_ms:g} ms; one server process each; CPU: the server's, µs a request"
    )
    print(
        "| store | path | mode | target | req/s | ÷ direct | p50 ms | p50 - direct ms | CPU µs/req | CPU ÷ reference |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    print("\nThe ledger on against off:")
    print(
        "| store | path | mode | CPU µs/req on / off | on - off | on ÷ off | p50 ms on / off | req/s on ÷ off |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(ratios))
    print(f"\ntotal errors: {errors}" + ("  (a failing result)" if errors else ""))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
