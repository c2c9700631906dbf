"""WebSocket steering: ``response.steer`` while a response on this connection is generating.

Owns the per-connection state and every rule that needs no socket: :func:`parse_steer`,
:class:`Steering` (one :class:`Target` per generating response, with its inherited settings,
accepted steering and budgets), :func:`required_inputs` and :func:`missing_outputs`. The WebSocket
session (``responses_app.api.session``) does the I/O. Nothing survives the connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.core import errors
from gateway.core.ids import new_id
from responses_app.features import async_tools

# The fields a ``response.steer`` event may carry (the SDK's ``BetaResponseSteerEvent``).
STEER_FIELDS = frozenset({"type", "previous_response_id", "input"})
# A steering message: an optional ``type`` (always ``message``), ``role`` (always ``user``) and content.
MESSAGE_FIELDS = frozenset({"type", "role", "content"})
TEXT_PART_FIELDS = frozenset({"type", "text"})
IMAGE_PART_FIELDS = frozenset({"type", "image_url", "detail"})
IMAGE_DETAILS = frozenset({"low", "high", "auto", "original"})

# Request fields that are not settings an automatic successor inherits.
NOT_INHERITED = ("input", "previous_response_id", "stream", "conversation")

# response.steer.failed codes (the SDK's ``BetaResponseSteerErrorCode``).
RESPONSE_NOT_FOUND = "response_not_found"
INVALID_INPUT = "invalid_input"
STEERING_NOT_SUPPORTED = "steering_not_supported"
TOO_MANY_PENDING_STEERS = "too_many_pending_steers"
RESPONSE_ALREADY_COMPLETED = "response_already_completed"
RESPONSE_NOT_ACTIVE = "response_not_active"
SUCCESSOR_CREATION_FAILED = "successor_creation_failed"

WAITING_FOR_REQUIRED_INPUT = "waiting_for_required_input"

# Client-owned call item → the output stub ``response.steer.pending`` asks for.
_REQUIRED: dict[str, str] = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
}
# Items that wait for the client in a way steering does not carry (approvals, other call kinds:
# the SDK's ``ResponseSteerRequiredInput`` has no ``local_shell_call_output``).
_UNSUPPORTED_CLIENT_ITEMS = frozenset(
    {
        "mcp_approval_request",
        "computer_call",
        "local_shell_call",
    }
)


class SteerFailure(Exception):
    """A steering submission that cannot be accepted (or accepted input that cannot be committed)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Steer:
    """One accepted submission: the input as submitted (the failure echo) and as input items."""

    id: str
    previous_response_id: str
    input: Any
    items: list[dict[str, Any]]
    size: int  # bytes of the echo, held against the accepted-steering budget
    notified: bool = False  # response.steer.pending was sent for it (at most once per submission)


@dataclass
class Target:
    """A generating response on this connection that steering may address."""

    response_id: str
    lane: str | None  # the lane key (the target's ``stream_id``, or None for the default lane)
    settings: dict[str, Any] | None  # what an automatic successor inherits; None once released
    settings_size: int
    refusal: SteerFailure | None  # set when this target never accepts steering
    state: str = "active"  # active | ended | waiting | succeeding | closed
    status: str | None = None  # the terminal status once ended
    batch: list[Steer] = field(default_factory=list)
    required: list[dict[str, Any]] = field(default_factory=list)
    ended_at: float | None = None
    superseded: bool = False  # a newer response.created appeared on its lane
    successor_scheduled: bool = False
    next_sequence: Callable[[], int] | None = None  # numbering that continues the target's stream


@dataclass(frozen=True)
class Limits:
    max_queued: int = 32
    input_bytes: int = 12 * 1024 * 1024
    settings_bytes: int = 12 * 1024 * 1024
    failure_bytes: int = 12 * 1024 * 1024
    target_ttl_s: float = 60.0
    max_targets: int = 1024  # records kept for ended targets (settings released or not)


# --- the client event ------------------------------------------------------------------------


