"""Background responses: the work runs detached from the HTTP request that created it.

With a broker it is the Celery task ``responses.run_background`` (queue ``responses``); without one,
an asyncio task on the server's loop (eager Celery would block the request). Every event is stored
for polling and streaming. A running response holds a lease; :func:`sweep_forever` fails rows whose
lease expired (``docs/operations.md``). A broker that refuses the task is a 503, nothing stored.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError

from gateway.core import errors
from gateway.core.config import Config, get_config
from gateway.core.db import run_orm
from gateway.core.lifecycle import drain
from gateway.core.principal import Limits, Principal
from gateway.core.runner import HOST
from responses_app.engine.domain import Prepared
from responses_app.engine.executor import Executor
from responses_app.engine.metering import current_request_id
from responses_app.storage.leases import lease_owner_alive, runner_id, start_heartbeat

log = logging.getLogger("responses.background")

# In-process runs by response id, so cancel can stop them at once (and so they are not collected).
_running: dict[str, asyncio.Task[None]] = {}

_FLUSH_EVENTS = 32
# How often the gateway that queued a background response on the broker checks whether it ended.
FINISHED_POLL_S = 1.0
_FLUSH_SECONDS = 0.05


def sweep_once() -> int:
    """One pass of the lease sweep: background responses (their number failed is returned), then file
    ingestions (files_app.ingest.sweep, which logs its own), then files past their ``expires_after``
    (their attachments, chunks and bytes)."""
    from files_app import ingest
    from files_app import services as files
    from responses_app.storage import services

    failed = services.response_sweep_leases(lease_owner_alive=lease_owner_alive, host_prefix=f"{HOST}/")
    try:
        ingest.sweep()
    except Exception:  # one sweep's failure does not stop the others
        log.exception("ingestion lease sweep failed")
    try:
        files.files_expired_delete()
    except Exception:
        log.exception("expired files sweep failed")
    return failed


async def sweep_forever() -> None:
    """The periodic sweep each gateway process runs (its first pass is the start-up recovery)."""
    interval = get_config().responses.sweep_interval_s
    while True:
        try:
            failed = await run_orm(sweep_once)
            if failed:
                log.warning("lease sweep: %d unfinished background responses stored failed", failed)
        except Exception:
            log.exception("lease sweep failed; next try in %g s", interval)
        await asyncio.sleep(interval)


async def create_background(prepared: Prepared, config: Config) -> dict[str, Any]:
    """Store a queued background response and start its work. The task is sent after commit; a broker
    that refuses it is a 503 and the row is removed, so nothing is left that nobody will run."""
    from responses_app.storage import services

    # The usage ledger charges its calls to this request's principal and id, wherever it runs.
    prepared.request_id = prepared.request_id or current_request_id()
    if not config.broker_enabled:
        snapshot: dict[str, Any] = await run_orm(
            services.response_create_queued,
            prepared=prepared,
            lease_owner=runner_id(),
            lease_s=config.responses.lease_s,
        )
        task = asyncio.get_running_loop().create_task(run_background(prepared, config))
        _running[prepared.response_id] = task
        task.add_done_callback(lambda _t: _running.pop(prepared.response_id, None))
        return snapshot
    snapshot = await run_orm(services.response_create_queued, prepared=prepared)
    try:
        # In this context, so the task's headers carry the current trace (run_in_executor copies none).
        context = contextvars.copy_context()
        await asyncio.get_running_loop().run_in_executor(None, context.run, _send_task, prepared)
    except Exception as exc:
        log.error("background response %s: the broker refused its task: %s", prepared.response_id, exc)
        await run_orm(services.response_delete_unsent, id=prepared.response_id)
        raise errors.ServiceUnavailable(
            "Background responses are unavailable: the task broker (REDIS_URL) cannot be reached.",
            code="broker_unavailable",
        ) from None
    return snapshot


async def finished(response_id: str) -> None:
    """Return once the background response has ended (completed, failed, cancelled or incomplete):
    its in-process task ends, or with a broker its stored status leaves queued/in_progress."""
    from responses_app.storage import selectors

    task = _running.get(response_id)
    if task is not None:
        await asyncio.wait([task])
        return
    while True:
        status = await run_orm(selectors.response_status, id=response_id)
        if status not in ("queued", "in_progress"):
            return
        await asyncio.sleep(FINISHED_POLL_S)


def _send_task(prepared: Prepared) -> None:
    # No retries: a broker that is down refuses the request now rather than holding it.
    run_background_task.apply_async(
        args=[prepared.response_id],
        kwargs={"principal": dataclasses.asdict(prepared.principal), "request_id": prepared.request_id},
        queue="responses",
        retry=False,
    )


def _principal(fields: dict[str, Any] | None, owner: str) -> Principal:
    """The principal a task was sent with (:func:`_send_task`); the row's owner alone without it."""
    if not isinstance(fields, dict) or fields.get("owner") != owner:
        return Principal(owner=owner)
    try:
        return Principal(**{**fields, "limits": Limits(**(fields.get("limits") or {}))})
    except TypeError:  # sent by another version of the gateway
        return Principal(owner=owner)


def cancel_local(response_id: str) -> None:
    task = _running.get(response_id)
    if task is not None:
        task.cancel()


