"""Shared fixtures: the live gateway, config overrides, real Redis."""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.core import config as config_module
from tests.servers import LiveServer

REDIS_URL = "redis://127.0.0.1:6379/15"

# Tests marked `slow` (real vLLM, real CLIs that npm installs on first use) get this time limit
# unless they carry their own `timeout` mark; every other test has pytest.ini's `timeout`.
SLOW_TIMEOUT_S = 1200

# The test now running, and the processes the test code started (see `_started_processes`).
_running: dict[str, Any] = {"item": None, "spawned": []}
TESTS = str(Path(__file__).resolve().parent)
STDLIB = sysconfig.get_paths()["stdlib"]


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Records a process that code under tests/ starts; one the product starts (the code sandbox's
    bubblewrap) is the product at work, not a test's server or CLI."""
    if event != "subprocess.Popen" or _running["item"] is None:
        return
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(STDLIB):
        frame = frame.f_back  # subprocess and asyncio themselves: the caller is the next frame
    if frame is not None and frame.f_code.co_filename.startswith(TESTS):
        _running["spawned"].append(args[1])


sys.addaudithook(_audit)


def _loopback_trust_file() -> str:
    """A trust file of one certificate. Every HTTP client a test makes (httpx, the OpenAI and Anthropic
    SDKs) loads its CA bundle when it is made, ~50 ms of CPU for a bundle of ~150 certificates; the
    tests speak plain HTTP to loopback servers only, so the bundle is never used."""
    import certifi

    pem = Path(certifi.where()).read_text()
    end = "-----END CERTIFICATE-----\n"
    path = Path(tempfile.gettempdir()) / "gateway-tests-one-ca.pem"
    if not path.exists():
        scratch = path.with_suffix(f".{os.getpid()}")
        scratch.write_text(pem[: pem.index(end) + len(end)])
        os.replace(scratch, path)  # xdist workers race to write the same bytes
    return str(path)


os.environ["SSL_CERT_FILE"] = _loopback_trust_file()


