"""Quotas per principal: requests per minute, tokens per minute and per day, concurrent requests,
enforced for the whole deployment (``docs/operations.md``, "Quotas").

A principal's limits are its API key's overrides, else the ``[quotas]`` defaults; a principal with no
limit is never looked up. Every admission is one atomic step in a store every gateway process shares:
Redis (one Lua script, one round trip) when ``REDIS_URL`` is set, else the database (one locking
transaction on the principal's :class:`~usage_app.models.QuotaState` row).

- Requests per minute: a sliding-window log of admission times, so no 60 s window ever admits more
  than the limit.
- Tokens: charged when a call's usage is known (:func:`charge`, from the ledger), into the current
  clock minute's and UTC day's counters; a request is admitted while the window still has budget.
- Concurrency: a slot per admitted request until its answer ends (a background response's until the
  work ends). Slots expire ``SLOT_TTL_S`` after their last renewal and live holders renew them, so a
  crashed process's slots free themselves.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import secrets
import threading
import time
import weakref
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.core import errors
from gateway.core.config import QuotasConfig, get_config
from gateway.core.principal import Limits, Principal

log = logging.getLogger("gateway.quotas")

MINUTE_MS = 60_000
DAY_MS = 86_400_000
# A concurrency slot lapses this long after its holder last renewed it (a crashed process's slots);
# live holders renew every third of it.
SLOT_TTL_S = 30.0
RENEW_EVERY_S = SLOT_TTL_S / 3

RawHeaders = list[tuple[bytes, bytes]]

# Fire-and-forget work (charges, releases, renewals): held until done, or the loop would drop it.
_tasks: set[asyncio.Task[Any]] = set()


def effective(principal: Principal, defaults: QuotasConfig) -> Limits | None:
    """The principal's limits (its key's overrides, else the defaults); None: unlimited."""
    own = principal.limits
    limits = Limits(
        own.requests_per_minute if own.requests_per_minute is not None else defaults.requests_per_minute,
        own.tokens_per_minute if own.tokens_per_minute is not None else defaults.tokens_per_minute,
        own.tokens_per_day if own.tokens_per_day is not None else defaults.tokens_per_day,
        own.max_concurrent if own.max_concurrent is not None else defaults.max_concurrent_requests,
    )
    if limits == _UNLIMITED:
        return None
    return limits


_UNLIMITED = Limits()


@dataclass(frozen=True, slots=True)
class Counts:
    """What the store saw at one admission (times in epoch ms, the store's clock)."""

    refused: str  # "" admitted; "requests", "tokens", "day_tokens" or "concurrency"
    requests: int  # admitted in the last minute (this one included when admitted)
    oldest: int  # the oldest of them (``now`` when none): when it leaves, one more is admitted
    newest: int  # the newest of them: when it leaves, the window is empty again
    minute_tokens: int
    day_tokens: int
    held: int  # concurrency slots held (this one included when admitted)
    now: int


def decide(limits: Limits, requests: int, slots: int, tokens: tuple[int, int]) -> str:
    """The refusal for these counts ("" admits), in the order the Redis script checks them."""
    rpm, tpm, tpd, concurrent = _numbers(limits)
    if rpm and requests >= rpm:
        return "requests"
    if tpm and tokens[0] >= tpm:
        return "tokens"
    if tpd and tokens[1] >= tpd:
        return "day_tokens"
    if concurrent and slots >= concurrent:
        return "concurrency"
    return ""


def _numbers(limits: Limits) -> tuple[int, int, int, int]:
    """The limits as the stores take them (0: unlimited)."""
    return (
        limits.requests_per_minute or 0,
        limits.tokens_per_minute or 0,
        limits.tokens_per_day or 0,
        limits.max_concurrent or 0,
    )


# --- stores ------------------------------------------------------------------------------------


class DatabaseStore:
    """The principal's :class:`QuotaState` row, read and written in one transaction that holds its
    lock: ``SELECT … FOR UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE`` (the project's SQLite
    transaction mode) on SQLite. Exact because admissions of one principal are serialized; meant for
    the processes of one host (``make run``), Redis for a deployment. Plain SQL on Django's
    connection: the ORM's query building would cost more than the transaction.

    The request log counts admissions per second (at most 61 pairs, whatever the limit), and a
    second's admissions leave the window 60 s after the second ends: no 60 s window ever admits
    more than the limit, and a request comes back at most a second later than an exact log's."""

    def __init__(self) -> None:
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]
        self._locks = weakref.WeakKeyDictionary()

    async def _run(self, fn: Any, *args: Any) -> Any:
        """One transaction at a time per process: the database's lock serializes the processes,
        and threads of one process queueing on it (SQLite's busy wait) would only add latency."""
        from gateway.core.db import run_orm

        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        async with lock:
            return await run_orm(fn, *args)

    async def admit(self, owner: str, limits: Limits, slot: str) -> Counts:
        result: Counts = await self._run(self._admit, owner, limits, slot, _now_ms())
        return result

    async def charge(self, owner: str, tokens: int) -> None:
        await self._run(self._charge, owner, tokens, _now_ms())

    async def renew(self, owner: str, slot: str) -> None:
        await self._run(self._set_slot, owner, slot, _now_ms() + int(SLOT_TTL_S * 1000))

    async def release(self, owner: str, slot: str) -> None:
        await self._run(self._set_slot, owner, slot, None)

    @staticmethod
    def _locked(cursor: Any, owner: str) -> list[Any]:
        """The row's columns (created first if missing), locked until the transaction ends."""
        from django.db import connection

        from usage_app.models import QuotaState

        table = QuotaState._meta.db_table
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        select = (
            f"SELECT requests, slots, minute, minute_tokens, day, day_tokens FROM {table} "
            f"WHERE owner = %s{lock}"
        )
        cursor.execute(select, [owner])
        row = cursor.fetchone()
        if row is None:
            cursor.execute(
                f"INSERT INTO {table} (owner, requests, slots, minute, minute_tokens, day, day_tokens) "
                f"VALUES (%s, {_json_param()}, {_json_param()}, 0, 0, 0, 0) ON CONFLICT (owner) DO NOTHING",
                [owner, "[]", "{}"],
            )
            cursor.execute(select, [owner])
            row = cursor.fetchone()
        values = list(row)
        for i in (0, 1):
            if isinstance(values[i], str | bytes):
                values[i] = orjson.loads(values[i])
        return values

    @staticmethod
    def _write(cursor: Any, owner: str, columns: dict[str, Any]) -> None:
        from usage_app.models import QuotaState

        sets = ", ".join(
            f"{name} = {_json_param() if name in ('requests', 'slots') else '%s'}" for name in columns
        )
        params = [orjson.dumps(v).decode() if k in ("requests", "slots") else v for k, v in columns.items()]
        cursor.execute(f"UPDATE {QuotaState._meta.db_table} SET {sets} WHERE owner = %s", [*params, owner])

    def _admit(self, owner: str, limits: Limits, slot: str, now: int) -> Counts:
        from django.db import connection, transaction

        with transaction.atomic(), connection.cursor() as cursor:
            stored, stored_slots, minute, minute_tokens, day, day_tokens = self._locked(cursor, owner)
            # [second, admissions] pairs; a second's admissions leave the window 60 s after its end.
            requests = [pair for pair in stored if pair[0] + 1000 + MINUTE_MS > now]
            admitted = sum(count for _, count in requests)
            slots = {k: v for k, v in stored_slots.items() if v > now}
            minute_tokens = minute_tokens if minute == now // MINUTE_MS else 0
            day_tokens = day_tokens if day == now // DAY_MS else 0
            refused = decide(limits, admitted, len(slots), (minute_tokens, day_tokens))
            if not refused:  # a refusal writes nothing
                if limits.requests_per_minute:
                    second = now - now % 1000
                    if requests and requests[-1][0] >= second:  # (another process's clock ran ahead)
                        requests[-1][1] += 1
                    else:
                        requests.append([second, 1])
                    admitted += 1
                if limits.max_concurrent:
                    slots[slot] = now + int(SLOT_TTL_S * 1000)
                self._write(cursor, owner, {"requests": requests, "slots": slots})
        return Counts(
            refused,
            admitted,
            requests[0][0] + 1000 if requests else now,
            requests[-1][0] + 1000 if requests else now,
            minute_tokens,
            day_tokens,
            len(slots),
            now,
        )

    def _charge(self, owner: str, tokens: int, now: int) -> None:
        from django.db import connection, transaction

        with transaction.atomic(), connection.cursor() as cursor:
            _, _, minute, minute_tokens, day, day_tokens = self._locked(cursor, owner)
            this_minute, today = now // MINUTE_MS, now // DAY_MS
            columns = {
                "minute": this_minute,
                "minute_tokens": (minute_tokens if minute == this_minute else 0) + tokens,
                "day": today,
                "day_tokens": (day_tokens if day == today else 0) + tokens,
            }
            self._write(cursor, owner, columns)

    def _set_slot(self, owner: str, slot: str, expiry: int | None) -> None:
        from django.db import connection, transaction

        with transaction.atomic(), connection.cursor() as cursor:
            slots = self._locked(cursor, owner)[1]
            if slot not in slots:
                return  # released already (or lapsed): a renewal does not bring it back
            if expiry is None:
                del slots[slot]
            else:
                slots[slot] = expiry
            self._write(cursor, owner, {"slots": slots})


