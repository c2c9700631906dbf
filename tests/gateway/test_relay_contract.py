"""The contract of ``gateway.relay`` with uvicorn's internals, and the start-up guard built on it.

``gateway.relay``'s docstring lists every internal it relies on (``RELIED_ON``) and the pinned
versions; these tests fail when one of them moves, and show that ``manage.py serve`` then falls back
to stock uvicorn with one warning, and that ``[server] direct_relay`` switches the relay off.
"""

from __future__ import annotations

import ast
import inspect
import logging
from pathlib import Path
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from gateway import relay
from gateway.relay import RELIED_ON, missing_internals, protocols
from gateway.relay.protocol import (
    DrainingHttpProtocol,
    DrainingServerProtocol,
    DrainingWebSocketProtocol,
    GatewayHttpProtocol,
    GatewayServerProtocol,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_uvicorn_internals_relied_on_are_there() -> None:
    assert missing_internals() == []


def test_every_internal_relied_on_is_in_the_docstring() -> None:
    doc = relay.__doc__ or ""
    for _, name, callables, attributes in RELIED_ON:
        assert f"``{name}" in doc or name in doc, name
        for member in [*callables, *(a for names in attributes.values() for a in names)]:
            assert f"``{member}``" in doc, member
    assert relay.UVICORN_VERSION in doc and relay.HTTPTOOLS_VERSION in doc


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        (HttpToolsProtocol, "_start_asgi_task"),
        (HttpToolsProtocol, "on_response_complete"),
        (HttpToolsProtocol, "send_400_response"),
        (RequestResponseCycle, "run_asgi"),
        (WebSocketsSansIOProtocol, "shutdown"),
    ],
)
def test_a_missing_internal_is_found(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> None:
    monkeypatch.delattr(owner, name)
    assert f"{owner.__name__}.{name}" in missing_internals()


def test_an_instance_attribute_no_longer_set_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    real = inspect.getsource

    def without_flow(obj: Any) -> str:
        source = real(obj)
        return (
            source.replace("self.flow =", "self.renamed_flow =")
            if obj is RequestResponseCycle.__init__
            else source
        )

    monkeypatch.setattr(inspect, "getsource", without_flow)
    assert missing_internals() == ["RequestResponseCycle.flow"]


def test_another_uvicorn_version_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    monkeypatch.setattr(uvicorn, "__version__", "9.9.9")
    assert missing_internals() == [f"uvicorn=={relay.UVICORN_VERSION} (installed: 9.9.9)"]


def test_uvicorn_answers_refused_bytes_through_send_400_response() -> None:
    """The protocol's envelope for malformed requests overrides this one call of uvicorn's."""
    source = inspect.getsource(HttpToolsProtocol.data_received)
    assert "except httptools.HttpParserError" in source
    assert "self.send_400_response(" in source


def test_the_draining_websocket_protocol_is_uvicorns_sansio_one() -> None:
    """Not the legacy ``websockets`` protocol: its closed connections left memory behind."""
    assert issubclass(DrainingWebSocketProtocol, WebSocketsSansIOProtocol)
    assert "shutdown" in WebSocketsSansIOProtocol.__dict__


def test_serve_picks_the_protocol_and_falls_back_to_stock_uvicorn(
    monkeypatch: pytest.MonkeyPatch, gateway_config: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.management.commands import serve

    gateway_config(llm_api_base="http://127.0.0.1:9")  # no embedded engine to start
    seen: dict[str, Any] = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **options: seen.update(options))
    monkeypatch.setattr(serve, "run_checks", lambda config: None)
    serve.Command().handle(host=None, port=None, server="uvicorn", workers=1)
    assert seen["http"] is DrainingServerProtocol and issubclass(
        DrainingServerProtocol, GatewayServerProtocol
    )
    assert seen["ws"] is DrainingWebSocketProtocol and seen["lifespan"] == "on"
    gateway_config(server__direct_relay=False)  # the limits without the relay
    serve.Command().handle(host=None, port=None, server="uvicorn", workers=1)
    assert seen["http"] is DrainingHttpProtocol and issubclass(DrainingHttpProtocol, GatewayHttpProtocol)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    gateway_config(server__direct_relay=True)
    monkeypatch.delattr(HttpToolsProtocol, "_start_asgi_task")
    serve.Command().handle(host=None, port=None, server="uvicorn", workers=1)
    assert seen["http"] == "httptools" and seen["ws"] == "websockets-sansio"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "HttpToolsProtocol._start_asgi_task" in warnings[0].getMessage()


def test_protocols_without_the_relay() -> None:
    assert protocols(False) == (DrainingHttpProtocol, DrainingWebSocketProtocol)


def test_only_the_relay_package_imports_uvicorn_protocols() -> None:
    offenders = []
    for package in ("gateway", "responses_app", "conversations_app", "inference_app"):
        for path in (ROOT / package).rglob("*.py"):
            if (ROOT / "gateway" / "relay") in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                offenders += [
                    f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("uvicorn.protocols")
                ]
    assert offenders == []