def _celery_keys_per_xdist_worker() -> None:
    """Under pytest-xdist, every Celery app a test configures prefixes its Redis keys (queues,
    bindings) with the xdist worker's id: the in-thread Celery workers of tests that run side by side
    then never take each other's tasks from the shared ``tools`` queue."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    import gateway.celery
    from inference_app.upstream import celery_config

    original = celery_config.configure

    def configure(app: Any, config: config_module.Config) -> Any:
        original(app, config)
        options = {**app.conf.broker_transport_options, "global_keyprefix": f"{worker}:"}
        app.conf.broker_transport_options = options
        return app

    celery_config.configure = configure
    gateway.celery.configure = configure  # type: ignore[attr-defined]


_celery_keys_per_xdist_worker()

# Tables a transactional test's flush leaves alone: what the migrations' post_migrate handlers wrote
# (content types and permissions), which no test changes. Re-creating them after every flush, as
# Django does, cost ~50 ms per transactional test (most of the quick tier's live-gateway tests).
_KEPT_TABLES = frozenset({"django_content_type", "auth_permission"})


def _flush_keeping_migration_data() -> None:
    from django.core.management.commands import flush

    def sql_flush(
        style: Any, connection: Any, reset_sequences: bool = True, allow_cascade: bool = False
    ) -> Any:
        tables = [
            t
            for t in connection.introspection.django_table_names(only_existing=True, include_views=False)
            if t not in _KEPT_TABLES
        ]
        return connection.ops.sql_flush(
            style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )

    flush.sql_flush = sql_flush
    flush.emit_post_migrate_signal = lambda *args, **kwargs: None


_flush_keeping_migration_data()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    _running.update(item=item, spawned=[])  # before any fixture, module-scoped ones included
    return (yield)


@pytest.fixture(autouse=True)
def _started_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """`make test-quick` runs the tests marked neither `process` nor `slow`: a test that starts
    another process (a gateway, a Celery worker, a PostgreSQL cluster, a CLI, a Python probe)
    must say so with the `process` mark, or the quick tier would start it."""
    marked = any(request.node.get_closest_marker(name) for name in ("process", "slow"))
    yield
    spawned, _running["spawned"] = _running["spawned"], []
    _running["item"] = None
    if spawned and not marked:
        pytest.fail(f"started a process without the `process` mark: {spawned[0]!r}", pytrace=False)


@pytest.fixture(autouse=True)
def _no_drain_left() -> Iterator[None]:
    """A server stopped in this process (its lifespan's end begins the drain) leaves the process's one
    drain begun: the next test's servers would refuse every request with 503."""
    yield
    from gateway.core.lifecycle import drain

    drain.reset()


@pytest.fixture(autouse=True)
def _fresh_auth_state(request: pytest.FixtureRequest) -> Iterator[None]:
    """No JWKS, discovery document or API-key snapshot leaks from one test into the next.

    Tests without database access run as if no named API key exists (the open gateway), so the
    auth layer never needs the table there.
    """
    from gateway.core.auth import apikeys, reset_caches

    reset_caches()
    uses_db = request.node.get_closest_marker("django_db") is not None or any(
        name in request.fixturenames for name in ("db", "transactional_db", "django_db_reset_sequences")
    )
    if not uses_db:
        apikeys.pin_no_keys()
    yield
    reset_caches()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's test databases; before they are dropped, the stored responses' writer gives
    back the connection its thread keeps (``responses_app.storage.group_commit.GroupWriter``), which would hold them."""
    yield
    from responses_app.storage.writes import final_writes

    final_writes.release()


@pytest.fixture
def gateway_config() -> Iterator[Callable[..., config_module.Config]]:
    """Override the process config for one test: ``gateway_config(llm_api_base=…, server__…=…)``."""
    original = config_module.get_config()

    def apply(**changes: Any) -> config_module.Config:
        new = config_module.replace(config_module.get_config(), **changes)  # cumulative
        config_module.set_config(new)
        return new

    yield apply
    config_module.set_config(original)


def serve_gateway() -> Iterator[LiveServer]:
    """The real ASGI application served by uvicorn on a loopback port, as ``manage.py serve`` runs it."""
    from gateway.asgi import application
    from inference_app.upstream.http import close_upstreams

    server = LiveServer(application, on_stop=close_upstreams).start()
    yield server
    server.stop()
    # The usage ledger's rows of this test go to its database before it is flushed, not into a
    # later test's (the writer would write them within a second).
    from usage_app import writer

    if writer.writer.pending:
        writer.flush_now()


@pytest.fixture
def live_gateway(transactional_db: None) -> Iterator[LiveServer]:
    """The gateway as ``manage.py serve`` runs it, on a loopback port (test database attached)."""
    yield from serve_gateway()


@pytest.fixture
def upstream() -> Iterator[Any]:
    """A scripted upstream speaking vLLM's formats on a loopback port."""
    from tests.upstream import ScriptedUpstream

    server = ScriptedUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def provider() -> Iterator[Any]:
    """A SearXNG-style search provider on a loopback port (tests/tools/tools_servers.py)."""
    from tests.tools.tools_servers import SearchProvider

    server = SearchProvider().start()
    yield server
    server.stop()


@pytest.fixture
def idp() -> Iterator[Any]:
    """A real OpenID provider (discovery, JWKS, token endpoints) on a loopback port: tests/oidc_provider.py."""
    from tests.oidc_provider import IdentityProvider

    provider = IdentityProvider().start()
    yield provider
    provider.stop()


@pytest.fixture
def oidc(
    idp: Any, gateway_config: Callable[..., config_module.Config]
) -> Callable[..., config_module.Config]:
    """Switch the gateway to OIDC mode against ``idp``; call it again with more ``auth__…`` changes."""
    from tests.oidc_provider import AUDIENCE

    def apply(**changes: Any) -> config_module.Config:
        return gateway_config(auth__oidc_issuer=idp.issuer, auth__oidc_audience=AUDIENCE, **changes)

    apply()
    return apply
