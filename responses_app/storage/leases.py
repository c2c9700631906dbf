"""Leases: which process (``host/pid/token``) owns a running stored response, renewed every
``[responses] heartbeat_s``; the sweep fails responses whose lease expired or whose process is gone."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable

from gateway.core.config import Config
from gateway.core.db import run_orm
from gateway.core.lifecycle import keep_running
from gateway.core.runner import owner_alive, runner_id

log = logging.getLogger(__name__)

# The lease owner names and liveness check live in the kernel (file ingestion holds leases too).
lease_owner_alive = owner_alive


class Heartbeat:
    """One lease held by this process (:func:`start_heartbeat`); :meth:`cancel` stops renewing it."""

    __slots__ = ("due", "every", "lease_s", "on_lost", "renewals", "response_id")

    def __init__(
        self,
        renewals: _Renewals,
        response_id: str,
        every: float,
        lease_s: float,
        on_lost: Callable[[], None],
    ) -> None:
        self.renewals = renewals
        self.response_id = response_id
        self.every = every
        self.lease_s = lease_s
        self.on_lost = on_lost
        self.due = 0.0

    def cancel(self) -> None:
        self.renewals.drop(self)
        # A cancelled lease is never reported lost; dropping the callback also breaks the cycle
        # with its holder (a stream's lease holds its heartbeat, whose callback is the lease's).
        self.on_lost = _nothing


def _nothing() -> None:
    pass


class _Renewals:
    """The leases held on one event loop, renewed together (one timer, one transaction for those due at
    once). A failed renewal is retried a heartbeat later; a lease found gone is reported lost."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: ``_renewals`` is keyed weakly by the loop, and a closed loop (a Celery task's
        # ``asyncio.run``) must be collectable.
        self._loop = weakref.ref(loop)
        self.held: dict[str, Heartbeat] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.renewing = False

    def add(self, heartbeat: Heartbeat) -> None:
        heartbeat.due = asyncio.get_running_loop().time() + heartbeat.every
        self.held[heartbeat.response_id] = heartbeat
        self._schedule()

    def drop(self, heartbeat: Heartbeat) -> None:
        if self.held.get(heartbeat.response_id) is heartbeat:
            del self.held[heartbeat.response_id]
        if not self.held and self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _schedule(self) -> None:
        """The timer at the earliest due renewal (none while a renewal runs: it schedules after)."""
        loop = self._loop()
        if self.renewing or not self.held or loop is None or loop.is_closed():
            return
        when = min(h.due for h in self.held.values())
        if self.timer is not None:
            if self.timer.when() <= when:
                return
            self.timer.cancel()
        self.timer = loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.timer = None
        self.renewing = True
        keep_running(asyncio.get_running_loop().create_task(self._renew()))

    async def _renew(self) -> None:
        from responses_app.storage import services

        try:
            loop = asyncio.get_running_loop()
            now = loop.time()
            due = [h for h in self.held.values() if h.due <= now]
            by_lease: dict[float, list[Heartbeat]] = {}
            for heartbeat in due:
                by_lease.setdefault(heartbeat.lease_s, []).append(heartbeat)
            owner = runner_id()
            for lease_s, group in by_lease.items():
                ids = [h.response_id for h in group]
                try:
                    renewed = await run_orm(
                        services.response_leases_renew, ids=ids, lease_owner=owner, lease_s=lease_s
                    )
                except Exception:
                    log.exception("lease renewal of %d responses failed", len(ids))
                    renewed = set(ids)  # tried again a heartbeat later
                for heartbeat in group:
                    heartbeat.due = loop.time() + heartbeat.every
                    if (
                        heartbeat.response_id in renewed
                        or self.held.get(heartbeat.response_id) is not heartbeat
                    ):
                        continue
                    # Failed by the sweep, cancelled or deleted: stop working on it.
                    self.drop(heartbeat)
                    heartbeat.on_lost()
        finally:
            self.renewing = False
            self._schedule()


_renewals: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Renewals] = weakref.WeakKeyDictionary()


def start_heartbeat(response_id: str, config: Config, on_lost: Callable[[], None]) -> Heartbeat:
    """Renew this process's lease of ``response_id`` every ``[responses] heartbeat_s`` until cancelled;
    ``on_lost()`` once a renewal finds it gone (swept, cancelled or deleted)."""
    loop = asyncio.get_running_loop()
    renewals = _renewals.get(loop)
    if renewals is None:
        for closed in [other for other in _renewals if other.is_closed()]:
            del _renewals[closed]  # a loop closed with a lease still held (its timer holds it)
        renewals = _renewals[loop] = _Renewals(loop)
    heartbeat = Heartbeat(
        renewals, response_id, config.responses.heartbeat_s, config.responses.lease_s, on_lost
    )
    renewals.add(heartbeat)
    return heartbeat
