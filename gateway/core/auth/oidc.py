"""OIDC bearer tokens: discovery, a JWKS cache with TTL and rotation, and token validation.

One issuer and one audience. An unknown ``kid`` triggers at most one shared refresh per
``jwks_min_refresh_interval_s`` (forged ``kid`` values cannot hammer the provider); a failed refresh
is a 503, distinct from a rejected token. Only asymmetric algorithms are accepted and ``oct`` keys
are ignored, so a public key can never serve as an HMAC secret.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jwt

from gateway.core import errors, outbound
from gateway.core.config import AuthConfig, Config, is_loopback_host

log = logging.getLogger("gateway.core.auth")

ALLOWED_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
# Which JWK key type (and curve) can verify which algorithm; a JWK without "alg" is matched by this.
_KTY_FOR_ALG = {
    "RS256": ("RSA", None),
    "RS384": ("RSA", None),
    "RS512": ("RSA", None),
    "PS256": ("RSA", None),
    "PS384": ("RSA", None),
    "PS512": ("RSA", None),
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", None),
}


class ProviderError(Exception):
    """The identity provider could not be reached or answered something unusable."""


@dataclass(frozen=True)
class VerifiedToken:
    issuer: str
    subject: str
    expires_at: float
    claims: dict[str, Any]


def claim_values(claims: dict[str, Any], name: str) -> list[str]:
    """A claim as a list of strings (a string claim, or a list claim such as ``groups``)."""
    value = claims.get(name)
    if isinstance(value, list):
        return [str(v) for v in value]
    if value is None:
        return []
    return [str(value)]


def is_usage_admin(claims: dict[str, Any], auth: AuthConfig) -> bool:
    """Whether a verified token's claims grant the usage admin role (``[auth] usage_admin_value``)."""
    return bool(auth.usage_admin_value) and auth.usage_admin_value in claim_values(
        claims, auth.usage_admin_claim
    )


def _invalid() -> errors.AuthenticationFailed:
    return errors.AuthenticationFailed(code="invalid_token")


def _unavailable(reason: str) -> errors.ServiceUnavailable:
    log.warning("identity provider unavailable: %s", reason)
    return errors.ServiceUnavailable(
        "The identity provider's signing keys could not be refreshed; try again later.",
        code="identity_provider_unavailable",
    )


