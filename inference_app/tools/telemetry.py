"""Each gateway tool call's span (``execute_tool {name}``, GenAI semantic conventions) and its
duration on ``gateway_tool_call_duration_seconds`` (``docs/operations.md``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from opentelemetry.trace import SpanKind

from gateway.core import metrics, spans
from inference_app.tools.base import ToolCall, ToolResult


async def traced(call: ToolCall, run: Callable[[ToolCall], Awaitable[ToolResult]]) -> ToolResult:
    """``run(call)`` inside its span (the current one: a Celery task it sends continues the trace),
    timed; a failed result marks the span failed with its error type."""
    started = time.perf_counter()
    with spans.tracer().start_as_current_span(
        f"execute_tool {call.name}",
        kind=SpanKind.INTERNAL,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        recording = span.is_recording()
        if recording:
            span.set_attributes(
                {
                    spans.OPERATION: "execute_tool",
                    spans.TOOL_NAME: call.name,
                    spans.TOOL_CALL_ID: call.call_id,
                    spans.TOOL_TYPE: "datastore" if call.kind == "file_search" else "extension",
                    "gateway.tool.kind": call.kind,
                }
            )
            if call.server_label:
                span.set_attribute("gateway.mcp.server_label", call.server_label)
            if spans.capture_content():
                span.set_attribute(spans.TOOL_ARGUMENTS, spans.content(call.arguments))
        try:
            result = await run(call)
        except BaseException as exc:
            metrics.observe_tool_call(call.kind, False, time.perf_counter() - started)
            spans.ended_by(span, exc)
            raise
        ok = result.ok
        metrics.observe_tool_call(call.kind, ok, time.perf_counter() - started)
        if recording:
            if not ok:
                spans.fail(span, result.error_type or "tool_error")
            if spans.capture_content():
                span.set_attribute(spans.TOOL_RESULT, spans.content(result.output))
    return result
