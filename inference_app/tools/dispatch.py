"""Running a round of gateway tool calls: on Celery ``tools`` workers, or in-process.

With a broker each call is a task on the ``tools`` queue (a sandbox crash cannot touch the gateway;
calls carrying credentials run in process, since task payloads carry no secrets, and so do
``file_search`` calls, which read the principal's rows in the gateway's own database), awaited on the
result backend's pub/sub. Both modes bound concurrency and time per call; a failure becomes a failed
:class:`ToolResult`, and results come back in call order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from gateway.core.aio import keep_cancellation
from gateway.core.config import Config, get_config
from inference_app.tools.base import ToolCall, ToolResult
from inference_app.tools.telemetry import traced

logger = logging.getLogger(__name__)

TOOL_TASK_NAME = "inference_app.run_gateway_tool"
TOOLS_QUEUE = "tools"


async def execute_call(call: ToolCall, config: Config) -> ToolResult:
    """Run one call here and now (the body of both modes); unexpected errors become failures."""
    from inference_app.tools.file_search import run_file_search
    from inference_app.tools.mcp import call_mcp_tool
    from inference_app.tools.sandbox import run_code_interpreter
    from inference_app.tools.web_fetch import run_web_fetch
    from inference_app.tools.web_search import run_web_search

    try:
        if call.kind == "web_search":
            return await run_web_search(call, config)
        if call.kind == "web_fetch":
            return await run_web_fetch(call, config)
        if call.kind == "code_interpreter":
            return await run_code_interpreter(call, config)
        if call.kind == "mcp":
            return await call_mcp_tool(call, config)
        if call.kind == "file_search":
            return await run_file_search(call, config)
        return ToolResult.failure(call, f"unknown gateway tool kind {call.kind!r}")
    except Exception as exc:
        logger.exception("gateway tool %s failed", call.kind)
        return ToolResult.failure(call, f"{call.kind} failed: {exc.__class__.__name__}: {exc}")


def timeout_result(call: ToolCall, timeout_s: float) -> ToolResult:
    return ToolResult.failure(call, f"{call.kind} call timed out after {timeout_s:g} s", duration_s=timeout_s)


def carries_credentials(call: ToolCall) -> bool:
    """Whether ``call`` holds MCP header credentials; such a call runs in the gateway process, since a
    task message would leave them in the broker in clear."""
    return call.kind == "mcp" and bool(call.tool.get("headers"))


def runs_in_gateway(call: ToolCall) -> bool:
    """Whether ``call`` runs in the gateway process even with a broker: credentials (above), or a
    ``file_search``, which is database queries on the principal's own stores (a task would add a
    round trip and put the owner in a broker message, for no isolation gained)."""
    return carries_credentials(call) or call.kind == "file_search"


async def run_in_process(call: ToolCall, config: Config) -> ToolResult:
    timeout = config.tools.call_timeout_s
    try:
        async with asyncio.timeout(timeout):
            return await execute_call(call, config)
    except TimeoutError:
        return timeout_result(call, timeout)


class CeleryDispatcher:
    """Sends calls to the ``tools`` queue and awaits their results without blocking the loop."""

    def __init__(self, app: Any, config: Config) -> None:
        import redis.asyncio as aioredis

        self.app = app
        self.config = config
        backend_url = app.conf.result_backend or config.redis_url
        self.redis = aioredis.Redis.from_url(backend_url)

    async def close(self) -> None:
        await self.redis.aclose()

    async def run(self, call: ToolCall) -> ToolResult:
        timeout = self.config.tools.call_timeout_s
        started = time.monotonic()
        backend = self.app.backend
        pubsub = self.redis.pubsub()
        task_id: str | None = None
        try:
            # Subscribe before sending: the worker publishes on the result key when it stores it.
            from celery.utils import uuid

            task_id = uuid()
            key = backend.get_key_for_task(task_id)
            await keep_cancellation(pubsub.subscribe(key))
            self.app.send_task(
                TOOL_TASK_NAME,
                args=[call.to_payload()],
                task_id=task_id,
                queue=TOOLS_QUEUE,
                # A call nobody picked up before its deadline is dropped by the worker.
                expires=timeout,
                # The payload may hold request-scoped MCP credentials: keep them out of events/logs.
                argsrepr=f"({call.kind} call {call.call_id})",
                kwargsrepr="{}",
            )
            async with asyncio.timeout(timeout):
                meta = await self._wait(key, pubsub)
        except TimeoutError:
            if task_id is not None:
                with contextlib.suppress(Exception):
                    self.app.control.revoke(task_id)
            return timeout_result(call, timeout)
        except Exception as exc:
            return ToolResult.failure(
                call, f"{call.kind} could not be dispatched: {exc.__class__.__name__}: {exc}"
            )
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            if task_id is not None:
                # Results hold tool output: nothing stays in Redis once the gateway has it.
                with contextlib.suppress(Exception):
                    await self.redis.delete(backend.get_key_for_task(task_id))
        status = meta.get("status")
        if status == "SUCCESS" and isinstance(meta.get("result"), dict):
            return ToolResult.from_payload(meta["result"])
        detail = meta.get("result")
        if isinstance(detail, dict):
            detail = f"{detail.get('exc_type', 'error')}: {detail.get('exc_message', '')}"
        logger.warning("tool task %s ended %s after %.2fs", task_id, status, time.monotonic() - started)
        return ToolResult.failure(call, f"{call.kind} worker failed ({status}): {detail}")

    async def _wait(self, key: bytes | str, pubsub: Any) -> dict[str, Any]:
        backend = self.app.backend
        stored = await keep_cancellation(self.redis.get(key))
        while stored is None:
            message = await keep_cancellation(pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0))
            if message is not None and message.get("type") == "message":
                stored = message["data"]
            elif message is None:
                # A missed publish (reconnect) must not hang the call: re-read the key.
                stored = await keep_cancellation(self.redis.get(key))
        meta = backend.decode_result(stored)
        if meta.get("status") not in ("SUCCESS", "FAILURE", "REVOKED"):
            return await self._wait_terminal(key, pubsub, meta)
        return dict(meta)

    async def _wait_terminal(self, key: bytes | str, pubsub: Any, meta: Any) -> dict[str, Any]:
        """Skip intermediate states (STARTED, RETRY) until a terminal one arrives."""
        backend = self.app.backend
        while meta.get("status") not in ("SUCCESS", "FAILURE", "REVOKED"):
            message = await keep_cancellation(pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0))
            raw = (
                message["data"]
                if message and message.get("type") == "message"
                else await keep_cancellation(self.redis.get(key))
            )
            if raw is not None:
                meta = backend.decode_result(raw)
        return dict(meta)


async def run_gateway_calls(
    calls: Sequence[ToolCall], *, config: Config | None = None, celery_app: Any = None
) -> list[ToolResult]:
    """Run one round of gateway calls (Celery ``tools`` tasks with a broker, else in-process); results in
    call order, failures as failed results."""
    config = config or get_config()
    if not calls:
        return []
    limit = asyncio.Semaphore(config.tools.max_concurrent_gateway_calls)
    dispatcher: CeleryDispatcher | None = None
    if config.broker_enabled and not all(runs_in_gateway(c) for c in calls):
        if celery_app is None:
            from inference_app.upstream.celery_config import client_app

            celery_app = client_app(config, "gateway-tools-client")
        dispatcher = CeleryDispatcher(celery_app, config)

    async def one(call: ToolCall) -> ToolResult:
        async with limit:
            if dispatcher is not None and not runs_in_gateway(call):
                return await dispatcher.run(call)
            return await run_in_process(call, config)

    try:
        return list(await asyncio.gather(*(traced(c, one) for c in calls)))
    finally:
        if dispatcher is not None:
            await dispatcher.close()
