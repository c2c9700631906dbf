"""``live_gateway`` served both ways, for the pass-through test modules.

A module that imports :func:`live_gateway_both_ways` from here (a fixture named ``live_gateway``)
runs every test that uses it three ways: relayed by the server protocol directly (``gateway.direct``,
what ``manage.py serve`` runs) on callbacks where it can, the same with every request in a task (the
path taken when something must be awaited first), and through the ASGI path (``gateway.fastpath``,
what daphne and other servers run).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import serve_gateway
from tests.servers import LiveServer


@pytest.fixture(params=["direct", "direct-task", "asgi"], name="live_gateway")
def live_gateway_both_ways(request: pytest.FixtureRequest, transactional_db: None) -> Iterator[LiveServer]:
    yield from serve_gateway(request.param)
