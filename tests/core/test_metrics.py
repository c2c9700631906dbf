"""``gateway.core.metrics``: ``observe_request`` records what the library's own metrics would, and with
several server processes (``PROMETHEUS_MULTIPROC_DIR``) every process's updates add up, a forked
child's included."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import GatewayProcess

ROOT = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter: prometheus_client picks its value class (one process or several) at
# import, from PROMETHEUS_MULTIPROC_DIR.
_MULTIPROCESS_SCRIPT = """
import os, sys
from prometheus_client import CollectorRegistry, multiprocess
from gateway.core.metrics import exposition, in_flight, observe_request


def totals():
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    labels = {"route": "/r", "method": "POST"}
    return (
        registry.get_sample_value("gateway_http_requests_total", {**labels, "status": "200"}),
        registry.get_sample_value("gateway_http_request_duration_seconds_sum", labels),
        registry.get_sample_value("gateway_http_request_duration_seconds_bucket", {**labels, "le": "0.005"}),
        registry.get_sample_value("gateway_http_request_duration_seconds_bucket", {**labels, "le": "+Inf"}),
        registry.get_sample_value("gateway_http_requests_in_flight", {}),
    )


for seconds in (0.002, 0.5, 0.004):
    observe_request("/r", "POST", 200, seconds)
in_flight(1)
in_flight(1)
in_flight(-1)
print(totals())
child = os.fork()
if child == 0:  # the child's updates go to files of its own, never to the parent's
    observe_request("/r", "POST", 200, 0.001)
    in_flight(1)
    os._exit(0)
os.waitpid(child, 0)
observe_request("/r", "POST", 200, 2.0)
print(totals())
assert b"gateway_http_requests_total" in exposition()
"""


@pytest.mark.process
def test_multiprocess_metrics_add_up_across_a_fork(tmp_path: Path) -> None:
    """The totals of the requests counted, the in-flight gauge's live sum, and a forked child's
    updates (children cached before the fork) in files of its own, the parent's not overwritten."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _MULTIPROCESS_SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == repr((3.0, 0.506, 2.0, 3.0, 1.0))
    # The child's counts and its in-flight request are in its own files (prometheus_client sums
    # them until the process is marked dead); the parent's count after the fork lands on its own 3.
    assert second == repr((5.0, 2.507, 3.0, 5.0, 2.0))


def test_observe_request_counts_as_inc_and_observe_do() -> None:
    """``observe_request`` counts the request and records its duration in the gateway's metrics,
    with its labels: the samples a histogram with the same buckets records."""
    from prometheus_client import CollectorRegistry, Histogram

    from gateway.core.metrics import LATENCY_BUCKETS, REGISTRY, observe_request

    durations = [0.0004, 0.001, 0.0011, 0.07, 0.25, 299.0, 301.0]
    reference = Histogram("ref", "", buckets=LATENCY_BUCKETS, registry=CollectorRegistry())
    for seconds in durations:
        observe_request("/test/observe", "PUT", 207, seconds)
        reference.observe(seconds)

    def samples(metric_source: Any, name: str, **labels: str) -> dict[str, float]:
        found = {}
        for metric in metric_source.collect():
            for sample in metric.samples:
                if sample.name.endswith("_created") or not sample.name.startswith(name):
                    continue
                if all(sample.labels.get(k) == v for k, v in labels.items()):
                    found[sample.name.removeprefix(name) + sample.labels.get("le", "")] = sample.value
        return found

    ours = samples(REGISTRY, "gateway_http_request_duration_seconds", route="/test/observe", method="PUT")
    assert ours == samples(reference, "ref")
    assert ours["_bucket0.001"] == 2 and ours["_count"] == len(durations)
    counted = samples(REGISTRY, "gateway_http_requests", route="/test/observe", status="207")
    assert counted == {"_total": len(durations)}


@pytest.mark.process
def test_metrics_add_up_every_server_process(upstream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With `[server] workers = 2`, /metrics counts the requests every worker answered."""
    gw = GatewayProcess(
        {
            "LLM_API_BASE": upstream.url,
            "GATEWAY_SERVER_DATA_DIR": str(tmp_path),
            "GATEWAY_SERVER_WORKERS": "2",
        }
    )
    try:
        gw.wait()
        for _ in range(50):  # both workers answering: /ready needs no upstream work here
            if httpx.get(f"{gw.url}/health").status_code == 200:
                break
            time.sleep(0.1)

        async def hammer() -> None:
            async def one_connection() -> None:
                async with httpx.AsyncClient() as client:  # its own connection, so workers share them
                    for _ in range(5):
                        assert (await client.get(f"{gw.url}/v1/nope")).status_code == 404

            await asyncio.gather(*(one_connection() for _ in range(8)))

        asyncio.run(hammer())
        text = httpx.get(f"{gw.url}/metrics").text
    finally:
        gw.stop()
    counts = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("gateway_http_requests_total{") and 'status="404"' in line
    ]
    assert sum(counts) == 40, text
    # Read through prometheus_client's multi-process collector (every worker's files), not from
    # the one process that answered the scrape: that collector writes no `_created` samples.
    assert "gateway_http_requests_created" not in text
    # The prometheus internals were probed on the gateway's own metrics, not on probes of their own
    # (which would land in every process's files).
    assert "compat_probe" not in text, text
    # The live sum over both processes: the scrape itself, every other request's begin and end
    # written by the process that served it.
    [in_flight] = [line for line in text.splitlines() if line.startswith("gateway_http_requests_in_flight ")]
    assert float(in_flight.rsplit(" ", 1)[1]) == 1.0, text
