"""Upstream failover under load: two paced streaming upstreams, one killed mid-load.

Starts two ``bench/fast_upstream.py`` processes (paced SSE: ``--tokens`` tokens, ``--token-delay-ms``
apart) and our gateway in front of both (``manage.py serve`` as ``make run`` runs it, with
``LLM_API_BASE`` listing the two), then runs ``--clients`` concurrent clients, each sending
streamed chat completions one after another for ``--seconds``. At ``--kill-at`` seconds one upstream
is killed (SIGKILL). Every request is classified:

- ``completed``: 200 and the stream ended with ``data: [DONE]`` and no error chunk;
- ``cut mid-stream``: the 200 head reached the client, the stream ended with the gateway's error
  chunk or without ``[DONE]`` (the upstream died under it: expected, no retry is possible once the
  head is sent);
- ``lost before streaming``: no 200 head (an error status or a failed connection): the gateway did
  not fail over. Target: 0;
- ``other errors``: anything else (a gateway error while both upstreams were alive, a client-side
  failure).

A run with any lost or other error fails (exit 1). It prints the totals, the gateway's
``gateway_upstream_failovers_total`` and ``gateway_upstream_up`` from ``/metrics`` and ``/ready``'s
``upstreams``.

    .venv/bin/python bench/upstream_failover.py [--clients 32] [--seconds 12] [--kill-at 5]
        [--tokens 40] [--token-delay-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import GatewayProcess, free_port, wait_port  # noqa: E402

BODY = orjson.dumps(
    {"model": "bench-model", "messages": [{"role": "user", "content": "Hello"}], "stream": True}
)


def start_upstream(port: int, tokens: int, delay_ms: float) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "fast_upstream.py"),
            "--port",
            str(port),
            "--tokens",
            str(tokens),
            "--token-delay-ms",
            str(delay_ms),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    return proc


async def one_request(session: aiohttp.ClientSession, url: str) -> str:
    """The outcome of one streamed request: completed, cut, lost, or other:<what>."""
    head = False
    try:
        async with session.post(url, data=BODY, headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                await resp.read()
                return "lost" if resp.status in (502, 503, 504) else f"other:status {resp.status}"
            head = True
            done = failed = False
            async for line in resp.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b'data: {"error"'):
                    failed = True  # a stream that broke off ends as vLLM's does: error chunk, [DONE]
            return "completed" if done and not failed else "cut"
    except (aiohttp.ClientError, TimeoutError) as exc:
        if head:
            return "cut"
        return f"other:{type(exc).__name__}" if not isinstance(exc, aiohttp.ClientConnectorError) else "lost"


async def client(session: aiohttp.ClientSession, url: str, until: float, outcomes: Counter[str]) -> None:
    while time.monotonic() < until:
        outcomes[await one_request(session, url)] += 1


async def run_load(gateway: str, args: argparse.Namespace, victim: subprocess.Popen[bytes]) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    start = time.monotonic()
    until = start + args.seconds
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        url = f"{gateway}/v1/chat/completions"
        tasks = [asyncio.create_task(client(session, url, until, outcomes)) for _ in range(args.clients)]
        await asyncio.sleep(args.kill_at)
        before = sum(outcomes.values())
        victim.send_signal(signal.SIGKILL)
        print(f"killed one upstream at {time.monotonic() - start:.1f}s ({before} requests finished by then)")
        await asyncio.gather(*tasks)
    return outcomes


def metric_lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--kill-at", type=float, default=5.0)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--token-delay-ms", type=float, default=20.0)
    args = parser.parse_args()

    ports = [free_port(), free_port()]
    upstreams: list[subprocess.Popen[bytes]] = []
    data_dir = tempfile.mkdtemp(prefix="bench-failover-")
    env = {
        "LLM_API_BASE": ",".join(f"http://127.0.0.1:{port}" for port in ports),
        "GATEWAY_SERVER_DATA_DIR": data_dir,
    }
    gateway: GatewayProcess | None = None
    try:
        upstreams = [start_upstream(port, args.tokens, args.token_delay_ms) for port in ports]
        gateway = GatewayProcess(env, log=os.path.join(data_dir, "gateway.log"))
        gateway.wait(timeout=120)  # a busy shared machine starts it slowly
        print(
            f"gateway {gateway.url} in front of {env['LLM_API_BASE']}; {args.clients} clients for "
            f"{args.seconds:g}s, {args.tokens} tokens {args.token_delay_ms:g} ms apart per stream"
        )
        outcomes = asyncio.run(run_load(gateway.url, args, upstreams[1]))
        import httpx

        metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
        ready = httpx.get(f"{gateway.url}/ready", timeout=10).json()
    finally:
        if gateway is not None:
            gateway.stop()
        for proc in upstreams:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    total = sum(outcomes.values())
    lost = outcomes["lost"]
    cut = outcomes["cut"]
    other = {k: v for k, v in outcomes.items() if k.startswith("other:")}
    print(f"requests:               {total}")
    print(f"completed:              {outcomes['completed']}")
    print(f"cut mid-stream:         {cut}  (expected: streams the killed upstream was sending)")
    print(f"lost before streaming:  {lost}  (target 0)")
    print(f"other errors:           {sum(other.values())}  {other or ''}")
    for line in metric_lines(metrics, "gateway_upstream_failovers_total") + metric_lines(
        metrics, "gateway_upstream_up"
    ):
        print(f"  {line}")
    print(f"/ready: {ready['status']} {orjson.dumps(ready.get('upstreams')).decode()}")
    ok = lost == 0 and not other and outcomes["completed"] > 0
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
