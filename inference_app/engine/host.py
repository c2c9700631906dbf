"""The engine host: one vLLM engine per process, on a private event loop, serving many requests at once.

Runs in each Celery inference worker and in embedded mode. Every request is a coroutine on the
``inference-engine`` loop thread, so concurrent requests reach the engine together and continuous
batching works. :meth:`EngineHost.serve` calls vLLM's own OpenAI app in-process (``vllm_compat``),
so the bytes are ``vllm serve``'s. ``vllm`` is imported only when the engine starts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gateway.core.config import Config
from inference_app.upstream.types import DEMO_MODEL_NAME, is_demo_model, served_name

log = logging.getLogger("inference.engine")

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


def default_model_dir(config: Config | None = None) -> Path:
    """Where ``manage.py build_tiny_model`` puts the demo model: ``<data_dir>/models/tiny-chat``."""
    from gateway.core.config import get_config

    config = config or get_config()
    data_dir = Path(config.server.data_dir)
    if not data_dir.is_absolute():
        data_dir = ROOT / data_dir
    return data_dir / "models" / DEMO_MODEL_NAME


def resolve_model(config: Config) -> str:
    """``MODEL`` when set (a Hugging Face id or a path), else the built demo model."""
    return config.model or str(default_model_dir(config))


def serve_flags(config: Config) -> list[str]:
    """The ``vllm serve`` flags for this config (vLLM parses and validates them)."""
    inf = config.inference
    flags = ["--model", resolve_model(config), "--served-model-name", served_name(config)]
    flags += ["--dtype", inf.dtype]
    demo = is_demo_model(config)
    max_len = inf.max_model_len or (512 if demo else 0)
    if max_len:
        flags += ["--max-model-len", str(max_len)]
    if inf.tensor_parallel_size != 1:
        flags += ["--tensor-parallel-size", str(inf.tensor_parallel_size)]
    if inf.chat_template:
        flags += ["--chat-template", inf.chat_template]
    # The demo model's template writes Hermes-style <tool_call> blocks.
    parser = inf.tool_call_parser or ("hermes" if demo else "")
    if parser:
        flags += ["--tool-call-parser", parser]
    if inf.enable_auto_tool_choice or (demo and parser):
        flags += ["--enable-auto-tool-choice"]
    if inf.reasoning_parser:
        flags += ["--reasoning-parser", inf.reasoning_parser]
    if inf.generation_config != "auto":
        flags += ["--generation-config", inf.generation_config]
    if inf.override_generation_config:
        flags += ["--override-generation-config", inf.override_generation_config]
    kv = inf.kv_cache_memory_bytes or (128 * 1024 * 1024 if demo else 0)
    if kv:
        flags += ["--kv-cache-memory-bytes", str(kv)]
    if inf.gpu_memory_utilization != 0.9:
        flags += ["--gpu-memory-utilization", str(inf.gpu_memory_utilization)]
    if inf.enforce_eager or demo:
        flags += ["--enforce-eager"]
    # Placement follows the prefix cache, so it is on (vLLM's default where the model supports it,
    # explicit here); usage reports what it saved (``cached_tokens``), which vLLM leaves out unless asked.
    flags += ["--enable-prefix-caching", "--enable-prompt-tokens-details"]
    flags += list(inf.engine_args)  # last: an operator's own flag wins
    return flags


@dataclass
class Served:
    """One answer of vLLM's application: status and headers first, then the body as it is produced."""

    status: int
    headers: list[tuple[str, str]]
    chunks: AsyncIterator[bytes]
    disconnect: asyncio.Event = field(repr=False)