async def run_background(prepared: Prepared, config: Config, *, upstream: Any = None) -> None:
    from responses_app.engine import runs
    from responses_app.storage import services

    response_id = prepared.response_id
    try:
        taken = await run_orm(
            services.response_lease_take,
            id=response_id,
            lease_owner=runner_id(),
            lease_s=config.responses.lease_s,
        )
    except (OperationalError, InterfaceError) as exc:
        raise _NotStarted(str(exc)) from exc
    if not taken:
        log.info("background response %s: no longer queued (cancelled), not run", response_id)
        return
    executor = Executor(prepared, config, upstream=upstream)
    pending: list[tuple[int, bytes]] = []
    last_flush = time.monotonic()
    cancelled = False

    async def flush() -> None:
        nonlocal last_flush, cancelled
        if not pending:
            return
        batch = list(pending)
        pending.clear()
        status = await run_orm(services.response_events_append, response_id=response_id, events=batch)
        last_flush = time.monotonic()
        if status == "cancelled":
            cancelled = True

    class _Cancelled(Exception):
        pass

    async def on_event(event: Any) -> None:
        pending.append((event.data["sequence_number"], event.json))
        if len(pending) >= _FLUSH_EVENTS or time.monotonic() - last_flush >= _FLUSH_SECONDS:
            await flush()
        if cancelled:
            raise _Cancelled

    executor.before_store = flush
    lost: list[bool] = []
    current = asyncio.current_task()
    assert current is not None

    def lose() -> None:
        lost.append(True)
        current.cancel()

    heartbeat = start_heartbeat(response_id, config, lose)
    # The shutdown waits for what follows the run too: the last events and a crash's stored failure.
    with drain.held():
        try:
            await runs.drive(executor, on_event)
            await flush()
        except _Cancelled:
            pass
        except asyncio.CancelledError:
            if lost:
                log.warning("background response %s: lease lost, work stopped", response_id)
                return
            log.info("background response %s cancelled", response_id)
            raise
        except Exception as exc:
            log.exception("background response %s crashed", response_id)
            try:
                await run_orm(
                    services.response_fail_unfinished,
                    id=response_id,
                    message=f"The background response failed: {type(exc).__name__}.",
                )
            except Exception:  # the database itself is down: the lease expires and the sweep fails it
                log.exception("background response %s: storing its failure failed", response_id)
        finally:
            heartbeat.cancel()


class _NotStarted(Exception):
    """The database failed before the row was taken: the task is retried (nothing ran yet)."""


@shared_task(
    name="responses.run_background",
    # Nobody reads its result (the row is the result); and sending it then needs no result backend.
    ignore_result=True,
    # Until the database answers again: a task that gave up would leave its row queued for good.
    autoretry_for=(_NotStarted,),
    retry_backoff=1,
    retry_backoff_max=10,
    max_retries=None,
)
def run_background_task(
    response_id: str, principal: dict[str, Any] | None = None, request_id: str = ""
) -> None:
    """Celery entry point: rebuild the prepared request from the stored record and run it
    (``principal`` and ``request_id``: the creating request's, for the usage ledger)."""
    asyncio.run(_run_stored_and_close(response_id, principal, request_id))


async def _run_stored_and_close(
    response_id: str, principal: dict[str, Any] | None = None, request_id: str = ""
) -> None:
    from inference_app.upstream.http import close_upstreams

    try:
        await _run_stored(response_id, principal, request_id)
    finally:
        # This task's event loop ends here: close its upstream connections with it, or every
        # task would leave a pool of open sockets (and its loop) behind in the worker.
        await close_upstreams()


async def _run_stored(
    response_id: str, principal: dict[str, Any] | None = None, request_id: str = ""
) -> None:
    from django.utils.http import http_date  # noqa: F401  (ensures Django is set up in the worker)

    from inference_app.upstream.http import forward_headers
    from responses_app.models import Response
    from responses_app.protocol.schemas import ResponseCreateRequest
    from responses_app.storage import prepare, services

    config = get_config()
    try:
        row = await run_orm(lambda: Response.objects.filter(id=response_id).first())
    except (OperationalError, InterfaceError) as exc:
        raise _NotStarted(str(exc)) from exc
    if row is None or row.is_terminal:
        log.info("background response %s: %s, nothing to run", response_id, row.status if row else "no row")
        return
    if row.status == Response.Status.IN_PROGRESS:
        # A redelivered task (its worker died): the events it sent cannot be resumed. A lease that
        # expired or belongs to a process that is gone is failed now; a live one runs elsewhere.
        from django.utils import timezone

        expired = row.lease_expires_at is None or row.lease_expires_at < timezone.now()
        if expired or not lease_owner_alive(row.lease_owner):
            await run_orm(
                services.response_fail_unfinished, id=row.id, message=services.LEASE_EXPIRED_MESSAGE
            )
            log.warning("background response %s: redelivered after its runner died; stored failed", row.id)
        return
    try:
        request = ResponseCreateRequest.model_validate(row.request)
        prepared = await run_orm(
            prepare.response_prepare,
            request=request,
            raw=row.request,
            owner=row.owner,
            headers=forward_headers({}, config),
            config=config,
            response_id=row.id,
            created_at=int(row.created_at.timestamp()),
            principal=_principal(principal, row.owner),
            request_id=request_id,
        )
    except (OperationalError, InterfaceError) as exc:
        raise _NotStarted(str(exc)) from exc
    except Exception as exc:  # e.g. its parent was deleted meanwhile
        message = exc.message if isinstance(exc, errors.GatewayError) else type(exc).__name__
        await run_orm(
            services.response_fail_unfinished,
            id=row.id,
            message=f"The background response could not start: {message}",
        )
        return
    await run_background(prepared, config)
