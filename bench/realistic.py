"""Realistic-traffic benchmark: many concurrent streams behind a paced upstream, side by side.

A paced upstream stands in for vLLM: the first token 50 ms after the request, then one token
every 20 ms, 200 tokens, in vLLM's wire formats (``/v1/responses`` named SSE events, the Responses
executor's default ``upstream_api``, and ``/v1/chat/completions`` chunks). Stored SSE Responses
streams (``POST /v1/responses``, ``stream``/``store`` true) and WebSocket responses (``WS
/v1/responses``, ``response.create`` with ``store`` true), 256, 1,024 and 4,096 at once, are run
against this gateway (``manage.py serve``, default configuration), the reference gateway
(``agentic-api`` 0.9.0) and the upstream directly (``direct``: SSE only), in one run. A fresh server
(and database) per cell, so memory figures do not carry over from a bigger cell.

Per cell, after three warm-up rounds: CPU per streamed token (the server's process tree, from /proc); added
latency to the first token and between tokens, p50/p99, measured against the upstream's own clock:
every delta carries the upstream's send time (CLOCK_MONOTONIC, shared by every process), the first
one also the time the request arrived, so ``TTFT+`` = client TTFT minus the upstream's own wait,
``ITL+`` = the gap between two tokens at the client minus the gap at the upstream, ``lag`` = receipt
minus send of each token (the ``direct`` rows are the floor: client, loopback and upstream). Peak
RSS of the server tree; RSS per open stream: (RSS - idle) / streams open, read when the most
streams were open (shown: on a slow machine the last streams start after the first end); errors (any error, a stream without
every token or without ``response.completed``, or a stored response that GET does not answer as
completed, fails the run: exit 1); the upstream's pacing error (actual minus scheduled send
time), so a late upstream is not taken for gateway latency. ``ITL+`` below zero:
tokens that arrive in a burst after a stall. Under each row, the share of the cell that the server
and the upstream spent runnable but waiting for a CPU (/proc schedstat): on a busy machine the
latency columns measure the machine, while CPU per token and memory stay comparable. The run ends
with the upstream paths each target called (our executor's default ``upstream_api`` is
``responses``; the reference calls ``/v1/responses`` too). A target whose WebSocket handshake is
refused shows ``n/a`` on WS; ``--quick``: levels 16,64 and 50 tokens.

Load generation: ``--clients`` processes (default one per 512 streams of the largest level, up to 8),
each on uvloop with one aiohttp session, the streams of a cell split between them; WebSocket
connections are opened first (256 handshakes at a time per process), then every ``response.create``
is sent at once. The upstream runs ``--upstream-procs`` processes on one port (``SO_REUSEPORT``;
default one per 1,024 streams, up to 4), each with one timer loop that sends every due token (a heap
of due times), not one sleeping task per stream. RLIMIT_NOFILE is raised to its hard limit.

    .venv/bin/python bench/realistic.py [--reference /work/ref-venv/bin/agentic-server]
        [--levels 256,1024,4096] [--tokens 200] [--first-ms 50] [--interval-ms 20]
        [--postgres postgres://postgres@127.0.0.1:5432/postgres] [--quick]
        [--targets gateway,reference,direct] [--modes sse,ws] [--clients N] [--upstream-procs N]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import math
import multiprocessing
import os
import re
import resource
import sys
import tempfile
import time
from array import array
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import fast_upstream  # noqa: E402
from bench.responses import cpu_seconds, postgres_url, start_reference  # noqa: E402
from bench.ws_soak import rss_mib  # noqa: E402
from tests.responses.scripts import Script, chat_chunks, responses_events, text  # noqa: E402
from tests.servers import GatewayProcess, free_port  # noqa: E402
from tests.upstream import MODEL, models_body  # noqa: E402

# A delta's text: ``~<send µs>~`` (the first one ``~<send µs>~<request arrival µs>~``).
DELTA = re.compile(rb'"(?:delta|content)":\s*"~(\d+)~(\d*)')
RESPONSE_ID = re.compile(rb'"id":\s*"(resp_[^"]+)"')


def _now_us() -> int:
    return time.monotonic_ns() // 1000


# --- the paced upstream ------------------------------------------------------------------------


class _Stream:
    """One open upstream stream: its transport, wire, next token and the events around the tokens."""

    __slots__ = ("arrived", "chat", "chunks", "due", "events", "index", "stamps", "template", "transport")

    def __init__(self, transport: asyncio.Transport, chat: bool, body: dict[str, Any], tokens: int) -> None:
        self.transport, self.chat, self.arrived = transport, chat, _now_us()
        self.index = 0
        self.stamps: list[int] = []
        self.due = 0.0
        script = Script(
            [text("~")], usage={"input_tokens": 12, "output_tokens": tokens, "total_tokens": 12 + tokens}
        )
        if chat:  # role, one content chunk (the template), finish, usage, [DONE]
            self.chunks = chat_chunks(script, body)
            self.events: list[tuple[str, dict[str, Any]]] = []
            template = self.chunks[1].replace(b'"~"', b'"DELTA"')
        else:  # created, in_progress, item added, part added, one delta (the template), 4 closing events
            self.events = responses_events(script, body)
            self.chunks = []
            kind, data = self.events[4]
            template = orjson.dumps({**data, "delta": "DELTA", "sequence_number": 987654321})
            template = b"event: " + kind.encode() + b"\ndata: " + template
        # A token's event is this template with its delta (and sequence number) put in: no JSON
        # encoding per token, so the upstream's cost a token stays small.
        before, after = template.split(b'"DELTA"')
        self.template = (b"data: " + before if chat else before, *after.split(b"987654321"))

    def frame(self, kind: str | None, payload: bytes) -> bytes:
        return _chunk((b"event: " + kind.encode() + b"\n" if kind else b"") + b"data: " + payload + b"\n\n")

    def head(self) -> bytes:
        out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        if self.chat:
            return out + self.frame(None, self.chunks[0])
        return out + b"".join(self.frame(kind, orjson.dumps(data)) for kind, data in self.events[:2])

    def token(self, last: bool) -> bytes:
        sent = _now_us()
        self.stamps.append(sent)
        delta = b"~%d~%d~" % (sent, self.arrived) if self.index == 0 else b"~%d~" % sent
        self.index += 1
        if self.chat:
            before, after = self.template
            out = _chunk(before + b'"' + delta + b'"' + after + b"\n\n")
            if last:
                out += b"".join(self.frame(None, c) for c in self.chunks[2:]) + b"0\r\n\r\n"
            return out
        before, middle, after = self.template
        event = before + b'"' + delta + b'"' + middle + b"%d" % (3 + self.index) + after + b"\n\n"
        out = _chunk(event)
        if self.index == 1:  # the message item and its part open with the first token, as in vLLM
            out = b"".join(self.frame(kind, orjson.dumps(data)) for kind, data in self.events[2:4]) + out
        if last:
            whole = "".join(
                f"~{s}~{self.arrived}~" if i == 0 else f"~{s}~" for i, s in enumerate(self.stamps)
            )
            kinds = [kind for kind, _ in self.events[5:]]
            done, part, item, completed = (data for _, data in self.events[5:])
            done["text"] = part["part"]["text"] = whole  # the part is the item's and the response's too
            for number, data in enumerate((done, part, item, completed)):
                data["sequence_number"] = 4 + self.index + number
                out += self.frame(kinds[number], orjson.dumps(data))
            out += b"0\r\n\r\n"
        return out


def _chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


class Pacer:
    """One timer loop per upstream process: a heap of (due time, stream); every due token is sent
    when its time comes, each stream on its own schedule (first token ``first_s`` after arrival,
    then every ``interval_s``), scheduled from the ideal times so lateness does not accumulate; one
    wake-up sends every token due within the next millisecond (the timer resolution)."""

    def __init__(self, tokens: int, first_s: float, interval_s: float) -> None:
        self.tokens, self.first_s, self.interval_s = tokens, first_s, interval_s
        self.heap: list[tuple[float, int, _Stream]] = []
        self.counter = 0
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.errors = array("d")  # actual minus scheduled send time, seconds
        self.paths: dict[str, int] = {}

    def open(self, stream: _Stream) -> None:
        stream.transport.write(stream.head())
        stream.due = time.monotonic() + self.first_s
        self._push(stream)

    def _push(self, stream: _Stream) -> None:
        self.counter += 1
        heapq.heappush(self.heap, (stream.due, self.counter, stream))
        if stream.due < self.timer_at:
            self._arm(stream.due)

    def _arm(self, at: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = at
        self.timer = asyncio.get_running_loop().call_later(max(0.0, at - time.monotonic()), self._tick)

    def _tick(self) -> None:
        self.timer, self.timer_at = None, math.inf
        heap = self.heap
        while heap and heap[0][0] <= time.monotonic() + 0.001:  # one wake-up for all due within 1 ms
            due, _, stream = heapq.heappop(heap)
            if stream.transport.is_closing():
                continue
            last = stream.index + 1 == self.tokens
            self.errors.append(time.monotonic() - due)
            stream.transport.write(stream.token(last))
            if not last:
                stream.due = due + self.interval_s
                self.counter += 1
                heapq.heappush(heap, (stream.due, self.counter, stream))
        if heap:
            self._arm(heap[0][0])

    def stats(self) -> dict[str, Any]:
        errors = sorted(self.errors)
        return {
            "paths": dict(self.paths),
            "pacing_ms": [1000 * q for q in _quantiles(errors, (0.5, 0.99, 1.0))],
        }


class PacedUpstream(fast_upstream.Upstream):
    """fast_upstream's HTTP/1.1 protocol (parser, ``/v1/models``, ``/health``); streamed
    ``/v1/responses`` and ``/v1/chat/completions`` requests go to the process's :class:`Pacer`."""

    pacer: Pacer

    def on_message_complete(self) -> None:
        path = self.url.split(b"?")[0]
        paths = self.pacer.paths
        paths[path.decode()] = paths.get(path.decode(), 0) + 1
        if path in (b"/v1/responses", b"/v1/chat/completions"):
            body = orjson.loads(b"".join(self.body))
            if body.get("stream"):
                assert self.transport is not None
                self.pacer.open(
                    _Stream(self.transport, path == b"/v1/chat/completions", body, self.pacer.tokens)
                )
                return
        super().on_message_complete()


