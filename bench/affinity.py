"""Placement bench: KV-cache-affine placement of agent lineages on Celery inference workers against
Celery's default placement (the shared ``inference`` queue), in one run (issue 61).

Two (``--workers``) Celery inference workers (``-P threads``), each hosting real vLLM on CPU with the
tiny demo model (prefix caching on, one core each: ``VLLM_CPU_OMP_THREADS_BIND``), Redis, and the
gateway as ``make run`` starts it (``manage.py serve``, ``REDIS_URL`` set, SQLite). Workload: ``--chains`` concurrent
agent chains of ``--turns`` streamed turns each through ``POST /v1/responses``. Every turn sends the
long shared system prompt (``instructions``) and a function tool; turns after the first continue the
previous response with ``previous_response_id`` and add a ``function_call`` item (the call the agent
made), its ``function_call_output`` (a few hundred tokens of tool output) and a short user message.

The two modes run one after the other, the gateway restarted between them with
``GATEWAY_ROUTING_AFFINITY=true`` / ``false``; the workers stay up, and each mode has its own system
prompt (it starts with the mode's name), so no prefix of one mode is cached for the other: vLLM's prefix
cache hashes blocks as a chain from the first token. The engines' KV cache is sized so that one
worker holds the working set of the chains affine placement gives it (``--kv-chains``, default half
the chains plus a margin), not of all of them: cache capacity is the scarce resource.

``--workers N`` runs N workers (engines bound to the cores in turn; the KV cache then holds
chains/N + 25 %).

Per mode: requests, errors, the fraction of prompt tokens served from the prefix cache (sum of
``cached_tokens`` / sum of ``input_tokens``, vLLM's own usage as the gateway passes it through), time
to first token p50/p99 (request sent to the first ``response.output_text.delta``; a turn that streams
no text counts its first delta event of any output item, and the count is shown), total time; the
requests each worker served (the ``outcomes`` of its Redis heartbeat), each request's time in its
worker (the worker's log line), the gateway's placement outcomes (``/metrics``) and the lineages'
placement records per worker (Redis); then the ratios affine / default. Target: cached fraction at least
2x, TTFT p50 lower. Any error fails the run (exit 1). Two bounds frame the cached fraction: the
ceiling (every chain's previous prompt and answer cached, only the new items computed) and the floor
(only the shared system prompt and tools cached); and the cached fraction by turn shows where a mode
loses. With N workers, default placement sends a turn to the worker that served the chain's previous
turn 1/N of the time, and the other worker may still hold an older prefix, so it sits at least 1/N
of the way from the floor to the ceiling: with two workers the 2x target needs it at the floor.

Run it in the inference venv, Redis on 127.0.0.1 (db 7 by default, flushed at start):

    .venv-inference/bin/python bench/affinity.py [--chains 32] [--turns 10] [--modes default,affine]
        [--workers 2] [--kv-chains N] [--redis-url redis://127.0.0.1:6379/7] [--keep]

About 6 to 7 minutes on 2 cores: 1.5 to 2.5 to start the engines, 1.5 to 2 per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import GatewayProcess, child_env  # noqa: E402

SERVED = "tiny-chat"
# The tiny model's rotary embeddings do not depend on its position limit: raised so ten turns fit.
MAX_POSITIONS = 8192
TOOL = {
    "type": "function",
    "name": "run_shell",
    "description": "Run a shell command in the project's sandbox and return its standard output.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "the command line"}},
        "required": ["command"],
    },
}
WORDS = [
    "build",
    "test",
    "module",
    "request",
    "worker",
    "gateway",
    "cache",
    "token",
    "stream",
    "queue",
    "lineage",
    "placement",
    "engine",
    "response",
    "config",
    "error",
    "retry",
    "timeout",
    "upstream",
    "history",
    "prompt",
    "server",
    "client",
    "thread",
    "process",
    "memory",
    "block",
    "prefix",
    "session",
    "schema",
    "record",
    "update",
    "delete",
    "create",
    "index",
    "commit",
    "branch",
    "merge",
]
COMMANDS = ["ls -la src", "pytest -q tests/unit", "git diff --stat", "grep -rn TODO .", "cat setup.cfg"]


# -- processes -----------------------------------------------------------------------------------
def engine_env(model: Path, args: argparse.Namespace) -> dict[str, str]:
    return {
        "MODEL": str(model),
        "GATEWAY_INFERENCE_SERVED_MODEL_NAME": SERVED,
        "GATEWAY_INFERENCE_DTYPE": "bfloat16",
        "GATEWAY_INFERENCE_MAX_MODEL_LEN": str(args.max_model_len),
        "GATEWAY_INFERENCE_KV_CACHE_MEMORY_BYTES": str(args.kv_bytes),
        "GATEWAY_INFERENCE_ENFORCE_EAGER": "true",
        "GATEWAY_INFERENCE_TOOL_CALL_PARSER": "hermes",
        "GATEWAY_INFERENCE_ENABLE_AUTO_TOOL_CHOICE": "true",
        "GATEWAY_INFERENCE_HEARTBEAT_INTERVAL_S": "0.5",
        "GATEWAY_INFERENCE_WORKER_LOST_AFTER_S": "3.0",
    }


class Worker:
    """``celery -A gateway worker -Q inference -P threads`` with its engine bound to one core."""

    def __init__(self, name: str, core: str, model: Path, args: argparse.Namespace, log: Path) -> None:
        env = child_env(engine_env(model, args))
        # The gateway's database (the worker's start-up lease sweep reads it).
        env["GATEWAY_SERVER_DATA_DIR"] = str(args.data_dir)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override the KV size set here
        env.update(
            {
                "REDIS_URL": args.redis_url,
                "PYTHONUNBUFFERED": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "HF_HUB_OFFLINE": "1",
                # One engine per core: vLLM binds its OpenMP threads to this list.
                "VLLM_CPU_OMP_THREADS_BIND": core,
                "OMP_NUM_THREADS": "1",
            }
        )
        self.name = name
        self.log_path = log
        self.log = log.open("w")
        cmd = [sys.executable, "-m", "celery", "-A", "gateway", "worker", "-Q", "inference", "-P", "threads"]
        cmd += [
            "-c",
            str(args.chains),
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "INFO",
        ]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def text(self, start: int = 0) -> str:
        with self.log_path.open("rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    def offset(self) -> int:
        return self.log_path.stat().st_size

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def heartbeats(client: redis.Redis) -> dict[int, dict[str, Any]]:
    """The live workers' heartbeat records, by process id (the worker id is ``host:pid``)."""
    out = {}
    for member in client.smembers("inference:workers"):
        name = member.decode() if isinstance(member, bytes) else str(member)
        raw = client.get(f"inference:worker:{name}")
        if raw:
            info = json.loads(raw)
            out[int(str(info["worker"]).rsplit(":", 1)[1])] = info
    return out


