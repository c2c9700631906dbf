"""Quotas bench: exactness across two gateway processes, and what admission costs per request.

Starts ``bench/fast_upstream.py`` and, for each store (the database: SQLite, or PostgreSQL when
``DATABASE_URL`` names it; then Redis at ``--redis``):

1. Exactness: two ``manage.py serve`` processes sharing the store, ``[quotas] requests_per_minute``
   = ``--limit``; ``--clients`` concurrent clients alternate between them for ``--seconds``. Prints
   the admitted requests (must equal the limit), the 429s and whether each carried ``retry-after``
   and the ``x-ratelimit-*`` headers, and server errors (must be 0).
2. Cost: one gateway without quotas, one with a requests-per-minute limit nobody reaches (every
   request admitted through the store: one step) and one with a concurrency limit as well (two:
   the admission and the slot's release), measured in interleaved rounds; prints requests/s,
   p50/p99 latency and the server's CPU time per request (from ``/proc``), against off.

    .venv/bin/python bench/quotas.py [--seconds 10] [--clients 64] [--limit 600]
        [--cost-seconds 3] [--rounds 3] [--redis redis://127.0.0.1:6379/5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.passthrough import wait_http  # noqa: E402
from bench.responses import cpu_seconds  # noqa: E402
from tests.servers import GatewayProcess, free_port  # noqa: E402

BODY = b'{"model":"bench-model","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'
HEADERS = {"content-type": "application/json"}
RATE_HEADERS = ("retry-after", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests")


@dataclass
class Tally:
    admitted: int = 0
    refused: int = 0
    refused_with_headers: int = 0
    server_errors: int = 0
    other: int = 0
    latencies: list[float] = field(default_factory=list)

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


async def load(urls: list[str], clients: int, seconds: float) -> Tally:
    """``clients`` loops posting chat completions for ``seconds``, alternating between ``urls``."""
    tally = Tally()
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client(i: int) -> None:
            url = urls[i % len(urls)] + "/v1/chat/completions"
            while time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    async with session.post(url, data=BODY, headers=HEADERS) as answer:
                        await answer.read()
                        status, headers = answer.status, answer.headers
                except aiohttp.ClientError:
                    tally.server_errors += 1
                    continue
                tally.latencies.append(time.perf_counter() - started)
                if status == 200:
                    tally.admitted += 1
                elif status == 429:
                    tally.refused += 1
                    if all(name in headers for name in RATE_HEADERS):
                        tally.refused_with_headers += 1
                elif status >= 500:
                    tally.server_errors += 1
                else:
                    tally.other += 1

        await asyncio.gather(*(client(i) for i in range(clients)))
    return tally


def gateway(env: dict[str, str], *, migrate: bool = True) -> GatewayProcess:
    process = GatewayProcess(env, migrate=migrate, log=os.devnull)
    wait_http(process.port)
    return process


def exactness(args: argparse.Namespace, upstream: str, store: str, tmp: Path) -> Tally:
    env = {
        "LLM_API_BASE": upstream,
        "LOG_LEVEL": "WARNING",
        "GATEWAY_SERVER_WORKERS": "1",
        "GATEWAY_SERVER_DATA_DIR": str(tmp / f"exact-{store}"),
        "GATEWAY_QUOTAS_REQUESTS_PER_MINUTE": str(args.limit),
    }
    if os.environ.get("DATABASE_URL"):
        env["DATABASE_URL"] = os.environ["DATABASE_URL"]
    if store == "redis":
        redis.Redis.from_url(args.redis).flushdb()
        env["REDIS_URL"] = args.redis
    first = gateway(env)
    second = gateway(env, migrate=False)  # the same database
    try:
        return asyncio.run(load([first.url, second.url], args.clients, args.seconds))
    finally:
        first.stop()
        second.stop()


def cost(args: argparse.Namespace, upstream: str, store: str, tmp: Path) -> dict[str, tuple[Tally, float]]:
    base = {
        "LLM_API_BASE": upstream,
        "LOG_LEVEL": "WARNING",
        "GATEWAY_SERVER_WORKERS": "1",
    }
    if os.environ.get("DATABASE_URL"):
        base["DATABASE_URL"] = os.environ["DATABASE_URL"]
    # Limits nobody reaches: every request goes through the store. "rpm": one step per request
    # (the admission); "rpm+slots": two (the admission, and the slot's release at the end).
    rpm = {**base, "GATEWAY_QUOTAS_REQUESTS_PER_MINUTE": "1000000000"}
    if store == "redis":
        redis.Redis.from_url(args.redis).flushdb()
        rpm["REDIS_URL"] = args.redis
    slots = {**rpm, "GATEWAY_QUOTAS_MAX_CONCURRENT_REQUESTS": "100000"}
    servers = {
        name: gateway({**env, "GATEWAY_SERVER_DATA_DIR": str(tmp / f"{name}-{store}")})
        for name, env in (("off", base), ("rpm", rpm), ("rpm+slots", slots))
    }
    best: dict[str, tuple[Tally, float]] = {}
    try:
        for _ in range(args.rounds):
            for name, server in servers.items():
                before = cpu_seconds(server.proc.pid)
                tally = asyncio.run(load([server.url], args.cost_clients, args.cost_seconds))
                cpu = (cpu_seconds(server.proc.pid) - before) / max(1, tally.admitted)
                if tally.server_errors or tally.refused or tally.other:
                    print(
                        f"  {store} {name}: {tally.server_errors} errors, {tally.refused} refused (a failing result)"
                    )
                if name not in best or tally.admitted > best[name][0].admitted:
                    best[name] = (tally, cpu)
    finally:
        for server in servers.values():
            server.stop()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--limit", type=int, default=600)
    parser.add_argument("--cost-seconds", type=float, default=3.0)
    parser.add_argument("--cost-clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--stores", default="database,redis")
    args = parser.parse_args()

    up_port = free_port()
    upstream_proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "fast_upstream.py"), "--port", str(up_port)]
    )
    upstream = f"http://127.0.0.1:{up_port}"
    wait_http(up_port)
    database = "PostgreSQL" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "SQLite"
    rows: list[str] = []
    costs: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-quotas-") as tmp_name:
            tmp = Path(tmp_name)
            for store in args.stores.split(","):
                label = f"{store} ({database})" if store == "database" else store
                t = exactness(args, upstream, store, tmp)
                verdict = "exact" if t.admitted == args.limit and t.server_errors == 0 else "FAILING"
                rows.append(
                    f"| {label} | {args.limit} | {t.admitted} | {t.refused} | {t.refused_with_headers} "
                    f"| {t.server_errors} | {t.other} | {verdict} |"
                )
                best = cost(args, upstream, store, tmp)
                off, off_cpu = best["off"]
                off_rps = off.admitted / args.cost_seconds
                for name in ("rpm", "rpm+slots"):
                    on, on_cpu = best[name]
                    on_rps = on.admitted / args.cost_seconds
                    costs.append(
                        f"| {label} | {name} | {off_rps:.0f} | {on_rps:.0f} | {on_rps / off_rps:.2f} "
                        f"| {off.pct(0.5):.2f} | {on.pct(0.5):.2f} | {on.pct(0.5) - off.pct(0.5):+.2f} "
                        f"| {on.pct(0.99):.2f} | {off_cpu * 1e6:.0f} | {on_cpu * 1e6:.0f} "
                        f"| {(on_cpu - off_cpu) * 1e6:+.0f} |"
                    )
    finally:
        upstream_proc.terminate()
        upstream_proc.wait()
    print(
        f"\nExactness: two gateway processes, {args.clients} clients, {args.seconds:g} s, "
        f"{args.limit} requests/min"
    )
    print("| store | limit | admitted | 429 | 429 with headers | server errors | other | |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nAdmission cost: one gateway process, {args.cost_clients} clients, best of {args.rounds} rounds")
    print(
        "| store | limits | req/s off | req/s on | ratio | p50 ms off | p50 ms on | p50 added | p99 ms on "
        "| CPU µs/req off | CPU µs/req on | CPU added |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(costs))


if __name__ == "__main__":
    main()
