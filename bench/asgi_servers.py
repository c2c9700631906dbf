"""daphne vs uvicorn (uvloop + httptools) on SSE and WebSocket, through the gateway's stack.

Both servers run the same ASGI app (the gateway middleware, Django and Channels, plus benchmark
routes) side by side; cells are interleaved so machine noise hits both alike.

    .venv/bin/python bench/asgi_servers.py [--seconds 3] [--concurrency 1,16,64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import free_port, wait_port  # noqa: E402

SERVERS = {
    "uvicorn": lambda port: [
        sys.executable,
        "-m",
        "uvicorn",
        "bench.server_app:application",
        "--port",
        str(port),
        "--loop",
        "uvloop",
        "--http",
        "httptools",
        "--log-level",
        "warning",
        "--no-access-log",
        "--lifespan",
        "off",
    ],
    "daphne": lambda port: [
        sys.executable,
        "-m",
        "daphne",
        "-p",
        str(port),
        "-v",
        "0",
        "bench.server_app:application",
    ],
}


async def sse_cell(url: str, concurrency: int, seconds: float) -> dict[str, float]:
    ttfb: list[float] = []
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            async with session.get(url) as resp:
                first = True
                async for _ in resp.content.iter_any():
                    if first:
                        ttfb.append(time.perf_counter() - t0)
                        first = False
            done += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {"streams/s": done / elapsed, "ttfb_p50_ms": statistics.median(ttfb) * 1000}


async def ws_cell(url: str, concurrency: int, seconds: float) -> dict[str, float]:
    rtts: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        async with session.ws_connect(url) as ws:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                await ws.send_str('{"type":"response.output_text.delta","delta":"tok"}')
                await ws.receive()
                rtts.append(time.perf_counter() - t0)

    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {"msgs/s": len(rtts) / elapsed, "rtt_p50_ms": statistics.median(rtts) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", default="1,16,64")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    env = dict(os.environ, GATEWAY_SERVER_DATA_DIR="/tmp/gateway-bench", LOG_LEVEL="WARNING")
    procs = {}
    ports = {}
    for name, cmd in SERVERS.items():
        ports[name] = free_port()
        procs[name] = subprocess.Popen(cmd(ports[name]), cwd=ROOT, env=env)
    try:
        for port in ports.values():
            wait_port(port)
        print(f"{'test':<6}{'conc':>5}  {'server':<8}{'rate':>12}{'p50 ms':>10}   ratio uvicorn/daphne")
        for c in levels:
            for kind in ("sse", "ws"):
                results = {}
                for name, port in ports.items():
                    if kind == "sse":
                        r = asyncio.run(
                            sse_cell(f"http://127.0.0.1:{port}/v1/bench/sse?n=50", c, args.seconds)
                        )
                        results[name] = (r["streams/s"], r["ttfb_p50_ms"])
                    else:
                        r = asyncio.run(ws_cell(f"ws://127.0.0.1:{port}/bench/ws", c, args.seconds))
                        results[name] = (r["msgs/s"], r["rtt_p50_ms"])
                for name, (rate, p50) in results.items():
                    ratio = results["uvicorn"][0] / results["daphne"][0] if name == "uvicorn" else ""
                    ratio_s = f"{ratio:.2f}x" if ratio else ""
                    print(f"{kind:<6}{c:>5}  {name:<8}{rate:>12.1f}{p50:>10.2f}   {ratio_s}")
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
