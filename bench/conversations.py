"""Conversations bench: page through a 10,000-item conversation and append turns to it.

Starts the real gateway (``manage.py serve``, as ``make run`` does) on the given database, seeds
one conversation of ``--items`` items through the API (20 per request, as clients must) and one of
200 items (so its pages are full too), then times over HTTP:

- listing every page of the big conversation (``limit=100``, both orders, following ``last_id``),
- single pages at the head, the middle (``after`` an item in the middle) and the tail,
- appending a turn (``POST …/items`` with a user message and an assistant reply),

and reports each against the same call on the 200-item conversation: a ratio near 1 means the
cost does not grow with the conversation (keyset pagination on (conversation, position), no
count, no scan). Usage::

    .venv/bin/python bench/conversations.py --database-url postgres://postgres@127.0.0.1:5432/bench_conv
    .venv/bin/python bench/conversations.py            # SQLite in a temporary data dir

``--before DIR`` instead compares this checkout's gateway with the gateway of another checkout
(``git worktree add DIR <commit>``) in one run: both serve SQLite side by side, each seeded with
one ``--compare-items`` conversation through the API, and the same calls (retrieve the
conversation; a page of ``limit=100`` after its 50th item) go to one and then the other, in
rounds, ``c`` clients at once (one keep-alive connection each, a light uvloop client). It
reports p50 latency, requests/s and the server process's CPU time per request (``/proc``, which
the machine's other load disturbs far less than latency) of each, and after/before::

    git worktree add /tmp/before <commit> && ln -s "$PWD/.venv" /tmp/before/.venv
    .venv/bin/python bench/conversations.py --before /tmp/before [--rounds 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.passthrough import PIDS, CellResult, run_cell  # noqa: E402
from tests.servers import GatewayProcess  # noqa: E402


class Gateway(GatewayProcess):
    """``manage.py serve`` in a subprocess, its log in a file (a pipe nobody reads would fill)."""

    def __init__(self, env: dict[str, str], log: Path, root: Path = ROOT) -> None:
        super().__init__(env, log=log, root=root)
        self.wait(60)


SMALL = 200


def write_json(path: Path | None, results: dict[str, Any]) -> None:
    """``--json``: the results, for comparing runs."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2))


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 2),
        "n": len(ordered),
    }


def message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}


