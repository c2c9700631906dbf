"""Settings for the ASGI-server benchmark: the gateway's settings plus benchmark routes."""

from gateway.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls_bench"
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
