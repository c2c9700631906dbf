"""Who runs a leased piece of work: this process's lease owner name (``host/pid/token``) and whether
the process a lease owner names is still alive. Background responses and file ingestions both hold
leases under it, and their sweeps ask :func:`owner_alive` before failing a row early."""

from __future__ import annotations

import os
import secrets
import socket

HOST = socket.gethostname()
_identity: tuple[int, str] | None = None


def runner_id() -> str:
    """This process's lease owner name, ``host/pid/token`` (a forked child gets its own)."""
    global _identity
    pid = os.getpid()
    if _identity is None or _identity[0] != pid:
        _identity = (pid, f"{HOST}/{pid}/{secrets.token_hex(4)}")
    return _identity[1]


def owner_alive(owner: str) -> bool:
    """Whether the process named by lease owner ``owner`` still runs (True where this host cannot tell:
    another host's, or not a ``host/pid/token`` name)."""
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