def _json_param() -> str:
    """The placeholder of a JSON column's value (text on SQLite, ``jsonb`` on PostgreSQL)."""
    from django.db import connection

    return "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"


# KEYS: the request log (zset), the slots (zset: id -> expiry), the token counters (hash).
# ARGV: rpm, tpm, tpd, concurrent (0: unlimited), the admission's id, the slot ttl (ms).
# The server's clock, so every gateway host measures the same windows.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rpm, tpm, tpd, conc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local id, ttl = ARGV[5], tonumber(ARGV[6])
local requests, oldest, newest = 0, now, now
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
  requests = redis.call('ZCARD', KEYS[1])
  if requests > 0 then
    oldest = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
    newest = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
  end
end
local mt, dt = 0, 0
if tpm > 0 or tpd > 0 then
  local h = redis.call('HMGET', KEYS[3], 'm', 'mt', 'd', 'dt')
  if tonumber(h[1]) == math.floor(now / 60000) then mt = tonumber(h[2]) end
  if tonumber(h[3]) == math.floor(now / 86400000) then dt = tonumber(h[4]) end
end
local held = 0
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  held = redis.call('ZCARD', KEYS[2])
end
local refused = ''
if rpm > 0 and requests >= rpm then refused = 'requests'
elseif tpm > 0 and mt >= tpm then refused = 'tokens'
elseif tpd > 0 and dt >= tpd then refused = 'day_tokens'
elseif conc > 0 and held >= conc then refused = 'concurrency'
else
  if rpm > 0 then
    redis.call('ZADD', KEYS[1], now, id)
    newest = now
    redis.call('PEXPIRE', KEYS[1], 60000)
    requests = requests + 1
  end
  if conc > 0 then
    redis.call('ZADD', KEYS[2], now + ttl, id)
    redis.call('PEXPIRE', KEYS[2], ttl)
    held = held + 1
  end
