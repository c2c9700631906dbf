"""WebSocket benchmark: this gateway vs the reference gateway (agentic-api 0.9.0) on WS /v1/responses.

Both talk to the same scripted upstream (vLLM's /v1/responses SSE format, instant answers), so the
figures are the gateways' own overhead:

* one connection with 16 lanes (``stream_id``), each lane sending ``--turns`` store:false requests
  back to back, each continuing the previous one (``previous_response_id``, connection-local state);
* 200 concurrent connections, each sending ``--turns`` requests on its default lane;
* gateway memory per idle connection (RSS growth with 500 open, idle connections).

Time to first delta = from sending ``response.create`` to the first ``response.output_text.delta``.

    .venv/bin/python bench/websocket.py [--reference /work/ref-venv/bin/agentic-server] [--turns 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.responses import start_gateway, start_reference, start_upstream  # noqa: E402


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _create(stream_id: str | None, previous: str | None) -> str:
    body: dict[str, Any] = {
        "type": "response.create",
        "model": "test-model",
        "input": "Tell me about the fox.",
        "store": False,
    }
    if stream_id is not None:
        body["stream_id"] = stream_id
    if previous is not None:
        body["previous_response_id"] = previous
    return orjson.dumps(body).decode()


class Mux:
    """Demultiplexes one connection's events by stream_id."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.queues: dict[str | None, asyncio.Queue[dict[str, Any]]] = {}
        self.reader = asyncio.create_task(self._read())

    def queue(self, stream_id: str | None) -> asyncio.Queue[dict[str, Any]]:
        return self.queues.setdefault(stream_id, asyncio.Queue())

    async def _read(self) -> None:
        async for raw in self.ws:
            event = orjson.loads(raw)
            self.queue(event.get("stream_id")).put_nowait(event)


async def _turns(mux: Mux, stream_id: str | None, turns: int, chain: bool, ttfd: list[float]) -> int:
    previous = None
    done = 0
    queue = mux.queue(stream_id)
    for _ in range(turns):
        started = time.perf_counter()
        await mux.ws.send(_create(stream_id, previous if chain else None))
        first = True
        while True:
            event = await queue.get()
            kind = event["type"]
            if kind == "response.output_text.delta" and first:
                ttfd.append((time.perf_counter() - started) * 1000)
                first = False
            elif kind in ("response.completed", "response.failed", "error"):
                if kind != "response.completed":
                    raise RuntimeError(f"request failed: {event}")
                previous = event["response"]["id"]
                done += 1
                break
    return done


def _summary(label: str, ttfd: list[float], done: int, elapsed: float) -> dict[str, Any]:
    ordered = sorted(ttfd)
    return {
        "scenario": label,
        "responses/s": done / elapsed,
        "ttfd p50 ms": statistics.median(ordered),
        "ttfd p95 ms": ordered[int(len(ordered) * 0.95) - 1],
    }


async def lanes16(url: str, turns: int) -> dict[str, Any]:
    ttfd: list[float] = []
    async with websockets.connect(url, max_size=None) as ws:
        mux = Mux(ws)
        started = time.perf_counter()
        counts = await asyncio.gather(*(_turns(mux, f"lane-{i}", turns, True, ttfd) for i in range(16)))
        elapsed = time.perf_counter() - started
        mux.reader.cancel()
    return _summary("1 connection x 16 lanes", ttfd, sum(counts), elapsed)


async def connections200(url: str, turns: int) -> dict[str, Any]:
    ttfd: list[float] = []
    conns = [await websockets.connect(url, max_size=None) for _ in range(200)]
    muxes = [Mux(ws) for ws in conns]
    started = time.perf_counter()
    counts = await asyncio.gather(*(_turns(m, None, turns, True, ttfd) for m in muxes))
    elapsed = time.perf_counter() - started
    for mux, ws in zip(muxes, conns, strict=True):
        mux.reader.cancel()
        await ws.close()
    return _summary("200 connections", ttfd, sum(counts), elapsed)


async def idle_memory(url: str, pid: int, count: int = 500) -> float:
    await asyncio.sleep(0.5)
    before = _rss_kib(pid)
    conns = [await websockets.connect(url, max_size=None) for _ in range(count)]
    await asyncio.sleep(1.0)
    after = _rss_kib(pid)
    for ws in conns:
        await ws.close()
    return (after - before) / count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", default="/work/ref-venv/bin/agentic-server")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()

    upstream = start_upstream()
    rows: list[tuple[str, dict[str, Any]]] = []
    memory: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        targets = []
        gateway, gateway_url = start_gateway(upstream, args.database_url, tmp)
        targets.append(("gateway", gateway, gateway_url))
        if Path(args.reference).exists():
            reference, reference_url = start_reference(args.reference, upstream, tmp)
            targets.append(("reference", reference, reference_url))
        try:
            for name, proc, base in targets:
                url = base.replace("http://", "ws://") + "/v1/responses"
                asyncio.run(lanes16(url, 2))  # warm-up
                rows.append((name, asyncio.run(lanes16(url, args.turns))))
                rows.append((name, asyncio.run(connections200(url, args.turns))))
                memory[name] = asyncio.run(idle_memory(url, proc.pid))
        finally:
            for _, proc, _ in targets:
                proc.terminate()
                proc.wait(10)
    print("| scenario | target | responses/s | TTFD p50 (ms) | TTFD p95 (ms) |")
    print("|---|---|---|---|---|")
    for name, row in sorted(rows, key=lambda r: (r[1]["scenario"], r[0])):
        print(
            f"| {row['scenario']} | {name} | {row['responses/s']:.0f} | "
            f"{row['ttfd p50 ms']:.1f} | {row['ttfd p95 ms']:.1f} |"
        )
    print()
    for name, kib in memory.items():
        print(f"idle connection memory, {name}: {kib:.1f} KiB per connection (RSS growth, 500 connections)")


if __name__ == "__main__":
    main()
