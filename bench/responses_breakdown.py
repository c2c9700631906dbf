"""Where a stored response's CPU goes, measured in one process (docs/performance.md, issue 16).

``bench/responses.py`` measures the gateway from outside, against the reference. This script calls
the one ``POST /v1/responses`` implementation (``responses_app.api.views.create``) directly, without an
HTTP server, against the same scripted upstream (``bench/responses.py``'s, in another process), and
prints the CPU per call (``time.process_time``: this process only) of three paths:

- ``passthrough``: ``store: false``, no executor (the stateless relay to the upstream);
- ``executor``: ``store: false`` forced through the executor (``prepare.needs_executor`` answers
  True for this run only): parse and validate, the upstream exchange (a JSON client's round: one
  non-streamed answer, read through the stream parser and emitter), no storage;
- ``stored``: ``store: true``, the whole stored path (group commit on the writer thread included).

Each call must answer 200 with a completed response; any error fails the run (exit 1).

    .venv/bin/python bench/responses_breakdown.py [--store sqlite|postgres] [--calls 3000]
        [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _upstream(port_out: Any) -> None:
    import responses as bench_responses  # bench/responses.py: the scripted upstream

    port_out.put(bench_responses.start_upstream())
    while True:
        time.sleep(3600)


def _setup(store: str, upstream: str) -> None:
    os.environ["LLM_API_BASE"] = upstream
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    if store == "postgres":
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS bench_breakdown")
            conn.execute("CREATE DATABASE bench_breakdown")
        os.environ["DATABASE_URL"] = "postgresql://postgres@127.0.0.1:5432/bench_breakdown"
    else:
        os.environ.pop("DATABASE_URL", None)
        os.environ["GATEWAY_SERVER_DATA_DIR"] = tempfile.mkdtemp(prefix="bench-breakdown-")
    os.environ["DJANGO_SETTINGS_MODULE"] = "gateway.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


async def _run(body: bytes, calls: int, concurrency: int) -> int:
    """``calls`` creates, ``concurrency`` at a time; the number that failed."""
    import orjson

    from gateway.core.principal import DEFAULT_PRINCIPAL
    from responses_app.api import views

    failures = 0
    left = [calls]

    async def worker() -> None:
        nonlocal failures
        while left[0] > 0:
            left[0] -= 1
            call = views.Call(
                "application/json", body, {"content-type": "application/json"}, DEFAULT_PRINCIPAL, False
            )
            try:
                outcome = await views.create(call)
                ok = outcome.status == 200
                if outcome.frames is not None:
                    async for _ in outcome.frames:
                        pass
                elif ok:
                    ok = orjson.loads(outcome.body).get("status") == "completed"
                if outcome.close is not None:
                    await outcome.close()
            except Exception:
                ok = False
            failures += not ok

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return failures


def _measure(body: bytes, calls: int, concurrency: int) -> tuple[float, int]:
    import uvloop

    uvloop.run(_run(body, min(calls, 200), concurrency))  # warm-up
    started = time.process_time()
    failures = uvloop.run(_run(body, calls, concurrency))
    return (time.process_time() - started) / calls * 1000, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="postgres")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    ports: Any = multiprocessing.Queue()
    multiprocessing.Process(target=_upstream, args=(ports,), daemon=True).start()
    _setup(args.store, ports.get(timeout=30))

    import orjson

    from responses_app.storage import prepare

    def body(store: bool) -> bytes:
        return orjson.dumps({"model": "bench-model", "input": "hi", "store": store})

    failed = 0
    for name, store, forced in (
        ("passthrough", False, False),
        ("executor", False, True),
        ("stored", True, False),
    ):
        original = prepare.needs_executor
        if forced:
            prepare.needs_executor = lambda *_: True  # type: ignore[assignment]
        try:
            ms, failures = _measure(body(store), args.calls, args.concurrency)
        finally:
            prepare.needs_executor = original
        failed += failures
        print(f"{name:12} {ms:.3f} ms CPU a call  ({failures} failed)", flush=True)
    if failed:
        raise SystemExit(f"{failed} calls failed: a run with errors is a failing result")


if __name__ == "__main__":
    main()