def upstream_main(port: int, control: Connection, tokens: int, first_ms: float, interval_ms: float) -> None:
    fast_upstream.configure(tokens, 0)
    PacedUpstream.models_response = fast_upstream._response(
        b"200 OK", b"application/json", orjson.dumps(models_body())
    )
    PacedUpstream.pacer = Pacer(tokens, first_ms / 1000, interval_ms / 1000)

    def command() -> None:
        try:
            order = control.recv()
        except EOFError:  # the bench ended
            os._exit(0)
        if order == "reset":
            PacedUpstream.pacer.errors = array("d")
            PacedUpstream.pacer.paths = {}
            control.send(None)
        else:
            control.send(PacedUpstream.pacer.stats())

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(PacedUpstream, "127.0.0.1", port, backlog=8192, reuse_port=True)
        loop.add_reader(control.fileno(), command)
        control.send("ready")
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


class Upstream:
    """The paced upstream's processes, all on one port."""

    def __init__(self, procs: int, args: argparse.Namespace) -> None:
        self.port = free_port()
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.controls: list[Connection] = []
        for _ in range(procs):
            mine, theirs = _CTX.Pipe()
            process = _CTX.Process(
                target=upstream_main,
                args=(self.port, theirs, args.tokens, args.first_ms, args.interval_ms),
                daemon=True,
            )
            process.start()
            self.processes.append(process)
            self.controls.append(mine)
        for control in self.controls:  # each says "ready" once it listens
            if not control.poll(30):
                raise TimeoutError("the paced upstream did not start")
            control.recv()
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def reset(self) -> None:
        for control in self.controls:
            control.send("reset")
        for control in self.controls:
            control.recv()

    def stats(self) -> dict[str, Any]:
        for control in self.controls:
            control.send("stats")
        answers = [control.recv() for control in self.controls]
        paths: dict[str, int] = {}
        for answer in answers:
            for path, count in answer["paths"].items():
                paths[path] = paths.get(path, 0) + count
        worst = [max(a["pacing_ms"][i] for a in answers) for i in range(3)]  # the worst process's
        return {"paths": paths, "pacing_ms": worst}


