"""Prometheus counters of model calls: ``gateway_model_requests_total{route,model,status}`` and
``gateway_tokens_total{model,kind}`` (``kind``: input, output, cached), on the kernel's registry
(:mod:`gateway.core.metrics`, multi-process aware).

Model labels are bounded: a model the upstream does not list (``GET /v1/models``, which the
pass-through catalog reports through :func:`models_listed`) is counted as ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import Counter

from gateway.core.metrics import REGISTRY

if TYPE_CHECKING:
    from usage_app.ledger import UsageEntry

OTHER = "other"

MODEL_REQUESTS = Counter(
    "gateway_model_requests_total",
    "Model calls that reached an upstream, by public route, model and the upstream's status.",
    ["route", "model", "status"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "gateway_tokens_total",
    "Tokens the upstream reported, by model and kind (input, output, cached).",
    ["model", "kind"],
    registry=REGISTRY,
)

# The model ids the upstream lists: replaced whenever a model list is read.
_known: frozenset[str] = frozenset()
# Cached children per label tuple (labels() locks and checks on every call); bounded as the labels are.
_requests: dict[tuple[str, str, int], Counter] = {}
_tokens: dict[tuple[str, str], Counter] = {}


def models_listed(ids: Iterable[str]) -> None:
    """The upstream's model list was read: these ids get their own label from now on."""
    global _known
    _known = frozenset(ids)


def model_label(model: str) -> str:
    return model if model in _known else OTHER


def observe(entry: UsageEntry) -> None:
    """Count one model call and the tokens it used."""
    model = model_label(entry.model)
    key = (entry.route, model, entry.status)
    requests = _requests.get(key)
    if requests is None:
        requests = _requests[key] = MODEL_REQUESTS.labels(entry.route, model, str(entry.status))
    requests.inc()
    for kind, value in (
        ("input", entry.input_tokens),
        ("output", entry.output_tokens),
        ("cached", entry.cached_tokens),
    ):
        if value:
            tokens = _tokens.get((model, kind))
            if tokens is None:
                tokens = _tokens[(model, kind)] = TOKENS.labels(model, kind)
            tokens.inc(value)