def wait_workers(workers: list[Worker], client: redis.Redis, timeout: float = 420) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for w in workers:
            if w.proc.poll() is not None:
                raise RuntimeError(f"worker {w.name} exited {w.proc.returncode}:\n{w.text()[-4000:]}")
        if len(heartbeats(client)) >= len(workers):
            return
        time.sleep(0.5)
    raise TimeoutError("workers not registered:\n" + "\n".join(w.text()[-2000:] for w in workers))


def build_model(work: Path) -> Path:
    from inference_app.engine.tiny_model import build_tiny_model

    model = build_tiny_model(work / SERVED)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = MAX_POSITIONS
    (model / "config.json").write_text(json.dumps(config, indent=2))
    tok = json.loads((model / "tokenizer_config.json").read_text())
    tok["model_max_length"] = MAX_POSITIONS
    (model / "tokenizer_config.json").write_text(json.dumps(tok, indent=2))
    return model


def shared_prefix(system: str, tokenizer: Any) -> int:
    """Tokens of the prompt every turn of every chain starts with: the rendered system prompt and tools
    (the common prefix of two chat-template renders that differ only in the user message)."""
    tools = [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]
    a, b = (
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": text}],
                tools=tools,
                tokenize=False,
            ),
            add_special_tokens=False,
        )
        for text in ("one", "two")
    )
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def kv_bytes_per_token(model: Path) -> int:
    """K and V of every layer for one token, bf16."""
    c = json.loads((model / "config.json").read_text())
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * 2


