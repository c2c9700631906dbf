"""``gateway.core.logging``: the access line, in text and JSON, carries the request id and no secrets."""

from __future__ import annotations

import re

import httpx
import orjson
import pytest

from tests.servers import GatewayProcess


@pytest.mark.process
def test_json_logs_carry_request_id_and_no_secrets(upstream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw = GatewayProcess(
        {"LOG_FORMAT": "json", "LLM_API_BASE": upstream.url, "GATEWAY_SERVER_DATA_DIR": str(tmp_path)}
    )
    try:
        gw.wait()
        r = httpx.post(
            f"{gw.url}/v1/nope",
            headers={"authorization": "Bearer sk-very-secret-token", "x-request-id": "trace-42"},
            content=b'{"prompt": "private words"}',
        )
        assert r.status_code == 404
    finally:
        gw.stop()
    out = gw.proc.stdout.read() if gw.proc.stdout else ""
    lines = [orjson.loads(line) for line in out.splitlines() if line.startswith("{")]
    access = [e for e in lines if e.get("logger") == "gateway.access"]
    assert any(e["request_id"] == "trace-42" and e["status"] == 404 and e["route"] for e in access)
    assert "sk-very-secret-token" not in out
    assert "private words" not in out


@pytest.mark.process
def test_text_access_log_line(upstream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The default (text) access line: time, level, logger, request id, method, path, status, ms."""
    gw = GatewayProcess({"LLM_API_BASE": upstream.url, "GATEWAY_SERVER_DATA_DIR": str(tmp_path)})
    try:
        gw.wait()
        for rid in ("trace-a", "trace-b"):
            assert httpx.get(f"{gw.url}/v1/nope", headers={"x-request-id": rid}).status_code == 404
    finally:
        gw.stop()
    out = gw.proc.stdout.read() if gw.proc.stdout else ""
    pattern = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO gateway\.access \[trace-(a|b)\] GET /v1/nope 404 \d+\.\dms$"
    assert len([line for line in out.splitlines() if re.match(pattern, line)]) == 2, out
