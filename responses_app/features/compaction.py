"""Compaction: a long item history becomes a window of the user's messages plus one summary.

Triggers: ``POST /v1/responses/compact``, ``context_management`` thresholds (:func:`over_threshold`
before every round), and a ``compaction_trigger`` input item. The summary is one non-streaming round
through the executor's upstream (``[responses] compaction_prompt``). ``encrypted_content`` is plain
text; upstream, only the latest ``compaction`` item is kept, as an assistant message
(``docs/responses.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.core import errors, spans
from gateway.core.config import Config
from gateway.core.ids import new_id
from gateway.core.sse import StreamFailure
from inference_app.upstream import lineage
from responses_app.engine import upstream_events
from responses_app.engine.metering import Meter, failed_status
from responses_app.features import async_tools
from usage_app.tap import tokens

COMPACTION = "compaction"
TRIGGER = "compaction_trigger"

DEFAULT_PROMPT = (
    "Your context window is about to be replaced by a summary. Write that summary now: a "
    "self-contained handoff that lets you continue this conversation without the messages above. "
    "Keep the user's goals, constraints and preferences, decisions made and why, facts and "
    "results learned (file names, commands, values, tool outputs that matter), what is done, what "
    "is still open, and the next step. Leave out pleasantries and anything already settled that no "
    "longer matters. Answer with the summary only."
)

# The estimate (docs/responses.md): text as UTF-8 bytes / 4 rounded up, plus framing per item and
# per content part, plus a fixed allowance per image. Deterministic; not a model's tokenizer.
BYTES_PER_TOKEN = 4
ITEM_FRAMING_TOKENS = 4
PART_FRAMING_TOKENS = 2
IMAGE_TOKENS = 1024
# Fields that are identity or bookkeeping, not text the model reads.
_NOT_TEXT = frozenset({"id", "type", "status", "call_id", "role", "_gateway"})
_IMAGE_PART_TYPES = frozenset({"input_image", "image_url"})

# Request fields forwarded on the summary round (spec: request-scoped, only when set).
FORWARDED = ("prompt_cache_key", "prompt_cache_retention", "service_tier")


# --- context_management -------------------------------------------------------------------------


def compact_threshold(value: Any) -> int | None:
    """The threshold of a request's ``context_management`` (None: no automatic compaction); at most one
    ``compaction`` entry, and everything malformed is a 400 naming its ``param``."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise errors.invalid_type("context_management", "an array", value)
    threshold: int | None = None
    seen = False
    for index, entry in enumerate(value):
        param = f"context_management[{index}]"
        if not isinstance(entry, dict):
            raise errors.invalid_type(param, "an object", entry)
        kind = entry.get("type")
        if kind is None:
            raise errors.BadRequest(
                f"Missing required parameter: '{param}.type'.",
                param=f"{param}.type",
                code="missing_required_parameter",
            )
        if kind != COMPACTION:
            shown = f"'{kind}'" if isinstance(kind, str) else errors.json_type_name(kind)
            raise errors.BadRequest(
                f"Invalid value: {shown}. Supported values are: 'compaction'.",
                param=f"{param}.type",
                code="invalid_value",
            )
        for key in entry:
            if key not in ("type", "compact_threshold"):
                raise errors.BadRequest(
                    f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}", code="unknown_parameter"
                )
        if seen:
            raise errors.BadRequest(
                "Invalid 'context_management': at most one 'compaction' entry is allowed.",
                param=param,
                code="invalid_value",
            )
        seen = True
        raw = entry.get("compact_threshold")
        if raw is None:
            continue  # no threshold: the entry is ignored
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise errors.invalid_type(f"{param}.compact_threshold", "an integer", raw)
        if raw < 1:
            raise errors.BadRequest(
                f"Invalid '{param}.compact_threshold': integer below minimum value. Expected a value "
                f">= 1, but got {raw} instead.",
                param=f"{param}.compact_threshold",
                code="integer_below_min_value",
            )
        threshold = raw
    return threshold


def check_trigger_position(items: list[Any]) -> None:
    """A ``compaction_trigger`` must be the final input item (the SDK's contract), and only one."""
    last = len(items) - 1
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == TRIGGER and index != last:
            raise errors.BadRequest(
                "A 'compaction_trigger' item must be the final input item.",
                param=f"input[{index}]",
                code="invalid_value",
            )


def check_compaction_item(item: dict[str, Any], param: str) -> None:
    """A client's ``compaction`` item needs its summary text (``encrypted_content``)."""
    if not isinstance(item.get("encrypted_content"), str):
        raise errors.BadRequest(
            f"Missing required parameter: '{param}.encrypted_content'.",
            param=f"{param}.encrypted_content",
            code="missing_required_parameter",
        )


