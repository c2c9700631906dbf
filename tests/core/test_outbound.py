"""The one outbound HTTP client: bounded calls, and aiohttp's errors mapped once to ours."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence

import pytest
from aiohttp import web

from gateway.core import outbound
from tests.servers import free_port, wait_port


class Site:
    """A real HTTP server on a loopback port, in its own thread and loop."""

    def __init__(self) -> None:
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.release = asyncio.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _app(self) -> web.Application:
        async def json_ok(request: web.Request) -> web.Response:
            return web.json_response({"q": request.query.get("q"), "accept": request.headers.get("Accept")})

        async def status(request: web.Request) -> web.Response:
            return web.Response(status=503, text="busy")

        async def big(request: web.Request) -> web.Response:
            return web.Response(body=b"x" * 5000)

        async def big_chunked(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for _ in range(10):
                await resp.write(b"y" * 1000)
            return resp

        async def not_json(request: web.Request) -> web.Response:
            return web.Response(text="<html>", content_type="text/html")

        async def slow(request: web.Request) -> web.Response:
            await self.release.wait()
            return web.Response(text="late")

        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPFound("/json")

        async def to_name(request: web.Request) -> web.Response:
            raise web.HTTPFound(f"http://localhost:{self.port}/json")

        async def to_literal(request: web.Request) -> web.Response:
            raise web.HTTPFound(f"http://127.0.0.1:{self.port}/json")

        app = web.Application()
        for path, handler in [
            ("/json", json_ok),
            ("/status", status),
            ("/big", big),
            ("/big-chunked", big_chunked),
            ("/not-json", not_json),
            ("/slow", slow),
            ("/redirect", redirect),
            ("/to-name", to_name),
            ("/to-literal", to_literal),
        ]:
            app.router.add_get(path, handler)
        return app

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.release = asyncio.Event()
        runner = web.AppRunner(self._app(), access_log=None)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def start(self) -> Site:
        self._thread.start()
        wait_port(self.port)
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.release.set)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture
def site() -> Iterator[Site]:
    s = Site().start()
    yield s
    s.stop()


async def test_get_json_and_fetch(site: Site) -> None:
    assert await outbound.get_json(f"{site.url}/json", timeout_s=5, max_bytes=1000, params={"q": "a b"}) == {
        "q": "a b",
        "accept": "application/json",
    }
    fetched = await outbound.fetch("GET", f"{site.url}/not-json", timeout_s=5, max_bytes=1000)
    assert (fetched.status, fetched.body, fetched.content_type) == (200, b"<html>", "text/html")
    redirect = await outbound.fetch("GET", f"{site.url}/redirect", timeout_s=5, max_bytes=1000)
    assert redirect.status == 302 and redirect.headers["Location"] == "/json"  # not followed unless asked
    followed = await outbound.fetch(
        "GET", f"{site.url}/redirect", timeout_s=5, max_bytes=1000, allow_redirects=True
    )
    assert followed.status == 200 and followed.url == f"{site.url}/json"


async def test_errors_are_ours_and_name_the_url(site: Site) -> None:
    with pytest.raises(outbound.OutboundStatus) as status:
        await outbound.get_json(f"{site.url}/status", timeout_s=5, max_bytes=1000)
    assert (str(status.value), status.value.status, status.value.body) == (
        f"{site.url}/status answered HTTP 503",
        503,
        b"busy",
    )
    with pytest.raises(outbound.OutboundTooLarge, match=r"/big answered 5000 bytes \(limit 1000\)$"):
        await outbound.fetch("GET", f"{site.url}/big", timeout_s=5, max_bytes=1000)
    with pytest.raises(outbound.OutboundTooLarge, match=r"/big-chunked answered more than 1000 bytes$"):
        await outbound.fetch("GET", f"{site.url}/big-chunked", timeout_s=5, max_bytes=1000)
    with pytest.raises(outbound.OutboundNotJson, match=r"/not-json did not answer JSON$"):
        await outbound.get_json(f"{site.url}/not-json", timeout_s=5, max_bytes=1000)
    with pytest.raises(outbound.OutboundTimeout, match=r"/slow did not answer within 0.2s$"):
        await outbound.fetch("GET", f"{site.url}/slow", timeout_s=0.2, max_bytes=1000)
    closed = f"http://127.0.0.1:{free_port()}/x"
    with pytest.raises(outbound.OutboundUnreachable, match=rf"^could not fetch {closed}: ClientConnector"):
        await outbound.fetch("GET", closed, timeout_s=5, max_bytes=1000)
    assert all(
        issubclass(kind, outbound.OutboundError)
        for kind in (
            outbound.OutboundStatus,
            outbound.OutboundTooLarge,
            outbound.OutboundNotJson,
            outbound.OutboundTimeout,
            outbound.OutboundUnreachable,
        )
    )


def test_get_json_from_sync_code(site: Site) -> None:
    assert (
        outbound.get_json_sync(f"{site.url}/json", timeout_s=5, max_bytes=1000)["accept"]
        == "application/json"
    )
    with pytest.raises(outbound.OutboundStatus):
        outbound.get_json_sync(f"{site.url}/status", timeout_s=5, max_bytes=1000)


async def test_connect_check_refuses_at_connect_time_on_every_hop(site: Site) -> None:
    seen: list[tuple[str, list[str]]] = []

    def only(allowed_host: str) -> outbound.ConnectCheck:
        def check(host: str, addresses: Sequence[str]) -> bool:
            seen.append((host, list(addresses)))
            return host == allowed_host

        return check

    by_name = f"http://localhost:{site.port}"
    # A name: the resolver's own answers meet the check, so the connection is never made.
    async with outbound.Client(timeout_s=5, connect_check=only("127.0.0.1")) as client:
        with pytest.raises(outbound.OutboundRefused) as refused:
            await client.fetch("GET", f"{by_name}/json", max_bytes=1000)
        assert refused.value.host == "localhost" and refused.value.url == f"{by_name}/json"
        assert any(host == "localhost" and "127.0.0.1" in addrs for host, addrs in seen)
        # Allowed first hop; its redirect to the name is refused when it is followed ...
        with pytest.raises(outbound.OutboundRefused) as refused:
            await client.fetch("GET", f"{site.url}/to-name", max_bytes=1000, allow_redirects=True)
        assert refused.value.host == "localhost"
        # ... and is only an answer when it is not.
        hop = await client.fetch("GET", f"{site.url}/to-name", max_bytes=1000)
        assert hop.status == 302
    # An IP literal is checked as its own address, on the first hop and after a redirect.
    async with outbound.Client(timeout_s=5, connect_check=only("localhost")) as client:
        with pytest.raises(outbound.OutboundRefused) as refused:
            await client.fetch("GET", f"{site.url}/json", max_bytes=1000)
        assert refused.value.host == "127.0.0.1"
        with pytest.raises(outbound.OutboundRefused) as refused:
            await client.fetch("GET", f"{by_name}/to-literal", max_bytes=1000, allow_redirects=True)
        assert refused.value.host == "127.0.0.1"
        followed = await client.fetch("GET", f"{by_name}/redirect", max_bytes=1000, allow_redirects=True)
        assert (followed.status, followed.url) == (200, f"{by_name}/json")
    assert ("127.0.0.1", ["127.0.0.1"]) in seen
    assert issubclass(outbound.OutboundRefused, outbound.OutboundError)


async def test_read_body_leaves_rejected_answers_unread(site: Site) -> None:
    async with outbound.Client(timeout_s=5) as client:
        # /big is over max_bytes, but its body is not wanted, so it is not read (no OutboundTooLarge).
        skipped = await client.fetch("GET", f"{site.url}/big", max_bytes=1000, read_body=lambda s: s != 200)
        assert (skipped.status, skipped.body) == (200, b"")
