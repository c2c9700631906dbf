"""The other writes of Responses: background rows, cancel and delete, leases and their sweep.

Every function is keyword-only, synchronous and runs in one transaction; async callers use
``gateway.core.db.run_orm``. Request preparation is ``storage.prepare``, the write path of a
finished response ``storage.writes``.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from gateway.core import errors
from responses_app.engine.domain import Prepared, base_snapshot, strip_credentials
from responses_app.models import Response, ResponseEvent
from responses_app.storage import rawsql, selectors
from responses_app.storage.history_cache import history_cache
from responses_app.storage.writes import lease_until


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
        lineage=p.lineage,
        request=strip_credentials(p.raw),
        snapshot=snapshot,
        lease_owner=lease_owner,
        lease_expires_at=lease_until(lease_s) if lease_s is not None else None,
    )
    return snapshot


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
        response.lease_expires_at = lease_until(lease_s)
        response.save(update_fields=["status", "snapshot", "lease_owner", "lease_expires_at"])
    return True


def response_leases_renew(*, ids: list[str], lease_owner: str, lease_s: float) -> set[str]:
    """The heartbeat of the leases a process holds (``leases.start_heartbeat``), in one transaction:
    the rows still ``lease_owner``'s and unfinished are locked and renewed, and their ids returned
    (the others were failed, cancelled or taken meanwhile)."""
    until = lease_until(lease_s)
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
