"""prometheus_client internals: one request's counter and histogram update without ``labels()``,
and without the multi-process value's lock and process check.

Going through ``labels()`` takes a lock and validates the labels on every call, and
``inc()``/``observe()`` check the metric each time and scan the buckets in Python; a pass-through
request is cheap enough for that to show (``docs/performance.md``). :func:`request_observer` hands
back, per (route, method, status), a function that updates the values behind those children
directly, and :func:`adder` one that adds to a value (the in-flight gauge's).

With several server processes (``PROMETHEUS_MULTIPROC_DIR``) each value is a ``MmapedValue``, whose
``inc`` takes a global lock and calls ``os.getpid()`` (to notice a fork) before it writes the new
value to the process's memory-mapped file: 0.8 µs an update here, five updates a request, 9 % of a
pass-through request's CPU with two processes (``docs/performance.md``). Here such a value is
updated as its ``inc`` does, without the lock and the check: its ``_value`` plus the amount, written
with its file's ``write_value(key, value, 0.0)`` (0.27 µs). The lock guards against threads, and
the metrics updated this way are only updated on the event loop's thread; a fork is told by
``os.register_at_fork`` instead (:func:`forget_at_fork`): the caller drops its updaters in the
child, and a new one first goes through the public ``inc(0)``, which moves the value to the
child's own file.

Relied on (prometheus_client ``VERSION``): a ``Counter`` child's ``_value``; a ``Histogram``
child's ``_sum``, ``_buckets`` and ``_upper_bounds``; each of those values' ``inc(amount)``; a
``MmapedValue``'s ``_multiprocess``, ``_value``, ``_key`` and ``_file``, and ``MmapedDict.write_value``.
:func:`usable` checks them on the metrics about to be updated (the ``MmapedValue`` ones in a
process with several, where their values are of that class); when one is gone (or the version
differs) the observer falls back to the public ``labels().inc()`` and ``labels().observe()``, and
:func:`adder` to the value's ``inc``.
``tests/gateway/test_compat.py`` fails when one moves.
"""

from __future__ import annotations

import importlib.metadata
import os
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

VERSION = "0.26.0"

Observer = Callable[[float], None]


def missing(counter: Any = None, histogram: Any = None) -> list[str]:
    """The internals relied on that the installed prometheus_client lacks (its version too), probed
    on a counter child and a histogram child (``counter``/``histogram``: these instead; the
    contract test's probes are made here, in a registry of their own)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    registry = CollectorRegistry()
    if counter is None:
        counter = Counter("compat_probe", "probe", ["a"], registry=registry).labels("x")
    if histogram is None:
        histogram = Histogram("compat_probe_seconds", "probe", ["a"], registry=registry).labels("x")
    return _gone(counter, histogram)


def _gone(counter: Any, histogram: Any = None) -> list[str]:
    """:func:`missing` on ``counter`` (a counter child or a metric without labels: what holds a
    ``_value``) and on ``histogram`` when given."""
    installed = importlib.metadata.version("prometheus_client")
    gone = [] if installed == VERSION else [f"prometheus_client=={VERSION} (installed: {installed})"]
    if not callable(getattr(getattr(counter, "_value", None), "inc", None)):
        gone.append("Counter._value")
    if histogram is not None:
        for name in ("sum", "buckets", "upper_bounds"):
            if not hasattr(histogram, f"_{name}"):
                gone.append(f"Histogram._{name}")
    value = getattr(counter, "_value", None)
    if getattr(value, "_multiprocess", False):  # several server processes: what _add() uses
        for name in ("_value", "_key", "_file"):
            if not hasattr(value, name):
                gone.append(f"MmapedValue.{name}")
        if not callable(getattr(getattr(value, "_file", None), "write_value", None)):
            gone.append("MmapedDict.write_value")
    return gone


# False: the public API everywhere (a test sets it); None: probe the metrics about to be used.
_usable: bool | None = None


def usable(counter: Any, histogram: Any = None) -> bool:
    """Whether the internals are there, probed on the metrics about to be updated (``counter``, and
    ``histogram`` when given), not on probes of our own: with several server processes every value
    made lands in the process's metric files, and a probe's would show in ``/metrics``. Called once
    per updater made (a label set, the in-flight gauge), not per request."""
    if _usable is not None:
        return _usable
    return not _gone(counter, histogram)


def request_observer(counter: Any, histogram: Any, route: str, method: str, status: str) -> Observer:
    """A function counting one request in ``counter`` and its seconds in ``histogram``."""
    count_child = counter.labels(route, method, status)
    latency = histogram.labels(route, method)
    if not usable(count_child, latency):

        def observe_public(seconds: float) -> None:
            count_child.inc()
            latency.observe(seconds)

        return observe_public
    count = _add(count_child._value)
    total = _add(latency._sum)
    buckets = [_add(bucket) for bucket in latency._buckets]
    bounds = latency._upper_bounds

    def observe(seconds: float) -> None:
        count(1)
        total(seconds)
        buckets[bisect_left(bounds, seconds)](1)  # the first bucket whose bound is >= seconds

    return observe


def adder(metric: Any) -> Callable[[float], None]:
    """A function adding its argument to ``metric``'s value (a metric without labels: a gauge),
    as ``metric.inc(amount)`` does."""
    if not usable(metric):
        return metric.inc  # type: ignore[no-any-return]
    return _add(metric._value)


def _add(value: Any) -> Callable[[float], None]:
    """``value.inc``, or for a multi-process value the same update without its lock and its
    process check (module docstring)."""
    if not getattr(value, "_multiprocess", False):
        return value.inc  # type: ignore[no-any-return]
    value.inc(0)  # the public path first: after a fork, it moves the value to this process's file
    write, key = value._file.write_value, value._key

    def add(amount: float) -> None:
        value._value += amount
        write(key, value._value, 0.0)

    return add


def forget_at_fork(forget: Callable[[], None]) -> None:
    """Call ``forget`` in the child after a fork: it drops the updaters made before it, which write
    to the parent's files."""
    os.register_at_fork(after_in_child=forget)