def check_provider_url(name: str, url: str) -> None:
    """Provider URLs must be https, except on loopback (development and tests)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname and is_loopback_host(parts.hostname):
        return
    raise ProviderError(f"{name} must be an https URL (plain http only on loopback), got {url!r}")


async def fetch_json(url: str, auth: AuthConfig) -> Any:
    """GET ``url`` and parse JSON, bounded by ``http_timeout_s`` and ``max_provider_response_bytes``."""
    try:
        return await outbound.get_json(
            url, timeout_s=auth.http_timeout_s, max_bytes=auth.max_provider_response_bytes
        )
    except outbound.OutboundError as exc:
        raise ProviderError(str(exc)) from None


def fetch_json_sync(url: str, auth: AuthConfig) -> Any:
    """The blocking twin of :func:`fetch_json` for sync code (admin single sign-on)."""
    try:
        return outbound.get_json_sync(
            url, timeout_s=auth.http_timeout_s, max_bytes=auth.max_provider_response_bytes
        )
    except outbound.OutboundError as exc:
        raise ProviderError(str(exc)) from None


def discovery_url(issuer: str) -> str:
    return issuer.rstrip("/") + "/.well-known/openid-configuration"


def validate_discovery(doc: Any, issuer: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ProviderError("the discovery document is not a JSON object")
    if doc.get("issuer") != issuer:
        raise ProviderError(f"the discovery document names issuer {doc.get('issuer')!r}, expected {issuer!r}")
    jwks_uri = doc.get("jwks_uri")
    if not isinstance(jwks_uri, str) or not jwks_uri:
        raise ProviderError("the discovery document has no jwks_uri")
    check_provider_url("jwks_uri", jwks_uri)
    return doc


@dataclass(frozen=True)
class SigningKey:
    kid: str | None
    kty: str
    crv: str | None
    alg: str | None  # as declared by the JWK; None: any algorithm of its key type
    key: Any  # a cryptography public key

    def compatible(self, alg: str) -> bool:
        if self.alg is not None:
            return self.alg == alg
        kty, crv = _KTY_FOR_ALG[alg]
        return self.kty == kty and (crv is None or self.crv == crv)


def parse_jwks(doc: Any) -> list[SigningKey]:
    """Usable signing keys of a JWKS; symmetric and encryption keys are skipped."""
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ProviderError("the JWKS is not a JSON object with a 'keys' list")
    keys: list[SigningKey] = []
    for raw in doc["keys"]:
        if not isinstance(raw, dict) or raw.get("kty") not in ("RSA", "EC", "OKP"):
            continue  # "oct" (symmetric) keys are never used: no HMAC with shared material
        if raw.get("use", "sig") != "sig":
            continue
        alg = raw.get("alg")
        if alg is not None and alg not in ALLOWED_ALGORITHMS:
            continue
        try:
            parsed = jwt.PyJWK(raw)
        except (jwt.PyJWTError, ValueError, TypeError, KeyError):
            log.info("skipping an unusable JWKS key (kid %r)", raw.get("kid"))
            continue
        kid = raw.get("kid")
        keys.append(
            SigningKey(
                kid=kid if isinstance(kid, str) else None,
                kty=raw["kty"],
                crv=raw.get("crv"),
                alg=alg,
                key=parsed.key,
            )
        )
    return keys


class OidcProvider:
    """Discovery document and JWKS of the configured issuer, shared by every request."""

    def __init__(self, auth: AuthConfig) -> None:
        self.auth = auth
        self.issuer = auth.oidc_issuer
        self.discovery: dict[str, Any] | None = None
        self.keys: list[SigningKey] = []
        self.fetched_at: float | None = None  # monotonic time of the last successful JWKS fetch
        self.attempted_at: float | None = None  # monotonic time of the last JWKS fetch attempt
        self.kid_refresh_at: float | None = None  # ... of the last refresh an unknown kid triggered
        self.last_error: str | None = None
        self.jwks_fetches = 0
        # One in-flight refresh per event loop: concurrent requests await the same one.
        self._inflight: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]]
        self._inflight = weakref.WeakKeyDictionary()

    # -- loading ------------------------------------------------------------------------------

    async def load(self) -> None:
        """Fetch discovery then the JWKS; raise :class:`ProviderError` when either fails."""
        await self._discover()
        await self._fetch_jwks()

    async def _discover(self) -> dict[str, Any]:
        if self.discovery is None:
            doc = await fetch_json(discovery_url(self.issuer), self.auth)
            self.discovery = validate_discovery(doc, self.issuer)
        return self.discovery

    async def _fetch_jwks(self) -> None:
        self.attempted_at = time.monotonic()
        try:
            discovery = await self._discover()
            doc = await fetch_json(discovery["jwks_uri"], self.auth)
            self.jwks_fetches += 1
            keys = parse_jwks(doc)
        except ProviderError as exc:
            self.last_error = str(exc)
            raise
        self.keys = keys
        self.fetched_at = time.monotonic()
        self.last_error = None

    async def refresh(self) -> None:
        """Refresh the JWKS once for every concurrent caller on this event loop."""
        loop = asyncio.get_running_loop()
        task = self._inflight.get(loop)
        if task is None:
            task = loop.create_task(self._fetch_jwks())
            self._inflight[loop] = task
            task.add_done_callback(lambda _t: self._inflight.pop(loop, None))
        try:
            # shield: a caller that goes away does not cancel the refresh others wait for.
            await asyncio.shield(task)
        except ProviderError as exc:
            raise _unavailable(str(exc)) from None

    def _cooling_down(self, since: float | None, now: float) -> bool:
        return since is not None and now - since < self.auth.jwks_min_refresh_interval_s

    # -- keys ---------------------------------------------------------------------------------

    def _find(self, kid: str | None, alg: str) -> SigningKey | None:
        if kid is None:
            # Without a kid only an unambiguous JWKS (one key) can be used.
            if len(self.keys) == 1 and self.keys[0].compatible(alg):
                return self.keys[0]
            return None
        for key in self.keys:
            if key.kid == kid and key.compatible(alg):
                return key
        return None

    async def signing_key(self, kid: str | None, alg: str) -> SigningKey:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        stale = self.fetched_at is None or now - self.fetched_at >= self.auth.jwks_ttl_s
        if stale:
            if (
                self.last_error is not None
                and self._cooling_down(self.attempted_at, now)
                and loop not in self._inflight
            ):
                # The last attempt failed moments ago: answer 503 without hammering the provider.
                raise _unavailable(self.last_error)
            await self.refresh()
        key = self._find(kid, alg)
        if key is None and not stale:
            # An unknown kid may mean the provider rotated its keys: refresh once (at most once per
            # interval however many unknown kids arrive; joined when a refresh is already running).
            if loop in self._inflight:
                await self.refresh()
                key = self._find(kid, alg)
            elif not self._cooling_down(self.kid_refresh_at, now):
                self.kid_refresh_at = now
                await self.refresh()
                key = self._find(kid, alg)
            elif self.last_error is not None:
                # The provider is failing and we may not retry yet: we cannot call the token bad.
                raise _unavailable(self.last_error)
        if key is None:
            raise _invalid()
        return key

    # -- tokens -------------------------------------------------------------------------------

    async def verify(self, token: str) -> VerifiedToken:
        """Validate ``token``; raise 401 for a rejected token and 503 when keys cannot be fetched."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise _invalid() from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALLOWED_ALGORITHMS:
            raise _invalid()
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise _invalid()
        key = await self.signing_key(kid, alg)
        audience = self.auth.oidc_audience
        try:
            claims = jwt.decode(
                token,
                key=key.key,
                algorithms=[alg],
                issuer=self.issuer,
                leeway=self.auth.leeway_s,
                options={"require": ["exp", "iss", "sub", "aud"], "verify_aud": False},
            )
        except (jwt.PyJWTError, ValueError, TypeError):
            raise _invalid() from None
        # OIDC_AUDIENCE is the complete trust set: every aud value must equal it.
        aud = claims.get("aud")
        values = aud if isinstance(aud, list) else [aud]
        if not values or any(value != audience for value in values):
            raise _invalid()
        if "azp" in claims and claims["azp"] != audience:
            raise _invalid()
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise _invalid()
        exp = claims.get("exp")
        if isinstance(exp, bool) or not isinstance(exp, int | float):
            raise _invalid()
        return VerifiedToken(issuer=self.issuer, subject=sub, expires_at=float(exp), claims=claims)


_providers: dict[AuthConfig, OidcProvider] = {}


def get_provider(config: Config) -> OidcProvider:
    """The provider for this auth configuration (a changed configuration starts afresh)."""
    provider = _providers.get(config.auth)
    if provider is None:
        if len(_providers) >= 8:
            _providers.clear()
        provider = _providers[config.auth] = OidcProvider(config.auth)
    return provider


def reset() -> None:
    """Forget every cached discovery document and JWKS (tests; configuration reloads)."""
    _providers.clear()


def startup_check(config: Config) -> OidcProvider:
    """Fetch discovery and the JWKS before serving; raise :class:`ProviderError` when either fails."""
    provider = get_provider(config)
    asyncio.run(provider.load())
    return provider
