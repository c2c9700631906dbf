"""Named inbound API keys (``sk-gw-…``, 256 random bits): generation, hashing, lookup and management.

The database keeps a SHA-256 digest and a display prefix. Each process caches the active keys for
at most ``SNAPSHOT_TTL_S`` (dropped at once on a local change), so a key revoked elsewhere stops
working within that time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from gateway.core import errors
from gateway.core.db import run_orm
from gateway.core.principal import LIMIT_FIELDS, NO_OVERRIDES, Limits

if TYPE_CHECKING:
    from gateway.core.models import ApiKey

log = logging.getLogger("gateway.core.auth")

KEY_PREFIX = "sk-gw-"
DISPLAY_PREFIX_LEN = len(KEY_PREFIX) + 6
SNAPSHOT_TTL_S = 1.0
LAST_USED_EVERY_S = 60.0


@dataclass(frozen=True)
class ActiveKey:
    id: int
    name: str
    key_hash: str
    is_admin: bool = False
    limits: Limits = NO_OVERRIDES


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    by_prefix: dict[str, tuple[ActiveKey, ...]]

    @property
    def any(self) -> bool:
        return bool(self.by_prefix)


_snapshot: Snapshot | None = None
_last_touched: dict[int, float] = {}
# The reload in progress, per event loop (tests and Celery tasks run several loops).
_reloads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Snapshot]]
_reloads = weakref.WeakKeyDictionary()
_generation = 0  # bumped by reset(): a reload that started before it does not store its result


def generate_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def display_prefix(secret: str) -> str:
    return secret[:DISPLAY_PREFIX_LEN]


def reset() -> None:
    """Drop the snapshot (after a create or revoke here; between tests)."""
    global _snapshot, _generation
    _snapshot = None
    _generation += 1
    _reloads.clear()  # a reload already running may predate the change: do not join it
    _last_touched.clear()


def pin_no_keys() -> None:
    """Behave as if no named key exists, without ever reading the table (tests without a database)."""
    global _snapshot
    _snapshot = Snapshot(float("inf"), {})


def _load_snapshot() -> Snapshot:
    from gateway.core.models import ApiKey

    by_prefix: dict[str, list[ActiveKey]] = {}
    rows = ApiKey.objects.filter(is_active=True).values_list(
        "pk", "name", "prefix", "key_hash", "is_admin", *LIMIT_FIELDS
    )
    for pk, name, prefix, key_hash, is_admin, *limits in rows:
        key = ActiveKey(
            pk,
            name,
            key_hash,
            is_admin,
            Limits(*limits) if any(v is not None for v in limits) else NO_OVERRIDES,
        )
        by_prefix.setdefault(prefix, []).append(key)
    return Snapshot(time.monotonic(), {p: tuple(v) for p, v in by_prefix.items()})


def fresh_snapshot() -> Snapshot | None:
    """The active keys when the snapshot needs no reload; ``None`` when :func:`snapshot` must load it."""
    current = _snapshot
    if current is not None and time.monotonic() - current.taken_at < SNAPSHOT_TTL_S:
        return current
    return None


async def snapshot() -> Snapshot:
    """The active keys, at most ``SNAPSHOT_TTL_S`` old, one shared reload when stale. When the database
    cannot be read the last snapshot stays; without one, a 503 (fail closed)."""
    current = _snapshot
    fresh = fresh_snapshot()
    if fresh is not None:
        return fresh
    loop = asyncio.get_running_loop()
    reload = _reloads.get(loop)
    if reload is None:
        reload = loop.create_task(_reload(current))
        _reloads[loop] = reload
        reload.add_done_callback(
            lambda task: _reloads.pop(loop, None) if _reloads.get(loop) is task else None
        )
    return await asyncio.shield(reload)


async def _reload(current: Snapshot | None) -> Snapshot:
    global _snapshot
    generation = _generation
    try:
        fresh = await run_orm(_load_snapshot)
    except DatabaseError as exc:
        log.warning("cannot read the API keys: %s", exc)
        if current is None:
            raise errors.ServiceUnavailable(
                "Authentication is unavailable: the API keys cannot be read.", code="auth_unavailable"
            ) from None
        return current
    if generation == _generation:
        _snapshot = fresh
    return fresh


def match(snap: Snapshot, secret: str) -> ActiveKey | None:
    """The active key whose digest equals ``secret``'s, compared in constant time."""
    digest = hash_secret(secret)
    found: ActiveKey | None = None
    # Every candidate is compared (no early exit), so timing says nothing about the digest.
    for candidate in snap.by_prefix.get(display_prefix(secret), ()):
        if hmac.compare_digest(candidate.key_hash, digest):
            found = candidate
    return found


