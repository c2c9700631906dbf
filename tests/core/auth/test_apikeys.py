"""API-key mode, the open gateway, and key management (the ``OPENAI_API_KEY`` rule for stored state:
``test_stored_state.py``)."""

from __future__ import annotations

import asyncio
import io
import logging
import threading
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from gateway.core.auth import apikeys
from gateway.core.models import ApiKey
from tests.core.auth.auth_helpers import WHOAMI, assert_refused, bearer, envelope, get

pytestmark = [pytest.mark.urls("tests.core.auth.urls_auth_testing"), pytest.mark.django_db(transaction=True)]


def create_key(name: str) -> tuple[ApiKey, str]:
    return apikeys.apikey_create(name=name)


# -- open gateway ---------------------------------------------------------------------------------


async def test_open_gateway_uses_the_default_principal() -> None:
    response = await get(WHOAMI, bearer("anything"))
    assert response.status_code == 200
    assert response.json() == {
        "owner": "default",
        "kind": "default",
        "subject": "",
        "expires_at": None,
        "credential_consumed": False,
    }


# -- named keys -----------------------------------------------------------------------------------


async def test_one_named_key_closes_the_gateway() -> None:
    from asgiref.sync import sync_to_async

    key, secret = await sync_to_async(create_key)("ci")
    assert_refused(await get(WHOAMI), "missing_bearer_token")
    assert_refused(await get(WHOAMI, bearer("sk-gw-wrong")), "invalid_token")
    assert_refused(
        await get(WHOAMI, bearer(secret[:-1] + ("A" if secret[-1] != "A" else "B"))), "invalid_token"
    )
    response = await get(WHOAMI, bearer(secret))
    assert response.status_code == 200
    assert response.json() == {
        "owner": f"key:{key.pk}",
        "kind": "api_key",
        "subject": "ci",
        "expires_at": None,
        "credential_consumed": True,
    }
    # Anthropic SDKs send the key as x-api-key.
    assert (await get(WHOAMI, {"x-api-key": secret})).json()["owner"] == f"key:{key.pk}"


async def test_each_key_is_its_own_principal() -> None:
    from asgiref.sync import sync_to_async

    (a, secret_a), (b, secret_b) = await sync_to_async(create_key)("a"), await sync_to_async(create_key)("b")
    assert (await get(WHOAMI, bearer(secret_a))).json()["owner"] == f"key:{a.pk}"
    assert (await get(WHOAMI, bearer(secret_b))).json()["owner"] == f"key:{b.pk}"


def test_keys_are_stored_hashed() -> None:
    key, secret = create_key("hashed")
    stored = ApiKey.objects.get(pk=key.pk)
    assert secret.startswith("sk-gw-") and len(secret) > 40
    assert stored.key_hash == apikeys.hash_secret(secret) != secret
    assert stored.prefix == secret[:12]
    assert all(secret not in str(value) for value in ApiKey.objects.values().get(pk=key.pk).values())


async def test_revoked_key_is_refused() -> None:
    from asgiref.sync import sync_to_async

    _, keep = await sync_to_async(create_key)("keep")
    _, gone = await sync_to_async(create_key)("gone")
    assert (await get(WHOAMI, bearer(gone))).status_code == 200
    await sync_to_async(apikeys.apikey_revoke)(name_or_id="gone")
    assert_refused(await get(WHOAMI, bearer(gone)), "invalid_token")
    assert (await get(WHOAMI, bearer(keep))).status_code == 200


async def test_require_api_key_without_any_key_refuses_everything(gateway_config: Any) -> None:
    gateway_config(auth__require_api_key=True)
    assert_refused(await get(WHOAMI), "missing_bearer_token")
    assert_refused(await get(WHOAMI, bearer("whatever")), "invalid_token")


async def test_key_use_is_recorded() -> None:
    from asgiref.sync import sync_to_async

    key, secret = await sync_to_async(create_key)("used")
    assert key.last_used_at is None
    assert (await get(WHOAMI, bearer(secret))).status_code == 200
    await key.arefresh_from_db()
    assert key.last_used_at is not None


