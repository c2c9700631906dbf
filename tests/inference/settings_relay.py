"""Gateway settings plus the relay URLconf, for gateway subprocesses in the inference tests."""

from gateway.settings import *  # noqa: F403

ROOT_URLCONF = "tests.inference.urls_relay"
