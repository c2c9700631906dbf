"""Checks run once before the server accepts connections (start-up refusals live here)."""

from __future__ import annotations

import logging

from gateway.core.config import Config, ConfigError

log = logging.getLogger("gateway.startup")


def run_checks(config: Config) -> None:
    """Raise ``ConfigError`` when the gateway must not serve (``manage.py serve`` prints it)."""
    entries = config.upstream_entries
    if len(entries) == 1:
        log.info("inference: HTTP upstream at %s (%s wire API)", config.upstream_base, config.upstream_api)
    elif entries:
        log.info(
            "inference: %d HTTP upstreams with failover (%s; %s wire API)",
            len(entries),
            ", ".join(entry.base for entry in entries),
            config.upstream_api,
        )
    elif config.broker_enabled:
        log.info("inference: Celery workers via the broker at REDIS_URL")
    else:
        from inference_app.upstream.http import embedded_engine_available

        if embedded_engine_available():
            log.info("inference: embedded vLLM engine in this process (starts on first use)")
        else:
            log.warning("inference: no LLM_API_BASE, no broker and no vLLM; inference routes answer 503")
    log.info(
        "database: %s; channel layer and Celery: %s",
        "PostgreSQL" if config.database_url.startswith("postgres") else "SQLite (embedded)",
        "Redis" if config.broker_enabled else "in-memory / in-process",
    )
    check_auth(config)
    from gateway.core import tracing

    tracing.check(config)


def _active_api_keys() -> int | None:
    """How many named API keys are active, or ``None`` when the table cannot be read (not migrated)."""
    from django.db import DatabaseError

    from gateway.core.models import ApiKey

    try:
        return ApiKey.objects.filter(is_active=True).count()
    except DatabaseError:
        return None


def check_auth(config: Config) -> None:
    """Fetch the identity provider's discovery document and JWKS (OIDC), and log the auth mode."""
    if config.oidc_enabled:
        from gateway.core.auth import oidc

        try:
            provider = oidc.startup_check(config)
        except oidc.ProviderError as exc:
            raise ConfigError(f"OIDC_ISSUER: identity provider check failed: {exc}") from None
        log.info(
            "auth: OIDC bearer tokens required on /v1 (issuer %s, audience %s, %d signing keys)",
            config.auth.oidc_issuer,
            config.auth.oidc_audience,
            len(provider.keys),
        )
        if config.auth.oidc_rp_client_id:
            log.info("auth: admin single sign-on through the same issuer (/oidc/authenticate/)")
        return
    count = _active_api_keys()
    if count:
        log.info("auth: API keys required on /v1 (%d active named keys)", count)
    elif config.auth.require_api_key:
        log.warning(
            "auth: GATEWAY_REQUIRE_API_KEY is set but no named key exists yet: every /v1 request "
            "is refused until one is created (manage.py apikey create NAME)"
        )
    else:
        log.warning(
            "auth: OPEN gateway: no OIDC and no API keys, every request belongs to the default "
            "principal (creating a named API key closes it)%s",
            "; stored state needs OPENAI_API_KEY as bearer token"
            if config.openai_api_key.get_secret_value()
            else "",
        )