class EngineHost:
    """One vLLM engine and vLLM's OpenAI application, on a private event loop thread."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.flags = serve_flags(config)
        self.served_name = served_name(config)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="inference-engine", daemon=True)
        self._started: concurrent.futures.Future[None] | None = None
        self._lock = threading.Lock()
        self.engine: Any = None
        self.app: Any = None
        self.max_model_len = 0
        # How many sequences the engine batches at once: the worker's own load bound for placement.
        self.max_num_seqs = 0
        self.models_body = b""

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    # -- life cycle ------------------------------------------------------------------------------
    def start(self) -> concurrent.futures.Future[None]:
        """Start the engine once (idempotent); the future completes when it serves."""
        with self._lock:
            if self._started is None:
                self._thread.start()
                self._started = asyncio.run_coroutine_threadsafe(self.load(), self.loop)
            return self._started

    def start_blocking(self, timeout: float | None = None) -> None:
        self.start().result(timeout)

    @property
    def ready(self) -> bool:
        return self._started is not None and self._started.done() and self._started.exception() is None

    async def load(self) -> None:
        """Load the engine and vLLM's application (on the engine loop; :meth:`start` runs it once)."""
        from inference_app.engine import vllm_compat

        model = resolve_model(self.config)
        vllm_compat.prepare_environment(offline=Path(model).exists())
        if is_demo_model(self.config) and not (Path(model) / "config.json").exists():
            from inference_app.engine.tiny_model import build_tiny_model

            log.info("building the tiny demo model in %s", model)
            await asyncio.to_thread(build_tiny_model, Path(model))
        args = vllm_compat.parse_serve_args(self.flags)
        log.info("starting vLLM %s: %s", vllm_compat.vllm_version(), " ".join(self.flags))
        self.engine = await vllm_compat.start_engine(args)
        self.app = await vllm_compat.build_openai_app(self.engine, args)
        self.max_model_len = vllm_compat.engine_max_model_len(self.engine)
        self.max_num_seqs = vllm_compat.engine_max_num_seqs(self.engine)
        served = await self.serve("GET", "/v1/models", "", {}, b"")
        self.models_body = b"".join([chunk async for chunk in served.chunks])
        log.info("vLLM engine ready: serving %s", self.served_name)

    def run(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the engine loop (from any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    @property
    def dead(self) -> bool:
        from inference_app.engine import vllm_compat

        return self.engine is not None and vllm_compat.engine_is_dead(self.engine)

    @property
    def unfinished_requests(self) -> int:
        from inference_app.engine import vllm_compat

        return 0 if self.engine is None else vllm_compat.engine_unfinished_requests(self.engine)

    def shutdown(self) -> None:
        from inference_app.engine import vllm_compat

        if self.engine is not None:
            vllm_compat.shutdown_engine(self.engine, timeout=10)
            self.engine = None
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    # -- serving ---------------------------------------------------------------------------------
    async def serve(
        self,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str] | list[tuple[str, str]],
        body: bytes,
        *,
        disconnect: asyncio.Event | None = None,
    ) -> Served:
        """Call vLLM's application for one request, on the engine loop; returns at the status line. Setting
        ``disconnect`` at any time aborts the request in the engine."""
        loop = asyncio.get_running_loop()
        head: asyncio.Future[tuple[int, list[tuple[str, str]]]] = loop.create_future()
        queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        if disconnect is None:
            disconnect = asyncio.Event()
        items = headers.items() if isinstance(headers, Mapping) else headers
        raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in items]
        if body and not any(k == b"content-length" for k, _ in raw_headers):
            raw_headers.append((b"content-length", str(len(body)).encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("latin-1"),
            "root_path": "",
            "query_string": query.encode("latin-1"),
            "headers": raw_headers,
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
            "state": {},
        }
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
                head.set_result((int(message["status"]), pairs))
            elif kind == "http.response.body":
                chunk = message.get("body", b"")
                if chunk:
                    queue.put_nowait(chunk)
                if not message.get("more_body", False):
                    queue.put_nowait(None)
            if disconnect.is_set():
                # What a server does once the client is gone: the app's next send fails.
                raise OSError("client disconnected")

        async def call() -> None:
            try:
                await self.app(scope, receive, send)
            except BaseException as exc:  # reported to the reader, then logged
                if not disconnect.is_set():
                    log.exception("vLLM application failed on %s %s", method, path)
                if not head.done():
                    head.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
                queue.put_nowait(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            else:
                queue.put_nowait(None)

        task = loop.create_task(call())
        _app_calls.add(task)
        task.add_done_callback(_app_calls.discard)
        try:
            status, response_headers = await head
        except BaseException:
            disconnect.set()
            raise

        async def chunks() -> AsyncIterator[bytes]:
            complete = False
            try:
                while True:
                    item = await queue.get()
                    if item is None:
                        complete = True
                        return
                    if isinstance(item, BaseException):
                        complete = True
                        raise RuntimeError(f"vLLM failed mid-response: {item!r}") from item
                    yield item
            finally:
                if not complete:
                    # The reader stopped early: the client is gone; vLLM aborts the request.
                    disconnect.set()

        return Served(status, response_headers, chunks(), disconnect)


# Strong references to the in-flight application calls (the loop keeps only weak ones).
_app_calls: set[asyncio.Task[None]] = set()

_host: EngineHost | None = None
_host_lock = threading.Lock()


def get_engine_host(config: Config) -> EngineHost:
    """The process's engine host (created on first use; started by the caller)."""
    global _host
    with _host_lock:
        if _host is None:
            _host = EngineHost(config)
        return _host


def install_engine_host(host: EngineHost) -> None:
    """Make ``host`` the process's engine host, before anything starts one: a host of another kind
    behind the same seam (the tests' relay to a scripted upstream overrides ``load`` and ``serve``)."""
    global _host
    with _host_lock:
        _host = host


def shutdown_engine_host() -> None:
    """Stop the process's engine (tests; worker shutdown)."""
    global _host
    with _host_lock:
        host, _host = _host, None
    if host is not None:
        host.shutdown()
