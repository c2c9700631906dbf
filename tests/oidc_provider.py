"""A real OpenID provider on a loopback port for the auth tests.

It serves the discovery document and a JWKS of RSA and EC keys generated here, plus the
authorization-code endpoints (token, userinfo) the admin single sign-on uses, and mints tokens
with PyJWT. Tests rotate keys, make the JWKS fail, slow or oversized, and count fetches.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.servers import free_port, wait_port

AUDIENCE = "gateway"

_KEY_CACHE: dict[str, Any] = {}


def rsa_key(name: str = "rsa") -> rsa.RSAPrivateKey:
    """RSA keys are slow to generate: one per name per test session."""
    if name not in _KEY_CACHE:
        _KEY_CACHE[name] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return _KEY_CACHE[name]  # type: ignore[no-any-return]


def ec_key(name: str = "ec") -> ec.EllipticCurvePrivateKey:
    if name not in _KEY_CACHE:
        _KEY_CACHE[name] = ec.generate_private_key(ec.SECP256R1())
    return _KEY_CACHE[name]  # type: ignore[no-any-return]


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned_token(claims: dict[str, Any], header: dict[str, Any]) -> str:
    """A token with ``alg: none`` and an empty signature."""
    return f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}."


def hmac_token(claims: dict[str, Any], header: dict[str, Any], secret: bytes) -> str:
    """An HS256 token signed with ``secret`` (PyJWT refuses a PEM public key as HMAC secret)."""
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(signature)}"


def public_pem(key: Any) -> bytes:
    return key.public_key().public_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


class IdentityProvider:
    def __init__(self, audience: str = AUDIENCE) -> None:
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.audience = audience
        # kid -> (private key, alg); published: kids served in the JWKS.
        self.keys: dict[str, tuple[Any, str]] = {
            "rsa-1": (rsa_key(), "RS256"),
            "ec-1": (ec_key(), "ES256"),
        }
        self.published = ["rsa-1", "ec-1"]
        self.discovery_overrides: dict[str, Any] = {}
        self.jwks_status = 200
        self.jwks_delay = 0.0
        self.jwks_padding = 0
        self.jwks_requests = 0
        self.discovery_requests = 0
        # Admin single sign-on: code -> claims of the user who "logged in" at the provider.
        self.client_id = "gateway-admin"
        self.client_secret = "admin-client-secret"
        self.codes: dict[str, dict[str, Any]] = {}
        self.access_tokens: dict[str, dict[str, Any]] = {}
        self.token_requests: list[dict[str, str]] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()

    # -- server -------------------------------------------------------------------------------

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self._discovery)
        app.router.add_get("/jwks", self._jwks)
        app.router.add_post("/token", self._token)
        app.router.add_get("/userinfo", self._userinfo)
        self._runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self._runner.setup())
        self.loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._started.set()
        self.loop.run_forever()

    def start(self) -> IdentityProvider:
        self._thread.start()
        self._started.wait(10)
        wait_port(self.port)
        return self

    def stop(self) -> None:
        if self.loop is None or not self._thread.is_alive():
            return
        runner = self._runner

        async def shutdown() -> None:
            if runner is not None:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def discovery_document(self) -> dict[str, Any]:
        doc = {
            "issuer": self.issuer,
            "jwks_uri": f"{self.issuer}/jwks",
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256", "ES256"],
        }
        doc.update(self.discovery_overrides)
        return doc

    async def _discovery(self, request: web.Request) -> web.Response:
        self.discovery_requests += 1
        return web.json_response(self.discovery_document())

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid in self.published:
            private, alg = self.keys[kid]
            algorithm = jwt.get_algorithm_by_name(alg)
            jwk = algorithm.to_jwk(private.public_key(), as_dict=True)
            jwk.update({"kid": kid, "use": "sig", "alg": alg})
            keys.append(jwk)
        doc: dict[str, Any] = {"keys": keys}
        if self.jwks_padding:
            doc["padding"] = "x" * self.jwks_padding
        return doc

    async def _jwks(self, request: web.Request) -> web.Response:
        self.jwks_requests += 1
        if self.jwks_delay:
            await asyncio.sleep(self.jwks_delay)
        if self.jwks_status != 200:
            return web.json_response({"error": "unavailable"}, status=self.jwks_status)
        return web.json_response(self.jwks())

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.token_requests.append({k: str(v) for k, v in form.items()})
        if form.get("client_id") != self.client_id or form.get("client_secret") != self.client_secret:
            return web.json_response({"error": "invalid_client"}, status=401)
        claims = self.codes.pop(str(form.get("code")), None)
        if claims is None:
            return web.json_response({"error": "invalid_grant"}, status=400)
        access_token = secrets.token_urlsafe(16)
        self.access_tokens[access_token] = claims
        id_token = self.mint(aud=self.client_id, **claims)
        return web.json_response(
            {"access_token": access_token, "token_type": "Bearer", "expires_in": 300, "id_token": id_token}
        )

    async def _userinfo(self, request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        claims = self.access_tokens.get(token)
        if claims is None:
            return web.json_response({"error": "invalid_token"}, status=401)
        return web.json_response({k: v for k, v in claims.items() if k not in ("nonce", "exp", "iat")})

    # -- keys and tokens ----------------------------------------------------------------------

    def rotate(self, kid: str = "rsa-2", *, keep_old: bool = False) -> str:
        """Publish a new RSA signing key under ``kid`` (and retire the old ones unless kept)."""
        self.keys[kid] = (rsa_key(kid), "RS256")
        self.published = [*self.published, kid] if keep_old else [kid]
        return kid

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": "alice",
            "aud": self.audience,
            "iat": now,
            "exp": now + 300,
        }
        for key, value in overrides.items():
            if value is _DROP:
                claims.pop(key, None)
            else:
                claims[key] = value
        return claims

    def mint(self, *, kid: str = "rsa-1", alg: str | None = None, key: Any = None, **claims: Any) -> str:
        private, default_alg = self.keys.get(kid, (key, alg or "RS256"))
        return jwt.encode(
            self.claims(**claims),
            key if key is not None else private,
            algorithm=alg or default_alg,
            headers={"kid": kid},
        )


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


_DROP: Any = _Drop()
DROP = _DROP  # pass as a claim value to remove that claim
