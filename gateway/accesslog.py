"""The access log: one line per HTTP request, written without the cost of ``logging`` per line.

Building a ``LogRecord``, running the filters and the formatter and flushing the stream once per
request cost about a tenth of a pass-through request's CPU (``docs/performance.md``). When the
access logger ends in the gateway's own console handler (the configured default), the line is
formatted here exactly as that handler would format it (text or JSON), and the lines of the last
``FLUSH_AFTER_S`` are written together (and at exit): one write per batch instead of one per
request. Any other logging set-up (another handler, a filter, a file) gets ordinary ``logging``
records.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import time
from typing import IO, Any

import orjson

from gateway.logging import JsonFormatter, RequestIdFilter, TextFormatter

logger = logging.getLogger("gateway.access")
# How long a line may wait for the lines after it before the batch is written.
FLUSH_AFTER_S = 0.05


class _Writer:
    """Formats access lines for one console handler and writes them once per loop iteration."""

    def __init__(self, handler: logging.StreamHandler[Any], json: bool) -> None:
        self.handler = handler
        self.stream: IO[str] = handler.stream
        self.json = json
        self.pending: list[str] = []
        self._flush_loop: asyncio.AbstractEventLoop | None = None
        self._second = -1
        self._stamp = ""

    def _timestamp(self, now: float) -> tuple[str, int]:
        second = int(now)
        if second != self._second:
            self._second = second
            fmt = "%Y-%m-%dT%H:%M:%S" if self.json else "%Y-%m-%d %H:%M:%S"
            self._stamp = time.strftime(fmt, (time.gmtime if self.json else time.localtime)(second))
        return self._stamp, int((now - second) * 1000)

    def line(self, method: str, path: str, route: str, status: int, ms: float, request_id: str) -> str:
        stamp, msecs = self._timestamp(time.time())
        message = f"{method} {path} {status} {ms:.1f}ms"
        if self.json:
            entry = {
                "ts": f"{stamp}.{msecs:03d}Z",
                "level": "INFO",
                "logger": "gateway.access",
                "message": message,
                "request_id": request_id,
                "method": method,
                "route": route,
                "status": status,
                "ms": ms,
            }
            return orjson.dumps(entry).decode() + "\n"
        return f"{stamp},{msecs:03d} INFO gateway.access [{request_id}] {message}\n"

    def write(self, text: str) -> None:
        self.pending.append(text)
        waiting = self._flush_loop
        if waiting is not None and not waiting.is_closed():
            return  # a flush is due on a live loop (asking for the running loop costs a getpid())
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._flush_loop = loop
        loop.call_later(FLUSH_AFTER_S, self.flush)

    def flush(self) -> None:
        self._flush_loop = None
        if self.pending:
            text, self.pending = "".join(self.pending), []
            self._emit(text)

    def _emit(self, text: str) -> None:
        self.handler.acquire()
        try:
            self.stream.write(text)
            self.stream.flush()
        except Exception:  # a log line must never fail a request
            self.handler.handleError(logging.makeLogRecord({"msg": text}))
        finally:
            self.handler.release()


_writer: _Writer | bool | None = False  # False: not resolved yet; None: use logging


def _flush_at_exit() -> None:
    if isinstance(_writer, _Writer):
        _writer.flush()


atexit.register(_flush_at_exit)


def _resolve() -> _Writer | None:
    """Our writer when the access logger ends in exactly the gateway's console handler."""
    handlers: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        handlers.extend(current.handlers)
        if not current.propagate:
            break
        current = current.parent
    if len(handlers) != 1 or type(handlers[0]) is not logging.StreamHandler:
        return None
    handler = handlers[0]
    if [type(f) for f in handler.filters] != [RequestIdFilter]:
        return None
    formatter = handler.formatter
    if type(formatter) is JsonFormatter:
        return _Writer(handler, json=True)
    if type(formatter) is TextFormatter:
        return _Writer(handler, json=False)
    return None


def reset() -> None:
    """Look at the logging set-up again (after it changed; tests)."""
    global _writer
    _flush_at_exit()
    _writer = False


def enabled() -> bool:
    return logger.isEnabledFor(logging.INFO)


def log_request(method: str, path: str, route: str, status: int, seconds: float, request_id: str) -> None:
    """Record one answered request (the caller checked :func:`enabled`)."""
    global _writer
    if _writer is False:
        _writer = _resolve()
    ms = seconds * 1000
    if isinstance(_writer, _Writer):
        _writer.write(_writer.line(method, path, route, status, ms, request_id))
        return
    logger.info(
        "%s %s %s %.1fms",
        method,
        path,
        status,
        ms,
        extra={"method": method, "route": route, "status": status, "ms": ms, "request_id": request_id},
    )
