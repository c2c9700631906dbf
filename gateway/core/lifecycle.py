"""The server process's life: graceful shutdown (the drain) and its periodic jobs.

SIGTERM begins the drain (:func:`drain_on_signal`) and reaches uvicorn only once every WebSocket has
closed or the grace is nearly over (uvicorn would cut them). Responses run inside
:func:`interruptible`: past ``[server] shutdown_grace_s`` they end ``failed`` and are stored so, so
every id a client saw is retrievable. The ``lifespan`` app runs :func:`on_startup` and
:func:`on_shutdown` jobs (``docs/operations.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

log = logging.getLogger("gateway.core.lifecycle")

# After the grace: how long interrupted responses get to store their failure and send their last
# event before uvicorn cancels what is left.
FLUSH_MARGIN_S = 5.0


class Interruptible:
    """One running response's handle in the drain (see :func:`interruptible`)."""

    __slots__ = ("_timeout", "interrupted")

    def __init__(self, timeout: asyncio.Timeout) -> None:
        self._timeout = timeout
        self.interrupted = False

    @property
    def expired(self) -> bool:
        return self._timeout.expired()

    def interrupt(self) -> None:
        if not self._timeout.expired():
            self._timeout.reschedule(asyncio.get_running_loop().time())


class Drain:
    """This process's shutdown: started once, by SIGTERM (or the lifespan's end)."""

    def __init__(self) -> None:
        self.deadline: float | None = None  # loop time after which running work is interrupted
        self.runs: set[Interruptible] = set()
        # Work that must end before the process may exit, interrupted or not: a run's failure being
        # stored after its interruption (see :meth:`held`).
        self.holds = 0
        self.websockets = 0  # WebSocket connections open (gateway.core.middleware counts them)
        self._listeners: set[Callable[[], None]] = set()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def begin(self, grace_s: float | None = None) -> None:
        """Start the drain (idempotent): running work gets ``grace_s`` (default: the config's)."""
        if self.deadline is not None:
            return
        if grace_s is None:
            from gateway.core.config import get_config

            grace_s = get_config().server.shutdown_grace_s
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + grace_s
        log.info("shutting down: %d responses running, %g s to finish", len(self.runs), grace_s)
        self._timer = loop.call_at(self.deadline, self._interrupt_all)
        for listener in list(self._listeners):
            listener()

    def _interrupt_all(self) -> None:
        if self.runs:
            log.warning("shutdown grace over: ending %d running responses as failed", len(self.runs))
        for run in list(self.runs):
            run.interrupt()

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the drain begins (at once if it has); returns the unsubscriber."""
        if self.deadline is not None:
            asyncio.get_running_loop().call_soon(callback)
        self._listeners.add(callback)
        return lambda: self._listeners.discard(callback)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The shutdown waits for this block (within the flush margin) even after its run was interrupted,
        so the process cannot exit while the run's failure is still being stored."""
        self.holds += 1
        try:
            yield
        finally:
            self.holds -= 1

    async def wait_idle(self) -> None:
        """Until no response runs or is held, or the deadline and the flush margin have passed."""
        loop = asyncio.get_running_loop()
        end = (self.deadline if self.deadline is not None else loop.time()) + FLUSH_MARGIN_S
        while (self.runs or self.holds) and loop.time() < end:
            await asyncio.sleep(0.05)

    async def wait_websockets_closed(self) -> None:
        """Until every WebSocket has closed, or the deadline and the flush margin are nearly over."""
        loop = asyncio.get_running_loop()
        end = (self.deadline if self.deadline is not None else loop.time()) + FLUSH_MARGIN_S - 1.0
        while self.websockets and loop.time() < end:
            await asyncio.sleep(0.05)

    def reset(self) -> None:
        """Forget a finished drain (tests that run several servers in one process)."""
        if self._timer is not None:
            self._timer.cancel()
        self.deadline = None
        self._timer = None


drain = Drain()


def interruptible() -> contextlib.AbstractAsyncContextManager[Interruptible]:
    """Run the body until it ends or the drain's deadline interrupts it (then it is cancelled at its
    ``await`` and ``handle.interrupted`` is True, so the caller ends the response). The body must run
    in the task that entered the block."""
    return _InterruptibleBlock()


class _InterruptibleBlock:
    """:func:`interruptible`'s block: an ``asyncio.timeout`` with no deadline, which the drain reschedules.
    A class because every response enters one and an async generator costs more."""

    __slots__ = ("handle", "timeout")

    async def __aenter__(self) -> Interruptible:
        self.timeout = asyncio.timeout(None)
        await self.timeout.__aenter__()
        handle = self.handle = Interruptible(self.timeout)
        drain.runs.add(handle)
        if drain.deadline is not None and asyncio.get_running_loop().time() >= drain.deadline:
            handle.interrupt()
        return handle

    async def __aexit__(self, exc_type: Any, exc: Any, traceback: Any) -> bool:
        handle = self.handle
        try:
            await self.timeout.__aexit__(exc_type, exc, traceback)
        except TimeoutError:
            if not handle.expired:
                raise  # another timeout inside the body: not ours
            handle.interrupted = True
            return True  # interrupted: the exception stops here
        finally:
            drain.runs.discard(handle)
        return False


# --- the ASGI lifespan: periodic jobs and the end of in-process work ---------------------------

_startup: list[Callable[[], Coroutine[Any, Any, None]]] = []


def on_startup(job: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``job`` (a long-lived coroutine: a periodic loop) as a task while the server runs."""
    if job not in _startup:
        _startup.append(job)


_shutdown: list[Callable[[], Coroutine[Any, Any, None]]] = []


def on_shutdown(job: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Await ``job`` at shutdown, once the work in flight has ended (closing the loop's clients)."""
    if job not in _shutdown:
        _shutdown.append(job)


# Tasks nobody awaits (a detached stream's run, a lease renewal): held here until they end.
_unawaited: set[asyncio.Task[Any]] = set()


def keep_running(task: asyncio.Task[Any]) -> None:
    """Hold a strong reference to ``task`` until it ends (asyncio keeps only weak ones)."""
    _unawaited.add(task)
    task.add_done_callback(_unawaited.discard)


async def lifespan(scope: dict[str, Any], receive: Any, send: Any) -> None:
    tasks: list[asyncio.Task[None]] = []
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            from django.apps import apps

            drain_on_signal(asyncio.get_running_loop())
            apps.check_apps_ready()  # the apps register their jobs when they are loaded
            tasks = [asyncio.create_task(job()) for job in _startup]
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            # Connections are closed by now; what runs still is work no client waits on.
            drain.begin()
            await drain.wait_idle()
            for task in tasks:
                task.cancel()
            for job in _shutdown:
                try:
                    await job()
                except Exception:
                    log.exception("a shutdown job failed")
            await send({"type": "lifespan.shutdown.complete"})
            return


def drain_on_signal(loop: asyncio.AbstractEventLoop) -> None:
    """Put the drain in front of uvicorn's SIGTERM handler, which would cut every open WebSocket at once:
    the signal reaches it once the WebSockets closed themselves (bounded), or at a second SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        return  # a server in a thread (tests): signals are the main thread's
    server_handler = signal.getsignal(signal.SIGTERM)
    if not callable(server_handler):
        return

    async def drain_then_stop(frame: Any) -> None:
        drain.begin()
        await drain.wait_websockets_closed()
        server_handler(signal.SIGTERM, frame)

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, server_handler)
        loop.call_soon_threadsafe(lambda: keep_running(loop.create_task(drain_then_stop(frame))))

    signal.signal(signal.SIGTERM, on_sigterm)
