"""Leases of running responses: who runs each (``runner_id``), its heartbeat, and the sweep that
fails the responses whose runner died.

A running background response (or stored stream) holds a lease its runner renews every
``[responses] heartbeat_s``; every gateway and worker sweeps expired leases. Used by the Celery
tasks (``tasks``) and by the runs they start (``runs``), which is why it is neither of them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Callable

from gateway.config import Config, get_config
from gateway.db import run_orm

log = logging.getLogger("responses.background")

HOST = socket.gethostname()
_identity: tuple[int, str] | None = None


def runner_id() -> str:
    """This process's lease owner name, ``host/pid/token`` (a forked child gets its own)."""
    global _identity
    pid = os.getpid()
    if _identity is None or _identity[0] != pid:
        _identity = (pid, f"{HOST}/{pid}/{secrets.token_hex(4)}")
    return _identity[1]


def lease_owner_alive(owner: str) -> bool:
    """Whether the process named by lease owner ``owner`` (of this host) still runs."""
    try:
        host, pid_text, _token = owner.split("/", 2)
        pid = int(pid_text)
    except ValueError:
        return True  # not ours to judge
    if host != HOST:
        return True
    if pid == os.getpid():
        return owner == runner_id()  # this pid's earlier life: a restarted process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_once() -> int:
    from responses_app import services

    return services.response_sweep_leases(lease_owner_alive=lease_owner_alive, host_prefix=f"{HOST}/")


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


def start_heartbeat(response_id: str, config: Config, on_lost: Callable[[], None]) -> asyncio.Task[None]:
    """Renew this process's lease of ``response_id`` every ``[responses] heartbeat_s`` until the
    task is cancelled; ``on_lost()`` once a renewal finds the lease gone (the row was failed by the
    sweep, cancelled or deleted). Background work and stored streams (``runs.drive``) share it."""
    return asyncio.get_running_loop().create_task(_heartbeat(response_id, config, on_lost))


async def _heartbeat(response_id: str, config: Config, on_lost: Callable[[], None]) -> None:
    from responses_app import services

    owner, every, lease_s = runner_id(), config.responses.heartbeat_s, config.responses.lease_s
    while True:
        await asyncio.sleep(every)
        try:
            renewed = await run_orm(
                services.response_lease_renew, id=response_id, lease_owner=owner, lease_s=lease_s
            )
        except Exception:
            log.exception("response %s: lease renewal failed", response_id)
            continue  # the database may come back before the lease expires
        if not renewed:  # failed by the sweep, or cancelled: stop working on it
            on_lost()
            return
