"""Gateway tools: a round of 5 concurrent web-search calls, in-process and through Celery, and the
Celery dispatch overhead per tool call.

A SearXNG-compatible provider on loopback answers after ``--delay-ms`` (100 ms). The Celery path
uses a real worker process (``celery -A gateway.celery worker -Q tools -P threads``) on the real
Redis (db 9). Cells are interleaved so machine noise hits both modes alike.

    .venv/bin/python bench/tools.py [--rounds 20] [--delay-ms 100] [--calls 200]

``--responses``: end to end through the Responses API instead — a gateway process (``manage.py
serve``, in-process tool calls, SQLite) in front of a scripted vLLM-format upstream whose first
round calls ``web_search`` 5 times and whose second round answers; the same request against a
provider answering at once isolates the tool round.

    .venv/bin/python bench/tools.py --responses [--rounds 20] [--delay-ms 100]
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")

import orjson  # noqa: E402

from gateway.core.config import Config, load_config, replace  # noqa: E402
from inference_app.tools import ToolCall, classify_tools, run_gateway_calls  # noqa: E402
from tests.tools.tools_servers import SearchProvider  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/9"


def calls(n: int) -> list[ToolCall]:
    ts = classify_tools([{"type": "web_search"}], config=load_config({}))
    return [
        ts.make_call(f"c{i}", "web_search", orjson.dumps({"queries": [f"q{i}"]}).decode()) for i in range(n)
    ]


def start_worker(provider_url: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(REDIS_URL=REDIS_URL, WEB_SEARCH_PROVIDER="searxng", WEB_SEARCH_BASE_URL=provider_url)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "gateway.celery",
            "worker",
            "-Q",
            "tools",
            "-P",
            "threads",
            "-c",
            "8",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )


async def timed_round(n: int, config: Config, app: object | None) -> float:
    started = time.perf_counter()
    results = await run_gateway_calls(calls(n), config=config, celery_app=app)
    elapsed = time.perf_counter() - started
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return elapsed


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p50 = statistics.median(ordered) * 1000
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000
    return f"{p50:.1f} ms (p95 {p95:.1f})"


async def main(args: argparse.Namespace) -> None:
    provider = SearchProvider(delay_s=args.delay_ms / 1000).start()
    instant = SearchProvider(delay_s=0.0).start()
    base = replace(load_config({}), web_search__provider="searxng")
    inproc = replace(base, web_search__base_url=provider.url)
    inproc_instant = replace(base, web_search__base_url=instant.url)

    from celery import Celery

    from gateway.celery import configure

    broker = replace(inproc, redis_url=REDIS_URL)
    app = configure(Celery("bench-tools"), broker)
    worker = start_worker(provider.url)
    worker_instant = None
    try:
        # Wait until the worker answers a call, then warm both paths.
        deadline = time.monotonic() + 60
        while True:
            [r] = await run_gateway_calls(
                calls(1), config=replace(broker, tools__call_timeout_s=2), celery_app=app
            )
            if r.ok:
                break
            if time.monotonic() > deadline:
                raise SystemExit("the Celery worker did not answer")
        for _ in range(3):
            await timed_round(5, inproc, None)
            await timed_round(5, broker, app)

        rounds_in: list[float] = []
        rounds_celery: list[float] = []
        singles_in: list[float] = []
        for _ in range(args.rounds):
            rounds_in.append(await timed_round(5, inproc, None))
            rounds_celery.append(await timed_round(5, broker, app))
            singles_in.append(await timed_round(1, inproc, None))

        # Dispatch overhead: single calls against a provider answering at once.
        worker.terminate()
        worker.wait(10)
        worker_instant = start_worker(instant.url)
        broker_instant = replace(inproc_instant, redis_url=REDIS_URL)
        while True:
            [r] = await run_gateway_calls(
                calls(1), config=replace(broker_instant, tools__call_timeout_s=2), celery_app=app
            )
            if r.ok:
                break
        over_in: list[float] = []
        over_celery: list[float] = []
        for _ in range(args.calls):
            over_in.append(await timed_round(1, inproc_instant, None))
            over_celery.append(await timed_round(1, broker_instant, app))
    finally:
        for proc in (worker, worker_instant):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        provider.stop()
        instant.stop()

    print(f"provider delay: {args.delay_ms} ms; {args.rounds} rounds; {args.calls} single calls")
    print(f"one call, in-process:            {ms(singles_in)}")
    print(f"round of 5 calls, in-process:    {ms(rounds_in)}")
    print(f"round of 5 calls, Celery worker: {ms(rounds_celery)}")
    print(f"one call at 0 ms, in-process:    {ms(over_in)}")
    print(f"one call at 0 ms, Celery worker: {ms(over_celery)}")
    overhead = (statistics.median(over_celery) - statistics.median(over_in)) * 1000
    print(f"Celery dispatch overhead per call (median difference): {overhead:.1f} ms")


# --- end to end through the Responses API -------------------------------------------------------


def start_tool_upstream() -> str:
    """A vLLM-format ``/v1/responses`` upstream: 5 web_search calls, then (given their outputs) text."""
    import threading

    from aiohttp import web

    from tests.responses.scripts import Script, call, responses_events, text
    from tests.servers import free_port, wait_port

    calls_round = Script(
        [call("web_search", orjson.dumps({"queries": [f"q{i}"]}).decode()) for i in range(5)]
    )
    answer = Script([text("Five searches done.")])

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        done = any(i.get("type") == "function_call_output" for i in body.get("input") or ())
        events = responses_events(answer if done else calls_round, body)
        frames = b"".join(
            b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n" for kind, data in events
        )
        response = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        await response.write(frames)
        await response.write_eof()
        return response

    port = free_port()

    def run() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/responses", handle)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    wait_port(port)
    return f"http://127.0.0.1:{port}"


def start_gateway(upstream: str, provider_url: str, data_dir: str) -> tuple[subprocess.Popen[Any], str]:
    from tests.servers import GatewayProcess

    env = {
        "LLM_API_BASE": upstream,
        "LOG_LEVEL": "WARNING",
        "GATEWAY_SERVER_DATA_DIR": data_dir,
        "WEB_SEARCH_PROVIDER": "searxng",
        "WEB_SEARCH_BASE_URL": provider_url,
    }
    gateway = GatewayProcess(env, log=os.devnull).wait(60)
    return gateway.proc, gateway.url


async def responses_main(args: argparse.Namespace) -> None:
    import tempfile

    import httpx

    provider = SearchProvider(delay_s=args.delay_ms / 1000).start()
    instant = SearchProvider(delay_s=0.0).start()
    upstream = start_tool_upstream()
    body = {"model": "m", "input": "search five things", "tools": [{"type": "web_search"}], "store": False}
    procs = []
    try:
        with tempfile.TemporaryDirectory() as slow_dir, tempfile.TemporaryDirectory() as fast_dir:
            slow, slow_url = start_gateway(upstream, provider.url, slow_dir)
            procs.append(slow)
            fast, fast_url = start_gateway(upstream, instant.url, fast_dir)
            procs.append(fast)
            async with httpx.AsyncClient(timeout=30) as client:

                async def once(base: str) -> float:
                    started = time.perf_counter()
                    r = await client.post(f"{base}/v1/responses", json=body)
                    elapsed = time.perf_counter() - started
                    data = r.json()
                    assert r.status_code == 200 and data["status"] == "completed", r.text
                    assert [i["status"] for i in data["output"][:5]] == ["completed"] * 5
                    return elapsed

                for _ in range(3):
                    await once(slow_url)
                    await once(fast_url)
                with_delay: list[float] = []
                without: list[float] = []
                for _ in range(args.rounds):
                    with_delay.append(await once(slow_url))
                    without.append(await once(fast_url))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        provider.stop()
        instant.stop()
    print(f"Responses API, 2 upstream rounds, 5 concurrent web-search calls; {args.rounds} requests each")
    print(f"provider {args.delay_ms:g} ms: {ms(with_delay)}")
    print(f"provider 0 ms:   {ms(without)}")
    extra = (statistics.median(with_delay) - statistics.median(without)) * 1000
    print(f"the tool round's share (median difference): {extra:.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--delay-ms", type=float, default=100.0)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--responses", action="store_true", help="end to end through the Responses API")
    parsed = parser.parse_args()
    asyncio.run(responses_main(parsed) if parsed.responses else main(parsed))
