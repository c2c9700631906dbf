"""The gateway's own spans: model rounds, tool calls, agents, compaction and storage writes, named and
attributed after the OpenTelemetry GenAI semantic conventions (``docs/operations.md``, "Spans").

Only the ``opentelemetry.trace`` API is used: with no tracer provider installed every span is a
non-recording no-op, and attributes are built only for a recording span. Content (prompts,
completions, tool arguments and results) is added only with ``[observability] capture_content``,
each value cut to :data:`MAX_CONTENT_CHARS`; credentials never.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

from gateway.core.config import get_config

TRACER_NAME = "agentic-gateway"
_cached: tuple[TracerProvider, Tracer] | None = None


def tracer() -> Tracer:
    """The gateway's tracer from the provider installed now: a no-op one without a provider, and a
    provider installed or replaced later (start-up, tests) is followed. The API's own proxy tracer
    would stay with the first provider it met."""
    global _cached
    provider = trace.get_tracer_provider()
    cached = _cached
    if cached is None or cached[0] is not provider:
        cached = _cached = (provider, provider.get_tracer(TRACER_NAME))
    return cached[1]


# The semantic conventions' names (gen_ai registry, v1.37+).
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_NAME = "gen_ai.tool.name"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
AGENT_NAME = "gen_ai.agent.name"
ERROR_TYPE = "error.type"

# The upstream speaks the OpenAI API (vLLM or a compatible server); the semconv's value for it.
PROVIDER_NAME = "openai"
MAX_CONTENT_CHARS = 16 * 1024


def capture_content() -> bool:
    return get_config().observability.capture_content


def content(value: Any) -> str:
    """``value`` as the JSON a content attribute carries, cut to :data:`MAX_CONTENT_CHARS`."""
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    if len(text) > MAX_CONTENT_CHARS:
        return text[:MAX_CONTENT_CHARS] + "…[truncated]"
    return text


def fail(span: Span, error: BaseException | str) -> None:
    """Mark ``span`` failed with ``error.type`` (the exception's class name, or the given type)."""
    if not span.is_recording():
        return
    kind = error if isinstance(error, str) else type(error).__name__
    span.set_attribute(ERROR_TYPE, kind)
    message = None if isinstance(error, str) else str(error)[:1024] or None
    span.set_status(Status(StatusCode.ERROR, message))


def ended_by(span: Span, exc: BaseException) -> None:
    """A span's work raised ``exc``: a failure, unless the caller went away (closed or cancelled)."""
    if (
        isinstance(exc, (GeneratorExit, KeyboardInterrupt, SystemExit))
        or type(exc).__name__ == "CancelledError"
    ):
        if span.is_recording():
            span.set_attribute("gateway.cancelled", True)
        return
    fail(span, exc)


def current(span: Span) -> contextlib.AbstractContextManager[Span]:
    """``span`` as the current span for a block that does not yield (an ``await`` inside an async
    generator included: the context is restored before the generator gives control back)."""
    if not span.get_span_context().is_valid:  # no provider: nothing to make current
        return contextlib.nullcontext(span)
    return trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False)


class ModelRound:
    """The span of one upstream model call (``chat {model}``, kind CLIENT), its parent the current span."""

    __slots__ = ("model", "span")

    def __init__(self, model: str, *, operation: str = "chat", **attributes: Any) -> None:
        self.model = model
        self.span = tracer().start_span(f"{operation} {model}" if model else operation, kind=SpanKind.CLIENT)
        if self.span.is_recording():
            self.span.set_attributes(
                {OPERATION: operation, PROVIDER: PROVIDER_NAME, REQUEST_MODEL: model, **attributes}
            )

    @property
    def recording(self) -> bool:
        return self.span.is_recording()

    def answered(
        self,
        *,
        response_id: str | None,
        response_model: str | None,
        finish_reasons: list[str] | None,
        input_tokens: int | None,
        output_tokens: int | None,
    ) -> None:
        """What the upstream answered: its ids, why it stopped and this call's own usage."""
        span = self.span
        if not span.is_recording():
            return
        if response_id:
            span.set_attribute(RESPONSE_ID, response_id)
        if response_model:
            span.set_attribute(RESPONSE_MODEL, response_model)
        if finish_reasons:
            span.set_attribute(FINISH_REASONS, finish_reasons)
        if input_tokens is not None:
            span.set_attribute(INPUT_TOKENS, input_tokens)
        if output_tokens is not None:
            span.set_attribute(OUTPUT_TOKENS, output_tokens)

    def messages(self, instructions: Any, input_items: Any, output_items: Any) -> None:
        """The round's prompt and completion (only with capture_content; call only when recording)."""
        if not capture_content():
            return
        if instructions:
            self.span.set_attribute(SYSTEM_INSTRUCTIONS, content(instructions))
        self.span.set_attribute(INPUT_MESSAGES, content(input_items))
        self.span.set_attribute(OUTPUT_MESSAGES, content(output_items))

    def end(self) -> None:
        self.span.end()


@contextlib.contextmanager
def internal(name: str, **attributes: Any) -> Iterator[Span]:
    """A current INTERNAL span around a block that does not yield; an exception marks it failed."""
    span = tracer().start_span(name, kind=SpanKind.INTERNAL)
    try:
        with current(span):
            if attributes and span.is_recording():
                span.set_attributes(attributes)
            yield span
    except BaseException as exc:
        ended_by(span, exc)
        raise
    finally:
        span.end()