end
return {refused, requests, oldest, newest, mt, dt, held, now}
"""

_CHARGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local m, d = math.floor(now / 60000), math.floor(now / 86400000)
local h = redis.call('HMGET', KEYS[1], 'm', 'mt', 'd', 'dt')
local mt, dt = 0, 0
if tonumber(h[1]) == m then mt = tonumber(h[2]) end
if tonumber(h[3]) == d then dt = tonumber(h[4]) end
redis.call('HSET', KEYS[1], 'm', m, 'mt', mt + tonumber(ARGV[1]), 'd', d, 'dt', dt + tonumber(ARGV[1]))
redis.call('PEXPIRE', KEYS[1], 86400000 * 2)
return 1
"""

# Renew (ARGV[2] > 0: the ttl in ms) or release a slot; a released or lapsed slot is not renewed.
_SLOT = """
if tonumber(ARGV[2]) > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return 1
"""


class RedisStore:
    """Redis: each step one Lua script (atomic, one round trip). Keys share the ``{owner}`` hash tag
    (one Redis Cluster slot per principal); a client per event loop."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]
        self._clients = weakref.WeakKeyDictionary()

    def _scripts(self) -> Any:
        loop = asyncio.get_running_loop()
        scripts = self._clients.get(loop)
        if scripts is None:
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(self.url)
            scripts = (
                client.register_script(_ADMIT),
                client.register_script(_CHARGE),
                client.register_script(_SLOT),
            )
            self._clients[loop] = scripts
        return scripts

    @staticmethod
    def _keys(owner: str) -> tuple[str, str, str]:
        tag = "gateway:quota:{" + owner + "}"
        return tag + ":requests", tag + ":slots", tag + ":tokens"

    async def admit(self, owner: str, limits: Limits, slot: str) -> Counts:
        result = await self._scripts()[0](
            keys=self._keys(owner), args=[*_numbers(limits), slot, int(SLOT_TTL_S * 1000)]
        )
        refused, requests, oldest, newest, mt, dt, held, now = result
        return Counts(refused.decode(), requests, oldest, newest, mt, dt, held, now)

    async def charge(self, owner: str, tokens: int) -> None:
        await self._scripts()[1](keys=[self._keys(owner)[2]], args=[tokens])

    async def renew(self, owner: str, slot: str) -> None:
        await self._scripts()[2](keys=[self._keys(owner)[1]], args=[slot, int(SLOT_TTL_S * 1000)])

    async def release(self, owner: str, slot: str) -> None:
        await self._scripts()[2](keys=[self._keys(owner)[1]], args=[slot, 0])


_stores: dict[str, DatabaseStore | RedisStore] = {}


def store() -> DatabaseStore | RedisStore:
    """The store of the current config: Redis when ``REDIS_URL`` is set, else the database."""
    url = get_config().redis_url
    found = _stores.get(url)
    if found is None:
        found = _stores[url] = RedisStore(url) if url else DatabaseStore()
    return found


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- admission ---------------------------------------------------------------------------------


class Ticket:
    """An admitted request of a limited principal: its answer's headers and its concurrency slot
    (renewed while held; :meth:`release` frees it, once)."""

    __slots__ = ("detached", "headers", "owner", "renewal", "slot", "store")

    def __init__(self, owner: str, slot: str | None, headers: RawHeaders, store: Any) -> None:
        self.owner = owner
        self.slot = slot
        self.headers = headers
        self.store = store
        self.detached = False  # a background response holds the slot until its work ends
        self.renewal: asyncio.TimerHandle | None = None
        if slot is not None:
            self._schedule_renewal()

    def _schedule_renewal(self) -> None:
        self.renewal = asyncio.get_running_loop().call_later(RENEW_EVERY_S, self._renew)

    def _renew(self) -> None:
        if self.slot is None:
            return
        _spawn(self.store.renew(self.owner, self.slot))
        self._schedule_renewal()

    def release(self) -> None:
        """The answer ended (or failed, or was cancelled): the slot is freed, off the caller's path."""
        if self.detached:
            return
        self.free()

    def free(self) -> None:
        slot, self.slot = self.slot, None
        if self.renewal is not None:
            self.renewal.cancel()
            self.renewal = None
        if slot is not None:
            _spawn(self.store.release(self.owner, slot))


