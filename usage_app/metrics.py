"""Prometheus metrics of model calls: ``gateway_model_requests_total{route,model,status}``,
``gateway_tokens_total{model,kind}`` (``kind``: input, output, cached), and the streamed rounds'
``gateway_time_to_first_token_seconds{model}`` and ``gateway_time_per_output_token_seconds{model}``,
on the kernel's registry (:mod:`gateway.core.metrics`, multi-process aware).

Model labels are bounded: a model the upstream does not list (``GET /v1/models``, which the
pass-through catalog reports through :func:`models_listed`) is counted as ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

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

# vLLM's own buckets for the same two measures (vllm/v1/metrics/loggers.py), a few short ones added.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 10.0, 20.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN = Histogram(
    "gateway_time_to_first_token_seconds",
    "From sending a streamed model round upstream to its first output delta, by model.",
    ["model"],
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "gateway_time_per_output_token_seconds",
    "A streamed model round's time after its first output delta, per further output token, by model.",
    ["model"],
    buckets=TPOT_BUCKETS,
    registry=REGISTRY,
)

# The model ids the upstream lists: replaced whenever a model list is read.
_known: frozenset[str] = frozenset()
# Cached children per label tuple (labels() locks and checks on every call); bounded as the labels are.
_requests: dict[tuple[str, str, int], Counter] = {}
_tokens: dict[tuple[str, str], Counter] = {}
_stream_children: dict[str, tuple[Histogram, Histogram]] = {}


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


def observe_stream(model: str, first_token_s: float, after_first_s: float, output_tokens: int | None) -> None:
    """One streamed model round: its time to first token, and, with two output tokens or more
    reported, its time per output token after the first."""
    label = model_label(model)
    children = _stream_children.get(label)
    if children is None:
        children = _stream_children[label] = (
            TIME_TO_FIRST_TOKEN.labels(label),
            TIME_PER_OUTPUT_TOKEN.labels(label),
        )
    ttft, tpot = children
    ttft.observe(first_token_s)
    if output_tokens is not None and output_tokens > 1:
        tpot.observe(after_first_s / (output_tokens - 1))