def _touch(key_id: int) -> None:
    from gateway.core.models import ApiKey

    ApiKey.objects.filter(pk=key_id).update(last_used_at=timezone.now())


def use_due(key: ActiveKey) -> bool:
    """Whether :func:`record_use` would write ``key``'s last use now."""
    return time.monotonic() - _last_touched.get(key.id, -LAST_USED_EVERY_S) >= LAST_USED_EVERY_S


async def record_use(key: ActiveKey) -> None:
    """Update ``last_used_at`` at most once a minute per key and process (no write per request)."""
    if not use_due(key):
        return
    _last_touched[key.id] = time.monotonic()
    await run_orm(_touch, key.id)


# -- services and selectors (management command, admin) ----------------------------------------


def apikey_create(*, name: str, **settings: Any) -> tuple[ApiKey, str]:
    """Create a named key; returns ``(ApiKey, secret)``. The secret is not stored anywhere.
    ``settings``: ``is_admin`` and quota overrides, checked as :func:`apikey_update` checks them."""
    from gateway.core.models import ApiKey

    name = name.strip()
    if not name:
        raise errors.BadRequest("An API key needs a name.", param="name")
    secret = generate_secret()
    key = ApiKey(name=name, prefix=display_prefix(secret), key_hash=hash_secret(secret))
    _apply(key, settings)
    with transaction.atomic():
        if ApiKey.objects.filter(name=name).exists():
            raise errors.Conflict(f"An API key named {name!r} already exists.", param="name")
        key.save()
    reset()
    return key, secret


def apikey_update(*, name_or_id: str, **settings: Any) -> ApiKey:
    """Change a key's ``is_admin`` flag or quota overrides (``None`` clears one: the [quotas] default).
    A negative, zero or non-integer limit is a 400 naming the field."""
    key = apikey_get(name_or_id=name_or_id)
    _apply(key, settings)
    key.save(update_fields=list(settings))
    reset()
    return key


def _apply(key: ApiKey, settings: dict[str, Any]) -> None:
    from django.core.exceptions import ValidationError

    for name, value in settings.items():
        if name != "is_admin" and name not in LIMIT_FIELDS:
            raise TypeError(f"not an API key setting: {name}")
        setattr(key, name, value)
    try:
        key.clean()
    except ValidationError as exc:
        name, messages = next(iter(exc.message_dict.items()))
        raise errors.BadRequest(messages[0], param=name, code="invalid_value") from None


def apikey_revoke(*, name_or_id: str) -> ApiKey:
    """Deactivate a key (kept for the record: its owner id stays on stored objects)."""
    key = apikey_get(name_or_id=name_or_id)
    if key.is_active:
        key.is_active = False
        key.revoked_at = timezone.now()
        key.save(update_fields=["is_active", "revoked_at"])
    reset()
    return key


def apikey_get(*, name_or_id: str) -> ApiKey:
    from gateway.core.models import ApiKey

    queryset = ApiKey.objects.filter(name=name_or_id)
    if name_or_id.isdigit():
        queryset = queryset | ApiKey.objects.filter(pk=int(name_or_id))
    key = queryset.first()
    if key is None:
        raise errors.NotFound(f"No API key named {name_or_id!r}.")
    return key


def apikey_list() -> QuerySet[ApiKey]:
    from gateway.core.models import ApiKey

    return ApiKey.objects.order_by("created_at", "pk")
