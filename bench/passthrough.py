"""Pass-through bench: direct to the upstream vs our gateway vs the reference gateway, interleaved.

Starts ``bench/fast_upstream.py``, our gateway (``manage.py serve``: uvicorn + uvloop + httptools,
exactly as ``make run``), and — when ``agentic-server`` is found — the reference gateway
(``pip install agentic-api==0.9.0`` in a separate venv; pass ``--reference /path/to/agentic-server``).
Then, for chat JSON and chat SSE at each concurrency, it runs every target for a few seconds, in
rounds, interleaved (direct, ours, reference, direct, ours, …) so drift on a shared machine hits all
of them alike, and prints requests/s, p50/p99 latency, p50 time to first content chunk and the
ratio to direct, taking the best round of each (and the median round's requests/s beside it), and
each server process's CPU time per answered request (median round; read from ``/proc``), which a
shared machine disturbs far less than requests/s.

The load generator is a raw keep-alive HTTP/1.1 client (uvloop + httptools), one connection per
concurrent worker, so it costs little CPU next to the servers it measures.

    .venv/bin/python bench/passthrough.py --reference /work/ref-venv/bin/agentic-server \\
        [--seconds 3] [--rounds 2] [--concurrency 1,16,64]
        [--before DIR [--before-workers N]]

``--before DIR`` adds the gateway of another checkout (``git worktree add DIR <commit>``), so a
change is measured against what it changes in one run, interleaved, on the same machine (with one
server process unless ``--before-workers`` says otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.responses import cpu_seconds  # noqa: E402
from tests.servers import GatewayProcess, free_port  # noqa: E402

CONTENT_MARKER = b'"delta":{"content":"'

HEALTH_REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
JSON_BODY = b'{"model":"bench-model","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'
SSE_BODY = (
    b'{"model":"bench-model","messages":[{"role":"user","content":"Hello"}],"max_tokens":16,"stream":true}'
)


def wait_http(port: int, path: str = "/health", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1"):
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing answering on port {port}")


# --- load generator ----------------------------------------------------------------------------


class _Conn(asyncio.Protocol):
    def __init__(self, stream: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.stream = stream
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[int] | None = None
        self.first_at = 0.0
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        if not self.first_at and (not self.stream or CONTENT_MARKER in body):
            self.first_at = time.perf_counter()

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(self.parser.get_status_code())

    async def request(self, raw: bytes) -> tuple[int, float, float]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.first_at = 0.0
        started = time.perf_counter()
        self.transport.write(raw)
        status = await self.done
        ended = time.perf_counter()
        return status, ended - started, (self.first_at or ended) - started


# The server process behind each port (the gateways' and the reference's): its CPU time is read
# around each cell, so the report has CPU per request, which a shared machine disturbs far less
# than requests/s.
# A gateway with several server processes is measured as its whole process tree (the supervisor
# and its workers), as bench/responses.py measures it.
PIDS: dict[int, int] = {}


@dataclass
class CellResult:
    latencies: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    answered: int = 0  # every 200, the warm-up's too
    cpu: float = float("nan")  # the server's CPU seconds over the whole cell

    @property
    def cpu_us(self) -> float:
        """The server's CPU µs per answered request (nan: not a process we started)."""
        return self.cpu / self.answered * 1e6 if self.answered else float("nan")

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def pct(self, values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _worker(
    port: int, raw: bytes, stream: bool, until: float, measure_from: float, out: CellResult
) -> None:
    loop = asyncio.get_running_loop()
    conn: _Conn | None = None
    while time.perf_counter() < until:
        if conn is None or conn.transport is None or conn.transport.is_closing():
            _, conn = await loop.create_connection(lambda: _Conn(stream), "127.0.0.1", port)
        try:
            status, latency, first = await conn.request(raw)
        except ConnectionError:
            conn = None
            out.errors += 1
            continue
        if status == 200:
            out.answered += 1
        if time.perf_counter() < measure_from:
            continue
        if status != 200:
            out.errors += 1
            continue
        out.latencies.append(latency)
        out.firsts.append(first)
    if conn is not None and conn.transport is not None:
        conn.transport.close()


async def run_cell(
    port: int, stream: bool, concurrency: int, seconds: float, warmup: float, raw: bytes = b""
) -> CellResult:
    body = SSE_BODY if stream else JSON_BODY
    raw = raw or (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer sk-bench\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    out = CellResult()
    start = time.perf_counter()
    measure_from = start + warmup
    until = measure_from + seconds
    pid = PIDS.get(port)
    cpu_before = cpu_seconds(pid) if pid else 0.0
    await asyncio.gather(*(_worker(port, raw, stream, until, measure_from, out) for _ in range(concurrency)))
    if pid:
        out.cpu = cpu_seconds(pid) - cpu_before
    out.seconds = seconds
    return out


# --- servers -------------------------------------------------------------------------------------


def start_servers(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, int], list[subprocess.Popen[Any]]]:
    procs: list[subprocess.Popen[Any]] = []
    up_port, ref_port = free_port(), free_port()
    procs.append(
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "fast_upstream.py"),
                "--port",
                str(up_port),
                "--tokens",
                str(args.tokens),
                "--token-delay-ms",
                str(args.token_delay_ms),
            ]
        )
    )
    wait_http(up_port)
    targets = {"direct": up_port}
    for workers in [int(w) for w in str(args.workers).split(",")]:
        gateway = GatewayProcess(
            {
                "LLM_API_BASE": f"http://127.0.0.1:{up_port}",
                "LOG_LEVEL": args.log_level,
                "GATEWAY_SERVER_DATA_DIR": str(tmp / f"ours-{workers}"),
                "GATEWAY_SERVER_WORKERS": str(workers),
            },
            log=os.devnull,
        )
        procs.append(gateway.proc)
        wait_http(gateway.port)
        targets["ours" if workers == 1 else f"ours-w{workers}"] = gateway.port
        PIDS[gateway.port] = gateway.proc.pid  # with its workers, if it has any
    extra: list[tuple[str, dict[str, str], Path]] = []
    if args.before:
        extra.append(
            ("before", {"GATEWAY_SERVER_WORKERS": str(args.before_workers)}, Path(args.before).resolve())
        )
    for name, env, root in extra:
        gateway = GatewayProcess(
            {
                "LLM_API_BASE": f"http://127.0.0.1:{up_port}",
                "LOG_LEVEL": args.log_level,
                "GATEWAY_SERVER_DATA_DIR": str(tmp / name),
                "GATEWAY_SERVER_WORKERS": "1",
                **env,
            },
            log=os.devnull,
            root=root,
        )
        procs.append(gateway.proc)
        wait_http(gateway.port)
        targets[name] = gateway.port
        PIDS[gateway.port] = gateway.proc.pid
    reference = args.reference or shutil.which("agentic-server")
    if reference:
        home = tmp / "ref"
        home.mkdir()
        ref_env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LLM_API_BASE")}
        ref_env.update({"HOME": str(home), "RUST_LOG": "warn"})
        procs.append(
            subprocess.Popen(
                [
                    reference,
                    "--llm-api-base",
                    f"http://127.0.0.1:{up_port}",
                    "--skip-llm-ready-check",
                    "--gateway-host",
                    "127.0.0.1",
                    "--gateway-port",
                    str(ref_port),
                ],
                cwd=home,
                env=ref_env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        wait_http(ref_port, "/health")
        targets["reference"] = ref_port
        PIDS[ref_port] = procs[-1].pid
    else:
        print("reference gateway not found (pass --reference): comparing direct and ours only")
    return targets, procs


def main() -> None:
    parser = argparse.ArgumentParser(description="pass-through bench: direct vs ours vs reference")
    parser.add_argument("--reference", default=os.environ.get("AGENTIC_SERVER", ""))
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--modes", default="json,sse")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument(
        "--workers",
        default="1",
        help="our gateway's server processes; a list (1,2) starts one gateway per value",
    )
    parser.add_argument(
        "--before",
        default="",
        help="a checkout of an earlier commit (git worktree add DIR COMMIT): its gateway runs beside ours",
    )
    parser.add_argument(
        "--before-workers", type=int, default=1, help="the 'before' gateway's server processes (default 1)"
    )
    parser.add_argument(
        "--django-floor",
        action="store_true",
        help="also time GET /health on our gateway: the cheapest Django view, no upstream call",
    )
    parser.add_argument(
        "--log-level", default="INFO", help="our gateway's LOG_LEVEL (INFO logs each request)"
    )
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    modes = args.modes.split(",")

    with tempfile.TemporaryDirectory() as tmp_name:
        targets, procs = start_servers(args, Path(tmp_name))
        try:
            results: dict[tuple[str, int, str], list[CellResult]] = {}
            floors: dict[int, list[CellResult]] = {}
            for round_ in range(args.rounds):
                for mode in modes:
                    for conc in concurrencies:
                        # direct first, then the others in an order rotated every round, so no
                        # target always runs right after the same one
                        others = list(targets)[1:]
                        shift = round_ % len(others) if others else 0
                        order = list(targets)[:1] + others[shift:] + others[:shift]
                        for name in order:
                            port = targets[name]
                            cell = uvloop.run(run_cell(port, mode == "sse", conc, args.seconds, args.warmup))
                            results.setdefault((mode, conc, name), []).append(cell)
                            print(
                                f"round {round_ + 1} {mode:4} c={conc:<3} {name:9} {cell.rps:8.0f} req/s "
                                f"p50 {cell.pct(cell.latencies, 0.5):6.2f} ms cpu {cell.cpu_us:6.1f} us/req "
                                f"errors {cell.errors}",
                                flush=True,
                            )
                        if args.django_floor and mode == modes[0]:
                            cell = uvloop.run(
                                run_cell(
                                    targets["ours"], False, conc, args.seconds, args.warmup, HEALTH_REQUEST
                                )
                            )
                            floors.setdefault(conc, []).append(cell)
                            print(
                                f"round {round_ + 1} GET /health (Django) c={conc:<3} {cell.rps:8.0f} req/s",
                                flush=True,
                            )
            report(results, modes, concurrencies, list(targets))
            if floors:
                print("\n| Django floor: GET /health on ours (no upstream call) | req/s | p50 ms |")
                print("|---|---|---|")
                for conc, cells in floors.items():
                    best = max(cells, key=lambda c: c.rps)
                    print(f"| c={conc} | {best.rps:.0f} | {best.pct(best.latencies, 0.5):.2f} |")
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def report(
    results: dict[tuple[str, int, str], list[CellResult]],
    modes: list[str],
    concurrencies: list[int],
    names: list[str],
) -> None:
    print()
    print(
        "| mode | conc | target | req/s | median round req/s | p50 ms | p99 ms | first content p50 ms "
        "| req/s vs direct | p50 overhead ms | server CPU µs/req (median round) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        for conc in concurrencies:
            best = {name: max(results[(mode, conc, name)], key=lambda c: c.rps) for name in names}
            direct = best["direct"]
            for name in names:
                cell = best[name]
                rounds = sorted(c.rps for c in results[(mode, conc, name)])
                median = rounds[len(rounds) // 2]
                ratio = cell.rps / direct.rps if direct.rps else float("nan")
                cpus = sorted(c.cpu_us for c in results[(mode, conc, name)])
                cpu = cpus[len(cpus) // 2]
                overhead = cell.pct(cell.latencies, 0.5) - direct.pct(direct.latencies, 0.5)
                print(
                    f"| {mode} | {conc} | {name} | {cell.rps:.0f} | {median:.0f} | {cell.pct(cell.latencies, 0.5):.2f} | "
                    f"{cell.pct(cell.latencies, 0.99):.2f} | {cell.pct(cell.firsts, 0.5):.2f} | {ratio:.2f} | "
                    f"{overhead:+.2f} | {cpu:.1f} |"
                )
    errors = sum(c.errors for cells in results.values() for c in cells)
    print(f"\nnon-200 or failed requests: {errors}")


if __name__ == "__main__":
    main()