# -- workload ------------------------------------------------------------------------------------
def system_prompt(mode: str, tokens: int, tokenizer: Any) -> str:
    """A long, shared agent system prompt; it starts with the mode's name, so the modes share no
    cached prefix."""
    rng = random.Random(7)
    lines = [f"[{mode}] You are a coding agent working in a software repository on behalf of a user."]
    rules = [
        "Read the relevant files before you change them, and keep every change small and reviewed.",
        "Run the tests after each change; when a test fails, read its output and fix the cause.",
        "Use the run_shell tool for commands; never guess at a file's contents or a command's output.",
        "Explain what you did in a few plain sentences when the task is done, and stop there.",
    ]
    n = 0
    while len(tokenizer.encode("\n".join(lines))) < tokens:
        n += 1
        topic = " ".join(rng.choice(WORDS) for _ in range(6))
        lines.append(f"Rule {n}: {rules[n % len(rules)]} This applies to {topic}.")
    return "\n".join(lines)


def tool_output(chain: int, turn: int, tokens: int, tokenizer: Any) -> str:
    rng = random.Random(chain * 1000 + turn)
    lines: list[str] = []
    while len(tokenizer.encode("\n".join(lines))) < tokens:
        path = "/".join(rng.choice(WORDS) for _ in range(3))
        lines.append(f"{path}.py:{rng.randint(1, 999)}: {' '.join(rng.choice(WORDS) for _ in range(5))}")
    return "\n".join(lines)


@dataclass
class Turn:
    ttft: float | None = None
    created: float | None = None  # request sent to response.created (the gateway's own part, mostly)
    first_kind: str = ""  # "text" or the event type of the first delta
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    number: int = 0  # the turn's place in its chain, from 1
    # Prompt tokens a cache could hold at best: the chain's previous prompt and answer (turn 1: the shared prefix).
    reusable: int = 0
    error: str = ""


@dataclass
class Tally:
    turns: list[Turn] = field(default_factory=list)

    def errors(self) -> list[str]:
        return [t.error for t in self.turns if t.error]