def has_trigger(items: Iterable[dict[str, Any]]) -> bool:
    return any(item.get("type") == TRIGGER for item in items)


# --- the estimate -------------------------------------------------------------------------------


def estimate_tokens(items: Iterable[dict[str, Any]], instructions: str | None = None) -> int:
    """Estimated tokens of the model-facing ``items`` (and ``instructions``)."""
    text_bytes = len(instructions.encode("utf-8")) if instructions else 0
    framing = 0
    images = 0
    for item in items:
        framing += ITEM_FRAMING_TOKENS
        for key, value in item.items():
            if key in _NOT_TEXT:
                continue
            if key == "content" and isinstance(value, list):
                for part in value:
                    framing += PART_FRAMING_TOKENS
                    if isinstance(part, dict) and part.get("type") in _IMAGE_PART_TYPES:
                        images += 1
                    else:
                        text_bytes += _text_bytes(part)
            else:
                text_bytes += _text_bytes(value)
    return math.ceil(text_bytes / BYTES_PER_TOKEN) + framing + images * IMAGE_TOKENS


def _text_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, dict):
        return sum(_text_bytes(v) for k, v in value.items() if k not in _NOT_TEXT)
    if isinstance(value, list):
        return sum(_text_bytes(v) for v in value)
    return 0


def over_threshold(
    threshold: int | None, model_items: list[dict[str, Any]], instructions: str | None
) -> bool:
    """Whether automatic compaction runs before this round: the estimate is greater than the
    threshold and there is something to summarize (not only the user's messages and a summary)."""
    if threshold is None or not summarizable(model_items):
        return False
    return estimate_tokens(model_items, instructions) > threshold


def summarizable(items: Iterable[dict[str, Any]]) -> bool:
    """Whether ``items`` hold anything besides user messages, compaction state and the async calls
    a window keeps (:func:`retained_messages`)."""
    items = list(items)
    kept_async = {id(item) for item in async_tools.retained_async_items(items)}
    return any(
        not (item.get("type", "message") == "message" and item.get("role") == "user")
        and item.get("type") not in (COMPACTION, TRIGGER)
        and not str(item.get("id", "")).startswith("cmp_")  # a summary, as the model reads it
        and id(item) not in kept_async
        for item in items
    )


# --- the model's view ---------------------------------------------------------------------------


