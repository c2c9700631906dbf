"""Structured logging: JSON lines when configured, always tagged with the request id and, while a
span is current (tracing on), the trace and span ids.

Bodies and credentials are never logged. The console handler sits behind a ``QueueHandler``
(:class:`QueuedConsoleHandler`), so formatting and writing happen off the event loop.
"""

from __future__ import annotations

import contextvars
import copy
import logging
import os
import queue
import time
import weakref
from logging.handlers import QueueHandler, QueueListener

import orjson
from opentelemetry import trace

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class RequestIdFilter(logging.Filter):
    """Tags a record with the request id and the current span's ids ("" when none), in the caller's
    context (before the record is queued)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        if "trace_id" not in record.__dict__:
            span = trace.get_current_span().get_span_context()
            if span.is_valid:
                trace_id, span_id = format(span.trace_id, "032x"), format(span.span_id, "016x")
                ids = f" trace_id={trace_id} span_id={span_id}"
            else:
                trace_id = span_id = ids = ""
            record.__dict__.update(trace_id=trace_id, span_id=span_id, trace_ids=ids)
        return True


# ``[request-id trace_id=… span_id=…]``; just ``[request-id]`` when no span is current.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s%(trace_ids)s] %(message)s"


class TextFormatter(logging.Formatter):
    """The gateway's text lines (``[server] log_format = "text"``): :data:`TEXT_FORMAT`, local time."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "trace_ids"):  # a handler without the filter
            record.trace_ids = ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    _SKIP = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "trace_ids"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", request_id_var.get()),
            "trace_id": getattr(record, "trace_id", ""),
            "span_id": getattr(record, "span_id", ""),
        }
        for key, value in vars(record).items():
            if key not in self._SKIP and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class QueuedConsoleHandler(QueueHandler):
    """The console handler on a ``QueueListener``'s thread; filters (the request id) run before the
    record is queued, and closing it writes what is queued."""

    def __init__(self, format: str = "text") -> None:
        super().__init__(queue.SimpleQueue())
        console = logging.StreamHandler()
        console.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
        self.listener = QueueListener(self.queue, console)
        self.listener.start()
        self.running = True
        # A forked child has no listener thread: it starts its own.
        restart = weakref.WeakMethod(self._restart)
        os.register_at_fork(after_in_child=lambda: (method := restart()) is not None and method())

    def _restart(self) -> None:
        if self.running:
            self.listener = QueueListener(self.queue, *self.listener.handlers)
            self.listener.start()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """The record with its message merged (its arguments may change once the caller goes on);
        a copy, since other handlers (and their formatters) see the original."""
        record = copy.copy(record)
        record.msg = record.getMessage()
        record.args = None
        return record

    def close(self) -> None:
        if self.running:
            self.running = False
            self.listener.stop()  # writes what is queued, then ends the thread
        super().close()


access_logger = logging.getLogger("gateway.access")


def log_access(method: str, path: str, route: str, status: int, seconds: float, request_id: str) -> None:
    """One access-log line for an answered HTTP request (when ``gateway.access`` logs INFO)."""
    if not access_logger.isEnabledFor(logging.INFO):
        return
    ms = seconds * 1000
    # makeRecord and handle, not info(): no search of the caller's frame for a line nobody shows.
    record = access_logger.makeRecord(
        access_logger.name,
        logging.INFO,
        __file__,
        0,
        "%s %s %s %.1fms",
        (method, path, status, ms),
        None,
        extra={"method": method, "route": route, "status": status, "ms": ms, "request_id": request_id},
    )
    access_logger.handle(record)