async def one_turn(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[Turn, str | None]:
    turn = Turn()
    response_id = None
    started = time.perf_counter()
    completed = False
    try:
        async with client.stream("POST", f"{url}/v1/responses", json=body) as r:
            if r.status_code != 200:
                turn.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return turn, None
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                kind = event.get("type", "")
                if turn.ttft is None and kind.endswith(".delta"):
                    turn.ttft = time.perf_counter() - started
                    turn.first_kind = "text" if kind == "response.output_text.delta" else kind
                elif kind == "response.created":
                    response_id = event["response"]["id"]
                    turn.created = time.perf_counter() - started
                elif kind in ("response.completed", "response.incomplete"):
                    # The random-weight model rarely ends an answer itself: max_output_tokens does.
                    reason = (event["response"].get("incomplete_details") or {}).get("reason")
                    if kind == "response.incomplete" and reason != "max_output_tokens":
                        turn.error = f"incomplete: {reason}"
                    completed = True
                    usage = event["response"].get("usage") or {}
                    turn.input_tokens = int(usage.get("input_tokens") or 0)
                    turn.output_tokens = int(usage.get("output_tokens") or 0)
                    details = usage.get("input_tokens_details") or {}
                    turn.cached_tokens = int(details.get("cached_tokens") or 0)
                elif kind in ("error", "response.failed"):
                    turn.error = f"{kind}: {json.dumps(event)[:300]}"
    except Exception as exc:  # counted: a run with errors is a failing result
        turn.error = f"{type(exc).__name__}: {exc}"[:300]
    if not turn.error and not completed:
        turn.error = "stream ended without response.completed or .incomplete"
    if not turn.error and not turn.input_tokens:
        turn.error = "no usage in response.completed"
    return turn, response_id


async def chain(
    client: httpx.AsyncClient,
    url: str,
    index: int,
    system: str,
    args: argparse.Namespace,
    tokenizer: Any,
    tally: Tally,
) -> None:
    await asyncio.sleep(index * args.stagger_ms / 1000)
    previous: str | None = None
    reusable = 0
    rng = random.Random(index)
    for turn_no in range(args.turns):
        body: dict[str, Any] = {
            "model": SERVED,
            "instructions": system,
            "tools": [TOOL],
            "stream": True,
            "store": True,
            "temperature": 0,
            "max_output_tokens": args.max_output_tokens,
        }
        if previous is not None and args.tool_ms:
            await asyncio.sleep(rng.uniform(0, 2 * args.tool_ms) / 1000)  # the agent runs the tool
        if previous is None:
            body["input"] = [
                {
                    "role": "user",
                    "content": f"Task {index}: the tests of module {rng.choice(WORDS)} fail; fix them.",
                }
            ]
        else:
            call_id = f"call_{index}_{turn_no}"
            body["previous_response_id"] = previous
            body["input"] = [
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "run_shell",
                    "arguments": json.dumps({"command": rng.choice(COMMANDS)}),
                },
                {
                    "type": "function_call_output",
                    "call_id": call_id,
                    "output": tool_output(index, turn_no, args.tool_tokens, tokenizer),
                },
                {"role": "user", "content": f"Step {turn_no}: look at that output and go on."},
            ]
        turn, response_id = await one_turn(client, url, body)
        turn.number = turn_no + 1
        turn.reusable = reusable
        reusable = turn.input_tokens + turn.output_tokens  # vLLM caches the answer's blocks too
        tally.turns.append(turn)
        if turn.error:
            return  # the chain cannot continue without its previous response
        previous = response_id


# -- one mode ------------------------------------------------------------------------------------
@dataclass
class ModeResult:
    mode: str
    tally: Tally
    wall: float
    served: dict[str, int]
    placements: dict[str, int]  # the gateway's gateway_inference_placements_total by outcome
    lineages: dict[str, int]  # placement records in Redis at the end, by worker
    load: tuple[float, float]  # the machine's 1-minute load average before and after
    shared: int  # tokens of the prompt prefix every request of the mode shares (system prompt, tools)
    engine_times: list[float]  # each request's time in its worker (task start to end), from the logs

    def cached_fraction(self) -> float:
        total = sum(t.input_tokens for t in self.tally.turns)
        return sum(t.cached_tokens for t in self.tally.turns) / total if total else 0.0

    def ttfts(self) -> list[float]:
        return sorted(t.ttft for t in self.tally.turns if t.ttft is not None)

    def after_created(self) -> list[float]:
        """First token after response.created: the model round's part (dispatch, queue, prefill)."""
        return sorted(
            t.ttft - t.created for t in self.tally.turns if t.ttft is not None and t.created is not None
        )


# The worker's log line per request: the time from the task's start to its last chunk.
ENGINE_TIME = re.compile(r"inference request \w+ POST /v1/responses: ok in ([\d.]+)s")


def socket_host() -> str:
    import socket

    return socket.gethostname()


