"""Admin single sign-on through the gateway's identity provider (mozilla-django-oidc, PKCE).

Staff and superuser flags come from one claim (``[auth] admin_staff_claim``) and are re-applied at
every sign-on. Users are matched by the provider's ``sub`` (``sso:<sub>``), never by e-mail, so an
identity-provider account can never take over a local account.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import jwt
import requests
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.views.generic import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationRequestView

from gateway.core import errors
from gateway.core.auth import oidc
from gateway.core.config import AuthConfig, Config, get_config

log = logging.getLogger("gateway.core.auth")


def sso_enabled(config: Config | None = None) -> bool:
    config = config or get_config()
    return bool(
        config.oidc_enabled
        and config.auth.oidc_rp_client_id
        and config.oidc_rp_client_secret.get_secret_value()
    )


def discovery(config: Config) -> dict[str, Any]:
    """The issuer's discovery document (cached with the bearer-token provider state)."""
    provider = oidc.get_provider(config)
    if provider.discovery is None:
        doc = oidc.fetch_json_sync(oidc.discovery_url(config.auth.oidc_issuer), config.auth)
        provider.discovery = oidc.validate_discovery(doc, config.auth.oidc_issuer)
    return provider.discovery


def admin_flags(claims: dict[str, Any], auth: AuthConfig) -> tuple[bool, bool]:
    """``(is_staff, is_superuser)`` granted by the configured claim."""
    values = oidc.claim_values(claims, auth.admin_staff_claim)
    superuser = bool(auth.admin_superuser_value) and auth.admin_superuser_value in values
    staff = superuser or (bool(auth.admin_staff_value) and auth.admin_staff_value in values)
    return staff, superuser


def sso_username(sub: str) -> str:
    username = f"sso:{sub}"
    if len(username) > 150:  # Django's username limit: keep it unique and stable
        username = "sso:" + hashlib.sha256(sub.encode()).hexdigest()
    return username


class GatewayOIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """mozilla-django-oidc's backend, configured from the gateway config and discovery."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The parent reads every endpoint from settings here; ours come from discovery, and only
        # when an SSO callback arrives (username/password logins never touch the provider).
        self.UserModel = get_user_model()

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        if request is None or not sso_enabled():
            return None
        if "code" not in request.GET or "state" not in request.GET:
            return None
        config = get_config()
        try:
            doc = discovery(config)
            self.OIDC_OP_TOKEN_ENDPOINT = doc["token_endpoint"]
            self.OIDC_OP_USER_ENDPOINT = doc.get("userinfo_endpoint")
            self.OIDC_OP_JWKS_ENDPOINT = doc["jwks_uri"]
            self.OIDC_RP_CLIENT_ID = config.auth.oidc_rp_client_id
            self.OIDC_RP_CLIENT_SECRET = config.oidc_rp_client_secret.get_secret_value()
            self.OIDC_RP_IDP_SIGN_KEY = None
            self.OIDC_RP_SIGN_ALGO = "RS256"
            return super().authenticate(request, **kwargs)
        except (SuspiciousOperation, oidc.ProviderError, requests.RequestException, KeyError) as exc:
            log.warning("admin single sign-on failed: %s", exc)
            return None

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        """Verify the ID token fully: signature (asymmetric only), issuer, audience, expiry, nonce."""
        config = get_config()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise SuspiciousOperation("the ID token is not a JWT") from None
        alg = header.get("alg")
        if alg not in oidc.ALLOWED_ALGORITHMS:
            raise SuspiciousOperation(f"ID token algorithm {alg!r} is not allowed")
        doc = oidc.fetch_json_sync(self.OIDC_OP_JWKS_ENDPOINT, config.auth)
        kid = header.get("kid")
        keys = [k for k in oidc.parse_jwks(doc) if k.compatible(alg) and (kid is None or k.kid == kid)]
        if not keys:
            raise SuspiciousOperation("no JWKS key matches the ID token")
        try:
            payload: dict[str, Any] = jwt.decode(
                token,
                key=keys[0].key,
                algorithms=[alg],
                audience=config.auth.oidc_rp_client_id,
                issuer=config.auth.oidc_issuer,
                leeway=config.auth.leeway_s,
                options={"require": ["exp", "iss", "sub", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise SuspiciousOperation(f"ID token rejected: {exc}") from None
        if self.get_settings("OIDC_USE_NONCE", True) and kwargs.get("nonce") != payload.get("nonce"):
            raise SuspiciousOperation("ID token nonce mismatch")
        return payload

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """ID token claims, completed by the userinfo endpoint when the provider has one."""
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            userinfo = super().get_userinfo(access_token, id_token, payload)
            if isinstance(userinfo, dict) and userinfo.get("sub", payload.get("sub")) == payload.get("sub"):
                claims.update(userinfo)
        return claims

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        staff, _ = admin_flags(claims, get_config().auth)
        return bool(claims.get("sub")) and staff

    def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet[Any]:
        return self.UserModel.objects.filter(username=sso_username(str(claims["sub"])))

    def create_user(self, claims: dict[str, Any]) -> Any:
        user = self.UserModel(username=sso_username(str(claims["sub"])))
        user.set_unusable_password()
        return self.update_user(user, claims)

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        user.is_staff, user.is_superuser = admin_flags(claims, get_config().auth)
        user.email = str(claims.get("email") or "")
        user.first_name = str(claims.get("given_name") or claims.get("name") or "")[:150]
        user.last_name = str(claims.get("family_name") or "")[:150]
        user.save()
        return user


class SsoAuthenticateView(OIDCAuthenticationRequestView):  # type: ignore[misc]
    """Starts the authorization-code flow at the provider's ``authorization_endpoint``."""

    def __init__(self, **kwargs: Any) -> None:
        View.__init__(self, **kwargs)

    @staticmethod
    def get_settings(attr: str, *args: Any) -> Any:
        if attr == "OIDC_RP_SCOPES":
            return get_config().auth.admin_sso_scopes
        return import_from_settings(attr, *args)

    def get(self, request: HttpRequest) -> HttpResponse:
        config = get_config()
        if not sso_enabled(config):
            raise Http404("single sign-on is not configured")
        try:
            doc = discovery(config)
            self.OIDC_OP_AUTH_ENDPOINT = doc["authorization_endpoint"]
        except (oidc.ProviderError, KeyError) as exc:
            log.warning("admin single sign-on unavailable: %s", exc)
            return errors.django_response(  # type: ignore[no-any-return]
                errors.ServiceUnavailable(
                    "The identity provider is unavailable.", code="identity_provider_unavailable"
                ),
                request,
            )
        self.OIDC_RP_CLIENT_ID = config.auth.oidc_rp_client_id
        return super().get(request)  # type: ignore[no-any-return]