# --- the load generator ------------------------------------------------------------------------

DELTA_TEXT = re.compile(DELTA.pattern.decode())
_JSON = {"content-type": "application/json"}
_ERROR = re.compile(rb'"(?:error|incomplete_details)":\s*\{[^{}]*\}')
_FAILED = re.compile(rb'response\.failed|response\.incomplete|"type":\s*"error"')


def cpu_wait(pids: list[int]) -> float:
    """Seconds the threads of ``pids`` and of every process below them spent runnable but waiting
    for a CPU (/proc schedstat): how much a shared machine held them back."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(
                    Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except OSError:
                continue
    tree, frontier = set(pids), list(pids)
    while frontier:
        children = [
            child for child, parent in parents.items() if parent == frontier[-1] and child not in tree
        ]
        frontier.pop()
        tree.update(children)
        frontier += children
    waited = 0
    for pid in tree:
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                waited += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[1])
        except OSError:
            continue
    return waited / 1e9


class Failed(Exception):
    pass


class Tally:
    """What one client process measured in one cell (seconds; arrays pickle compactly)."""

    def __init__(self) -> None:
        self.ttft, self.itl, self.lag = array("d"), array("d"), array("d")
        self.errors: list[str] = []
        self.error_count = 0
        self.ids: list[str] = []
        self.spans = array("d")  # (opened, closed) of each stream's connection, flat

    def stream(self, started: float, sends: list[int], recvs: list[float], arrived: int, tokens: int) -> None:
        """One finished stream: its added TTFT, added inter-token gaps and per-token lags."""
        if len(sends) != tokens or not arrived:
            raise Failed(f"{len(sends)} of {tokens} tokens (request arrival stamp: {bool(arrived)})")
        self.ttft.append((recvs[0] - started) - (sends[0] - arrived) / 1e6)
        previous_send, previous_recv = sends[0] / 1e6, recvs[0]
        self.lag.append(previous_recv - previous_send)
        for send_us, recv in zip(sends[1:], recvs[1:], strict=True):
            send = send_us / 1e6
            self.lag.append(recv - send)
            self.itl.append((recv - previous_recv) - (send - previous_send))
            previous_send, previous_recv = send, recv


async def sse_stream(session: aiohttp.ClientSession, spec: dict[str, Any], tally: Tally) -> None:
    body = orjson.dumps({"model": MODEL, "input": "Tell me about the fox.", "stream": True, "store": True})
    sends: list[int] = []
    recvs: list[float] = []
    arrived, completed, response_id = 0, False, None
    started = time.monotonic()
    async with session.post(spec["base"] + "/v1/responses", data=body, headers=_JSON) as answer:
        if answer.status != 200:
            raise Failed(f"HTTP {answer.status}: {(await answer.read())[:300]!r}")
        buffer = b""
        async for chunk in answer.content.iter_any():
            now = time.monotonic()
            buffer += chunk
            end = buffer.rfind(b"\n\n")
            if end < 0:
                continue
            block, buffer = buffer[: end + 2], buffer[end + 2 :]
            for match in DELTA.finditer(block):
                sends.append(int(match[1]))
                recvs.append(now)
                if match[2]:
                    arrived = int(match[2])
            if response_id is None and (found := RESPONSE_ID.search(block)):
                response_id = found[1].decode()
            if _FAILED.search(block):
                error = _ERROR.search(block)
                raise Failed(f"failed event: {(error[0] if error else block[-300:])!r}")
            if b"response.completed" in block:
                completed = True
    if not completed:
        raise Failed(f"no response.completed after {len(sends)} tokens: {buffer[-200:]!r}")
    tally.stream(started, sends, recvs, arrived, spec["tokens"])
    if response_id and len(tally.ids) < 4:
        tally.ids.append(response_id)


async def ws_stream(ws: aiohttp.ClientWebSocketResponse, spec: dict[str, Any], tally: Tally) -> None:
    create = orjson.dumps(
        {"type": "response.create", "model": MODEL, "input": "Tell me about the fox.", "store": True}
    ).decode()
    sends: list[int] = []
    recvs: list[float] = []
    arrived, response_id = 0, None
    started = time.monotonic()
    await ws.send_str(create)
    while True:
        message = await ws.receive()
        now = time.monotonic()
        if message.type != aiohttp.WSMsgType.TEXT:
            raise Failed(f"WebSocket {message.type.name} after {len(sends)} tokens: {message.data!r}")
        match = DELTA_TEXT.search(message.data)
        if match:
            sends.append(int(match[1]))
            recvs.append(now)
            if match[2]:
                arrived = int(match[2])
            continue
        event = orjson.loads(message.data)
        kind = event.get("type")
        if kind == "response.created":
            response_id = event["response"]["id"]
        elif kind == "response.completed":
            break
        elif kind in ("response.failed", "response.incomplete", "error"):
            error = _ERROR.search(message.data.encode())
            raise Failed(f"{kind}: {(error[0] if error else message.data[:300])!r}")
    tally.stream(started, sends, recvs, arrived, spec["tokens"])
    if response_id and len(tally.ids) < 4:
        tally.ids.append(response_id)


async def run_share(session: aiohttp.ClientSession, control: Connection, spec: dict[str, Any]) -> Tally:
    """This process's share of a cell: WebSockets connected first; "ready"; on "go", every stream at once."""
    tally = Tally()

    def failed(exc: BaseException) -> None:
        tally.error_count += 1
        if len(tally.errors) < 3:
            tally.errors.append(f"{type(exc).__name__}: {exc}"[:400])

    sockets: list[tuple[aiohttp.ClientWebSocketResponse | None, float]] = []
    if spec["mode"] == "ws":
        handshakes = asyncio.Semaphore(256)
        url = spec["base"].replace("http://", "ws://") + "/v1/responses"

        async def connect() -> None:
            try:
                async with handshakes:
                    ws = await session.ws_connect(
                        url, max_msg_size=0, timeout=aiohttp.ClientWSTimeout(ws_close=10)
                    )
                sockets.append((ws, time.monotonic()))
            except Exception as exc:  # counted: a run with errors is a failing result
                failed(exc)

        await asyncio.gather(*(connect() for _ in range(spec["count"])))
    control.send("ready")
    assert control.recv() == "go"

    async def one(ws: aiohttp.ClientWebSocketResponse | None, opened: float) -> None:
        opened = opened or time.monotonic()
        try:
            async with asyncio.timeout(spec["deadline_s"]):
                if ws is None:
                    await sse_stream(session, spec, tally)
                else:
                    await ws_stream(ws, spec, tally)
        except Exception as exc:  # counted: a run with errors is a failing result
            failed(exc)
        finally:
            if ws is not None:
                await ws.close()
            tally.spans.extend((opened, time.monotonic()))

    # An SSE stream's connection opens with its request (opened 0: now).
    streams = sockets if spec["mode"] == "ws" else [(None, 0.0)] * spec["count"]
    await asyncio.gather(*(one(ws, opened) for ws, opened in streams))
    return tally