# The ticket of the request being served (a background response takes its slot over).
_current: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("quota_ticket", default=None)


def gate(principal: Principal, path: str) -> Awaitable[Ticket] | None:
    """The pipeline's quota rule (``gateway.core.pipeline.quota_gate``): None for an unlimited
    principal, else the admission to await."""
    limits = effective(principal, get_config().quotas)
    if limits is None:
        return None
    return admit(principal, limits, anthropic=errors.is_anthropic_path(path))


async def admit(principal: Principal, limits: Limits, *, anthropic: bool = False) -> Ticket:
    """Admit one request of ``principal`` or raise the 429 (then nothing is counted)."""
    where = store()
    slot = secrets.token_hex(8)
    counts = await where.admit(principal.owner, limits, slot)
    headers = rate_limit_headers(limits, counts, anthropic=anthropic)
    if counts.refused:
        retry_ms = _retry_after_ms(limits, counts)
        named = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
        named["retry-after"] = str(max(1, math.ceil(retry_ms / 1000)))
        raise errors.quota_exceeded(
            "tokens" if counts.refused in ("tokens", "day_tokens") else "requests",
            _message(limits, counts, retry_ms),
            named,
        )
    ticket = Ticket(principal.owner, slot if limits.max_concurrent else None, headers, where)
    _current.set(ticket)
    return ticket


async def admit_principal(principal: Principal, *, path: str = "/v1/responses") -> Ticket | None:
    """:func:`gate` for a caller outside the HTTP pipeline (a WebSocket ``response.create``)."""
    pending = gate(principal, path)
    return None if pending is None else await pending


def hold_until(done: Coroutine[Any, Any, None]) -> None:
    """The request being served started background work: its concurrency slot stays held until
    ``done`` returns (the work ended, failed or was cancelled), not until its HTTP answer ends."""
    ticket = _current.get()
    if ticket is None or ticket.slot is None or ticket.detached:
        done.close()
        return
    ticket.detached = True

    async def hold() -> None:
        try:
            await done
        finally:
            ticket.free()

    _spawn(hold())


def charge(entry: Any) -> None:
    """Charge a model call's tokens (input plus output) to its principal's token windows; never
    raises and never waits: the store is written by a task of its own."""
    try:
        limits = effective(entry.principal, get_config().quotas)
        tokens = entry.tokens
        if limits is None or not (limits.tokens_per_minute or limits.tokens_per_day) or tokens <= 0:
            return
        _spawn(store().charge(entry.principal.owner, tokens))
    except Exception:
        log.exception("quota charge failed")


