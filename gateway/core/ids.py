"""Public ids minted by the gateway: ``resp_…``, ``msg_…``, ``fc_…``, ``conv_…``, ``req_…``.

A millisecond timestamp first (creation order, index locality), then unguessable CSPRNG bytes,
drawn 4 KiB at a time (:class:`_RandomBytes`) so minting does not give up the GIL for a system
call per id.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time

_VALID_INCOMING_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class _RandomBytes:
    """``os.urandom`` bytes drawn ``size`` at a time, each slice handed out once. A forked child starts
    with an empty buffer (never its parent's bytes) and a new lock."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.clear()
        os.register_at_fork(after_in_child=self.clear)

    def clear(self) -> None:
        self.lock = threading.Lock()
        self.buffer, self.offset = b"", 0

    def take(self, n: int) -> bytes:
        if n > self.size:
            return os.urandom(n)
        with self.lock:
            start = self.offset
            if start + n > len(self.buffer):
                self.buffer, start = os.urandom(self.size), 0
            self.offset = start + n
            return self.buffer[start : start + n]


_random = _RandomBytes()


def new_id(prefix: str, random_bytes: int = 18) -> str:
    """``<prefix>_`` + 12 hex digits of time + ``2*random_bytes`` random hex digits."""
    return f"{prefix}_{int(time.time() * 1000):012x}{_random.take(random_bytes).hex()}"


def new_request_id() -> str:
    """A time-ordered ``req_`` id; it only correlates log lines, so its random part is not cryptographic."""
    return f"req_{int(time.time() * 1000):012x}{random.getrandbits(80):020x}"


def request_id_for(incoming: str | None) -> str:
    """The caller's ``X-Request-Id`` when it is a sane one, else a new id."""
    if incoming and valid_incoming_request_id(incoming):
        return incoming
    return new_request_id()


def valid_incoming_request_id(value: str) -> bool:
    return bool(_VALID_INCOMING_REQUEST_ID.match(value))


def has_prefix(value: str, prefix: str) -> bool:
    """True when ``value`` looks like one of our ids of kind ``prefix``."""
    return value.startswith(prefix + "_") and len(value) > len(prefix) + 1
