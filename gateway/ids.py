"""Public ids minted by the gateway: ``resp_…``, ``msg_…``, ``fc_…``, ``conv_…``, ``req_…``.

Ids start with a millisecond timestamp so they sort by creation time (good index locality), then
carry enough randomness to be unguessable.
"""

from __future__ import annotations

import random
import re
import secrets
import time

_VALID_INCOMING_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def new_id(prefix: str, random_bytes: int = 18) -> str:
    """``<prefix>_`` + 12 hex digits of time + ``2*random_bytes`` random hex digits."""
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(random_bytes)}"


def new_request_id() -> str:
    """A time-ordered request id with Anthropic's ``req_`` prefix.

    Request ids only correlate log lines, so their random part comes from the (much cheaper)
    non-cryptographic generator; stored objects' ids use :func:`new_id`.
    """
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
