"""The ``code_interpreter`` gateway tool: Python in a fresh bubblewrap sandbox per call.

``bwrap --unshare-all`` (no network, own PID namespace), read-only ``/usr``, a private size-limited
tmpfs as ``/tmp``, no inherited environment, no capabilities, no nested user namespaces, and never
root's credentials. A tiny launcher sets hard rlimits (CPU, memory, processes, file size, no core)
before the user's code runs; wall-clock and output caps kill the whole sandbox from outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.core.config import CodeInterpreterConfig, Config
from inference_app.tools.base import ToolCall, ToolResult

# Runs inside the sandbox: lower every limit, then execute the program read from stdin.
_LAUNCHER = """
import resource, sys
def cap(res, value):
    resource.setrlimit(res, (value, value))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu} + 1))
cap(resource.RLIMIT_AS, {memory})
cap(resource.RLIMIT_NPROC, {nproc})
cap(resource.RLIMIT_FSIZE, {fsize})
cap(resource.RLIMIT_CORE, 0)
source = sys.stdin.read()
sys.stdin.close()
sys.argv = ["main.py"]
del cap, resource
code = compile(source, "main.py", "exec")
del source
exec(code, {{"__name__": "__main__", "__builtins__": __builtins__}})
"""


def _exit_reason(exit_code: int, output: bytes, config: CodeInterpreterConfig) -> str | None:
    """Why the run ended abnormally, or ``None`` when the program exited (bwrap: 128 + N for signal N)."""
    if exit_code == 1 and output.startswith(b"bwrap: "):
        return "the sandbox could not start: " + output.decode("utf-8", "replace").strip()[7:]
    if exit_code < 0:
        return f"the sandbox was killed by signal {-exit_code}"
    if exit_code <= 128:
        return None
    sig = exit_code - 128
    if sig == signal.SIGXCPU or sig == signal.SIGKILL:
        # SIGXCPU at the soft CPU limit; SIGKILL at the hard one (a program that caught SIGXCPU).
        return f"the program was stopped: CPU time limit of {config.cpu_time_s} s exceeded"
    if sig == signal.SIGXFSZ:
        return f"the program was stopped: file size limit of {config.max_file_size_bytes} bytes exceeded"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        return None  # an exit status above 128 chosen by the program
    return f"the program was stopped by {name}"


@dataclass(frozen=True)
class SandboxRun:
    """What one run produced. ``error`` is set when a limit stopped it or it could not start."""

    logs: str
    exit_code: int | None
    error: str | None
    duration_s: float
    truncated: bool = False


def sandbox_python(config: CodeInterpreterConfig) -> str:
    if config.python:
        return config.python
    for candidate in ("/usr/local/bin/python3", "/usr/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return "/usr/bin/python3"


def sandbox_available(config: CodeInterpreterConfig) -> str | None:
    """``None`` when the sandbox can run here, else why not."""
    if not config.enabled:
        return "the code interpreter is disabled ([code_interpreter] enabled = false)"
    if not shutil.which(config.bwrap):
        return f"the sandbox is unavailable: {config.bwrap!r} (bubblewrap) is not installed"
    if not os.access(sandbox_python(config), os.X_OK):
        return f"the sandbox is unavailable: no Python interpreter at {sandbox_python(config)}"
    return None


def _bind_args(config: CodeInterpreterConfig, python: str) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    # Merged-/usr systems have /bin -> usr/bin etc.; mirror them as symlinks, else bind the dirs.
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if Path(top).is_symlink():
            args += ["--symlink", os.readlink(top), top]
        elif Path(top).is_dir():
            args += ["--ro-bind", top, top]
    for extra in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        args += ["--ro-bind-try", extra, extra]
    prefix = str(Path(os.path.realpath(python)).parent.parent)
    binds = list(config.extra_ro_binds)
    if not prefix.startswith("/usr/"):
        binds.insert(0, prefix)
    for bind in binds:
        args += ["--ro-bind", bind, bind]
    return args


def build_command(config: CodeInterpreterConfig) -> list[str]:
    python = sandbox_python(config)
    launcher = _LAUNCHER.format(
        cpu=config.cpu_time_s,
        memory=config.memory_bytes,
        nproc=config.max_processes,
        fsize=config.max_file_size_bytes,
    )
    return [
        config.bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv", "HOME", "/tmp",
        "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
        "--setenv", "LANG", "C.UTF-8",
        "--hostname", "sandbox",
        *_bind_args(config, python),
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(config.tmp_size_bytes),
        "--tmpfs", "/tmp",
        # The sandbox's own root (a tmpfs bwrap builds) becomes read-only too: only /tmp is writable.
        "--remount-ro", "/",
        "--chdir", "/tmp",
        "--uid", "1000",
        "--gid", "1000",
        "--cap-drop", "ALL",
        # -I ignores PYTHON* variables and user site; -u keeps stdout/stderr in order; -B no .pyc.
        python, "-I", "-u", "-B", "-c", launcher,
    ]  # fmt: skip


async def _read_capped(
    stream: asyncio.StreamReader, buffer: bytearray, cap: int, overflow: asyncio.Event
) -> None:
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        room = cap - len(buffer)
        if room > 0:
            buffer += chunk[:room]
        if len(chunk) > room:
            # Keep draining (and discarding) until the killed sandbox closes its end.
            overflow.set()


def _kill(proc: asyncio.subprocess.Process) -> None:
    # bwrap leads its own session (start_new_session); its PID namespace dies with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


async def run_python(code: str, config: CodeInterpreterConfig) -> SandboxRun:
    """Run ``code`` in a fresh sandbox; never raises for anything the code does."""
    started = time.monotonic()
    unavailable = sandbox_available(config)
    if unavailable:
        return SandboxRun("", None, unavailable, 0.0)
    if len(code.encode()) > config.max_code_bytes:
        return SandboxRun("", None, f"the program is larger than {config.max_code_bytes} bytes", 0.0)
    command = build_command(config)
    if os.geteuid() == 0:
        # Drop root before bwrap starts with setpriv: uvloop's subprocess support has no user=/group=, and
        # preexec_fn is unsafe in a threaded process.
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            return SandboxRun("", None, "the sandbox is unavailable: running as root needs setpriv", 0.0)
        command = [
            setpriv,
            f"--reuid={config.run_as_uid}",
            f"--regid={config.run_as_gid}",
            "--clear-groups",
            "--",
            *command,
        ]
    try:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
            env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
        )
    except OSError as exc:
        return SandboxRun("", None, f"the sandbox could not start: {exc}", time.monotonic() - started)

    output = bytearray()
    overflow = asyncio.Event()
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    deadline = started + config.wall_time_s
    error: str | None = None

    async def communicate() -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(code.encode())
            await stdin.drain()
            stdin.close()
        await _read_capped(stdout, output, config.max_output_bytes, overflow)

    talk = asyncio.ensure_future(communicate())
    overflow_wait = asyncio.ensure_future(overflow.wait())
    try:
        done, _ = await asyncio.wait(
            {talk, overflow_wait}, timeout=config.wall_time_s, return_when=asyncio.FIRST_COMPLETED
        )
        if overflow.is_set():
            error = f"output limit of {config.max_output_bytes} bytes exceeded; the program was stopped"
            _kill(proc)
        elif not done:
            error = f"wall-clock time limit of {config.wall_time_s:g} s exceeded; the program was stopped"
            _kill(proc)
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                exit_code = await proc.wait()
        except TimeoutError:
            # Output closed but the program still runs (or ignores it): the wall clock still counts.
            error = error or (
                f"wall-clock time limit of {config.wall_time_s:g} s exceeded; the program was stopped"
            )
            _kill(proc)
            exit_code = await proc.wait()
    except BaseException:
        # Cancelled (the call timed out upstream) or anything else: never leave a sandbox behind.
        _kill(proc)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await proc.wait()
        raise
    finally:
        overflow_wait.cancel()
        # Every writer is dead once the sandbox is: the pipe reaches EOF and its transport closes.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            async with asyncio.timeout(5):
                await talk
    if error is None:
        error = _exit_reason(exit_code, bytes(output), config)
    logs = output.decode("utf-8", "replace")
    return SandboxRun(logs, exit_code, error, time.monotonic() - started, truncated=overflow.is_set())


async def run_code_interpreter(call: ToolCall, config: Config) -> ToolResult:
    try:
        args = call.parsed_arguments()
    except ValueError as exc:
        return ToolResult.failure(call, str(exc))
    code = args.get("code")
    if not isinstance(code, str) or not code.strip():
        return ToolResult.failure(call, "code_interpreter needs 'code': the Python program to run")
    run = await run_python(code, config.code_interpreter)
    outputs = [{"type": "logs", "logs": run.logs}]
    if run.error:
        text = run.logs + ("\n" if run.logs and not run.logs.endswith("\n") else "") + f"[{run.error}]"
        return ToolResult(
            call_id=call.call_id,
            kind="code_interpreter",
            status="failed",
            output=text,
            error=run.error,
            code=code,
            outputs=outputs,
            duration_s=run.duration_s,
        )
    text = run.logs if run.logs else "(no output)"
    if run.exit_code:
        text += f"\n[exit status {run.exit_code}]"
    return ToolResult(
        call_id=call.call_id,
        kind="code_interpreter",
        status="completed",
        output=text,
        code=code,
        outputs=outputs,
        duration_s=run.duration_s,
    )