def test_key_created_in_another_process_closes_a_running_gateway(live_gateway: Any) -> None:
    assert httpx.get(f"{live_gateway.url}{WHOAMI}").status_code == 200
    # Written directly, as `manage.py apikey create` in another process would: no local reset.
    secret = apikeys.generate_secret()
    ApiKey.objects.create(
        name="other", prefix=apikeys.display_prefix(secret), key_hash=apikeys.hash_secret(secret)
    )
    import time

    time.sleep(apikeys.SNAPSHOT_TTL_S + 0.1)
    assert httpx.get(f"{live_gateway.url}{WHOAMI}").status_code == 401
    assert httpx.get(f"{live_gateway.url}{WHOAMI}", headers=bearer(secret)).status_code == 200


def test_named_keys_are_ignored_when_oidc_is_on(gateway_config: Any) -> None:
    """OIDC mode needs an OIDC token: a named API key is not one."""
    from tests.oidc_provider import IdentityProvider

    idp = IdentityProvider().start()
    try:
        gateway_config(auth__oidc_issuer=idp.issuer, auth__oidc_audience="gateway")
        _, secret = create_key("ignored")
        from django.test import Client

        response = Client().get(WHOAMI, headers=bearer(secret))
        assert response.status_code == 401
        assert response.json() == envelope("invalid_token")
    finally:
        idp.stop()


# -- the key is consumed, the upstream credential injected ----------------------------------------


def test_api_key_is_consumed_and_the_upstream_key_injected(
    live_gateway: Any, upstream: Any, gateway_config: Any
) -> None:
    from aiohttp import web

    async def answer(request: web.Request, rec: Any) -> web.StreamResponse:
        return web.json_response({"ok": True})

    upstream.script("/v1/chat/completions", answer)
    gateway_config(llm_api_base=upstream.url, openai_api_key="upstream-secret")
    _, secret = create_key("forwarder")
    r = httpx.post(f"{live_gateway.url}/v1/test/forward", json={}, headers={"x-api-key": secret})
    assert r.status_code == 200, r.text
    received = upstream.last("/v1/chat/completions").headers
    assert received["authorization"] == "Bearer upstream-secret"
    assert "x-api-key" not in received
    assert not any(secret in value for value in received.values())


# -- OPENAI_API_KEY and stored state --------------------------------------------------------------


def test_pass_through_injects_the_upstream_key_when_the_caller_sends_none(
    live_gateway: Any, upstream: Any, gateway_config: Any
) -> None:
    from aiohttp import web

    async def answer(request: web.Request, rec: Any) -> web.StreamResponse:
        return web.json_response({"ok": True})

    upstream.script("/v1/chat/completions", answer)
    upstream.script("/v1/chat/completions", answer)
    gateway_config(llm_api_base=upstream.url, openai_api_key="upstream-secret")
    assert httpx.post(f"{live_gateway.url}/v1/test/forward", json={}).status_code == 200
    assert upstream.last("/v1/chat/completions").headers["authorization"] == "Bearer upstream-secret"
    # A caller-supplied credential on an open gateway is the caller's own business: passed through.
    headers = bearer("callers-own")
    assert httpx.post(f"{live_gateway.url}/v1/test/forward", json={}, headers=headers).status_code == 200
    assert upstream.last("/v1/chat/completions").headers["authorization"] == "Bearer callers-own"


# -- management: command, admin, start-up log ------------------------------------------------------


def test_apikey_command_create_list_revoke() -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command("apikey", "create", "deploy", stdout=out, stderr=err)
    secret = out.getvalue().strip()
    assert secret.startswith("sk-gw-") and "\n" not in secret
    assert "not shown again" in err.getvalue()
    key = ApiKey.objects.get(name="deploy")
    assert key.key_hash == apikeys.hash_secret(secret)

    out = io.StringIO()
    call_command("apikey", "list", stdout=out)
    listing = out.getvalue()
    assert "deploy" in listing and secret[:12] in listing and secret not in listing and "active" in listing

    with pytest.raises(CommandError, match="already exists"):
        call_command("apikey", "create", "deploy", stdout=io.StringIO(), stderr=io.StringIO())

    out = io.StringIO()
    call_command("apikey", "revoke", "deploy", stdout=out)
    assert "revoked" in out.getvalue()
    key.refresh_from_db()
    assert key.is_active is False and key.revoked_at is not None
    with pytest.raises(CommandError, match="No API key named 'nope'"):
        call_command("apikey", "revoke", "nope", stdout=io.StringIO())


