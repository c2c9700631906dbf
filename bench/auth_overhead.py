"""Per-request cost of inbound authentication (``gateway.core.auth.authenticate``), in-process.

Modes: open gateway, a named API key, and OIDC bearer tokens (RS256 and ES256) verified against a
real loopback provider (tests/oidc_provider.py) with a warm JWKS cache. Prints microseconds per
call. Run: ``.venv/bin/python bench/auth_overhead.py`` (SQLite; set DATABASE_URL for PostgreSQL).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
os.environ.setdefault("GATEWAY_SERVER_DATA_DIR", "var/bench")

import django

django.setup()

from django.core.management import call_command  # noqa: E402

from gateway.core import config as config_module  # noqa: E402
from gateway.core.auth import apikeys, authenticate, reset_caches  # noqa: E402
from gateway.core.models import ApiKey  # noqa: E402
from tests.oidc_provider import AUDIENCE, IdentityProvider  # noqa: E402

N = 5000


async def measure(label: str, headers: dict[str, str]) -> None:
    await authenticate("/v1/chat/completions", headers)  # warm caches
    started = time.perf_counter()
    for _ in range(N):
        await authenticate("/v1/chat/completions", headers)
    per_call = (time.perf_counter() - started) / N * 1e6
    print(f"{label:<28} {per_call:8.1f} µs/request")


async def main() -> None:
    base = config_module.get_config()
    await measure("open gateway", {})

    _, secret = await asyncio.to_thread(apikeys.apikey_create, name=f"bench-{time.time_ns()}")
    await measure("named API key", {"authorization": f"Bearer {secret}"})
    await asyncio.to_thread(lambda: ApiKey.objects.filter(name__startswith="bench-").delete())
    reset_caches()

    idp = IdentityProvider().start()
    try:
        config_module.set_config(
            config_module.replace(base, auth__oidc_issuer=idp.issuer, auth__oidc_audience=AUDIENCE)
        )
        await measure("OIDC RS256 (2048-bit)", {"authorization": f"Bearer {idp.mint(kid='rsa-1')}"})
        await measure("OIDC ES256 (P-256)", {"authorization": f"Bearer {idp.mint(kid='ec-1')}"})
    finally:
        idp.stop()
        config_module.set_config(base)


if __name__ == "__main__":
    call_command("migrate", verbosity=0)
    asyncio.run(main())
