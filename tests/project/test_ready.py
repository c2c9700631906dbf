"""/ready: 200 only when the database answers and the upstream is reachable; 503 names the failure."""

from __future__ import annotations

import httpx
import pytest

from tests.servers import GatewayProcess, LiveServer, free_port


def test_ready_ok_with_database_and_upstream(live_gateway: LiveServer, gateway_config, upstream) -> None:  # type: ignore[no-untyped-def]
    gateway_config(llm_api_base=upstream.url)
    r = httpx.get(f"{live_gateway.url}/ready")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "checks": {"database": {"status": "ok"}, "upstream": {"status": "ok"}},
        "upstreams": {upstream.url: {"state": "up"}},
    }
    assert (
        f'gateway_upstream_up{{upstream="{upstream.url}"}} 1.0'
        in httpx.get(f"{live_gateway.url}/metrics").text
    )


def test_ready_503_when_upstream_down(live_gateway: LiveServer, gateway_config) -> None:  # type: ignore[no-untyped-def]
    base = f"http://127.0.0.1:{free_port()}"
    gateway_config(llm_api_base=base)
    r = httpx.get(f"{live_gateway.url}/ready")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "fail"
    assert body["checks"]["database"] == {"status": "ok"}
    assert body["checks"]["upstream"]["status"] == "fail"
    assert body["upstreams"] == {base: {"state": "down"}}
    assert f'gateway_upstream_up{{upstream="{base}"}} 0.0' in httpx.get(f"{live_gateway.url}/metrics").text


def test_ready_503_without_any_inference_backend(live_gateway: LiveServer, gateway_config) -> None:  # type: ignore[no-untyped-def]
    gateway_config(llm_api_base="")
    r = httpx.get(f"{live_gateway.url}/ready")
    assert r.status_code == 503
    assert "LLM_API_BASE" in r.json()["checks"]["upstream"]["error"]


def test_ready_probe_is_bounded_when_upstream_hangs(
    live_gateway: LiveServer, gateway_config, upstream
) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from aiohttp import web

    async def hang(request, rec):  # type: ignore[no-untyped-def]
        await asyncio.sleep(10)
        return web.Response()

    upstream.script("/health", hang)
    gateway_config(llm_api_base=upstream.url, upstream__ready_timeout_s=0.5)
    r = httpx.get(f"{live_gateway.url}/ready", timeout=5)
    assert r.status_code == 503
    assert r.elapsed.total_seconds() < 2
    assert "no answer within" in r.json()["checks"]["upstream"]["error"]


@pytest.mark.process
def test_ready_503_when_database_down(upstream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A gateway whose PostgreSQL does not answer is alive but not ready."""
    gw = GatewayProcess(
        {
            "DATABASE_URL": f"postgres://postgres@127.0.0.1:{free_port()}/nowhere",
            "LLM_API_BASE": upstream.url,
            "GATEWAY_SERVER_DATA_DIR": str(tmp_path),
        },
        migrate=False,
    ).wait()
    try:
        assert httpx.get(f"{gw.url}/health").status_code == 200
        r = httpx.get(f"{gw.url}/ready", timeout=10)
        assert r.status_code == 503
        body = r.json()
        assert body["checks"]["database"]["status"] == "fail"
        assert body["checks"]["upstream"] == {"status": "ok"}
    finally:
        gw.stop()