@pytest.mark.process
def test_apikey_command_through_manage_py() -> None:
    """The real command line prints only the secret on stdout."""
    import subprocess
    import sys

    from django.conf import settings

    from tests.servers import ROOT

    db = settings.DATABASES["default"]
    # The command runs in another process, on the test database (SQLite's is a file too).
    if db["ENGINE"] == "django.db.backends.postgresql":
        url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    else:
        url = f"sqlite:///{db['NAME']}"
    proc = subprocess.run(
        [sys.executable, "manage.py", "apikey", "create", "cli"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": url, "GATEWAY_SECRET_KEY": "x" * 50},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    secret = proc.stdout.strip()
    assert ApiKey.objects.get(name="cli").key_hash == apikeys.hash_secret(secret)


def test_admin_creates_a_key_and_shows_the_secret_once(admin_client: Any) -> None:
    response = admin_client.post("/admin/gateway/apikey/add/", {"name": "from-admin"}, follow=True)
    assert response.status_code == 200
    key = ApiKey.objects.get(name="from-admin")
    shown = [str(m) for m in response.context["messages"] if "created:" in str(m)]
    assert len(shown) == 1 and key.prefix in shown[0]
    secret = shown[0].split("created: ", 1)[1].split(" ")[0]
    assert apikeys.hash_secret(secret) == key.key_hash
    # The change page never shows the secret again.
    page = admin_client.get(f"/admin/gateway/apikey/{key.pk}/change/")
    assert page.status_code == 200 and secret not in page.content.decode()
    # Revoking from the list.
    admin_client.post(
        "/admin/gateway/apikey/", {"action": "revoke", "_selected_action": [key.pk]}, follow=True
    )
    key.refresh_from_db()
    assert key.is_active is False


def test_startup_log_says_which_mode(caplog: Any, gateway_config: Any) -> None:
    from gateway.startup import run_checks

    caplog.set_level(logging.INFO, logger="gateway.startup")
    run_checks(gateway_config())
    assert "auth: OPEN gateway" in caplog.text
    caplog.clear()
    run_checks(gateway_config(auth__require_api_key=True))
    assert "GATEWAY_REQUIRE_API_KEY is set but no named key exists" in caplog.text
    caplog.clear()
    create_key("one")
    run_checks(gateway_config())
    assert "auth: API keys required on /v1 (1 active named keys)" in caplog.text


def test_unreadable_key_table_fails_closed(live_gateway: Any) -> None:
    """No API-key snapshot and no readable table: 503, never an open gateway."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE gateway_apikey RENAME TO gateway_apikey_away")
    try:
        r = httpx.get(f"{live_gateway.url}{WHOAMI}")
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "auth_unavailable"
        assert "www-authenticate" not in r.headers
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE gateway_apikey_away RENAME TO gateway_apikey")
    apikeys.reset()
    assert httpx.get(f"{live_gateway.url}{WHOAMI}").status_code == 200


async def test_concurrent_requests_share_one_snapshot_reload(monkeypatch: Any) -> None:
    """A stale snapshot is reloaded once for all the requests waiting on it, not once each."""
    from asgiref.sync import sync_to_async

    _, secret = await sync_to_async(create_key)("shared")
    loads = []
    original = apikeys._load_snapshot

    def counting_load() -> apikeys.Snapshot:
        loads.append(1)
        return original()

    monkeypatch.setattr(apikeys, "_load_snapshot", counting_load)
    apikeys.reset()
    snaps = await asyncio.gather(*(apikeys.snapshot() for _ in range(20)))
    assert len(loads) == 1
    assert all(s is snaps[0] for s in snaps)
    assert apikeys.match(snaps[0], secret) is not None


async def test_a_reload_started_before_a_reset_does_not_hide_a_new_key(monkeypatch: Any) -> None:
    """Keys created here drop the snapshot at once, even while an older reload is still running."""
    from asgiref.sync import sync_to_async

    await sync_to_async(create_key)("first")
    apikeys.reset()
    release = threading.Event()
    original = apikeys._load_snapshot

    def slow_load() -> apikeys.Snapshot:
        snap = original()
        release.wait(5)
        return snap

    monkeypatch.setattr(apikeys, "_load_snapshot", slow_load)
    old_reload = asyncio.ensure_future(apikeys.snapshot())
    await asyncio.sleep(0.05)
    monkeypatch.setattr(apikeys, "_load_snapshot", original)
    _, secret = await sync_to_async(create_key)("second")  # resets the snapshot
    fresh = await apikeys.snapshot()
    assert apikeys.match(fresh, secret) is not None
    release.set()
    await old_reload
    assert apikeys.match(await apikeys.snapshot(), secret) is not None
