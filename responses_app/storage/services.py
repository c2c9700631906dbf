"""Writes (and the request preparation that validates against stored state).

Every function is keyword-only, synchronous and runs in one transaction; async callers use
``gateway.core.db.run_orm`` (a worker thread, so the event loop never blocks on the database), and the
writes of a stored response (:func:`response_store_final`, :func:`response_create_in_progress`)
go through :data:`final_writes`, their group commit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from conversations_app import selectors as conversation_selectors
from conversations_app import services as conversation_services
from conversations_app.models import Item
from gateway.core import errors
from gateway.core.config import Config
from gateway.core.ids import new_id
from responses_app.engine import translate
from responses_app.engine.domain import Prepared, base_snapshot, strip_credentials
from responses_app.engine.tool_loop import PRIVATE_KEY, web_search_available
from responses_app.features import async_tools
from responses_app.models import Response, ResponseEvent
from responses_app.protocol.features import refuse_executor_only
from responses_app.protocol.multi_agent_config import AGENT_ITEM_TYPES, INPUT_MARK, refuse_in_multi_agent_mode
from responses_app.protocol.schemas import ResponseCreateRequest, check_prompt_cache_options
from responses_app.storage import rawsql, selectors
from responses_app.storage.group_commit import GroupWriter
from responses_app.storage.history_cache import history_cache

COMPACTION_TYPES = frozenset({"compaction", "compaction_trigger"})
# Input items only the executor can serve: compaction and client tool-search state.
# Multi-agent items too: the executor drops them from the model's input (never sent raw upstream).
EXECUTOR_ITEM_TYPES = COMPACTION_TYPES | {"tool_search_call", "tool_search_output"} | AGENT_ITEM_TYPES
# Gateway-owned fields the upstream's /v1/responses does not know: present with any value, they
# send the request through the executor, which never forwards them (the direct path is byte for byte).
GATEWAY_OWNED = frozenset({"context_management", "multi_agent"})


def needs_executor(request: ResponseCreateRequest, raw: dict[str, Any], config: Config) -> bool:
    """False only for stateless requests the upstream's own ``/v1/responses`` can answer as is."""
    if config.upstream_api != "responses":
        return True  # a chat-only upstream cannot take a Responses body
    if request.store is not False or request.background:
        return True
    if request.previous_response_id is not None or request.conversation is not None:
        return True
    if not GATEWAY_OWNED.isdisjoint(raw):
        return True  # whatever their value ([] or enabled: false included): only the executor drops them
    if any(tool.get("type") != "function" for tool in request.tools or ()):
        return True
    if async_tools.needs_executor(request.tools, request.input):
        return True
    return isinstance(request.input, list) and any(
        item.get("type") in EXECUTOR_ITEM_TYPES for item in request.input
    )


def prepare_reads_database(request: ResponseCreateRequest) -> bool:
    """Whether :func:`response_prepare` consults stored state for ``request`` (else it can run on
    the event loop: nothing but validation and fresh ids)."""
    if request.previous_response_id is not None or request.conversation is not None:
        return True
    return _references_items(request)


def _references_items(request: ResponseCreateRequest) -> bool:
    if not isinstance(request.input, list):
        return False
    return any(isinstance(item, dict) and isinstance(item.get("id"), str) for item in request.input)