def seed(http: httpx.Client, count: int) -> tuple[str, list[str]]:
    r = http.post("/v1/conversations", json={"items": [message("user", "item 0")]})
    r.raise_for_status()
    conversation_id = r.json()["id"]
    for start in range(1, count, 20):
        batch = [
            message("user" if i % 2 else "assistant", f"item {i}")
            for i in range(start, min(count, start + 20))
        ]
        http.post(f"/v1/conversations/{conversation_id}/items", json={"items": batch}).raise_for_status()
    ids: list[str] = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 100, "order": "asc"}
        if after:
            params["after"] = after
        page = http.get(f"/v1/conversations/{conversation_id}/items", params=params).json()
        ids += [item["id"] for item in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert len(ids) == count, (len(ids), count)
    return conversation_id, ids


def concurrent(base: str, path: str, params: dict[str, Any], clients: int, repeat: int) -> dict[str, Any]:
    """``clients`` clients (one connection each) sending ``repeat`` GETs each, all at once."""
    samples: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def client() -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
            http.get(path, params=params).raise_for_status()  # connect and warm up
            start.wait()
            mine = timed(lambda: http.get(path, params=params).raise_for_status(), repeat)
        with lock:
            samples.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return {"clients": clients, **summary(samples), "rps": round(len(samples) / elapsed, 1)}


def walk(http: httpx.Client, conversation_id: str, order: str) -> list[float]:
    """Every page, following ``last_id``; returns per-page latencies."""
    samples, after = [], None
    while True:
        params: dict[str, Any] = {"limit": 100, "order": order}
        if after:
            params["after"] = after
        started = time.perf_counter()
        page = http.get(f"/v1/conversations/{conversation_id}/items", params=params).json()
        samples.append((time.perf_counter() - started) * 1000)
        if not page["has_more"]:
            return samples
        after = page["last_id"]


def compare(args: argparse.Namespace) -> None:
    """This checkout's gateway ("after") against ``args.before``'s, interleaved (module docstring)."""
    data_dir = Path(tempfile.mkdtemp(prefix="bench-conv-"))
    gateways: dict[str, Gateway] = {}
    calls: dict[str, dict[str, bytes]] = {}
    try:
        for name, root in (("before", Path(args.before).resolve()), ("after", ROOT)):
            (data_dir / name).mkdir()
            env = {
                "GATEWAY_SERVER_DATA_DIR": str(data_dir / name),
                "GATEWAY_SERVER_WORKERS": "1",
                "LOG_LEVEL": "WARNING",
            }
            gateway = gateways[name] = Gateway(env, data_dir / name / "gateway.log", root=root)
            PIDS[gateway.port] = gateway.proc.pid
            with httpx.Client(base_url=gateway.url, timeout=60) as http:
                conversation_id, ids = seed(http, args.compare_items)
            after = ids[min(50, len(ids) - 1)]
            calls[name] = {
                "retrieve": f"/v1/conversations/{conversation_id}",
                "page": f"/v1/conversations/{conversation_id}/items?limit=100&order=asc&after={after}",
            }
        concurrencies = [int(n) for n in args.concurrency.split(",") if n]
        cells: dict[tuple[str, int, str], list[CellResult]] = {}
        for round_no in range(args.rounds):
            for c in concurrencies:
                for call in ("retrieve", "page"):
                    # Alternate which goes first, so drift in the machine's load hits both alike.
                    order = ("before", "after") if round_no % 2 == 0 else ("after", "before")
                    for name in order:
                        gateway = gateways[name]
                        raw = f"GET {calls[name][call]} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
                        cell = asyncio.run(run_cell(gateway.port, False, c, args.seconds, args.warmup, raw))
                        if cell.errors:
                            raise RuntimeError(f"{name} {call} c={c}: {cell.errors} failed requests")
                        cells.setdefault((call, c, name), []).append(cell)
    finally:
        for gateway in gateways.values():
            gateway.stop()

    def merged(parts: list[CellResult]) -> dict[str, float]:
        latencies = sorted(x for part in parts for x in part.latencies)
        seconds = sum(part.seconds for part in parts)
        answered = sum(part.answered for part in parts)
        return {
            "p50_ms": round(statistics.median(latencies) * 1000, 2),
            "rps": round(len(latencies) / seconds, 1),
            "cpu_ms": round(sum(part.cpu for part in parts) / answered * 1000, 2),
        }

    results: dict[str, Any] = {"before": str(args.before), "items": args.compare_items, "rounds": args.rounds}
    print(f"\n## Conversations before/after ({args.before} vs this checkout, SQLite, {args.rounds} rounds)\n")
    print(
        "| call | before p50 ms | after p50 ms | after/before | before req/s | after req/s "
        "| before CPU ms/req | after CPU ms/req |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for c in concurrencies:
        for call in ("retrieve", "page"):
            b, a = merged(cells[(call, c, "before")]), merged(cells[(call, c, "after")])
            results[f"{call} c={c}"] = {"before": b, "after": a}
            print(
                f"| {call} c={c} | {b['p50_ms']} | {a['p50_ms']} | {a['p50_ms'] / b['p50_ms']:.2f} "
                f"| {b['rps']} | {a['rps']} | {b['cpu_ms']} | {a['cpu_ms']} |"
            )
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    write_json(args.json, results)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default="", help="PostgreSQL URL; empty: SQLite")
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--concurrency",
        default="1,16",
        help="comma-separated client counts for the concurrent rows (page and retrieve, c clients at once)",
    )
    parser.add_argument(
        "--no-analyze",
        action="store_true",
        help="skip ANALYZE after seeding (PostgreSQL's autovacuum would run it; stale statistics "
        "make the planner read the whole conversation's index range and sort it)",
    )
    parser.add_argument(
        "--before",
        default="",
        help="a checkout of an earlier commit: compare its gateway with this one's (module docstring)",
    )
    parser.add_argument("--compare-items", type=int, default=400, help="with --before: items seeded")
    parser.add_argument("--rounds", type=int, default=3, help="with --before: rounds of every call")
    parser.add_argument("--seconds", type=float, default=3.0, help="with --before: seconds per call")
    parser.add_argument("--warmup", type=float, default=0.5, help="with --before: unmeasured seconds")
    args = parser.parse_args()
    if args.before:
        if args.database_url:
            parser.error("--before compares on SQLite (each gateway its own database)")
        compare(args)
        return

    data_dir = tempfile.mkdtemp(prefix="bench-conv-")
    env = {"GATEWAY_SERVER_DATA_DIR": data_dir, "LOG_LEVEL": "WARNING"}
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OIDC_")) and k != "DATABASE_URL"
    }
    full_env = {**inherited, **env}  # for `manage.py shell` below; the gateway filters its own
    gateway = Gateway(env, Path(data_dir) / "gateway.log")  # migrates first, as `make run` does
    try:
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            started = time.perf_counter()
            big, big_ids = seed(http, args.items)
            seed_s = time.perf_counter() - started
            small, small_ids = seed(http, SMALL)
            if not args.no_analyze:
                analyze = "from django.db import connection; connection.cursor().execute('ANALYZE')"
                subprocess.run(
                    [sys.executable, "manage.py", "shell", "-c", analyze], cwd=ROOT, env=full_env, check=True
                )
            results: dict[str, Any] = {
                "database": "postgresql" if args.database_url else "sqlite",
                "items": args.items,
                "seed_s": round(seed_s, 1),
                "analyzed": not args.no_analyze,
            }

            def page(conversation_id: str, **params: Any) -> Callable[[], Any]:
                return lambda: http.get(
                    f"/v1/conversations/{conversation_id}/items", params=params
                ).raise_for_status()

            rows = {
                "first page (desc, limit=100)": (page(big, limit=100), page(small, limit=100)),
                "middle page (after, asc, limit=100)": (
                    page(big, limit=100, order="asc", after=big_ids[len(big_ids) // 2]),
                    page(small, limit=100, order="asc", after=small_ids[len(small_ids) // 2]),
                ),
                "last page (after, asc, limit=100)": (
                    page(big, limit=100, order="asc", after=big_ids[-101]),
                    page(small, limit=100, order="asc", after=small_ids[-101]),
                ),
                "retrieve conversation": (
                    lambda: http.get(f"/v1/conversations/{big}").raise_for_status(),
                    lambda: http.get(f"/v1/conversations/{small}").raise_for_status(),
                ),
            }
            counter = iter(range(10**9))

            def append(conversation_id: str) -> Callable[[], Any]:
                def run() -> None:
                    n = next(counter)
                    http.post(
                        f"/v1/conversations/{conversation_id}/items",
                        json={"items": [message("user", f"q{n}"), message("assistant", f"a{n}")]},
                    ).raise_for_status()

                return run

            rows["append a turn (2 items)"] = (append(big), append(small))
            for name, (big_call, small_call) in rows.items():
                timed(big_call, 3)  # warm up
                timed(small_call, 3)
                # Alternate the two so that load from other processes hits both alike.
                big_samples: list[float] = []
                small_samples: list[float] = []
                for _ in range(args.repeat):
                    big_samples += timed(big_call, 1)
                    small_samples += timed(small_call, 1)
                b, s = summary(big_samples), summary(small_samples)
                results[name] = {"big": b, "small": s, "ratio_p50": round(b["p50_ms"] / s["p50_ms"], 2)}
            for c in [int(n) for n in args.concurrency.split(",") if n]:
                for name, path, params in (
                    (
                        "page",
                        f"/v1/conversations/{big}/items",
                        {"limit": 100, "order": "asc", "after": big_ids[len(big_ids) // 2]},
                    ),
                    ("retrieve", f"/v1/conversations/{big}", {}),
                ):
                    results[f"{name} at c={c}"] = concurrent(gateway.url, path, params, c, args.repeat)
            for order in ("asc", "desc"):
                started = time.perf_counter()
                samples = walk(http, big, order)
                total = time.perf_counter() - started
                results[f"walk all pages ({order})"] = {
                    "pages": len(samples),
                    "total_s": round(total, 2),
                    **summary(samples),
                }
    finally:
        gateway.stop()

    analyzed = "after ANALYZE" if results["analyzed"] else "without ANALYZE"
    print(f"\n## Conversations bench ({results['database']}, {results['items']} items, {analyzed})\n")
    print(
        f"| operation | {results['items']} items p50 / p95 (ms) | {SMALL} items p50 / p95 (ms) | ratio p50 |"
    )
    print("|---|---|---|---|")
    for name, row in results.items():
        if isinstance(row, dict) and "big" in row:
            b, s = row["big"], row["small"]
            print(
                f"| {name} | {b['p50_ms']} / {b['p95_ms']} | {s['p50_ms']} / {s['p95_ms']} | {row['ratio_p50']} |"
            )
    print("\n| concurrent | clients | p50 / p95 (ms) | requests/s |")
    print("|---|---|---|---|")
    for name, row in results.items():
        if isinstance(row, dict) and "rps" in row:
            print(f"| {name} | {row['clients']} | {row['p50_ms']} / {row['p95_ms']} | {row['rps']} |")
    for order in ("asc", "desc"):
        row = results[f"walk all pages ({order})"]
        print(
            f"| walk all {row['pages']} pages ({order}) | per page {row['p50_ms']} / {row['p95_ms']}, "
            f"total {row['total_s']} s | | |"
        )
    print(f"\nseeding {results['items']} items through the API (20 per request): {results['seed_s']} s")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
