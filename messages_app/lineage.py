"""The lineage of a Messages request (``inference_app.upstream.lineage``): Claude Code's session.

Claude Code sends ``metadata.user_id``, which names its session: ``user_<hash>_account_<uuid>_session_<uuid>``,
or (newer versions) a JSON object with a ``session_id``. Every request of one session re-sends that
session's prefix, so the session is the lineage of the request and its server-tool rounds. A
``user_id`` with no session part is the lineage as a whole (one user's requests share their system
prompt and tools). No ``user_id``: no lineage. Scoped by the owner, like every lineage key.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from inference_app.upstream import lineage

_USER_ID = b'"user_id"'
_SESSION = re.compile(r"_session_([0-9A-Za-z-]+)")


def session_of(user_id: str) -> str:
    """The session a ``metadata.user_id`` names (the whole id when it names none)."""
    if user_id.startswith("{"):
        try:
            data = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            data = None
        session = data.get("session_id") if isinstance(data, dict) else None
        if isinstance(session, str) and session:
            return session
    match = _SESSION.search(user_id)
    return match.group(1) if match else user_id


def of_request(data: Any, owner: str) -> str | None:
    """The lineage of a parsed Messages request, or None."""
    metadata = data.get("metadata") if isinstance(data, dict) else None
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user_id, str) or not user_id:
        return None
    return lineage.key(owner, "messages", session_of(user_id))


def of_body(body: bytes, owner: str) -> str | None:
    """:func:`of_request` of a raw body; parsed only when it names a ``user_id`` at all (the relay
    reads nothing else of it)."""
    if body.find(_USER_ID) < 0:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # the upstream answers it
    return of_request(data, owner)