def submitted(content: dict[str, Any]) -> tuple[str, Any]:
    """``(previous_response_id, input)`` as submitted, for the failure echo of any refusal."""
    pid = content.get("previous_response_id")
    return (pid if isinstance(pid, str) else ""), content.get("input", "")


def parse_steer(content: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The target id and the input items of a ``response.steer`` event; ``invalid_input`` else."""
    extra = sorted(set(content) - STEER_FIELDS)
    if "stream_id" in extra:
        raise SteerFailure(
            INVALID_INPUT,
            "response.steer must not carry 'stream_id': the target response determines the lane.",
        )
    if extra:
        raise SteerFailure(
            INVALID_INPUT,
            f"response.steer accepts only 'type', 'previous_response_id' and 'input'; remove "
            f"{', '.join(repr(k) for k in extra)} (an automatic successor uses the target's settings).",
        )
    pid = content.get("previous_response_id")
    if not isinstance(pid, str) or not pid:
        raise SteerFailure(INVALID_INPUT, "response.steer requires 'previous_response_id', a response ID.")
    if "input" not in content:
        raise SteerFailure(INVALID_INPUT, "response.steer requires 'input': text or user messages.")
    return pid, steer_items(content["input"])


def steer_items(value: Any) -> list[dict[str, Any]]:
    """Steering input as user message items (text, empty text included, becomes one message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise SteerFailure(INVALID_INPUT, "'input' must be a string or an array of user messages.")
    if not value:
        raise SteerFailure(INVALID_INPUT, "'input' must not be an empty array.")
    items = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise SteerFailure(INVALID_INPUT, f"{where} must be a user message object.")
        if item.get("type", "message") != "message":
            raise SteerFailure(
                INVALID_INPUT,
                f"{where}.type must be 'message': steering accepts only user messages "
                "(tool outputs and other items are not supported).",
            )
        extra = sorted(set(item) - MESSAGE_FIELDS)
        if extra:
            raise SteerFailure(
                INVALID_INPUT,
                f"{where} may contain only 'type', 'role' and 'content'; remove "
                f"{', '.join(repr(k) for k in extra)}.",
            )
        if item.get("role") != "user":
            raise SteerFailure(INVALID_INPUT, f"{where}.role must be 'user'.")
        items.append({"type": "message", "role": "user", "content": _content(item.get("content"), where)})
    return items


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise SteerFailure(
            INVALID_INPUT, f"{where}.content must be a string or a non-empty array of content parts."
        )
    parts = []
    for index, part in enumerate(content):
        at = f"{where}.content[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_file":
            raise SteerFailure(INVALID_INPUT, f"{at}: file input is not supported by the gateway.")
        if kind == "input_text":
            if set(part) - TEXT_PART_FIELDS or not isinstance(part.get("text"), str):
                raise SteerFailure(INVALID_INPUT, f"{at}: an input_text part carries only a string 'text'.")
        elif kind == "input_image":
            if set(part) - IMAGE_PART_FIELDS:
                raise SteerFailure(
                    INVALID_INPUT,
                    f"{at}: an input_image part carries 'image_url' and an optional 'detail' "
                    "(file IDs are not supported by the gateway).",
                )
            if not isinstance(part.get("image_url"), str) or not part["image_url"]:
                raise SteerFailure(INVALID_INPUT, f"{at}: an input_image part requires 'image_url'.")
            if part.get("detail") is not None and part["detail"] not in IMAGE_DETAILS:
                raise SteerFailure(INVALID_INPUT, f"{at}.detail must be one of low, high, auto, original.")
        else:
            raise SteerFailure(INVALID_INPUT, f"{at}: content parts must be 'input_text' or 'input_image'.")
        parts.append(dict(part))
    return parts


# --- targets ---------------------------------------------------------------------------------


def eligibility(raw: dict[str, Any], *, generate: bool, conversation_id: str | None) -> SteerFailure | None:
    """Why a response never accepts steering (scope of the spec), or None when it may."""
    if not generate:
        return SteerFailure(
            STEERING_NOT_SUPPORTED,
            "Prewarm responses (generate: false) do not generate and cannot be steered.",
        )
    multi_agent = raw.get("multi_agent")
    if isinstance(multi_agent, dict) and multi_agent.get("enabled"):
        return SteerFailure(STEERING_NOT_SUPPORTED, "Multi-agent responses cannot be steered.")
    if conversation_id is not None or raw.get("conversation") is not None:
        return SteerFailure(STEERING_NOT_SUPPORTED, "Responses bound to a conversation cannot be steered.")
    if raw.get("context_management") or _has_compaction(raw.get("input")):
        return SteerFailure(
            STEERING_NOT_SUPPORTED, "Compaction and context-management requests cannot be steered."
        )
    return None


def _has_compaction(items: Any) -> bool:
    return isinstance(items, list) and any(
        isinstance(i, dict) and str(i.get("type", "")).startswith("compaction") for i in items
    )


def settings_of(raw: dict[str, Any]) -> dict[str, Any]:
    """The parent's effective settings: its request without input and continuation fields."""
    return {k: v for k, v in raw.items() if k not in NOT_INHERITED}


def required_inputs(output: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The output stubs a parent's client calls need, and the unsupported client item kinds."""
    stubs: list[dict[str, Any]] = []
    unsupported: list[str] = []
    for item in output:
        kind = item.get("type")
        if kind in _UNSUPPORTED_CLIENT_ITEMS:
            unsupported.append(str(kind))
            continue
        stub_type = _REQUIRED.get(str(kind))
        if stub_type is None or async_tools.call_is_async(item):
            continue  # an async call may stay pending: its output can come in any later request
        if kind == "tool_search_call" and item.get("execution", "client") != "client":
            continue
        stub: dict[str, Any] = {"type": stub_type, "call_id": item.get("call_id")}
        if kind == "function_call":
            stub["name"] = item.get("name")
        elif kind == "tool_search_call":
            stub["execution"] = "client"
        stubs.append(stub)
    return stubs, unsupported


def missing_outputs(required: list[dict[str, Any]], items: Any) -> list[str]:
    """Call ids of ``required`` stubs an explicit continuation's input does not answer."""
    given = set()
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict):
                given.add((item.get("type"), item.get("call_id")))
    return [str(s["call_id"]) for s in required if (s["type"], s["call_id"]) not in given]


def successor_fields(target: Target) -> dict[str, Any]:
    """The automatic successor's request: the parent's settings, the parent as
    ``previous_response_id`` and the accepted steering, in acceptance order, as its input."""
    assert target.settings is not None
    fields = dict(target.settings)
    fields["input"] = [item for steer in target.batch for item in steer.items]
    fields["previous_response_id"] = target.response_id
    return fields


def steered_fields(target: Target, raw: dict[str, Any]) -> dict[str, Any]:
    """An explicit continuation of a parent with pending steering must answer every required call (else
    400 ``missing_required_input``); the accepted steering is prepended to its input."""
    given = raw.get("input")
    missing = missing_outputs(target.required, given)
    if missing:
        raise errors.BadRequest(
            f"This continuation of '{target.response_id}' carries pending steering and must supply "
            f"the outputs of every required call; missing: {', '.join(missing)}.",
            param="input",
            code="missing_required_input",
        )
    fields = {k: v for k, v in raw.items() if k != "stream"}
    steered = [item for steer in target.batch for item in steer.items]
    fields["input"] = [*steered, *(given if isinstance(given, list) else [])]
    return fields


def _size(value: Any) -> int:
    return len(orjson.dumps(value))


class Steering:
    """Steering state of one WebSocket connection (see the module docstring)."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self.targets: dict[str, Target] = {}
        self.input_bytes = 0  # accepted steering echoes not yet committed, failed or discarded
        self.settings_bytes = 0  # retained settings
        self.failure_bytes = 0  # failure echoes queued for the client and not yet written

    # --- targets ---------------------------------------------------------------------------

    def register(
        self,
        response_id: str,
        lane: str | None,
        settings: dict[str, Any] | None,
        refusal: SteerFailure | None,
    ) -> Target:
        """A ``response.created`` on ``lane``: older targets there release their settings."""
        self.expire()
        for other in self.targets.values():
            if other.lane == lane and not other.superseded:
                other.superseded = True
                if not other.batch:
                    self._release(other)
        size = _size(settings) if settings is not None and refusal is None else 0
        if refusal is None and settings is not None and not self._fit(size):
            refusal = SteerFailure(
                RESPONSE_NOT_ACTIVE,
                "This response is not accepting steering: its settings exceed the connection's "
                "remaining steering settings budget.",
            )
        target = Target(
            response_id,
            lane,
            settings if refusal is None else None,
            size if refusal is None else 0,
            refusal,
        )
        self.settings_bytes += target.settings_size
        self.targets[response_id] = target
        self._bound_records()
        return target

    def _fit(self, size: int) -> bool:
        """Whether ``size`` bytes of settings fit, evicting idle ended targets (oldest first)."""
        budget = self.limits.settings_bytes
        if self.settings_bytes + size <= budget:
            return True
        idle = sorted(
            (t for t in self.targets.values() if t.ended_at is not None and not t.batch and t.settings),
            key=lambda t: t.ended_at or 0.0,
        )
        for target in idle:
            self._forget(target)
            if self.settings_bytes + size <= budget:
                return True
        return False

    def _bound_records(self) -> None:
        over = len(self.targets) - self.limits.max_targets
        if over <= 0:
            return
        ended = sorted(
            (t for t in self.targets.values() if t.ended_at is not None and not t.batch),
            key=lambda t: t.ended_at or 0.0,
        )
        for target in ended[:over]:
            self._forget(target)

    def _release(self, target: Target) -> None:
        self.settings_bytes -= target.settings_size
        target.settings = None
        target.settings_size = 0

    def _forget(self, target: Target) -> None:
        self._release(target)
        self.targets.pop(target.response_id, None)

    def expire(self) -> None:
        """Completed targets without accepted steering are forgotten after the TTL."""
        deadline = self.clock() - self.limits.target_ttl_s
        for target in list(self.targets.values()):
            if target.ended_at is not None and target.ended_at <= deadline and not target.batch:
                self._forget(target)

    # --- submissions -----------------------------------------------------------------------

    def submit(self, pid: str, submitted_input: Any, items: list[dict[str, Any]]) -> tuple[Target, Steer]:
        """Accept steering for ``pid`` (acceptance order is the batch order) or raise SteerFailure."""
        self.expire()
        target = self.targets.get(pid)
        if target is None:
            raise SteerFailure(
                RESPONSE_NOT_FOUND,
                f"Response '{pid}' is not available for steering on this connection "
                "(steering addresses responses generated on the current connection).",
            )
        if target.refusal is not None:
            raise SteerFailure(target.refusal.code, target.refusal.message)
        if target.state in ("succeeding", "closed") or (target.superseded and not target.batch):
            if target.status == "completed":
                raise SteerFailure(
                    RESPONSE_ALREADY_COMPLETED,
                    f"Response '{pid}' completed and is no longer accepting steering input.",
                )
            raise SteerFailure(
                RESPONSE_NOT_ACTIVE, f"Response '{pid}' is no longer accepting steering input."
            )
        if len(target.batch) >= self.limits.max_queued:
            raise SteerFailure(
                TOO_MANY_PENDING_STEERS,
                f"Response '{pid}' already has {self.limits.max_queued} queued steering updates.",
            )
        size = _size(submitted_input)
        if self.input_bytes + size > self.limits.input_bytes:
            raise SteerFailure(
                TOO_MANY_PENDING_STEERS,
                f"Accepted steering input on this connection would exceed {self.limits.input_bytes} bytes.",
            )
        steer = Steer(new_id("steer"), pid, submitted_input, items, size)
        target.batch.append(steer)
        self.input_bytes += size
        return target, steer

    def ended(self, target: Target, status: str, output: list[dict[str, Any]]) -> list[Steer]:
        """The target's terminal event was sent; returns the accepted steering that fails with it.

        A failed parent, or one waiting on calls steering cannot describe, fails its batch; otherwise the
        batch waits (``response.steer.pending``) or goes to an automatic successor.
        """
        target.status = status
        target.ended_at = self.clock()
        if status not in ("completed", "incomplete"):
            target.state = "closed"
            target.refusal = SteerFailure(RESPONSE_NOT_ACTIVE, f"Response '{target.response_id}' {status}.")
            return self.take(target)
        required, unsupported = required_inputs(output)
        if unsupported:
            target.state = "closed"
            target.refusal = SteerFailure(
                STEERING_NOT_SUPPORTED,
                f"Response '{target.response_id}' waits for client input steering does not carry "
                f"({', '.join(sorted(set(unsupported)))}).",
            )
            return self.take(target)
        target.required = required
        target.state = "waiting" if required else "ended"
        return []

    def take(self, target: Target) -> list[Steer]:
        """Remove the target's batch (to fail it): its bytes leave the accepted-steering budget."""
        batch, target.batch = target.batch, []
        self.input_bytes -= sum(s.size for s in batch)
        if target.superseded:
            self._release(target)
        return batch

    def commit(self, target: Target) -> list[Steer]:
        """The successor's ``response.created``: the batch now belongs to that response."""
        target.state = "closed"
        batch = self.take(target)
        self._release(target)
        return batch

    def waiting_for(self, lane: str | None, pid: str | None) -> Target | None:
        """The target an explicit ``response.create`` on ``lane`` continues with pending steering."""
        target = self.targets.get(pid) if pid is not None else None
        if target is None or target.state != "waiting" or not target.batch or target.lane != lane:
            return None
        return target

    def discard(self) -> None:
        """The connection ended: unapplied steering is dropped, nothing is replayed."""
        for target in self.targets.values():
            target.batch = []
        self.targets.clear()
        self.input_bytes = self.settings_bytes = 0

    # --- failure echoes --------------------------------------------------------------------

    def reserve_failure(self, size: int) -> bool:
        if self.failure_bytes + size > self.limits.failure_bytes:
            return False
        self.failure_bytes += size
        return True

    def release_failure(self, size: int) -> None:
        self.failure_bytes -= size


# --- events ----------------------------------------------------------------------------------


# --- the running response's side (``responses_app.engine.executor``) ------------------------------------

STEERED_REASON = "steered"  # the incomplete_details reason of a response that stopped for steering


@dataclass
class Boundary:
    """Asked at each safe boundary of a running response: does accepted steering wait? If so the
    response stops there and ends ``incomplete`` (:func:`steered_details`), its output kept."""

    requested: Callable[[], bool] | None = None

    def waiting(self) -> bool:
        return self.requested is not None and self.requested()


def steered_details() -> dict[str, Any]:
    """The ``incomplete_details`` of a response that stopped for steering."""
    return {"reason": STEERED_REASON}


def accepted_event(steer: Steer, sequence_number: int, stream_id: str | None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "response.steer.accepted",
        "sequence_number": sequence_number,
        "steer": {"id": steer.id, "previous_response_id": steer.previous_response_id},
    }
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def pending_event(
    steer: Steer, required: list[dict[str, Any]], sequence_number: int, stream_id: str | None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "response.steer.pending",
        "reason": WAITING_FOR_REQUIRED_INPUT,
        "required_input": [dict(stub) for stub in required],
        "sequence_number": sequence_number,
        "steer": {"id": steer.id, "previous_response_id": steer.previous_response_id},
    }
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def failed_event(
    failure: SteerFailure,
    *,
    previous_response_id: str,
    submitted_input: Any,
    steer_id: str | None,
    sequence_number: int,
    stream_id: str | None,
) -> dict[str, Any]:
    return errors.ws_steer_failed_event(
        code=failure.code,
        message=failure.message,
        previous_response_id=previous_response_id,
        submitted_input=submitted_input,
        steer_id=steer_id,
        sequence_number=sequence_number,
        stream_id=stream_id,
    )
