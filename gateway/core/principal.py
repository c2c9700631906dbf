"""Who is calling: the principal every authenticated request carries (``request.principal``,
``scope["principal"]``), and whether its credential was consumed (then never forwarded upstream).
Stored objects record ``principal.owner``; every read and write filters by it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal


@dataclass(frozen=True)
class Limits:
    """Quota overrides of one API key (``None``: the ``[quotas]`` default)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    max_concurrent: int | None = None


NO_OVERRIDES = Limits()
# The quota overrides an API key may carry (one ApiKey column each), in Limits' field order.
LIMIT_FIELDS = tuple(field.name for field in fields(Limits))


@dataclass(frozen=True)
class Principal:
    owner: str  # stable owner key stored on objects: "default", "oidc:<iss>#<sub>", "key:<id>"
    kind: Literal["default", "oidc", "api_key", "upstream_key"] = "default"
    subject: str = ""
    expires_at: float | None = None  # epoch seconds (OIDC exp); None: no expiry
    api_key_id: int | None = None  # the API key that authenticated the request
    is_admin: bool = False  # sees every principal's usage (an admin API key, the OIDC admin group)
    limits: Limits = NO_OVERRIDES  # the API key's quota overrides


DEFAULT_PRINCIPAL = Principal(owner="default", kind="default")


def request_principal(request: Any) -> Principal:
    """The principal of an HTTP request (the default principal when the gateway is open)."""
    return getattr(request, "principal", None) or DEFAULT_PRINCIPAL


def scope_principal(scope: dict[str, Any]) -> Principal:
    """The principal of a WebSocket connection."""
    return scope.get("principal") or DEFAULT_PRINCIPAL


def credential_consumed(request: Any) -> bool:
    """True when the gateway authenticated the caller with its credential (never forward it)."""
    return bool(getattr(request, "credential_consumed", False))