def placement_counts(url: str) -> dict[str, int]:
    """The gateway's placement counter by outcome (hit, moved, new, fallback), from ``/metrics``."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out = {}
    for m in re.finditer(r'^gateway_inference_placements_total\{outcome="(\w+)"\} ([\d.e+]+)$', text, re.M):
        out[m.group(1)] = int(float(m.group(2)))
    return out


def quantile(ordered: list[float], q: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_mode(
    mode: str,
    workers: list[Worker],
    client: redis.Redis,
    model: Path,
    args: argparse.Namespace,
    work: Path,
    tokenizer: Any,
) -> ModeResult:
    affine = mode == "affine"
    env = {
        "REDIS_URL": args.redis_url,
        "GATEWAY_ROUTING_AFFINITY": "true" if affine else "false",
        "GATEWAY_SERVER_DATA_DIR": str(work / "var"),
        "LOG_LEVEL": "WARNING",
        "GATEWAY_INFERENCE_SERVED_MODEL_NAME": SERVED,
        "GATEWAY_INFERENCE_HEARTBEAT_INTERVAL_S": "0.5",
        "GATEWAY_INFERENCE_WORKER_LOST_AFTER_S": "3.0",
    }
    gateway = GatewayProcess(env, log=work / f"gateway-{mode}.log").wait(60)
    try:
        system = system_prompt(mode, args.system_tokens, tokenizer)
        limits = httpx.Limits(max_connections=args.chains + 4, max_keepalive_connections=args.chains + 4)

        async def warm_up() -> None:
            """One short request: the gateway is up and reaches a worker."""
            async with httpx.AsyncClient(timeout=600) as http:
                body = {"model": SERVED, "input": f"warm-up {mode}", "stream": True, "max_output_tokens": 2}
                warm, _ = await one_turn(http, gateway.url, body)
                if warm.error:
                    raise RuntimeError(f"warm-up failed: {warm.error}")

        async def load() -> tuple[Tally, float]:
            tally = Tally()
            async with httpx.AsyncClient(timeout=600, limits=limits) as http:
                started = time.perf_counter()
                await asyncio.gather(
                    *(chain(http, gateway.url, i, system, args, tokenizer, tally) for i in range(args.chains))
                )
                return tally, time.perf_counter() - started

        load_before = os.getloadavg()[0]
        asyncio.run(warm_up())
        time.sleep(1.0)  # the warm-up is in the workers' next heartbeat
        before = {pid: dict(info.get("outcomes", {})) for pid, info in heartbeats(client).items()}
        offsets = [w.offset() for w in workers]
        tally, wall = asyncio.run(load())
        time.sleep(1.0)
        placements = placement_counts(gateway.url)
        lineages: dict[str, int] = {}
        names = {f"{socket_host()}:{w.proc.pid}": w.name for w in workers}
        for key in client.scan_iter("inference:placement:*"):
            raw = client.get(key)
            worker = raw.decode() if isinstance(raw, bytes) else str(raw)
            lineages[names.get(worker, worker)] = lineages.get(names.get(worker, worker), 0) + 1
        for key in client.scan_iter("inference:placement:*"):
            client.delete(key)  # the next mode starts with no record
        after = heartbeats(client)
        engine_times = sorted(
            float(t)
            for w, off in zip(workers, offsets, strict=True)
            for t in ENGINE_TIME.findall(w.text(off))
        )
        served = {}
        for w in workers:
            info = after.get(w.proc.pid, {})
            ok = int(info.get("outcomes", {}).get("ok", 0)) - int(before.get(w.proc.pid, {}).get("ok", 0))
            served[w.name] = ok
        return ModeResult(
            mode,
            tally,
            wall,
            served,
            placements,
            lineages,
            (load_before, os.getloadavg()[0]),
            shared_prefix(system, tokenizer),
            engine_times,
        )
    finally:
        gateway.stop()


# -- main ----------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chains", type=int, default=32)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--modes", default="default,affine")
    parser.add_argument(
        "--workers", type=int, default=2, help="inference workers (engines bound to cores in turn)"
    )
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--tool-tokens", type=int, default=250)
    parser.add_argument("--max-output-tokens", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=6144)
    parser.add_argument(
        "--kv-chains",
        type=float,
        default=0,
        help="chains whose final working set one worker's KV cache holds (default: chains/workers + 25%%)",
    )
    parser.add_argument(
        "--stagger-ms", type=float, default=50, help="chain i starts i * this after the first"
    )
    parser.add_argument(
        "--tool-ms",
        type=float,
        default=0,
        help="mean pause before each continuation (uniform 0 to 2x): tool time",
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) on success")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-affinity-"))
    model = build_model(work)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)

    # Sizes: a chain's prompt at its last turn, measured on a sample of the workload.
    system_len = len(tokenizer.encode(system_prompt("default", args.system_tokens, tokenizer)))
    prefix_len = shared_prefix(system_prompt("default", args.system_tokens, tokenizer), tokenizer)
    tool_len = prefix_len - system_len
    per_turn = (
        len(tokenizer.encode(tool_output(0, 1, args.tool_tokens, tokenizer))) + 60 + args.max_output_tokens
    )
    final_len = prefix_len + 50 + per_turn * args.turns
    shared = prefix_len
    if final_len > args.max_model_len:
        raise SystemExit(
            f"a chain's last prompt (~{final_len} tokens) exceeds --max-model-len {args.max_model_len}"
        )
    kv_chains = args.kv_chains or args.chains / args.workers * 1.25
    per_token = kv_bytes_per_token(model)
    working_set = shared + kv_chains * (final_len - shared)
    # vLLM needs room for one request of max_model_len at least.
    working_set = max(working_set, 1.1 * args.max_model_len)
    args.kv_bytes = int(working_set * per_token)
    print(
        f"workload: {args.chains} chains x {args.turns} turns; system prompt {system_len} tokens, tools "
        f"{tool_len}, +~{per_turn} tokens per turn (tool output {args.tool_tokens}), last prompt ~{final_len} "
        f"tokens; max_output_tokens {args.max_output_tokens}; chains start {args.stagger_ms:g} ms apart; tool pause {args.tool_ms:g} ms mean",
        flush=True,
    )
    print(
        f"KV cache per worker: GATEWAY_INFERENCE_KV_CACHE_MEMORY_BYTES={args.kv_bytes} "
        f"({args.kv_bytes / 2**20:.1f} MiB, {per_token} B/token, ~{int(working_set)} tokens: the working set "
        f"of {kv_chains:g} chains; all {args.chains} need ~{int(shared + args.chains * (final_len - shared))}); "
        f"max_model_len {args.max_model_len}",
        flush=True,
    )

    args.data_dir = work / "var"
    migrate_env = child_env({"GATEWAY_SERVER_DATA_DIR": str(args.data_dir)})
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=migrate_env, check=True
    )
    client = redis.Redis.from_url(args.redis_url)
    client.flushdb()  # this bench's own db: no queued task or placement record of an earlier run
    workers: list[Worker] = []
    results: list[ModeResult] = []
    try:
        cores = sorted(os.sched_getaffinity(0))
        for i in range(args.workers):
            name = f"inf-{chr(ord('a') + i)}"
            workers.append(Worker(name, str(cores[i % len(cores)]), model, args, work / f"{name}.log"))
        t0 = time.monotonic()
        wait_workers(workers, client)
        print(f"workers up in {time.monotonic() - t0:.0f}s", flush=True)
        for w in workers:
            blocks = re.findall(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens", w.text())
            if blocks:
                print(f"  {w.name}: vLLM KV cache {blocks[-1]} tokens", flush=True)
        for mode in args.modes.split(","):
            print(f"mode {mode}: running", flush=True)
            result = run_mode(mode, workers, client, model, args, work, tokenizer)
            results.append(result)
            report(result)
    finally:
        for w in workers:
            w.stop()
        client.flushdb()
        client.close()

    print()
    print(
        "reference (agentic-api): not run. It has one upstream and no worker placement; it cannot reach "
        "Celery workers, and in front of one vLLM server every lineage meets the same cache, which "
        "measures that server's cache size, not a placement policy."
    )
    by_mode = {r.mode: r for r in results}
    errors = sum(len(r.tally.errors()) for r in results)
    if "affine" in by_mode and "default" in by_mode:
        a, d = by_mode["affine"], by_mode["default"]
        frac = a.cached_fraction() / d.cached_fraction() if d.cached_fraction() else float("inf")
        p50 = quantile(a.ttfts(), 0.5) / quantile(d.ttfts(), 0.5)
        print(
            f"affine/default: cached fraction {frac:.2f}x (target >= 2), TTFT p50 {p50:.2f}x (target < 1), "
            f"TTFT p99 {quantile(a.ttfts(), 0.99) / quantile(d.ttfts(), 0.99):.2f}x, model round's part of TTFT "
            f"p50 {quantile(a.after_created(), 0.5) / quantile(d.after_created(), 0.5):.2f}x, "
            f"total time {a.wall / d.wall:.2f}x"
        )
    if errors:
        print(f"FAILED: {errors} errors; logs in {work}")
        sys.exit(1)
    if args.keep:
        print(f"logs in {work}")
    else:
        subprocess.run(["rm", "-rf", str(work)], check=False)


def report(r: ModeResult) -> None:
    t = r.ttfts()
    not_text = sum(1 for x in r.tally.turns if x.first_kind and x.first_kind != "text")
    inp = sum(x.input_tokens for x in r.tally.turns)
    cached = sum(x.cached_tokens for x in r.tally.turns)
    print(
        f"  {r.mode}: requests {len(r.tally.turns)}, errors {len(r.tally.errors())}, cached fraction "
        f"{r.cached_fraction():.3f} ({cached}/{inp} tokens), TTFT p50 {quantile(t, 0.5) * 1000:.0f} ms "
        f"p99 {quantile(t, 0.99) * 1000:.0f} ms mean {sum(t) / max(1, len(t)) * 1000:.0f} ms (first delta not text: {not_text}), total {r.wall:.1f}s",
        flush=True,
    )
    firsts = sum(1 for x in r.tally.turns if not x.reusable)
    reusable = sum(x.reusable for x in r.tally.turns) + r.shared * max(0, firsts - len(r.served))
    # Every request but each worker's first can find the shared prefix cached.
    shared = r.shared * max(0, len(r.tally.turns) - len(r.served))
    print(
        f"    bounds: ceiling {reusable / inp if inp else 0:.3f} (each chain's previous prompt and answer cached, "
        f"the new part computed), floor ~{shared / inp if inp else 0:.3f} (only the shared system prompt and tools cached)",
        flush=True,
    )
    by_turn = []
    for n in range(1, max((x.number for x in r.tally.turns), default=0) + 1):
        of_n = [x for x in r.tally.turns if x.number == n]
        total = sum(x.input_tokens for x in of_n)
        by_turn.append(f"{sum(x.cached_tokens for x in of_n) / total:.2f}" if total else "-")
    print(f"    cached fraction by turn: {' '.join(by_turn)}", flush=True)
    c = sorted(x.created for x in r.tally.turns if x.created is not None)
    m = r.after_created()
    print(
        f"    TTFT split: request to response.created (the gateway's part: history, in_progress row) p50 "
        f"{quantile(c, 0.5) * 1000:.0f} ms p99 {quantile(c, 0.99) * 1000:.0f} ms; response.created to the first "
        f"delta (the model round) p50 {quantile(m, 0.5) * 1000:.0f} ms p99 {quantile(m, 0.99) * 1000:.0f} ms",
        flush=True,
    )
    e = r.engine_times
    print(
        f"    requests per worker (their heartbeats' outcome counts): {r.served}; time in the worker (task "
        f"start to end, {len(e)} requests) p50 {quantile(e, 0.5) * 1000:.0f} ms p99 {quantile(e, 0.99) * 1000:.0f} ms",
        flush=True,
    )
    print(
        f"    placements (gateway /metrics): {r.placements or 'none'}; lineage records per worker at the end: "
        f"{r.lineages or 'none'}; load average {r.load[0]:.1f} -> {r.load[1]:.1f}",
        flush=True,
    )
    for error in r.tally.errors()[:3]:
        print(f"    error: {error}", flush=True)


if __name__ == "__main__":
    main()
