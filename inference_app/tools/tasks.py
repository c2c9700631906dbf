"""Celery tasks of the ``tools`` queue: one serialized gateway tool call in, its result out.
Nothing is retried: a failed call is a result the model sees (a retry could repeat a side effect)."""

from __future__ import annotations

import asyncio
from typing import Any

from celery import shared_task

from gateway.core.config import get_config
from inference_app.tools.base import ToolCall
from inference_app.tools.dispatch import TOOL_TASK_NAME, run_in_process


@shared_task(name=TOOL_TASK_NAME)
def run_gateway_tool(payload: dict[str, Any]) -> dict[str, Any]:
    """Run one gateway tool call on this worker, bounded by ``[tools] call_timeout_s``."""
    call = ToolCall.from_payload(payload)
    result = asyncio.run(run_in_process(call, get_config()))
    return result.to_payload()
