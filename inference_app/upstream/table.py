"""The upstream table: several OpenAI-compatible servers behind one :class:`Upstream`, with failover.

Each request goes to an upstream that serves its ``model`` (configured ``models``, or discovered from
the server's ``/v1/models``); a model no upstream is known to serve goes to any healthy one, which
answers its own 404. Among the candidates, a round with a lineage goes to the same upstream every time
(weighted rendezvous hashing of the lineage key: deterministic, so every gateway replica agrees with
no shared state); a round without one is spread by weight.

Health: a connect error, a 5xx head or no head in time takes an upstream out for a back-off
(``routing.backoff_s``, doubling per consecutive failure up to ``backoff_max_s``); after it the next
request tries it again, and one success marks it up. A request that failed before anything was
handed back is sent once more to another candidate; once the head is returned there is no retry.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import orjson

from gateway.core import errors, metrics
from gateway.core.config import Config, UpstreamEntry
from inference_app.upstream import lineage
from inference_app.upstream.http import HttpUpstream
from inference_app.upstream.types import Body, UpstreamResponse, model_cards, read_body
from usage_app.tap import FORM_PREFIX_BYTES, form_model, request_model

log = logging.getLogger("gateway.upstream")

# Bound of one model-list discovery (the read timeout is for generations, far longer).
DISCOVERY_TIMEOUT_S = 5.0


@dataclass(eq=False)
class Member:
    """One upstream of the table and what the gateway knows of it."""

    entry: UpstreamEntry
    client: HttpUpstream
    failures: int = 0  # consecutive failures; 0: up
    down_until: float = 0.0  # monotonic end of the back-off
    discovered: frozenset[str] | None = None  # ids of its /v1/models, when read
    discovered_at: float = 0.0
    discovery: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def base(self) -> str:
        return self.entry.base

    def up(self, now: float) -> bool:
        """Not in a back-off (a member whose back-off ended is tried again: half-open)."""
        return self.down_until <= now

    def serves(self, model: str) -> bool:
        models = self.entry.models or self.discovered or ()
        return model in models

    def listed(self, card: Any) -> bool:
        """Whether a card of its /v1/models belongs in the union (configured models filter it)."""
        return isinstance(card, dict) and (not self.entry.models or card.get("id") in self.entry.models)


class UpstreamTable:
    """Several HTTP upstreams (``config.upstream_entries``) with model routing, spread and failover."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.members = [Member(entry, HttpUpstream(config, entry)) for entry in config.upstream_entries]
        for member in self.members:
            metrics.upstream_up(member.base, True)

    # -- health ----------------------------------------------------------------------------------
    def failed(self, member: Member, reason: str) -> None:
        """``member`` failed before answering: out for a back-off (not lengthened while already out,
        so the requests that were in flight when it died count once)."""
        now = time.monotonic()
        if not member.up(now):
            return
        routing = self.config.routing
        member.failures += 1
        backoff = min(routing.backoff_s * 2 ** (member.failures - 1), routing.backoff_max_s)
        member.down_until = now + backoff
        metrics.upstream_up(member.base, False)
        log.warning("upstream %s failed (%s): out for %.3gs", member.base, reason, backoff)

    def succeeded(self, member: Member) -> None:
        if member.failures:
            log.info("upstream %s answers again", member.base)
            metrics.upstream_up(member.base, True)
        member.failures = 0
        member.down_until = 0.0

    def states(self) -> dict[str, dict[str, Any]]:
        """Each upstream by base URL: ``up``, ``down`` (in a back-off, ``retry_in_s``) or
        ``half_open`` (its back-off is over: the next request tries it), and the models known."""
        now = time.monotonic()
        out: dict[str, dict[str, Any]] = {}
        for member in self.members:
            if not member.failures:
                state: dict[str, Any] = {"state": "up"}
            elif member.up(now):
                state = {"state": "half_open", "failures": member.failures}
            else:
                retry = round(member.down_until - now, 3)
                state = {"state": "down", "failures": member.failures, "retry_in_s": retry}
            state["models"] = sorted(member.entry.models or member.discovered or ())
            out[member.base] = state
        return out

    async def ready(self, timeout: float) -> None:
        """Probe every upstream not in a back-off (a probe counts like a request); raise unless one
        that is up serves each configured model (with none configured: unless one is up)."""
        now = time.monotonic()
        probed = [m for m in self.members if m.up(now)]
        results = await asyncio.gather(*(m.client.ready(timeout) for m in probed), return_exceptions=True)
        for member, result in zip(probed, results, strict=True):
            if isinstance(result, BaseException):
                self.failed(member, str(result) or type(result).__name__)
            else:
                self.succeeded(member)
        now = time.monotonic()
        up = [m for m in self.members if m.up(now) and not m.failures]
        if not up:
            raise RuntimeError("no upstream is up")
        configured = {model for m in self.members for model in m.entry.models}
        missing = sorted(model for model in configured if not any(m.serves(model) for m in up))
        if missing:
            raise RuntimeError(f"no upstream that is up serves {', '.join(missing)}")

    # -- model routing ---------------------------------------------------------------------------
    async def candidates(self, model: str | None) -> list[Member]:
        """The upstreams that serve ``model`` (discovering stale lists first), or all of them when
        none is known to (or the request names no model)."""
        if model is None:
            return self.members
        await self._discover()
        serving = [m for m in self.members if m.serves(model)]
        return serving or self.members

    async def _discover(self) -> None:
        """Refresh the model lists older than ``models_ttl_s``: one read per upstream at a time
        (concurrent requests share it), waited for only where no list is known yet."""
        now = time.monotonic()
        ttl = self.config.routing.models_ttl_s
        loop = asyncio.get_running_loop()
        waits = []
        for member in self.members:
            if member.entry.models or not member.up(now):
                continue
            if member.discovered is not None and now - member.discovered_at < ttl:
                continue
            task = member.discovery
            if task is None or task.done() or task.get_loop() is not loop:
                task = member.discovery = loop.create_task(self._read_models(member))
            if member.discovered is None:
                waits.append(task)
        if waits:
            await asyncio.wait(waits)

    async def _read_models(self, member: Member) -> None:
        headers = {"authorization": f"Bearer {member.client.api_key}"} if member.client.api_key else {}
        try:
            async with asyncio.timeout(DISCOVERY_TIMEOUT_S):
                status, body = await _fetch(member, headers)
        except (errors.GatewayError, TimeoutError) as exc:
            self.failed(member, f"model list: {exc}")
            return
        if status >= 500:
            self.failed(member, f"model list: status {status}")
            return
        cards = model_cards(body) if status == 200 else None
        if cards is None:
            log.warning("upstream %s: no model list (status %d)", member.base, status)
            cards = []
        self.succeeded(member)
        member.discovered = frozenset(card["id"] for card in cards if isinstance(card.get("id"), str))
        member.discovered_at = time.monotonic()

    def pick(self, candidates: list[Member], exclude: Member | None = None) -> Member | None:
        """The upstream for this round among ``candidates``: the healthy ones, else the one whose
        back-off ends first. A lineage (with ``routing.affinity``) always lands on the same one."""
        pool = [m for m in candidates if m is not exclude]
        if not pool:
            return None
        now = time.monotonic()
        healthy = [m for m in pool if m.up(now)]
        if not healthy:
            return min(pool, key=lambda m: m.down_until)
        key = lineage.current()
        if key is not None and self.config.routing.affinity:
            return max(healthy, key=lambda m: rendezvous_score(key, m.base, m.entry.weight))
        return random.choices(healthy, weights=[m.entry.weight for m in healthy])[0]

    # -- sending ---------------------------------------------------------------------------------
    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Body = None,
        headers: Mapping[str, str] | None = None,
        query: str = "",
    ) -> UpstreamResponse:
        if method == "GET" and path == "/v1/models" and not query:
            return await self._models(headers or {})
        # In one piece: the model is read from it, and a retry sends it again.
        data = None if body is None else await read_body(body)
        candidates = await self.candidates(_model_of(path, data, headers or {}))
        first = self.pick(candidates)
        assert first is not None  # the table has members
        outcome = await self._attempt(first, method, path, data, headers, query)
        if isinstance(outcome, UpstreamResponse) and outcome.status < 500:
            return outcome
        second = self.pick(candidates, exclude=first)
        if second is None:
            return _result(outcome)
        metrics.upstream_failover(first.base)
        if isinstance(outcome, UpstreamResponse):
            await outcome.aclose()
        log.info("retrying %s %s on upstream %s after %s failed", method, path, second.base, first.base)
        return _result(await self._attempt(second, method, path, data, headers, query))

    async def _attempt(
        self,
        member: Member,
        method: str,
        path: str,
        data: bytes | None,
        headers: Mapping[str, str] | None,
        query: str,
    ) -> UpstreamResponse | errors.GatewayError:
        """One try on ``member``: its answer (health recorded from the head), or the failure that may
        be retried elsewhere."""
        try:
            response = await member.client.send(method, path, body=data, headers=headers, query=query)
        except (errors.UpstreamError, errors.UpstreamTimeout) as exc:
            self.failed(member, exc.message)
            return exc
        if response.status >= 500:
            self.failed(member, f"status {response.status}")
        else:
            self.succeeded(member)
        return response

    async def _models(self, headers: Mapping[str, str]) -> UpstreamResponse:
        """vLLM's ``/v1/models`` list, merged over the healthy upstreams (first card per id)."""
        now = time.monotonic()
        targets = [m for m in self.members if m.up(now)] or [min(self.members, key=lambda m: m.down_until)]
        results = await asyncio.gather(*(_fetch(m, headers) for m in targets), return_exceptions=True)
        data: list[Any] = []
        seen: set[str] = set()
        answered = False
        refusal: tuple[int, bytes] | None = None
        failure: BaseException | None = None
        for member, result in zip(targets, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, errors.UpstreamError | errors.UpstreamTimeout):
                    raise result
                self.failed(member, result.message)
                failure = failure or result
                continue
            status, body = result
            if status >= 500:
                self.failed(member, f"status {status}")
                refusal = refusal or (status, body)
                continue
            self.succeeded(member)
            cards = model_cards(body) if status == 200 else None
            if cards is None:
                refusal = refusal or (status, body)  # e.g. the caller's key refused: said as it was
                continue
            answered = True
            member.discovered = frozenset(c["id"] for c in cards if isinstance(c.get("id"), str))
            member.discovered_at = time.monotonic()
            for card in cards:
                card_id = card.get("id")
                if isinstance(card_id, str) and member.listed(card) and card_id not in seen:
                    seen.add(card_id)
                    data.append(card)
        if answered:
            # Starlette's JSONResponse separators, as vLLM's own answer.
            return _answer(200, orjson.dumps({"object": "list", "data": data}))
        if refusal is not None:
            return _answer(*refusal)
        assert failure is not None
        raise failure


