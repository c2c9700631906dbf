"""Metrics and token-quota charges for each model call (:func:`count`, called by the ledger for every
entry, recorded or only observed). Never raises to the caller."""

from __future__ import annotations

import logging

from usage_app import metrics, quotas
from usage_app.ledger import UsageEntry

log = logging.getLogger("gateway.usage")


def count(entry: UsageEntry) -> None:
    try:
        metrics.observe(entry)
    except Exception:
        log.exception("usage metrics: a model call could not be counted")
    quotas.charge(entry)  # never raises; the store is written by a task of its own
