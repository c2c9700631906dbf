"""OIDC bearer tokens on /v1: each validation rule, the JWKS cache, rotation and provider failures.

The identity provider is a real aiohttp server on loopback (tests/oidc_provider.py) serving
discovery and a JWKS of RSA and EC keys generated for the test run; tokens are minted with PyJWT.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from django.test import AsyncClient

from tests.core.auth.auth_helpers import bearer
from tests.oidc_provider import (
    AUDIENCE,
    DROP,
    IdentityProvider,
    ec_key,
    hmac_token,
    public_pem,
    rsa_key,
    unsigned_token,
)

pytestmark = pytest.mark.urls("tests.core.auth.urls_auth_testing")

WHOAMI = "/v1/test/whoami"
INVALID_TOKEN = {
    "error": {
        "message": "invalid bearer token",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_token",
    }
}
MISSING_TOKEN = {
    "error": {
        "message": "invalid bearer token",
        "type": "authentication_error",
        "param": None,
        "code": "missing_bearer_token",
    }
}
PROVIDER_DOWN = {
    "error": {
        "message": "The identity provider's signing keys could not be refreshed; try again later.",
        "type": "server_error",
        "param": None,
        "code": "identity_provider_unavailable",
    }
}


async def get(path: str, headers: dict[str, str] | None = None) -> Any:
    return await AsyncClient().get(path, headers=headers or {})


def assert_rejected(response: Any, body: dict[str, Any] = INVALID_TOKEN) -> None:
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.headers["Content-Type"] == "application/json"
    assert response.json() == body


def assert_provider_down(response: Any) -> None:
    assert response.status_code == 503
    assert "WWW-Authenticate" not in response.headers
    assert response.json() == PROVIDER_DOWN


# -- accepted tokens ------------------------------------------------------------------------------


async def test_rsa_token_is_accepted_and_names_the_principal(idp: IdentityProvider, oidc: Any) -> None:
    token = idp.mint(sub="alice")
    response = await get(WHOAMI, bearer(token))
    assert response.status_code == 200
    body = response.json()
    assert body["owner"] == f"oidc:{idp.issuer}#alice"
    assert body["kind"] == "oidc"
    assert body["subject"] == "alice"
    assert body["credential_consumed"] is True
    assert body["expires_at"] == pytest.approx(time.time() + 300, abs=5)


async def test_ec_token_is_accepted(idp: IdentityProvider, oidc: Any) -> None:
    response = await get(WHOAMI, bearer(idp.mint(kid="ec-1", sub="bob")))
    assert response.status_code == 200
    assert response.json()["owner"] == f"oidc:{idp.issuer}#bob"


async def test_audience_list_whose_every_value_matches_is_accepted(idp: IdentityProvider, oidc: Any) -> None:
    response = await get(WHOAMI, bearer(idp.mint(aud=[AUDIENCE, AUDIENCE], azp=AUDIENCE)))
    assert response.status_code == 200


async def test_x_api_key_header_carries_the_token_too(idp: IdentityProvider, oidc: Any) -> None:
    response = await get(WHOAMI, {"x-api-key": idp.mint()})
    assert response.status_code == 200


async def test_expired_within_leeway_is_accepted(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__leeway_s=30)
    token = idp.mint(exp=int(time.time()) - 10)
    assert (await get(WHOAMI, bearer(token))).status_code == 200
    oidc(auth__leeway_s=0)
    assert_rejected(await get(WHOAMI, bearer(token)))


# -- missing and rejected credentials -----------------------------------------------------------


async def test_missing_header_is_401_missing_bearer_token(oidc: Any) -> None:
    assert_rejected(await get(WHOAMI), MISSING_TOKEN)


async def test_unknown_v1_route_also_needs_a_token(oidc: Any) -> None:
    # Authentication comes before routing: an unauthenticated caller cannot probe for routes.
    assert_rejected(await get("/v1/does-not-exist"), MISSING_TOKEN)


@pytest.mark.parametrize(
    "authorization",
    ["Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "Bearer not-a-jwt", "Bearer a.b.c", "Token x.y.z"],
)
async def test_malformed_authorization_is_invalid_token(oidc: Any, authorization: str) -> None:
    assert_rejected(await get(WHOAMI, {"Authorization": authorization}))


async def test_wrong_audience_in_a_list_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    # Our audience is in the list, but so is another: OIDC_AUDIENCE is the complete trust set.
    assert_rejected(await get(WHOAMI, bearer(idp.mint(aud=[AUDIENCE, "other-service"]))))


async def test_other_audience_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    assert_rejected(await get(WHOAMI, bearer(idp.mint(aud="other-service"))))


async def test_missing_audience_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    assert_rejected(await get(WHOAMI, bearer(idp.mint(aud=DROP))))


async def test_empty_audience_list_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    assert_rejected(await get(WHOAMI, bearer(idp.mint(aud=[]))))


async def test_azp_mismatch_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    assert_rejected(await get(WHOAMI, bearer(idp.mint(azp="some-other-client"))))


async def test_expired_token_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__leeway_s=5)
    assert_rejected(await get(WHOAMI, bearer(idp.mint(exp=int(time.time()) - 60))))


async def test_token_without_exp_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    assert_rejected(await get(WHOAMI, bearer(idp.mint(exp=DROP))))


async def test_not_yet_valid_token_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__leeway_s=5)
    assert_rejected(await get(WHOAMI, bearer(idp.mint(nbf=int(time.time()) + 120))))


async def test_nbf_within_leeway_is_accepted(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__leeway_s=30)
    assert (await get(WHOAMI, bearer(idp.mint(nbf=int(time.time()) + 10)))).status_code == 200


async def test_wrong_issuer_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    assert_rejected(await get(WHOAMI, bearer(idp.mint(iss="https://evil.example"))))


async def test_empty_subject_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    assert_rejected(await get(WHOAMI, bearer(idp.mint(sub=""))))


async def test_missing_subject_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    assert_rejected(await get(WHOAMI, bearer(idp.mint(sub=DROP))))


async def test_bad_signature_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    # Signed by a key the provider never published, under a published kid.
    forged = idp.mint(kid="rsa-1", key=rsa_key("attacker"))
    assert_rejected(await get(WHOAMI, bearer(forged)))
    # A valid token whose payload was swapped keeps a signature that no longer matches.
    good, other = idp.mint(sub="alice"), idp.mint(sub="mallory")
    spliced = ".".join([good.split(".")[0], other.split(".")[1], good.split(".")[2]])
    assert_rejected(await get(WHOAMI, bearer(spliced)))


async def test_ec_token_under_an_rsa_kid_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    assert_rejected(await get(WHOAMI, bearer(idp.mint(kid="rsa-1", alg="ES256", key=ec_key()))))


async def test_alg_none_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    token = unsigned_token(idp.claims(), {"alg": "none", "typ": "JWT", "kid": "rsa-1"})
    assert_rejected(await get(WHOAMI, bearer(token)))


async def test_hs256_signed_with_the_public_key_is_rejected(idp: IdentityProvider, oidc: Any) -> None:
    # The classic algorithm-confusion attack: the published RSA public key used as an HMAC secret.
    pem = public_pem(rsa_key())
    for kid in ("rsa-1", None):
        header: dict[str, Any] = {"alg": "HS256", "typ": "JWT"}
        if kid:
            header["kid"] = kid
        assert_rejected(await get(WHOAMI, bearer(hmac_token(idp.claims(), header, pem))))


# -- the JWKS cache, rotation and provider failures ------------------------------------------------


async def test_jwks_is_cached(idp: IdentityProvider, oidc: Any) -> None:
    for _ in range(3):
        assert (await get(WHOAMI, bearer(idp.mint()))).status_code == 200
    assert idp.discovery_requests == 1
    assert idp.jwks_requests == 1


async def test_jwks_ttl_expiry_refetches(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__jwks_ttl_s=1)
    assert (await get(WHOAMI, bearer(idp.mint()))).status_code == 200
    await asyncio.sleep(1.1)
    assert (await get(WHOAMI, bearer(idp.mint()))).status_code == 200
    assert idp.jwks_requests == 2


async def test_unknown_kid_refreshes_so_rotation_works(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__jwks_min_refresh_interval_s=0)
    assert (await get(WHOAMI, bearer(idp.mint()))).status_code == 200
    assert idp.jwks_requests == 1
    idp.rotate("rsa-2")  # the provider retires rsa-1 and signs with a new key
    response = await get(WHOAMI, bearer(idp.mint(kid="rsa-2", sub="carol")))
    assert response.status_code == 200
    assert response.json()["subject"] == "carol"
    assert idp.jwks_requests == 2
    # The retired key is gone from the refreshed cache.
    assert_rejected(await get(WHOAMI, bearer(idp.mint(kid="rsa-1"))))


async def test_unknown_kid_refresh_is_rate_limited(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__jwks_min_refresh_interval_s=1.0)
    assert (await get(WHOAMI, bearer(idp.mint()))).status_code == 200
    assert idp.jwks_requests == 1
    # A rotation right after the first fetch is picked up at once: one refresh.
    idp.rotate("rsa-2", keep_old=True)
    assert (await get(WHOAMI, bearer(idp.mint(kid="rsa-2")))).status_code == 200
    assert idp.jwks_requests == 2
    # Within the interval, further unknown kids (forged or rotated again) do not reach the provider.
    idp.rotate("rsa-3", keep_old=True)
    for kid in ("forged-1", "forged-2", "rsa-3"):
        assert_rejected(await get(WHOAMI, bearer(idp.mint(kid=kid, key=rsa_key(kid), alg="RS256"))))
    assert idp.jwks_requests == 2
    await asyncio.sleep(1.05)
    assert (await get(WHOAMI, bearer(idp.mint(kid="rsa-3")))).status_code == 200
    assert idp.jwks_requests == 3


async def test_concurrent_unknown_kid_requests_share_one_refresh(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__jwks_min_refresh_interval_s=0)
    assert (await get(WHOAMI, bearer(idp.mint()))).status_code == 200
    idp.rotate("rsa-2")
    idp.jwks_delay = 0.3
    token = idp.mint(kid="rsa-2")
    responses = await asyncio.gather(*(get(WHOAMI, bearer(token)) for _ in range(8)))
    assert [r.status_code for r in responses] == [200] * 8
    assert idp.jwks_requests == 2  # the initial fetch and exactly one refresh


async def test_jwks_refresh_failure_is_503_without_www_authenticate(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__jwks_min_refresh_interval_s=0)
    assert (await get(WHOAMI, bearer(idp.mint()))).status_code == 200
    idp.rotate("rsa-2")
    idp.jwks_status = 500
    assert_provider_down(await get(WHOAMI, bearer(idp.mint(kid="rsa-2"))))
    # Tokens signed with cached keys keep working while the provider is failing.
    assert (await get(WHOAMI, bearer(idp.mint(kid="rsa-1")))).status_code == 200


async def test_jwks_server_down_is_503(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__jwks_min_refresh_interval_s=0)
    assert (await get(WHOAMI, bearer(idp.mint()))).status_code == 200
    token = idp.mint(kid="rsa-2", key=rsa_key("rsa-2"), alg="RS256")
    idp.stop()  # connection refused from now on
    assert_provider_down(await get(WHOAMI, bearer(token)))


async def test_expired_cache_with_provider_down_is_503(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__jwks_ttl_s=1)
    assert (await get(WHOAMI, bearer(idp.mint()))).status_code == 200
    token = idp.mint()
    idp.stop()
    await asyncio.sleep(1.1)
    assert_provider_down(await get(WHOAMI, bearer(token)))


async def test_discovery_unreachable_at_first_request_is_503(idp: IdentityProvider, oidc: Any) -> None:
    idp.stop()
    # A malformed token is refused before the provider is needed: still a 401.
    assert_rejected(await get(WHOAMI, bearer("a.b.c")))
    assert_provider_down(await get(WHOAMI, bearer(idp.mint())))


async def test_provider_response_size_is_bounded(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__max_provider_response_bytes=4096)
    idp.jwks_padding = 10_000
    assert_provider_down(await get(WHOAMI, bearer(idp.mint())))
    idp.jwks_padding = 0
    oidc(auth__max_provider_response_bytes=4096, auth__jwks_min_refresh_interval_s=0)
    assert (await get(WHOAMI, bearer(idp.mint()))).status_code == 200


async def test_provider_timeout_is_bounded(idp: IdentityProvider, oidc: Any) -> None:
    oidc(auth__http_timeout_s=0.3)
    idp.jwks_delay = 3.0
    started = time.monotonic()
    assert_provider_down(await get(WHOAMI, bearer(idp.mint())))
    assert time.monotonic() - started < 2.0


# -- the live server: envelopes, public paths, CORS and SDK clients --------------------------------


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_messages_routes_answer_the_anthropic_envelope(
    live_gateway: Any, idp: IdentityProvider, oidc: Any, path: str
) -> None:
    for headers in ({}, bearer(idp.mint(aud="other-service"))):
        r = httpx.post(f"{live_gateway.url}{path}", json={"model": "m", "messages": []}, headers=headers)
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        body = r.json()
        assert body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "invalid bearer token"},
            "request_id": body["request_id"],
        }
        assert body["request_id"].startswith("req_")
        assert r.headers["request-id"] == body["request_id"]


def test_anthropic_sdk_sees_authentication_error(live_gateway: Any, idp: IdentityProvider, oidc: Any) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=live_gateway.url, api_key="not-a-token", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 401
    assert info.value.request_id is not None and info.value.request_id.startswith("req_")
    assert info.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid bearer token"},
        "request_id": info.value.request_id,
    }


def test_openai_sdk_sees_authentication_error(
    live_gateway: Any, idp: IdentityProvider, oidc: Any, upstream: Any, gateway_config: Any
) -> None:
    import openai

    gateway_config(llm_api_base=upstream.url)

    client = openai.OpenAI(base_url=f"{live_gateway.url}/v1", api_key="not-a-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        client.models.list()
    assert info.value.status_code == 401
    assert info.value.code == "invalid_token"
    assert info.value.type == "authentication_error"
    # A valid token gets past authentication, and the identity token never reaches the upstream.
    token = idp.mint()
    client = openai.OpenAI(base_url=f"{live_gateway.url}/v1", api_key=token, max_retries=0)
    assert [m.id for m in client.models.list()] == ["test-model"]
    assert token not in upstream.last("/v1/models").headers.get("authorization", "")


def test_health_ready_and_metrics_stay_public(live_gateway: Any, oidc: Any, gateway_config: Any) -> None:
    assert httpx.get(f"{live_gateway.url}/health").status_code == 200
    ready = httpx.get(f"{live_gateway.url}/ready")
    assert ready.status_code != 401 and "www-authenticate" not in ready.headers
    assert httpx.get(f"{live_gateway.url}/metrics").status_code == 200


def test_metrics_can_require_the_v1_credentials(live_gateway: Any, idp: IdentityProvider, oidc: Any) -> None:
    oidc(server__metrics_public=False)
    r = httpx.get(f"{live_gateway.url}/metrics")
    assert r.status_code == 401
    assert r.json() == MISSING_TOKEN
    r = httpx.get(f"{live_gateway.url}/metrics", headers=bearer(idp.mint()))
    assert r.status_code == 200
    assert "gateway_http_requests_total" in r.text


def test_token_never_reaches_the_upstream(
    live_gateway: Any, upstream: Any, idp: IdentityProvider, oidc: Any, gateway_config: Any
) -> None:
    from aiohttp import web

    async def answer(request: web.Request, rec: Any) -> web.StreamResponse:
        return web.json_response({"ok": True})

    upstream.script("/v1/chat/completions", answer)
    oidc(llm_api_base=upstream.url, openai_api_key="upstream-secret")
    token = idp.mint()
    r = httpx.post(
        f"{live_gateway.url}/v1/test/forward",
        json={"model": "m", "messages": []},
        headers={**bearer(token), "x-api-key": token, "x-custom": "kept"},
    )
    assert r.status_code == 200, r.text
    received = upstream.last("/v1/chat/completions").headers
    assert received["authorization"] == "Bearer upstream-secret"
    assert "x-api-key" not in received
    assert received["x-custom"] == "kept"
    assert not any(token in value for value in received.values())


def test_forward_headers_drops_a_consumed_credential(gateway_config: Any) -> None:
    from inference_app.upstream.http import forward_headers

    config = gateway_config(openai_api_key="upstream-secret")
    incoming = {"Authorization": "Bearer id-token", "X-Api-Key": "id-token", "Accept": "x"}
    out = forward_headers(incoming, config, caller_credential_consumed=True)
    assert out == {"authorization": "Bearer upstream-secret", "accept": "x"}
    # Not consumed (open gateway): the caller's own credential passes through untouched.
    out = forward_headers(incoming, config, caller_credential_consumed=False)
    assert out["authorization"] == "Bearer id-token"


@pytest.mark.process
def test_a_gateway_without_oidc_never_loads_the_oidc_module() -> None:
    """The OIDC module brings aiohttp and PyJWT: importing it on a request (as ``authenticate`` did
    on every API-key or open gateway, once the key snapshot first went stale) blocked the worker's
    event loop for about 0.1 s. Checked in a fresh interpreter: this process imported it long ago."""
    import subprocess
    import sys

    from tests.servers import ROOT

    probe = (
        "import asyncio, os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'gateway.settings');"
        "import django; django.setup(); import gateway.asgi;"
        "from gateway.core import auth; from gateway.core.auth import apikeys; apikeys.pin_no_keys();"
        "result = asyncio.run(auth.authenticate('/v1/responses', {'authorization': 'Bearer x'}));"
        "print(result.principal.kind, 'gateway.core.auth.oidc' in sys.modules)"
    )
    env = {"PATH": "/usr/bin:/bin", "GATEWAY_SECRET_KEY": "x" * 50}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["default", "False"], out.stderr
