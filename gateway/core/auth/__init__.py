"""Inbound authentication: one framework-agnostic entry point for HTTP, WebSocket and ASGI paths.

``authenticate(path, headers)`` returns the principal and whether the credential was consumed
(never forwarded upstream), or raises a 401 / 503. Modes: OIDC, API keys, or open (stored state
then guarded by ``OPENAI_API_KEY``). Every stored object is filtered by owner (:func:`owned_get`
and friends): another owner's id is "not found" (``docs/auth.md``).
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db.models import Model, QuerySet

from gateway.core import errors
from gateway.core.auth import apikeys
from gateway.core.config import get_config
from gateway.core.principal import DEFAULT_PRINCIPAL, Principal, request_principal


@dataclass(frozen=True)
class AuthResult:
    principal: Principal
    credential_consumed: bool


OPEN = AuthResult(DEFAULT_PRINCIPAL, False)
UPSTREAM_KEY_PRINCIPAL = Principal(owner=DEFAULT_PRINCIPAL.owner, kind="upstream_key")
_UPSTREAM_KEY_RESULT = AuthResult(UPSTREAM_KEY_PRINCIPAL, False)


PUBLIC_API_PATHS = frozenset({"/v1/openapi.json"})  # the API's description, never stored data


def requires_auth(path: str) -> bool:
    """``/v1/*`` is protected (and ``/metrics`` when not public); ``/health``, ``/ready``, the OpenAPI
    document and its Swagger UI (``/docs/``) stay public."""
    if path.startswith("/v1/"):
        return path not in PUBLIC_API_PATHS
    return path == "/metrics" and not get_config().server.metrics_public


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """``Authorization: Bearer <t>``, else ``x-api-key``; ``None`` when absent, ``""`` when malformed."""
    authorization = headers.get("authorization")
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or " " in token:
            return ""
        return token
    api_key = headers.get("x-api-key")
    if api_key is not None:
        return api_key.strip()
    return None


def _refusal(token: str | None) -> errors.AuthenticationFailed:
    if token is None:
        return errors.AuthenticationFailed(code="missing_bearer_token")
    return errors.AuthenticationFailed(code="invalid_token")


async def authenticate(path: str, headers: Mapping[str, str]) -> AuthResult:
    """Authenticate a request to ``path`` with lower-cased ``headers``."""
    config = get_config()
    token = bearer_token(headers)
    if config.oidc_enabled:
        # Imported only where it is used: it brings aiohttp and PyJWT (about 0.1 s of the event
        # loop the first time), which an API-key or open gateway never needs.
        from gateway.core.auth import oidc

        if not token:
            raise _refusal(token)
        verified = await oidc.get_provider(config).verify(token)
        principal = Principal(
            owner=f"oidc:{verified.issuer}#{verified.subject}",
            kind="oidc",
            subject=verified.subject,
            expires_at=verified.expires_at,
            is_admin=oidc.is_usage_admin(verified.claims, config.auth),
        )
        return AuthResult(principal, True)

    result, key = _by_key(await apikeys.snapshot(), token)
    if key is not None:
        await apikeys.record_use(key)
    return result


def authenticate_now(path: str, headers: Mapping[str, str]) -> AuthResult | None:
    """:func:`authenticate` when it can decide without I/O, else ``None`` (OIDC, a key snapshot to
    reload, a key's last use to write)."""
    if get_config().oidc_enabled:
        return None
    snap = apikeys.fresh_snapshot()
    if snap is None:
        return None
    result, key = _by_key(snap, bearer_token(headers))
    if key is not None and apikeys.use_due(key):
        return None
    return result


def _by_key(snap: Any, token: str | None) -> tuple[AuthResult, Any]:
    """API-key and open mode: the result, and the key used (``None`` when none was needed)."""
    config = get_config()
    if snap.any or config.auth.require_api_key:
        key = apikeys.match(snap, token) if token else None
        if key is None:
            raise _refusal(token)
        principal = Principal(
            owner=f"key:{key.id}",
            kind="api_key",
            subject=key.name,
            api_key_id=key.id,
            is_admin=key.is_admin,
            limits=key.limits,
        )
        return AuthResult(principal, True), key

    upstream_key = config.openai_api_key.get_secret_value()
    if upstream_key and token and hmac.compare_digest(token.encode(), upstream_key.encode()):
        # The caller holds the upstream credential: it may read stored state (see below). It is
        # not consumed: forwarding it is forwarding the very credential the gateway would inject.
        return _UPSTREAM_KEY_RESULT, None
    return OPEN, None


def reset_caches() -> None:
    """Forget cached JWKS / discovery documents and the API-key snapshot (tests; reloads)."""
    from gateway.core.auth import apikeys, oidc

    oidc.reset()
    apikeys.reset()


# -- stored state: the OPENAI_API_KEY rule ------------------------------------------------------


def check_stored_state_access(principal: Principal, headers: Mapping[str, str]) -> None:
    """Refuse (401) an open-gateway caller without ``OPENAI_API_KEY`` reading or deleting stored state,
    so stored data is never open while a key exists."""
    if principal.kind != "default":
        return
    if not get_config().openai_api_key.get_secret_value():
        return
    raise _refusal(bearer_token(headers))


def require_stored_state_access(request: Any) -> None:
    """:func:`check_stored_state_access` for a Django request (after the auth middleware ran)."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    check_stored_state_access(request_principal(request), headers)


View = TypeVar("View", bound=Callable[..., Awaitable[Any]])


def stored_state_view(view: View) -> View:
    """Decorate an async view that reads or deletes stored state with the ``OPENAI_API_KEY`` rule."""

    @functools.wraps(view)
    async def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
        require_stored_state_access(request)
        return await view(request, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


# -- ownership ----------------------------------------------------------------------------------

M = TypeVar("M", bound=Model)


def owner_filter(principal: Principal) -> dict[str, str]:
    """The ORM filter selecting ``principal``'s objects: ``Model.objects.filter(**owner_filter(p))``."""
    return {"owner": principal.owner}


def owned(queryset: QuerySet[M], principal: Principal) -> QuerySet[M]:
    """``queryset`` narrowed to the objects ``principal`` owns (every read and write goes through this)."""
    return queryset.filter(**owner_filter(principal))


def owned_get(
    queryset: QuerySet[M], principal: Principal, *, not_found: str = "Not found.", **lookup: Any
) -> M:
    """The one object matching ``lookup`` that ``principal`` owns; another owner's is "not found" too,
    so other principals' ids cannot be probed."""
    obj = owned(queryset, principal).filter(**lookup).first()
    if obj is None:
        raise errors.NotFound(not_found)
    return obj


async def aowned_get(
    queryset: QuerySet[M], principal: Principal, *, not_found: str = "Not found.", **lookup: Any
) -> M:
    """:func:`owned_get` for async code (on an ORM thread: ``gateway.core.db.run_orm``)."""
    from gateway.core.db import run_orm

    return await run_orm(lambda: owned_get(queryset, principal, not_found=not_found, **lookup))


__all__ = [
    "OPEN",
    "AuthResult",
    "aowned_get",
    "authenticate",
    "bearer_token",
    "check_stored_state_access",
    "owned",
    "owned_get",
    "owner_filter",
    "require_stored_state_access",
    "requires_auth",
    "reset_caches",
    "stored_state_view",
]