def model_view(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` as the model reads them: the latest ``compaction`` item as an assistant message
    holding its summary; earlier ones (superseded by it) and ``compaction_trigger`` items dropped."""
    latest = max((index for index, item in enumerate(items) if item.get("type") == COMPACTION), default=None)
    if latest is None and not has_trigger(items):
        return items
    out = []
    for index, item in enumerate(items):
        kind = item.get("type")
        if kind == TRIGGER or (kind == COMPACTION and index != latest):
            continue
        if kind == COMPACTION:
            out.append(summary_message(item))
        else:
            out.append(item)
    return out


def summary_message(item: dict[str, Any]) -> dict[str, Any]:
    """A ``compaction`` item as the assistant message the model sees (its text taken literally)."""
    text = item.get("encrypted_content")
    return {
        "id": item.get("id") or new_id("msg"),
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": text if isinstance(text, str) else "", "annotations": []}
        ],
    }


# --- the window ---------------------------------------------------------------------------------


def compaction_item(summary: str) -> dict[str, Any]:
    return {"id": new_id("cmp"), "type": COMPACTION, "encrypted_content": summary}


def retained_messages(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user's messages of ``items`` in stored form (ids kept, so a checkpoint references them), plus
    async calls and their outputs as they are (spec): a pending call stays in the model's context."""
    items = list(items)
    kept_async = {id(item) for item in async_tools.retained_async_items(items)}
    out = []
    for item in items:
        if id(item) in kept_async:
            out.append(item)
            continue
        if item.get("type", "message") != "message" or item.get("role") != "user":
            continue
        message = {
            "id": item.get("id") or new_id("msg"),
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": item.get("content") or [],
        }
        out.append(message if message == item else {**item, **message})
    return out


# --- the summary round --------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    text: str
    usage: dict[str, Any] | None  # in the Responses usage shape, as the upstream reported it
    service_tier: str | None
    response_id: str | None = None  # the upstream's, for the summary round's span
    model: str | None = None


def forwarded_fields(raw: dict[str, Any], prompt_cache_options: dict[str, Any] | None) -> dict[str, Any]:
    """The request-scoped fields the summary round carries (only those set)."""
    out = {key: raw[key] for key in FORWARDED if raw.get(key) is not None}
    if prompt_cache_options is not None:
        out["prompt_cache_options"] = prompt_cache_options
    return out


def summary_body(
    *,
    config: Config,
    model: str,
    model_items: list[dict[str, Any]],
    instructions: str | None,
    forwarded: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """The upstream path and body of the summary round (non-streaming) for ``model_items``."""
    from responses_app.engine import translate

    prompt = config.responses.compaction_prompt or DEFAULT_PROMPT
    max_tokens = config.responses.compaction_max_output_tokens or None
    if config.upstream_api == "chat_completions":
        messages = translate.items_to_messages(instructions, model_items)
        messages.append({"role": "user", "content": prompt})
        body: dict[str, Any] = {"model": model, "messages": messages, **forwarded, "stream": False}
        if max_tokens is not None:
            body["max_completion_tokens"] = max_tokens
        return "/v1/chat/completions", body
    request = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}
    body = {"model": model}
    if instructions is not None:
        body["instructions"] = instructions
    body["input"] = [*(translate.output_to_input(item) for item in model_items), request]
    body.update(forwarded)
    if max_tokens is not None:
        body["max_output_tokens"] = max_tokens
    body["store"] = False
    body["stream"] = False
    return "/v1/responses", body


async def summarize(
    *,
    upstream: Any,
    config: Config,
    headers: dict[str, str],
    model: str,
    model_items: list[dict[str, Any]],
    instructions: str | None,
    forwarded: dict[str, Any],
    meter: Meter,
    lineage_key: str | None,
) -> Summary:
    """Run the summary round (one usage-ledger row on ``meter``) in ``lineage_key``, the lineage it
    compacts (the summary re-sends that lineage's prefix); an upstream refusal or an empty summary
    raises a :class:`errors.GatewayError` (4xx: the upstream's message; else 502)."""
    path, body = summary_body(
        config=config, model=model, model_items=model_items, instructions=instructions, forwarded=forwarded
    )
    sent = dict(headers)
    sent["content-type"] = "application/json"
    sent["accept"] = "application/json"
    with (
        lineage.bind(lineage_key),
        spans.internal("compaction", **{"gateway.compaction.input_items": len(model_items)}),
    ):
        summary = await _summary_round(upstream, config, path, body, sent, model, meter)
    if not summary.text.strip():
        raise errors.UpstreamError("The upstream model returned an empty compaction summary.")
    return summary


async def _summary_round(
    upstream: Any,
    config: Config,
    path: str,
    body: dict[str, Any],
    sent: dict[str, str],
    model: str,
    meter: Meter,
) -> Summary:
    """The summary's upstream call, in its ``chat {model}`` span (a child of ``compaction``)."""
    span = spans.ModelRound(model, **{"gateway.round.kind": "compaction"})
    call = meter.start()
    status = 200
    summary: Summary | None = None
    try:
        with spans.current(span.span):
            response = await upstream.send("POST", path, body=orjson.dumps(body), headers=sent)
        call.received = status = response.status
        try:
            # The executor's one-answer rounds read and check an answer the same way (parsers.read_whole).
            payload = await upstream_events.read_answer(
                response, config.responses.max_upstream_sse_line_bytes
            )
            if response.status != 200:
                raise upstream_events.status_error(response.status, payload, "the compaction summary request")
            if path == "/v1/chat/completions":
                summary = _chat_summary(upstream_events.chat_answer(payload))
            else:
                summary = _responses_summary(upstream_events.responses_answer(payload))
        except StreamFailure as exc:  # cut short, over the limit or malformed: the upstream's fault
            raise errors.UpstreamError(exc.message) from None
        finally:
            await response.aclose()
    except BaseException as exc:
        status = failed_status(exc, call.received)
        spans.ended_by(span.span, exc)
        raise
    finally:
        used = tokens(summary.usage if summary is not None else None)
        meter.end(call, status, used)
        if span.recording:
            span.answered(
                response_id=summary.response_id if summary is not None else None,
                response_model=summary.model if summary is not None else None,
                finish_reasons=["stop"] if summary is not None else None,
                input_tokens=used[0],
                output_tokens=used[1],
            )
            if summary is not None:
                span.messages(None, body.get("input") or body.get("messages"), summary.text)
        span.end()
    return summary


def _tier(answer: dict[str, Any]) -> str | None:
    tier = answer.get("service_tier")
    return tier if isinstance(tier, str) else None


def _responses_summary(answer: dict[str, Any]) -> Summary:
    texts = []
    for item in answer.get("output") or ():
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
    usage = answer.get("usage")
    return Summary(
        "".join(texts).strip(),
        usage_dict(usage) if isinstance(usage, dict) else None,
        _tier(answer),
        *_identity(answer),
    )


def _chat_summary(answer: dict[str, Any]) -> Summary:
    """From a chat completion checked as the chunk it would stream as (its message is the delta)."""
    choices = answer.get("choices") or []
    message = choices[0].get("delta") if choices else None
    content = message.get("content") if isinstance(message, dict) else None
    usage = answer.get("usage")
    converted = None
    if isinstance(usage, dict):
        converted = usage_dict(
            {
                "input_tokens": usage.get("prompt_tokens"),
                "input_tokens_details": usage.get("prompt_tokens_details"),
                "output_tokens": usage.get("completion_tokens"),
                "output_tokens_details": usage.get("completion_tokens_details"),
                "total_tokens": usage.get("total_tokens"),
            }
        )
    return Summary(
        content.strip() if isinstance(content, str) else "", converted, _tier(answer), *_identity(answer)
    )


def _identity(answer: dict[str, Any]) -> tuple[str | None, str | None]:
    """The answer's id and model, when they are strings."""
    ident, model = answer.get("id"), answer.get("model")
    return (ident if isinstance(ident, str) else None, model if isinstance(model, str) else None)


def usage_dict(usage: dict[str, Any]) -> dict[str, Any]:
    """Responses usage with integer counters only (absent details stay empty; nothing derived)."""

    def count(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def details(value: Any) -> dict[str, int]:
        if not isinstance(value, dict):
            return {}
        return {k: v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}

    input_tokens = count(usage.get("input_tokens"))
    output_tokens = count(usage.get("output_tokens"))
    total = usage.get("total_tokens")
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": details(usage.get("input_tokens_details")),
        "output_tokens": output_tokens,
        "output_tokens_details": details(usage.get("output_tokens_details")),
        "total_tokens": count(total) if isinstance(total, int) else input_tokens + output_tokens,
    }


# --- compaction inside a running response (the executor's hook before every round) ------------


class Compactor:
    """One response's compaction state: its threshold, whether its input ends with a
    ``compaction_trigger``, and the window once it compacted.

    The executor calls :meth:`before_round` before every round and reads items through
    :meth:`window`; a compacted response stores :meth:`checkpoint` as its continuation's history.
    """

    def __init__(self, prepared: Any) -> None:
        self.p = prepared
        self.threshold = compact_threshold(prepared.raw.get("context_management"))
        self.trigger = has_trigger(prepared.new_items)
        self.retained: list[dict[str, Any]] | None = None  # set once compacted
        self.item: dict[str, Any] | None = None  # the latest compaction item of this response
        self.ends_response = False  # a compaction_trigger response ends with its compaction item

    @property
    def compacted(self) -> bool:
        return self.item is not None

    def window(self, model_items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The executor's model items (history, input, output, in order) as the model reads them:
        after a compaction in this response, the retained messages, the summary and what followed."""
        if self.item is not None and self.retained is not None:
            cut = next((i for i, item in enumerate(model_items) if item.get("id") == self.item["id"]), None)
            if cut is not None:
                model_items = [*self.retained, *model_items[cut:]]
        return model_view(model_items)

    def checkpoint(self, prior: list[dict[str, Any]], output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The history a continuation of this response starts from."""
        if self.item is None or self.retained is None:
            return [*prior, *output]
        at = next(i for i, item in enumerate(output) if item.get("id") == self.item["id"])
        return [*self.retained, *output[at:]]

    def may_compact(self) -> bool:
        """Whether :meth:`before_round` may compact: a trigger not yet answered, or a threshold."""
        return not self.ends_response and (self.trigger or self.threshold is not None)

    async def before_round(self, ex: Any) -> Any:
        """Compact first when the trigger asks for it (once) or the estimate is over the threshold;
        yields the compaction item's events. Upstream failures end the response failed."""
        if not self.may_compact():
            return
        model_items = ex.model_items()
        if not self.trigger and not over_threshold(self.threshold, model_items, ex.p.request.instructions):
            return
        from gateway.core.sse import StreamFailure

        try:
            summary = await summarize(
                upstream=ex.upstream,
                config=ex.config,
                headers=ex.p.headers,
                model=ex.p.request.model,
                model_items=model_items,
                instructions=ex.p.request.instructions,
                forwarded=forwarded_fields(ex.p.raw, ex.p.prompt_cache_options),
                meter=ex.meter,
                lineage_key=ex.lineage,
            )
        except errors.GatewayError as exc:
            if exc.status < 500:
                ex.http_error = exc
            raise StreamFailure(exc.message, status=exc.status) from None
        if summary.usage is not None:
            ex.usage.add_reported(summary.usage)
        prior = [*ex.p.history, *ex.p.new_items]
        current = self.checkpoint(prior, ex.output)
        self.retained = retained_messages(current)
        self.item = compaction_item(summary.text)
        for event in ex.emitter.whole(self.item):
            yield event
        if self.trigger:
            # The summary is the response's one inference round: its tier is the one returned.
            ex.service_tier = summary.service_tier
            self.ends_response = True
            self.trigger = False
