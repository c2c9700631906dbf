"""Inbound authentication: one framework-agnostic entry point used by every layer.

``authenticate(path, headers)`` is called by the Django auth middleware for HTTP, by the WebSocket
upgrade check, and by any ASGI fast path. It returns the caller's principal and whether the
gateway consumed the caller's credential (then it is never forwarded upstream), or raises
``errors.AuthenticationFailed`` (401) / ``errors.ServiceUnavailable`` (503, identity provider down).

The real OIDC / API-key logic lands with the authentication issue; until then the gateway is open.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.principal import DEFAULT_PRINCIPAL, Principal


@dataclass(frozen=True)
class AuthResult:
    principal: Principal
    credential_consumed: bool


OPEN = AuthResult(DEFAULT_PRINCIPAL, False)


def requires_auth(path: str) -> bool:
    """``/v1/*`` is protected; ``/health`` and ``/ready`` stay public."""
    return path.startswith("/v1/")


async def authenticate(path: str, headers: Mapping[str, str]) -> AuthResult:
    """Authenticate a request to ``path`` with lower-cased ``headers``."""
    return OPEN


def require_stored_state_access(request: object) -> None:
    """Refuse callers who may not read or write stored state (responses, conversations).

    Stub until the authentication issue lands: there, with OIDC off and ``OPENAI_API_KEY`` set, a
    caller whose bearer is not that key gets 401. Until then the gateway is open.
    """
    return None
