"""Background responses: the work runs detached from the HTTP request that created it.

With a broker (``REDIS_URL``) the work is the Celery task ``responses.run_background`` on the
``responses`` queue (run a worker with ``-Q responses``). Without one, Celery would run the task
eagerly inside the request, blocking it, so the gateway instead starts an asyncio task on the
server's own event loop: the request returns at once, and ``cancel`` cancels that task. Either
way every event is persisted (``ResponseEvent``) so clients can poll or stream it, and a cancel
is seen by the runner at its next flush (the database row is the source of truth).

In-process background work does not survive a restart of the gateway process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from celery import shared_task

from gateway.config import Config, get_config
from gateway.db import run_orm
from responses_app.executor import Executor, Prepared

log = logging.getLogger("responses.background")

# In-process runs by response id, so cancel can stop them at once (and so they are not collected).
_running: dict[str, asyncio.Task[None]] = {}

_FLUSH_EVENTS = 32
_FLUSH_SECONDS = 0.05


def start_background(prepared: Prepared, config: Config) -> None:
    """Start the work of a queued background response (call after the queued row is committed)."""
    if config.broker_enabled:
        run_background_task.apply_async(args=[prepared.response_id], queue="responses")
        return
    task = asyncio.get_running_loop().create_task(run_background(prepared, config))
    _running[prepared.response_id] = task
    task.add_done_callback(lambda _t: _running.pop(prepared.response_id, None))


def cancel_local(response_id: str) -> None:
    task = _running.get(response_id)
    if task is not None:
        task.cancel()


async def run_background(prepared: Prepared, config: Config, *, upstream: Any = None) -> None:
    from responses_app import services

    if not await run_orm(services.response_mark_in_progress, id=prepared.response_id):
        return  # cancelled before it started
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
        status = await run_orm(
            services.response_events_append, response_id=prepared.response_id, events=batch
        )
        last_flush = time.monotonic()
        if status == "cancelled":
            cancelled = True

    executor.before_store = flush
    events = executor.run()
    try:
        async for event in events:
            pending.append((event.data["sequence_number"], event.json))
            if len(pending) >= _FLUSH_EVENTS or time.monotonic() - last_flush >= _FLUSH_SECONDS:
                await flush()
            if cancelled:
                break
        await flush()
    except asyncio.CancelledError:
        log.info("background response %s cancelled", prepared.response_id)
        raise
    except Exception:
        log.exception("background response %s crashed", prepared.response_id)
    finally:
        await events.aclose()  # type: ignore[attr-defined]


@shared_task(name="responses.run_background", queue="responses")
def run_background_task(response_id: str) -> None:
    """Celery entry point: rebuild the prepared request from the stored record and run it."""
    asyncio.run(_run_stored_and_close(response_id))


async def _run_stored_and_close(response_id: str) -> None:
    from inference_app.upstream import close_upstreams

    try:
        await _run_stored(response_id)
    finally:
        # This task's event loop ends here: close its upstream connections with it, or every
        # task would leave a pool of open sockets (and its loop) behind in the worker.
        await close_upstreams()


async def _run_stored(response_id: str) -> None:
    from django.utils.http import http_date  # noqa: F401  (ensures Django is set up in the worker)

    from inference_app.upstream import forward_headers
    from responses_app import services
    from responses_app.models import Response
    from responses_app.schemas import ResponseCreateRequest

    row = await run_orm(lambda: Response.objects.filter(id=response_id).first())
    if row is None or row.status != Response.Status.QUEUED:
        return
    config = get_config()
    request = ResponseCreateRequest.model_validate(row.request)
    prepared = await run_orm(
        services.response_prepare,
        request=request,
        raw=row.request,
        owner=row.owner,
        headers=forward_headers({}, config),
        config=config,
        response_id=row.id,
        created_at=int(row.created_at.timestamp()),
    )
    await run_background(prepared, config)
