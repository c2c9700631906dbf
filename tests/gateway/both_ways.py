"""``live_gateway`` served with the relay on and off, for the pass-through test modules.

A module that imports :func:`live_gateway_both_ways` from here (a fixture named ``live_gateway``)
runs every test that uses it twice: with the relay below ASGI (``gateway.relay``, what ``manage.py
serve`` runs) and with it switched off (``[server] direct_relay = false``: the ASGI fast path,
``gateway.fastpath``, what daphne and other servers run too).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import serve_gateway
from tests.servers import LiveServer


@pytest.fixture(params=["relay-on", "relay-off"], name="live_gateway")
def live_gateway_both_ways(request: pytest.FixtureRequest, transactional_db: None) -> Iterator[LiveServer]:
    yield from serve_gateway(request.param)
