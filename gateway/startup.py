"""Checks run once before the server accepts connections (start-up refusals live here)."""

from __future__ import annotations

import logging

from gateway.config import Config

log = logging.getLogger("gateway.startup")


def run_checks(config: Config) -> None:
    """Raise ``ConfigError`` (or an auth start-up error) when the gateway must not serve."""
    if config.llm_api_base:
        log.info("inference: HTTP upstream at %s (%s wire API)", config.upstream_base, config.upstream_api)
    elif config.broker_enabled:
        log.info("inference: Celery workers via the broker at REDIS_URL")
    else:
        from inference_app.upstream import embedded_engine_available

        if embedded_engine_available():
            log.info("inference: embedded vLLM engine in this process (starts on first use)")
        else:
            log.warning("inference: no LLM_API_BASE, no broker and no vLLM; inference routes answer 503")
    log.info(
        "database: %s; channel layer and Celery: %s",
        "PostgreSQL" if config.database_url.startswith("postgres") else "SQLite (embedded)",
        "Redis" if config.broker_enabled else "in-memory / in-process",
    )