def rendezvous_score(key: str, base: str, weight: float) -> float:
    """Weighted highest-random-weight score of ``base`` for ``key``: the highest wins, and removing
    an upstream moves only the keys it held (each to its next-best)."""
    digest = hashlib.sha256(f"{key}\x00{base}".encode()).digest()
    unit = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64  # in (0, 1)
    return -weight / math.log(unit)


def _model_of(path: str, data: bytes | None, headers: Mapping[str, str]) -> str | None:
    """The model a request names: a JSON body's ``model``, a multipart form's ``model`` field, or the
    id in ``/v1/models/{id}`` (the usage ledger's readers of the same fields)."""
    if path.startswith("/v1/models/"):
        return unquote(path.removeprefix("/v1/models/"))
    if not data:
        return None
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "").lower()
    if content_type.startswith("multipart/form-data"):
        return form_model(data[:FORM_PREFIX_BYTES])
    return request_model(data) or None


async def _fetch(member: Member, headers: Mapping[str, str]) -> tuple[int, bytes]:
    response = await member.client.send("GET", "/v1/models", headers=headers)
    try:
        return response.status, await response.read()
    finally:
        await response.aclose()


def _result(outcome: UpstreamResponse | errors.GatewayError) -> UpstreamResponse:
    if isinstance(outcome, errors.GatewayError):
        raise outcome
    return outcome


def _answer(status: int, payload: bytes) -> UpstreamResponse:
    headers = [("content-length", str(len(payload))), ("content-type", "application/json")]
    return UpstreamResponse(status, headers, _once(payload))


async def _once(payload: bytes) -> AsyncIterator[bytes]:
    yield payload
