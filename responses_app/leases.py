"""Leases: which process owns a running response, and its heartbeat.

A running stored response is leased by the process working on it (``host/pid/token``), renewed
every ``[responses] heartbeat_s``; the sweep fails responses whose lease expired or whose owner
process of this host is gone. Background work (``tasks``) and stored streams (``runs``) share this.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Callable

from gateway.config import Config
from gateway.db import run_orm

log = logging.getLogger(__name__)

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
