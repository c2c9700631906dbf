"""The serving process's garbage-collector settings (gateway/asgi.py, docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.servers import ROOT

pytestmark = pytest.mark.process


def test_the_asgi_app_freezes_start_up_objects_and_raises_only_the_young_threshold() -> None:
    """Checked in a fresh interpreter: this test process may have imported the app long ago."""
    probe = (
        "import gc, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'gateway.settings');"
        "import gateway.asgi as a;"
        "print(gc.get_freeze_count() > 10000, gc.get_threshold()[0] == a.GC_GEN0_THRESHOLD > 700,"
        " gc.get_threshold()[2] <= 10)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    # The oldest generation is collected as often as CPython's default (a cycle left by a request
    # must not wait for hundreds of thousands of requests: gateway/asgi.py).
    assert out.stdout.split() == ["True", "True", "True"], out.stderr