def response_prepare(
    *,
    request: ResponseCreateRequest,
    raw: dict[str, Any],
    owner: str,
    headers: dict[str, str],
    config: Config,
    response_id: str | None = None,
    created_at: int | None = None,
    cached_history: list[dict[str, Any]] | None = None,
    model_turn: bool = True,
) -> Prepared:
    """Validate against stored state and resolve the history this response continues from.

    ``cached_history`` is the checkpoint of ``previous_response_id`` when the caller holds it
    (the WebSocket transport's connection-local state); then the database is not consulted for it.
    ``model_turn`` False (``POST /v1/responses/compact``): the history is summarized, not answered,
    so the rules on tool calls and their outputs do not apply (a call may await its output).
    """
    if request.previous_response_id is not None and request.conversation is not None:
        raise errors.BadRequest(
            "Mutually exclusive parameters: Ensure you are only providing one of: "
            "'previous_response_id' or 'conversation'.",
            param=None,
            code="mutually_exclusive_parameters",
        )
    refuse_executor_only(raw)
    # Refused before any history lookup or inference (spec: prompt_cache_options).
    cache_options = check_prompt_cache_options(
        raw.get("prompt_cache_options"), supported=config.responses.prompt_cache_options_supported
    )
    if request.background and not request.stores:
        raise errors.BadRequest(
            "Background mode requires store=true.", param="background", code="invalid_value"
        )
    # Tool names the upstream will see; colliding names are refused before any lookup or inference.
    tool_map = translate.ToolMap.build(request.tools, search_available=web_search_available(config))

    history: list[dict[str, Any]] = []
    agent_tree: dict[str, Any] | None = None
    revision = 0
    conversation_id = request.conversation_id
    if request.previous_response_id is not None and cached_history is not None:
        history = list(cached_history)
    elif request.previous_response_id is not None:
        history, agent_tree = _previous_history(request.previous_response_id, owner)
    elif conversation_id is not None:
        conversation_selectors.check_conversation_id(conversation_id, param="conversation")
        try:
            stored, revision = conversation_selectors.conversation_history(
                conversation_id=conversation_id, owner=owner
            )
        except errors.NotFound as exc:
            exc.param = "conversation"  # on Responses the conversation is a request parameter
            raise
        history = [item.data for item in stored]

    new_items, to_insert = _resolve_input(translate.normalize_input(request.input), owner)
    if cached_history is not None and request.stores:
        # A stored response continuing an in-memory (possibly unstored) parent: its checkpoint must
        # only reference stored items, so the parent's items are stored with it (duplicates ignored).
        to_insert = [*history, *to_insert]
    if agent_tree is not None and model_turn:
        # A multi-agent continuation inherits the tree's configuration, and its rules: the same
        # refusals as a fresh multi-agent request (max_tool_calls would count per agent otherwise).
        refuse_in_multi_agent_mode(raw)
    if model_turn:  # OpenAI's pairing rules; a pending async call may go unanswered (or be answered again)
        async_tools.check_tool_outputs(history, new_items, translate.CALL_TYPES)
    multi_agent = raw.get("multi_agent")
    if model_turn and (
        agent_tree is not None or (isinstance(multi_agent, dict) and multi_agent.get("enabled") is True)
    ):
        async_tools.check_multi_agent_outputs(history, new_items)
    tool_map.load([*history, *new_items])  # the tools a client tool search loaded become callable
    return Prepared(
        request=request,
        raw=raw,
        owner=owner,
        response_id=response_id or new_id("resp"),
        created_at=created_at if created_at is not None else int(time.time()),
        history=history,
        new_items=new_items,
        items_to_insert=to_insert,
        store=request.stores,
        headers=headers,
        previous_response_id=request.previous_response_id,
        conversation_id=conversation_id,
        conversation_revision=revision,
        prompt_cache_options=cache_options,
        background=bool(request.background),
        tool_map=tool_map,
        agent_tree=agent_tree,
    )