def _spawn(work: Coroutine[Any, Any, None]) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # called from synchronous code: a thread of its own runs it
        threading.Thread(target=asyncio.run, args=(_logged(work),), daemon=True).start()
        return
    task = loop.create_task(_logged(work))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def _logged(work: Coroutine[Any, Any, None]) -> None:
    try:
        await work
    except Exception:
        log.exception("quota store update failed")


# --- headers and messages ------------------------------------------------------------------------


def _token_window(limits: Limits, counts: Counts) -> tuple[int, int, int] | None:
    """The token limit the headers show (per minute, else per day): limit, used, reset (ms)."""
    if limits.tokens_per_minute:
        return limits.tokens_per_minute, counts.minute_tokens, MINUTE_MS - counts.now % MINUTE_MS
    if limits.tokens_per_day:
        return limits.tokens_per_day, counts.day_tokens, DAY_MS - counts.now % DAY_MS
    return None


def _retry_requests_ms(counts: Counts) -> int:
    """Until the oldest request of the window leaves it (then one more is admitted)."""
    return max(0, counts.oldest + MINUTE_MS - counts.now) if counts.requests else 0


def _requests_reset_ms(counts: Counts) -> int:
    """Until the window is back to its initial state (its newest request left it): OpenAI's and
    Anthropic's meaning of the requests' reset."""
    return max(0, counts.newest + MINUTE_MS - counts.now) if counts.requests else 0


def rate_limit_headers(limits: Limits, counts: Counts, *, anthropic: bool) -> RawHeaders:
    """OpenAI's ``x-ratelimit-*`` headers (reset as a duration), or on ``/v1/messages*``
    Anthropic's ``anthropic-ratelimit-*`` (reset as an RFC 3339 time), for the limits that are set."""
    out: list[tuple[str, str]] = []
    windows: list[tuple[str, int, int, int]] = []
    if limits.requests_per_minute:
        rpm = limits.requests_per_minute
        windows.append(("requests", rpm, max(0, rpm - counts.requests), _requests_reset_ms(counts)))
    token_window = _token_window(limits, counts)
    if token_window is not None:
        limit, used, reset = token_window
        windows.append(("tokens", limit, max(0, limit - used), reset))
    for kind, limit, remaining, reset in windows:
        if anthropic:
            out.append((f"anthropic-ratelimit-{kind}-limit", str(limit)))
            out.append((f"anthropic-ratelimit-{kind}-remaining", str(remaining)))
            out.append((f"anthropic-ratelimit-{kind}-reset", rfc3339(counts.now + reset)))
        else:
            out.append((f"x-ratelimit-limit-{kind}", str(limit)))
            out.append((f"x-ratelimit-remaining-{kind}", str(remaining)))
            out.append((f"x-ratelimit-reset-{kind}", duration(reset)))
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out]


def duration(ms: int) -> str:
    """OpenAI's reset form (Go's duration): ``59ms``, ``1s``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{minutes}m{seconds}"
    return seconds


def rfc3339(epoch_ms: int) -> str:
    """Anthropic's reset form: the UTC time, to the second (rounded up), ``2026-12-06T23:00:00Z``."""
    moment = datetime.fromtimestamp(math.ceil(epoch_ms / 1000), UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _retry_after_ms(limits: Limits, counts: Counts) -> int:
    if counts.refused == "requests":
        return _retry_requests_ms(counts)
    if counts.refused == "tokens":
        return MINUTE_MS - counts.now % MINUTE_MS
    if counts.refused == "day_tokens":
        return DAY_MS - counts.now % DAY_MS
    return 1000  # concurrency: when a running request ends, which nobody can tell


def _message(limits: Limits, counts: Counts, retry_ms: int) -> str:
    wait = f"Please try again in {duration(retry_ms)}."
    if counts.refused == "requests":
        limit, used, what = limits.requests_per_minute, counts.requests, "requests per min (RPM)"
    elif counts.refused == "tokens":
        limit, used, what = limits.tokens_per_minute, counts.minute_tokens, "tokens per min (TPM)"
    elif counts.refused == "day_tokens":
        limit, used, what = limits.tokens_per_day, counts.day_tokens, "tokens per day (TPD)"
    else:
        limit, used, what = limits.max_concurrent, counts.held, "concurrent requests"
        wait = "Please try again when one of your running requests has finished."
    return f"Rate limit reached on {what}: Limit {limit}, Used {used}, Requested 1. {wait}"
