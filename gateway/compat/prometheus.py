"""prometheus_client internals: one request's counter and histogram update without ``labels()``.

Going through ``labels()`` takes a lock and validates the labels on every call, and
``inc()``/``observe()`` check the metric each time and scan the buckets in Python; a pass-through
request is cheap enough for that to show (``docs/performance.md``). :func:`request_observer` hands
back, per (route, method, status), a function that updates the values behind those children
directly.

Relied on (prometheus_client ``VERSION``): a ``Counter`` child's ``_value``; a ``Histogram``
child's ``_sum``, ``_buckets`` and ``_upper_bounds``; each of those values' ``inc(amount)``.
:func:`missing` checks them; when one is gone (or the version differs) the observer falls back to
the public ``labels().inc()`` and ``labels().observe()``. ``tests/gateway/test_compat.py`` fails when
one moves.
"""

from __future__ import annotations

import importlib.metadata
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

VERSION = "0.26.0"

Observer = Callable[[float], None]


def missing(counter: Any = None, histogram: Any = None) -> list[str]:
    """The internals relied on that the installed prometheus_client lacks (its version too), probed
    on a counter child and a histogram child (``counter``/``histogram``: these instead)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    installed = importlib.metadata.version("prometheus_client")
    gone = [] if installed == VERSION else [f"prometheus_client=={VERSION} (installed: {installed})"]
    registry = CollectorRegistry()
    if counter is None:
        counter = Counter("compat_probe", "probe", ["a"], registry=registry).labels("x")
    if histogram is None:
        histogram = Histogram("compat_probe_seconds", "probe", ["a"], registry=registry).labels("x")
    if not callable(getattr(getattr(counter, "_value", None), "inc", None)):
        gone.append("Counter._value")
    for name in ("sum", "buckets", "upper_bounds"):
        if not hasattr(histogram, f"_{name}"):
            gone.append(f"Histogram._{name}")
    return gone


_usable: bool | None = None


def usable() -> bool:
    global _usable
    if _usable is None:
        _usable = not missing()
    return _usable


def request_observer(counter: Any, histogram: Any, route: str, method: str, status: str) -> Observer:
    """A function counting one request in ``counter`` and its seconds in ``histogram``."""
    count_child = counter.labels(route, method, status)
    latency = histogram.labels(route, method)
    if not usable():

        def observe_public(seconds: float) -> None:
            count_child.inc()
            latency.observe(seconds)

        return observe_public
    count, total, buckets, bounds = count_child._value, latency._sum, latency._buckets, latency._upper_bounds

    def observe(seconds: float) -> None:
        count.inc(1)
        total.inc(seconds)
        buckets[bisect_left(bounds, seconds)].inc(1)  # the first bucket whose bound is >= seconds

    return observe
