"""Admin single sign-on: the authorization-code flow against a real loopback provider."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from gateway.core.auth.admin_sso import admin_flags
from gateway.core.config import AuthConfig, ConfigError, load_config
from tests.oidc_provider import IdentityProvider

pytestmark = pytest.mark.django_db


@pytest.fixture
def sso(idp: IdentityProvider, gateway_config: Any) -> IdentityProvider:
    gateway_config(
        auth__oidc_issuer=idp.issuer,
        auth__oidc_audience="gateway",
        auth__oidc_rp_client_id=idp.client_id,
        oidc_rp_client_secret=idp.client_secret,
        auth__admin_staff_value="gw-staff",
        auth__admin_superuser_value="gw-root",
        auth__admin_sso_scopes="openid email profile groups",
    )
    return idp


def start_login(client: Client, idp: IdentityProvider) -> dict[str, str]:
    response = client.get("/oidc/authenticate/?next=/admin/")
    assert response.status_code == 302
    location = urlsplit(response["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == f"{idp.issuer}/authorize"
    return {k: v[0] for k, v in parse_qs(location.query).items()}


def finish_login(client: Client, idp: IdentityProvider, params: dict[str, str], **claims: Any) -> Any:
    idp.codes["code-1"] = {"sub": "u-123", "email": "ada@example.com", "nonce": params["nonce"], **claims}
    return client.get(f"/oidc/callback/?code=code-1&state={params['state']}")


# -- configuration and claim mapping --------------------------------------------------------------


@pytest.mark.parametrize(
    "env, message",
    [
        ({"OIDC_RP_CLIENT_ID": "c"}, "OIDC_RP_CLIENT_ID: admin single sign-on needs OIDC_ISSUER"),
        (
            {"OIDC_RP_CLIENT_ID": "c", "OIDC_ISSUER": "https://idp.example", "OIDC_AUDIENCE": "gw"},
            "OIDC_RP_CLIENT_SECRET: must be set together with OIDC_RP_CLIENT_ID",
        ),
        (
            {
                "OIDC_RP_CLIENT_ID": "c",
                "OIDC_RP_CLIENT_SECRET": "s",
                "OIDC_ISSUER": "https://idp.example",
                "OIDC_AUDIENCE": "gw",
            },
            "auth.admin_staff_value: admin single sign-on needs admin_staff_value or admin_superuser_value",
        ),
    ],
)
def test_sso_settings_must_be_complete(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env)


@pytest.mark.parametrize(
    "claims, expected",
    [
        ({"groups": ["eng", "gw-staff"]}, (True, False)),
        ({"groups": ["gw-root"]}, (True, True)),
        ({"groups": "gw-staff"}, (True, False)),
        ({"groups": ["eng"]}, (False, False)),
        ({}, (False, False)),
        ({"roles": ["gw-root"]}, (False, False)),  # another claim than the configured one
    ],
)
def test_claim_maps_to_staff_and_superuser(claims: dict[str, Any], expected: tuple[bool, bool]) -> None:
    auth = AuthConfig(
        admin_staff_claim="groups", admin_staff_value="gw-staff", admin_superuser_value="gw-root"
    )
    assert admin_flags(claims, auth) == expected


def test_custom_claim_name() -> None:
    auth = AuthConfig(admin_staff_claim="role", admin_staff_value="admin")
    assert admin_flags({"role": "admin"}, auth) == (True, False)


# -- login page and redirect ----------------------------------------------------------------------


def test_login_page_has_no_sso_link_unless_configured(client: Client) -> None:
    page = client.get("/admin/login/")
    assert page.status_code == 200
    assert "Log in with SSO" not in page.content.decode()
    assert client.get("/oidc/authenticate/").status_code == 404


def test_login_page_offers_sso_and_keeps_password_login(client: Client, sso: IdentityProvider) -> None:
    page = client.get("/admin/login/?next=/admin/").content.decode()
    assert 'href="/oidc/authenticate/?next=/admin/"' in page
    assert 'name="password"' in page
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456")
    assert client.login(username="root", password="pw-123456")
    assert client.get("/admin/").status_code == 200


def test_authenticate_redirects_to_the_providers_authorize_endpoint(
    client: Client, sso: IdentityProvider
) -> None:
    params = start_login(client, sso)
    assert params["client_id"] == sso.client_id
    assert params["response_type"] == "code"
    assert params["scope"] == "openid email profile groups"
    assert params["redirect_uri"] == "http://testserver/oidc/callback/"
    assert params["code_challenge_method"] == "S256" and params["code_challenge"]
    assert params["state"] and params["nonce"]


# -- the full code flow ---------------------------------------------------------------------------


def test_group_member_signs_in_as_superuser(client: Client, sso: IdentityProvider) -> None:
    params = start_login(client, sso)
    response = finish_login(client, sso, params, groups=["gw-root"], name="Ada")
    assert response.status_code == 302
    assert response["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200
    user = get_user_model().objects.get(username="sso:u-123")
    assert (user.is_staff, user.is_superuser) == (True, True)
    assert user.email == "ada@example.com"
    assert not user.has_usable_password()
    token_request = sso.token_requests[-1]
    assert token_request["grant_type"] == "authorization_code"
    assert token_request["code_verifier"]  # PKCE


def test_staff_flags_follow_the_claim_at_each_sign_in(client: Client, sso: IdentityProvider) -> None:
    finish_login(client, sso, start_login(client, sso), groups=["gw-root"])
    client.logout()
    finish_login(client, sso, start_login(client, sso), groups=["gw-staff"])
    user = get_user_model().objects.get(username="sso:u-123")
    assert (user.is_staff, user.is_superuser) == (True, False)


def test_user_without_the_claim_value_is_refused(client: Client, sso: IdentityProvider) -> None:
    response = finish_login(client, sso, start_login(client, sso), groups=["eng"])
    assert response.status_code == 302
    assert response["Location"] == "/admin/login/?sso=failed"
    assert not get_user_model().objects.filter(username="sso:u-123").exists()
    assert client.get("/admin/").status_code == 302  # still anonymous: sent to the login page
    assert "Single sign-on failed" in client.get("/admin/login/?sso=failed").content.decode()


def test_id_token_for_another_client_is_refused(client: Client, sso: IdentityProvider) -> None:
    params = start_login(client, sso)
    original = sso.mint

    def mint_for_other(**kwargs: Any) -> str:
        kwargs["aud"] = "someone-else"
        return original(**kwargs)

    sso.mint = mint_for_other  # type: ignore[method-assign]
    response = finish_login(client, sso, params, groups=["gw-root"])
    assert response["Location"] == "/admin/login/?sso=failed"
    assert not get_user_model().objects.filter(username="sso:u-123").exists()


def test_sso_cannot_take_over_a_local_account(client: Client, sso: IdentityProvider) -> None:
    local = get_user_model().objects.create_superuser("root", "ada@example.com", "pw-123456")
    finish_login(client, sso, start_login(client, sso), groups=["gw-staff"], preferred_username="root")
    local.refresh_from_db()
    assert local.is_superuser and local.check_password("pw-123456")
    assert get_user_model().objects.get(username="sso:u-123").is_superuser is False
