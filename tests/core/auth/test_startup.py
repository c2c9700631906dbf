"""Start-up with OIDC: discovery then JWKS must succeed before the gateway serves."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest

from gateway.core.config import ConfigError, load_config
from gateway.startup import check_auth
from tests.oidc_provider import IdentityProvider
from tests.servers import ROOT, GatewayProcess, free_port


def oidc_config(issuer: str, **env: str) -> Any:
    return load_config({"OIDC_ISSUER": issuer, "OIDC_AUDIENCE": "gateway", **env})


def test_startup_fetches_discovery_and_jwks(idp: IdentityProvider, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="gateway.startup")
    check_auth(oidc_config(idp.issuer))
    assert idp.discovery_requests == 1 and idp.jwks_requests == 1
    assert (
        f"auth: OIDC bearer tokens required on /v1 (issuer {idp.issuer}, audience gateway, 2 signing keys)"
        in caplog.text
    )


def test_startup_refuses_when_discovery_fails() -> None:
    issuer = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ConfigError, match=r"^OIDC_ISSUER: identity provider check failed: could not fetch"):
        check_auth(oidc_config(issuer))


def test_startup_refuses_an_issuer_mismatch(idp: IdentityProvider) -> None:
    idp.discovery_overrides["issuer"] = "https://someone-else.example"
    with pytest.raises(ConfigError, match=r"names issuer 'https://someone-else\.example', expected"):
        check_auth(oidc_config(idp.issuer))
    assert idp.jwks_requests == 0


def test_startup_refuses_when_jwks_fails(idp: IdentityProvider) -> None:
    idp.jwks_status = 500
    with pytest.raises(ConfigError, match=r"/jwks answered HTTP 500"):
        check_auth(oidc_config(idp.issuer))


def test_startup_refuses_a_plain_http_jwks_uri_off_loopback(idp: IdentityProvider) -> None:
    idp.discovery_overrides["jwks_uri"] = "http://keys.example/jwks"
    with pytest.raises(ConfigError, match="jwks_uri must be an https URL"):
        check_auth(oidc_config(idp.issuer))


def test_startup_refuses_an_oversized_discovery_document(idp: IdentityProvider) -> None:
    idp.discovery_overrides["padding"] = "x" * 5000
    with pytest.raises(ConfigError, match=r"more than 4096 bytes|answered 5\d+ bytes"):
        check_auth(oidc_config(idp.issuer, GATEWAY_AUTH_MAX_PROVIDER_RESPONSE_BYTES="4096"))


def test_one_oidc_setting_stops_startup() -> None:
    with pytest.raises(ConfigError, match="OIDC_AUDIENCE: must be set together with OIDC_ISSUER"):
        load_config({"OIDC_ISSUER": "https://idp.example"})


@pytest.mark.process
def test_manage_py_serve_refuses_to_start_when_discovery_fails() -> None:
    issuer = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "manage.py", "serve"],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "OIDC_ISSUER": issuer,
            "OIDC_AUDIENCE": "gateway",
            "PORT": str(free_port()),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"configuration error: OIDC_ISSUER: identity provider check failed: could not fetch {issuer}/.well-known/openid-configuration"
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.process
def test_manage_py_serve_starts_with_a_reachable_provider(idp: IdentityProvider) -> None:
    gateway = GatewayProcess({"OIDC_ISSUER": idp.issuer, "OIDC_AUDIENCE": "gateway"}).wait()
    try:
        import httpx

        r = httpx.get(f"{gateway.url}/v1/anything")
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "missing_bearer_token"
        r = httpx.get(f"{gateway.url}/v1/anything", headers={"Authorization": f"Bearer {idp.mint()}"})
        assert r.status_code == 404  # authenticated; no such route
        # The keys fetched at start-up serve the first request: no second JWKS fetch.
        assert idp.jwks_requests == 1
    finally:
        gateway.stop()
