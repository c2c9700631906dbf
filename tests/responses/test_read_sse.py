"""``gateway.core.sse.read_sse``: the upstream's SSE events, whatever the chunking; a line over
``max_upstream_sse_line_bytes`` is a :class:`StreamFailure`, in one chunk or across several."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.core.sse import StreamFailure, read_sse

STREAM = (
    b'event: response.created\r\ndata: {"a":1}\r\n\r\n'  # CRLF line ends
    b": keep-alive\n\n"  # a comment, and a blank line with no event before it
    b"data: one\ndata: two\n\n"  # two data lines: one event, joined with a newline
    b"event: e\ndata:no-space\n\n"
    b"id: 7\nretry: 10\ndata: x\n\n"  # fields the gateway does not use
    b"event: partial\ndata: never ended"  # a last event without its blank line: dropped
)
EXPECTED = [
    ("response.created", b'{"a":1}'),
    (None, b"one\ntwo"),
    ("e", b"no-space"),
    (None, b"x"),
]


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _read(parts: list[bytes], limit: int = 1 << 20) -> list[tuple[str | None, bytes]]:
    return [event async for event in read_sse(_chunks(parts), limit)]


async def test_the_same_events_at_every_split() -> None:
    assert await _read([STREAM]) == EXPECTED
    for cut in range(1, len(STREAM)):
        assert await _read([STREAM[:cut], STREAM[cut:]]) == EXPECTED, cut
    assert await _read([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


@pytest.mark.parametrize("size", [1, 7, 4096])
async def test_a_line_over_the_limit_fails_however_it_arrives(size: int) -> None:
    long = b"data: " + b"x" * 200 + b"\n\n"
    stream = b"data: ok\n\n" + long
    parts = [stream[i : i + size] for i in range(0, len(stream), size)]
    events: list[tuple[str | None, bytes]] = []
    with pytest.raises(StreamFailure, match="max_upstream_sse_line_bytes"):
        async for event in read_sse(_chunks(parts), 100):
            events.append(event)
    assert events == [(None, b"ok")]
    # At the limit exactly: read.
    exact = b"data: " + b"y" * 94 + b"\n\n"
    assert await _read([exact], 100) == [(None, b"y" * 94)]