def client_main(control: Connection) -> None:
    async def serve() -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            while (spec := control.recv()) is not None:
                control.send(await run_share(session, control, spec))

    uvloop.run(serve())


class Clients:
    """The load generator's processes; a cell's streams are split evenly between them."""

    def __init__(self, count: int) -> None:
        self.controls: list[Connection] = []
        self.processes = []
        for _ in range(count):
            mine, theirs = _CTX.Pipe()
            process = _CTX.Process(target=client_main, args=(theirs,), daemon=True)
            process.start()
            self.processes.append(process)
            self.controls.append(mine)

    def run(self, spec: dict[str, Any], streams: int, sample: Any = None) -> list[Tally]:
        """Run ``streams`` streams; ``sample()`` is called every 0.1 s meanwhile. Answers each
        process's tally and (after "go") the seconds until the last stream ended."""
        count = len(self.controls)
        for index, control in enumerate(self.controls):
            control.send({**spec, "count": streams // count + (index < streams % count)})
        self._gather(sample)
        started = time.monotonic()
        for control in self.controls:
            control.send("go")
        tallies = self._gather(sample)
        self.elapsed = time.monotonic() - started
        return tallies

    def _gather(self, sample: Any) -> list[Any]:
        answers: dict[int, Any] = {}
        while len(answers) < len(self.controls):
            for ready in wait([c for i, c in enumerate(self.controls) if i not in answers], 0.1):
                assert isinstance(ready, Connection)
                answers[self.controls.index(ready)] = ready.recv()
            if sample is not None:
                sample()
        return [answers[i] for i in range(len(self.controls))]

    def close(self) -> None:
        for control in self.controls:
            control.send(None)
        for process in self.processes:
            process.join(10)


_CTX = multiprocessing.get_context("spawn")


def _quantiles(ordered: Any, qs: tuple[float, ...]) -> list[float]:
    """Nearest-rank quantiles of an already sorted sequence (nan when empty)."""
    if not ordered:
        return [math.nan for _ in qs]
    return [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in qs]


# --- the run -----------------------------------------------------------------------------------


class Target:
    """A server under test, fresh for one cell: its base URL, the pids whose trees it runs in."""

    def __init__(self, name: str, upstream: Upstream, args: argparse.Namespace, cell_dir: Path) -> None:
        self.name, self.log = name, cell_dir / f"{name}.log"
        self.gateway: GatewayProcess | None = None
        self.proc: Any = None
        cell_dir.mkdir(parents=True, exist_ok=True)
        database = ""
        if args.postgres and name != "direct":
            database = postgres_url(args.postgres, f"bench_realistic_{name}")
        if name == "direct":
            self.base, self.pids = upstream.url, upstream.pids
        elif name == "gateway":
            # As bench/responses.py's start_gateway, with a log kept for errors under load.
            env = {
                "LLM_API_BASE": upstream.url,
                "LOG_LEVEL": "WARNING",
                "GATEWAY_SERVER_DATA_DIR": str(cell_dir),
            }
            if database:
                env["DATABASE_URL"] = database
            self.gateway = GatewayProcess(env, log=self.log).wait(120)
            self.base, self.pids = self.gateway.url, [self.gateway.proc.pid]
        else:
            self.proc, self.base = start_reference(args.reference, upstream.url, str(cell_dir), database)
            self.pids = [self.proc.pid]

    def rss(self) -> float:
        return sum(rss_mib(pid) for pid in self.pids)

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def log_errors(self) -> list[str]:
        if not self.log.exists():
            return []
        lines = self.log.read_text(errors="replace").splitlines()
        words = ("Traceback", "ERROR", "WARNING", "Error")
        return [line for line in lines if any(w in line for w in words) and "gateway.startup" not in line]

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)


async def _stored(base: str, ids: list[str]) -> list[str]:
    """Stored responses that GET does not answer as completed."""
    bad = []
    async with aiohttp.ClientSession() as session:
        for response_id in ids:
            async with session.get(f"{base}/v1/responses/{response_id}") as answer:
                body = await answer.read()
                if answer.status != 200 or orjson.loads(body).get("status") != "completed":
                    bad.append(f"GET {response_id}: {answer.status} {body[:200]!r}")
    return bad


async def _ws_supported(base: str) -> bool:
    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(base.replace("http://", "ws://") + "/v1/responses"):
                return True
        except aiohttp.WSServerHandshakeError:
            return False


def cell(
    target: Target, mode: str, level: int, clients: Clients, upstream: Upstream, args: argparse.Namespace
) -> dict[str, Any]:
    spec = {
        "base": target.base,
        "mode": mode,
        "tokens": args.tokens,
        "deadline_s": args.first_ms / 1000 + args.tokens * args.interval_ms / 1000 + 300,
    }
    # Every server process's code paths, pools and database connections: uvicorn's workers share one
    # listening socket, so one round may land on one process; three rounds reach them all.
    warm = [tally for _ in range(3) for tally in clients.run(spec, min(level, 64))]
    time.sleep(0.5)
    idle = target.rss()
    samples = [(time.monotonic(), idle)]
    upstream.reset()
    cpu = target.cpu()
    waits = cpu_wait(target.pids), cpu_wait(upstream.pids)
    tallies = clients.run(spec, level, lambda: samples.append((time.monotonic(), target.rss())))
    elapsed = clients.elapsed
    time.sleep(0.5)  # writes after the last event
    cpu = target.cpu() - cpu
    waits = cpu_wait(target.pids) - waits[0], cpu_wait(upstream.pids) - waits[1]
    pacing = upstream.stats()
    errors = [e for t in warm + tallies for e in t.errors]
    count = sum(t.error_count for t in warm + tallies)
    if target.name != "direct":
        bad = asyncio.run(_stored(target.base, [i for t in tallies for i in t.ids][:8]))
        errors += bad
        count += len(bad)
    tokens = sum(len(t.ttft) for t in tallies) * args.tokens
    # RSS with the most streams open (on a slow machine the last streams start after the first end).
    spans = [(t.spans[i], t.spans[i + 1]) for t in tallies for i in range(0, len(t.spans), 2)]
    most_open, rss_then = max(
        (sum(opened <= at <= closed for opened, closed in spans), rss) for at, rss in samples
    )
    merged = {key: sorted(v for t in tallies for v in getattr(t, key)) for key in ("ttft", "itl", "lag")}
    return {
        "tokens_s": tokens / elapsed,
        "cpu_us": cpu * 1e6 / tokens if tokens else math.nan,
        **{key: [1000 * q for q in _quantiles(values, (0.5, 0.99))] for key, values in merged.items()},
        "peak_mib": max(rss for _, rss in samples),
        "per_stream_kib": (rss_then - idle) * 1024 / most_open if most_open else math.nan,
        "most_open": most_open,
        "pacing_ms": pacing["pacing_ms"],
        "paths": pacing["paths"],
        "wait_pct": [100 * w / elapsed for w in waits],
        "errors": count,
        "first_errors": errors[:3],
        "log_errors": target.log_errors(),
    }


HEADER = (
    "| mode | streams | target | tokens/s | CPU µs/token | TTFT+ p50 / p99 ms | ITL+ p50 / p99 ms | "
    "lag p50 / p99 ms | peak RSS MiB | RSS/stream KiB | upstream pacing p50 / p99 / max ms | errors |"
)


def _row(mode: str, level: int, name: str, r: dict[str, Any] | None) -> str:
    if r is None:
        return f"| {mode} | {level} | {name} | n/a |  |  |  |  |  |  |  |  |"
    ttft, itl, lag, pacing = r["ttft"], r["itl"], r["lag"], r["pacing_ms"]
    return (
        f"| {mode} | {level} | {name} | {r['tokens_s']:.0f} | {r['cpu_us']:.1f} | {ttft[0]:.1f} / {ttft[1]:.1f} | "
        f"{itl[0]:.2f} / {itl[1]:.2f} | {lag[0]:.2f} / {lag[1]:.2f} | {r['peak_mib']:.0f} | "
        f"{r['per_stream_kib']:.1f} ({r['most_open']} open) | "
        f"{pacing[0]:.2f} / {pacing[1]:.2f} / {pacing[2]:.2f} | {r['errors']} |"
    )


def _raise_fd_limit(streams: int) -> None:
    """Each stream holds a client, a server and an upstream socket (two on the gateway)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < 3 * streams + 1024:
        print(f"(RLIMIT_NOFILE hard limit {hard}: {streams} streams may run out of descriptors)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reference", default="/work/ref-venv/bin/agentic-server")
    parser.add_argument(
        "--levels", default="", help="streams at once, comma-separated (default 256,1024,4096)"
    )
    parser.add_argument("--quick", action="store_true", help="levels 16,64 and 50 tokens (unless given)")
    parser.add_argument("--tokens", type=int, default=0, help="tokens a stream (default 200)")
    parser.add_argument("--first-ms", type=float, default=50.0)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument(
        "--postgres",
        default="",
        help="a PostgreSQL server URL: fresh bench_realistic_* databases there (default SQLite files)",
    )
    parser.add_argument("--targets", default="gateway,reference,direct")
    parser.add_argument("--modes", default="sse,ws")
    parser.add_argument(
        "--clients", type=int, default=0, help="load generator processes (default 1 per 512 streams, up to 8)"
    )
    parser.add_argument(
        "--upstream-procs",
        type=int,
        default=0,
        help="upstream processes (default 1 per 1,024 streams, up to 4)",
    )
    args = parser.parse_args()
    levels = [int(n) for n in (args.levels or ("16,64" if args.quick else "256,1024,4096")).split(",")]
    args.tokens = args.tokens or (50 if args.quick else 200)
    _raise_fd_limit(max(levels))
    targets = args.targets.split(",")
    if "reference" in targets and not Path(args.reference).exists():
        print(f"(no reference at {args.reference!r}: left out)")
        targets.remove("reference")

    upstream = Upstream(args.upstream_procs or min(4, math.ceil(max(levels) / 1024)), args)
    clients = Clients(args.clients or min(8, math.ceil(max(levels) / 512)))
    print(
        f"paced upstream: {len(upstream.pids)} process(es), first token {args.first_ms:g} ms, then every "
        f"{args.interval_ms:g} ms, {args.tokens} tokens; {len(clients.controls)} client process(es); "
        f"{os.cpu_count()} CPUs; store: {'PostgreSQL' if args.postgres else 'SQLite'}",
        flush=True,
    )
    rows: list[str] = []
    results: dict[tuple[str, int, str], dict[str, Any] | None] = {}
    paths: dict[str, dict[str, int]] = {}
    total_errors = 0
    with tempfile.TemporaryDirectory(prefix="bench-realistic-") as tmp:
        try:
            for mode in args.modes.split(","):
                for level in levels:
                    for name in targets:
                        result: dict[str, Any] | None = None
                        if not (mode == "ws" and name == "direct"):
                            target = Target(name, upstream, args, Path(tmp) / f"{mode}-{level}-{name}")
                            try:
                                if mode == "sse" or asyncio.run(_ws_supported(target.base)):
                                    result = cell(target, mode, level, clients, upstream, args)
                            finally:
                                target.stop()
                        results[mode, level, name] = result
                        rows.append(_row(mode, level, name, result))
                        print(rows[-1], flush=True)
                        if result is None:
                            continue
                        for path, count in result["paths"].items():
                            paths.setdefault(name, {})[path] = paths.get(name, {}).get(path, 0) + count
                        total_errors += result["errors"]
                        server_wait, upstream_wait = result["wait_pct"]
                        print(
                            f"    waiting for a CPU, per second of the cell: server {server_wait:.0f} %, "
                            f"upstream {upstream_wait:.0f} %",
                            flush=True,
                        )
                        for error in result["first_errors"]:
                            print(f"    error: {error}", flush=True)
                        for line in result["log_errors"][:5]:
                            print(f"    {name} log: {line[:300]}", flush=True)
        finally:
            clients.close()
    print()
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    for (mode, level, name), r in results.items():
        ref = results.get((mode, level, "reference"))
        if name == "gateway" and r and ref:
            print(
                f"{mode} {level}: gateway / reference: CPU per token {r['cpu_us'] / ref['cpu_us']:.2f}, "
                f"RSS per stream {r['per_stream_kib'] / ref['per_stream_kib']:.2f}"
            )
    for name, counts in paths.items():
        print(f"{name} called upstream: " + ", ".join(f"{p} x{c}" for p, c in sorted(counts.items())))
    print(f"total errors: {total_errors}" + ("  (a failing result)" if total_errors else ""))
    sys.exit(1 if total_errors else 0)


if __name__ == "__main__":
    main()
