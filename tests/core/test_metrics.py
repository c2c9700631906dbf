"""``gateway.core.metrics`` with several server processes (``PROMETHEUS_MULTIPROC_DIR``): every process's
updates add up, and a forked child records into files of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