def _previous_history(previous_id: str, owner: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The checkpoint items of the owner's finished response ``previous_id``, and its agent tree
    (multi-agent responses; else None).

    The parent's row is always read (existence, owner, status: one indexed query), so deletes on
    any process and other owners' ids are honoured; only the items come from the in-process
    cache when it holds them.
    """
    cached = history_cache.get(previous_id, owner)
    found = rawsql.parent_row(previous_id, owner, with_item_ids=cached is None)
    status, item_ids, agent_tree = found if found is not None else (None, None, None)
    if status is None:
        # OpenAI answers 400 for an unknown previous response; another owner's id is unknown.
        if cached is not None:
            history_cache.discard(previous_id)  # deleted by another process
        raise errors.BadRequest(
            f"Previous response with id '{previous_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    if status in (Response.Status.QUEUED, Response.Status.IN_PROGRESS):
        raise errors.BadRequest(
            f"Previous response with id '{previous_id}' is still {status}; "
            "wait for it to finish before continuing it.",
            param="previous_response_id",
            code="previous_response_in_progress",
        )
    if cached is not None:
        return cached, agent_tree
    history = [item.data for item in selectors.items_in_order(ids=item_ids or [], owner=owner)]
    history_cache.put(previous_id, owner, history)
    return history, agent_tree


def _resolve_input(
    items: list[dict[str, Any]], owner: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Input items with our ids: stored items are referenced, new ones get a fresh id."""
    wanted = [item["id"] for item in items if isinstance(item.get("id"), str)]
    stored = {i.id: i for i in Item.objects.filter(id__in=wanted, owner=owner)} if wanted else {}
    resolved: list[dict[str, Any]] = []
    to_insert: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if item.get("type") == "item_reference":
            ref = stored.get(item["id"])
            if ref is None:
                raise errors.BadRequest(
                    f"Item with id '{item['id']}' not found.",
                    param=f"input[{index}].id",
                    code="item_not_found",
                )
            resolved.append(ref.data)
            continue
        item_id = item.get("id")
        existing = stored.get(item_id) if isinstance(item_id, str) else None
        if existing is not None:
            resolved.append(existing.data)
            continue
        item = dict(item)
        item["id"] = translate.mint_item_id(item["type"])
        if item["type"] in AGENT_ITEM_TYPES:
            item[PRIVATE_KEY] = INPUT_MARK  # stored, never the model's (responses_app.features.multi_agent)
        if item["type"] == "message" and "status" not in item:
            item["status"] = "completed"
        resolved.append(item)
        to_insert.append(item)
    return resolved, to_insert


@dataclass(frozen=True)
class Outcome:
    """How a response ended: what :func:`response_store_final` stores with its checkpoint."""

    status: str
    snapshot: dict[str, Any] | None  # None: a history-only record (a /compact checkpoint)
    output_items: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    # A background response's terminal event (sequence number, JSON), stored with it.
    terminal_event: tuple[int, bytes] | None = None
    # The history a continuation starts from when it is not history + input + output: a response
    # that compacted (responses_app.features.compaction) continues from its window.
    window: list[dict[str, Any]] | None = None
    agent_tree: dict[str, Any] | None = None  # a multi-agent response's tree snapshot


@dataclass
class FinalWrite:
    """A finished response to store (:func:`response_store_final`)."""

    prepared: Prepared
    outcome: Outcome


@dataclass
class InProgressWrite:
    """The ``in_progress`` row of a stored stream (:func:`response_create_in_progress`)."""

    prepared: Prepared
    snapshot: dict[str, Any]
    lease_owner: str
    lease_s: float


def response_store_rows(writes: list[FinalWrite | InProgressWrite]) -> list[bool]:
    """Store ``writes`` that touch nothing but their items and row, all in one statement
    (:func:`rawsql.store_responses`): a batch of :data:`final_writes`. One answer per write (False:
    a finished response cancelled meanwhile); a stored final write's checkpoint is cached once
    committed."""
    built = [
        _final_rows(write.prepared, write.outcome)
        if isinstance(write, FinalWrite)
        else _in_progress_rows(write)
        for write in writes
    ]
    stored = rawsql.store_responses(built)
    _cache_on_commit(
        [write for write, ok in zip(writes, stored, strict=True) if ok and isinstance(write, FinalWrite)]
    )
    return stored


# The group commit of the stored-response writes: a plain finished response and a stream's
# ``in_progress`` row are combined into one statement with the others of their batch (put); a
# response with more to write (its conversation, a background response's terminal event) runs its
# own function in the batch's transaction (run). ``store_final`` chooses.
final_writes = GroupWriter(rawsql.writing, combine=response_store_rows)


async def store_final(prepared: Prepared, outcome: Outcome) -> bool:
    """Store a finished response through :data:`final_writes` (from async code)."""
    if _writes_alone(prepared, outcome):
        return await final_writes.run(response_store_final, prepared=prepared, outcome=outcome)
    stored: bool = await final_writes.put(FinalWrite(prepared, outcome))
    return stored


def store_in_progress(
    prepared: Prepared, snapshot: dict[str, Any], lease_owner: str, lease_s: float
) -> asyncio.Future[Any]:
    """Queue a stored stream's ``in_progress`` row on :data:`final_writes` (from the event loop): the
    future of its write, which :func:`withdraw_in_progress` may take back until a batch takes it."""
    return final_writes.submit(InProgressWrite(prepared, snapshot, lease_owner, lease_s))


def withdraw_in_progress(write: asyncio.Future[Any]) -> bool:
    """Take back an ``in_progress`` row that no batch has taken yet (its final row supersedes it)."""
    return final_writes.withdraw(write)


def _writes_alone(p: Prepared, outcome: Outcome) -> bool:
    """Whether storing this response writes more than its items and row."""
    return bool(p.conversation_id) or (p.background and outcome.terminal_event is not None)


def _final_rows(p: Prepared, outcome: Outcome) -> tuple[list[Any], Any]:
    return rawsql.rows(
        items=[*p.items_to_insert, *outcome.output_items],
        owner=p.owner,
        response=_response_values(p, outcome),
    )


def _cache_on_commit(writes: list[FinalWrite]) -> None:
    """Cache the checkpoints of stored ``writes`` once committed (a group commit may roll the batch
    back and write it again): one callback for the batch."""

    def cache() -> None:
        for write in writes:
            history_cache.put(
                write.prepared.response_id, write.prepared.owner, _window(write.prepared, write.outcome)
            )

    if writes:
        transaction.on_commit(cache)


def response_store_final(*, prepared: Prepared, outcome: Outcome) -> bool:
    """Store a finished response: its new items once and its row with the checkpoint, in one
    transaction (with the terminal event of a background response, and the append to its
    conversation). False when the response was cancelled meanwhile (its row stays as it is).

    Every finished response takes this path (:func:`rawsql.store_responses`); the checkpoint is
    then cached for a continuation on this process.
    """
    p = prepared
    if not _writes_alone(p, outcome):
        return response_store_rows([FinalWrite(p, outcome)])[0]
    terminal_event = outcome.terminal_event if p.background else None
    item_rows, response_row = _final_rows(p, outcome)
    with rawsql.writing():
        stored = rawsql.store_response(item_rows=item_rows, response_row=response_row)
        if stored and terminal_event is not None:
            ResponseEvent.objects.create(
                response_id=p.response_id,
                sequence_number=terminal_event[0],
                data=terminal_event[1].decode(),
            )
        if stored and p.conversation_id:
            conversation_services.conversation_append_items(
                conversation_id=p.conversation_id,
                owner=p.owner,
                item_ids=[item["id"] for item in (*p.new_items, *outcome.output_items)],
                expected_revision=p.conversation_revision,
            )
    if stored:
        _cache_on_commit([FinalWrite(p, outcome)])
    return stored


def _window(p: Prepared, outcome: Outcome) -> list[dict[str, Any]]:
    if outcome.window is not None:
        return outcome.window
    return [*p.history, *p.new_items, *outcome.output_items]


def response_compaction_store(
    *,
    prepared: Prepared,
    retained: list[dict[str, Any]],
    item: dict[str, Any],
    kept: list[dict[str, Any]],
    usage: dict[str, Any],
) -> None:
    """Store a ``POST /v1/responses/compact`` answer as a checkpoint (the retained user messages,
    the compaction item, then ``kept``: a multi-agent chain's subagent items, with its agent tree)
    that ``previous_response_id`` can name. The retained messages that were stored already are
    referenced, not copied; nothing stored before is changed.

    The record is history only (no snapshot): ``GET /v1/responses/{id}`` answers it 409, as the
    spec says of records made through history-only APIs; the compaction object is not a response.
    """
    new_ids = {i["id"] for i in prepared.items_to_insert}
    window = dataclasses.replace(
        prepared,
        history=[],
        new_items=retained,
        items_to_insert=[message for message in retained if message["id"] in new_ids],
    )
    outcome = Outcome(
        "completed",
        None,
        [item],
        usage,
        window=[*retained, item, *kept],
        agent_tree=prepared.agent_tree,
    )
    response_store_final(prepared=window, outcome=outcome)


def _response_values(p: Prepared, outcome: Outcome) -> dict[str, Any]:
    """The response row's values (by attribute name); the end of the response decides the
    :data:`rawsql.FINAL_COLUMNS`, which are all a background response's placeholder takes."""
    return {
        "id": p.response_id,
        "owner": p.owner,
        "model": p.request.model,
        "background": p.background,
        "previous_response_id": p.previous_response_id,
        "conversation_id": p.conversation_id or "",
        "request": strip_credentials(p.raw),
        "status": outcome.status,
        "snapshot": outcome.snapshot,
        "usage": outcome.usage,
        "error": outcome.error,
        "agent_tree": outcome.agent_tree,
        "history_item_ids": [item["id"] for item in _window(p, outcome)],
        "input_item_count": _input_count(p, outcome),
        "completed_at": timezone.now(),
    }


def _input_count(p: Prepared, outcome: Outcome) -> int:
    """How many leading checkpoint items are input (the rest is output): for a window, the items
    before the first of this response's output items in it."""
    if outcome.window is None:
        return len(p.history) + len(p.new_items)
    produced = {item["id"] for item in outcome.output_items}
    return next((i for i, item in enumerate(outcome.window) if item["id"] in produced), len(outcome.window))


def response_create_queued(
    *, prepared: Prepared, lease_owner: str = "", lease_s: float | None = None
) -> dict[str, Any]:
    """A background response, stored as ``queued`` before any work starts; an in-process one
    under this process's lease from the start (it has no broker to hold it meanwhile)."""
    p = prepared
    snapshot = base_snapshot(p, Response.Status.QUEUED)
    Response.objects.create(
        id=p.response_id,
        owner=p.owner,
        status=Response.Status.QUEUED,
        model=p.request.model,
        background=True,
        previous_response_id=p.previous_response_id,
        conversation_id=p.conversation_id or "",
        request=strip_credentials(p.raw),
        snapshot=snapshot,
        lease_owner=lease_owner,
        lease_expires_at=_lease_until(lease_s) if lease_s is not None else None,
    )
    return snapshot


def response_create_in_progress(
    *, prepared: Prepared, snapshot: dict[str, Any], lease_owner: str, lease_s: float
) -> None:
    """The row of a stored response whose id is announced before it ends (SSE, WebSocket): written
    ``in_progress`` under ``lease_owner``'s lease before ``response.created``, so the sweep fails it
    if its process dies (docs/operations.md). :func:`response_store_final` finishes it; until then
    it references no item (its items are stored with it at the end)."""
    response_store_rows([InProgressWrite(prepared, snapshot, lease_owner, lease_s)])


def _in_progress_rows(write: InProgressWrite) -> tuple[list[Any], Any]:
    values = _response_values(write.prepared, Outcome(Response.Status.IN_PROGRESS.value, write.snapshot, []))
    values.update(
        history_item_ids=[],
        input_item_count=0,
        completed_at=None,
        lease_owner=write.lease_owner,
        lease_expires_at=_lease_until(write.lease_s),
    )
    return rawsql.rows(items=[], owner=write.prepared.owner, response=values)


def response_delete_unsent(*, id: str) -> None:
    """Remove a queued response whose task could not be sent (the request is refused with 503)."""
    Response.objects.filter(id=id, status=Response.Status.QUEUED).delete()


def response_events_append(*, response_id: str, events: list[tuple[int, bytes]]) -> str | None:
    """Persist stream events of a background response; returns its current status."""
    ResponseEvent.objects.bulk_create(
        [
            ResponseEvent(response_id=response_id, sequence_number=seq, data=data.decode())
            for seq, data in events
        ],
        ignore_conflicts=True,
    )
    return selectors.response_status(id=response_id)


@transaction.atomic
def response_cancel(*, id: str, owner: str) -> dict[str, Any]:
    response = selectors.response_get(id=id, owner=owner)
    if not response.background:
        raise errors.BadRequest(
            "Only responses created with background=true can be cancelled.",
            param=None,
            code="invalid_request",
        )
    if response.status == Response.Status.CANCELLED:
        return response.snapshot or {}
    if response.is_terminal:
        raise errors.BadRequest(
            f"Cannot cancel a {response.status} response.", param=None, code="invalid_request"
        )
    snapshot = dict(response.snapshot or {})
    snapshot["status"] = Response.Status.CANCELLED
    updated = Response.objects.filter(
        id=id, status__in=[Response.Status.QUEUED, Response.Status.IN_PROGRESS]
    ).update(status=Response.Status.CANCELLED, snapshot=snapshot, completed_at=timezone.now())
    if not updated:  # it finished meanwhile
        response.refresh_from_db()
        if response.status != Response.Status.CANCELLED:
            raise errors.BadRequest(
                f"Cannot cancel a {response.status} response.", param=None, code="invalid_request"
            )
        return response.snapshot or {}
    return snapshot


def response_delete(*, id: str, owner: str) -> None:
    """Delete the response record; its items stay (later responses' checkpoints share them).

    Its cached checkpoint goes at once on this process; other processes check the parent's row
    before every continuation, so they refuse it too."""
    response = selectors.response_get(id=id, owner=owner)
    response.delete()
    history_cache.discard(id)


# --- leases of running background responses and stored streams (docs/operations.md) ---------------------------------

_UNFINISHED = (Response.Status.QUEUED, Response.Status.IN_PROGRESS)


def _lease_until(lease_s: float) -> Any:
    return timezone.now() + datetime.timedelta(seconds=lease_s)


def response_lease_take(*, id: str, lease_owner: str, lease_s: float) -> bool:
    """Mark a ``queued`` background response ``in_progress`` under ``lease_owner``'s lease."""
    with transaction.atomic():
        response = Response.objects.select_for_update().filter(id=id, status=Response.Status.QUEUED).first()
        if response is None:
            return False
        snapshot = dict(response.snapshot or {})
        snapshot["status"] = Response.Status.IN_PROGRESS
        response.status = Response.Status.IN_PROGRESS
        response.snapshot = snapshot
        response.lease_owner = lease_owner
        response.lease_expires_at = _lease_until(lease_s)
        response.save(update_fields=["status", "snapshot", "lease_owner", "lease_expires_at"])
    return True


def response_leases_renew(*, ids: list[str], lease_owner: str, lease_s: float) -> set[str]:
    """The heartbeat of the leases a process holds (``leases.start_heartbeat``), in one transaction:
    the rows still ``lease_owner``'s and unfinished are locked and renewed, and their ids returned
    (the others were failed, cancelled or taken meanwhile)."""
    until = _lease_until(lease_s)
    with transaction.atomic():
        rows = Response.objects.filter(id__in=ids, lease_owner=lease_owner, status__in=_UNFINISHED)
        renewed = set(rows.select_for_update().values_list("id", flat=True))
        if renewed:
            rows.filter(id__in=renewed).update(lease_expires_at=until)
    return renewed


def response_fail_unfinished(
    *, id: str, message: str, lease_expired_before: Any = None, code: str = "server_error"
) -> bool:
    """Store an unfinished response ``failed`` with ``message`` and, for a background one, end its
    stored event stream with ``response.failed`` (a client tailing it gets its terminal event).

    With ``lease_expired_before``, only while its lease is older than that (the sweep: a runner
    that renewed meanwhile keeps it). False when it had finished (or was renewed) meanwhile.
    """
    with transaction.atomic():
        rows = Response.objects.select_for_update().filter(id=id, status__in=_UNFINISHED)
        if lease_expired_before is not None:
            rows = rows.filter(lease_expires_at__lt=lease_expired_before)
        response = rows.first()
        if response is None:
            return False
        error = {"code": code, "message": message}
        snapshot = dict(response.snapshot or {})
        snapshot.update(status=Response.Status.FAILED, error=error, completed_at=None)
        response.status = Response.Status.FAILED
        response.snapshot = snapshot
        response.error = error
        response.completed_at = timezone.now()
        response.lease_expires_at = None
        response.save(update_fields=["status", "snapshot", "error", "completed_at", "lease_expires_at"])
        if not response.background:
            return True  # nothing streams its stored events (GET ?stream=true is background only)
        last = ResponseEvent.objects.filter(response_id=id).order_by("-sequence_number").first()
        sequence_number = 0 if last is None else last.sequence_number + 1
        event = {"type": "response.failed", "response": snapshot, "sequence_number": sequence_number}
        ResponseEvent.objects.create(
            response_id=id, sequence_number=sequence_number, data=rawsql.dumps(event) or ""
        )
    return True


LEASE_EXPIRED_MESSAGE = (
    "The process running this response stopped before it finished (its lease expired); "
    "the response was not completed. Create it again."
)
ORPHAN_MESSAGE = (
    "The process running this response exited before it finished; "
    "the response was not completed. Create it again."
)


def response_sweep_leases(*, lease_owner_alive: Any = None, host_prefix: str = "") -> int:
    """Fail every unfinished response (background, or a stored stream) whose lease has expired, and (start-up recovery)
    those held by a process of this host (``host_prefix``) that ``lease_owner_alive`` says is
    gone; returns how many were failed."""
    now = timezone.now()
    failed = 0
    expired = Response.objects.filter(status__in=_UNFINISHED, lease_expires_at__lt=now)
    for id in list(expired.values_list("id", flat=True)[:1000]):
        failed += response_fail_unfinished(id=id, message=LEASE_EXPIRED_MESSAGE, lease_expired_before=now)
    if host_prefix and lease_owner_alive is not None:
        held = Response.objects.filter(status__in=_UNFINISHED, lease_owner__startswith=host_prefix)
        for id, owner in list(held.values_list("id", "lease_owner")[:1000]):
            if not lease_owner_alive(owner):
                failed += response_fail_unfinished(id=id, message=ORPHAN_MESSAGE)
    return failed
