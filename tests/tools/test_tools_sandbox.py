"""The code-interpreter sandbox, for real: bubblewrap namespaces plus resource limits.

Every hostile program fails cleanly within its bound, and a normal call right after it works.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.core.config import Config, load_config, replace
from inference_app.tools import ToolResult, classify_tools, run_gateway_calls

# No skip without bubblewrap: `make test` installs it (tests/ensure_tools.sh); without it these fail
# with the sandbox's own "is not installed" error.


def sandbox_config(**changes: Any) -> Config:
    base = {"code_interpreter__cpu_time_s": 2, "code_interpreter__wall_time_s": 5.0}
    base.update(changes)
    return replace(load_config({}), **base)


async def run_code(code: str, config: Config | None = None) -> ToolResult:
    config = config or sandbox_config()
    ts = classify_tools([{"type": "code_interpreter", "container": {"type": "auto"}}], config=config)
    call = ts.make_call("call_ci", "code_interpreter", orjson.dumps({"code": code}).decode())
    [result] = await run_gateway_calls([call], config=config)
    return result


async def assert_still_serving(config: Config | None = None) -> None:
    result = await run_code("print(sum(range(10)))", config)
    assert result.status == "completed", result.error
    assert result.outputs == [{"type": "logs", "logs": "45\n"}]


async def test_runs_python_and_returns_logs() -> None:
    code = "import sys\nprint('hello')\nprint('warn', file=sys.stderr)\nprint(2 ** 10)"
    result = await run_code(code)
    assert result.status == "completed" and result.error is None
    assert result.code == code
    assert result.outputs == [{"type": "logs", "logs": "hello\nwarn\n1024\n"}]
    assert result.output == "hello\nwarn\n1024\n"


async def test_an_exception_is_output_for_the_model_not_a_failure() -> None:
    result = await run_code("1 / 0")
    assert result.status == "completed"
    assert "ZeroDivisionError: division by zero" in result.output
    assert result.output.endswith("[exit status 1]")


async def test_each_call_gets_a_fresh_private_tmp() -> None:
    first = await run_code("open('note.txt', 'w').write('x'); import os; print(os.getcwd(), os.listdir('.'))")
    assert first.output == "/tmp ['note.txt']\n"
    second = await run_code("import os; print(os.listdir('/tmp'))")
    assert second.output == "[]\n"


async def test_reaching_the_network_fails() -> None:
    code = (
        "import socket\n"
        "for host, port in [('1.1.1.1', 53), ('127.0.0.1', 5432), ('127.0.0.1', 6379)]:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2)\n"
        "        print('CONNECTED', host, port)\n"
        "    except OSError as exc:\n"
        "        print('refused', host, port, exc.errno)\n"
        "import os\n"
        "print(sorted(os.listdir('/sys/class/net')) if os.path.exists('/sys/class/net') else 'no sysfs')\n"
    )
    started = time.monotonic()
    result = await run_code(code)
    assert time.monotonic() - started < 5
    assert "CONNECTED" not in result.output
    assert result.output.count("refused") == 3
    await assert_still_serving()


async def test_writing_outside_the_sandbox_fails(tmp_path: Any) -> None:
    target = tmp_path / "escape.txt"
    code = (
        "import os\n"
        f"for path in ['/usr/escape.txt', '/etc/escape.txt', {str(target)!r}, '/escape.txt']:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print('WROTE', path)\n"
        "    except OSError as exc:\n"
        "        print('denied', path, exc.errno)\n"
    )
    result = await run_code(code)
    assert "WROTE" not in result.output
    assert result.output.count("denied") == 4
    assert not target.exists()
    await assert_still_serving()


async def test_the_host_is_not_visible() -> None:
    code = (
        "import os\n"
        "print(sorted(os.listdir('/')))\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "print(os.getuid(), len(pids) <= 3, dict(os.environ).get('DATABASE_URL'))\n"
        "print(os.path.exists('/work'), os.path.exists('/root'), os.path.exists('/home'))\n"
    )
    result = await run_code(code)
    lines = result.output.splitlines()
    assert "work" not in lines[0] and "home" not in lines[0]
    assert lines[1] == "1000 True None"  # own uid, own PID namespace, no inherited environment
    assert lines[2] == "False False False"


async def test_a_fork_bomb_fails_cleanly() -> None:
    code = (
        "import os\n"
        "children = 0\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            while True:\n"
        "                pass\n"
        "        children += 1\n"
        "    except OSError:\n"
        "        print('fork refused after', children)\n"
        "        break\n"
    )
    started = time.monotonic()
    result = await run_code(code, sandbox_config(code_interpreter__max_processes=8))
    elapsed = time.monotonic() - started
    assert elapsed < 8, f"fork bomb ran {elapsed:.1f}s"
    assert "fork refused after" in result.output
    assert int(result.output.split("fork refused after")[1].split()[0]) < 8
    await assert_still_serving()


async def test_a_memory_bomb_fails_cleanly() -> None:
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(32 * 1024 * 1024))\n"
    started = time.monotonic()
    result = await run_code(code, sandbox_config(code_interpreter__memory_bytes=256 * 1024 * 1024))
    assert time.monotonic() - started < 8
    assert "MemoryError" in result.output
    await assert_still_serving()


async def test_an_endless_loop_hits_the_cpu_limit() -> None:
    # A generous wall clock: on a busy machine 1 s of CPU can take several seconds to use up.
    config = sandbox_config(code_interpreter__cpu_time_s=1, code_interpreter__wall_time_s=20.0)
    started = time.monotonic()
    result = await run_code("while True:\n    pass\n", config)
    elapsed = time.monotonic() - started
    assert result.status == "failed"
    assert result.error == "the program was stopped: CPU time limit of 1 s exceeded"
    assert result.output.endswith("[the program was stopped: CPU time limit of 1 s exceeded]")
    assert 0.9 < elapsed < 20
    await assert_still_serving()


async def test_a_sleeping_program_hits_the_wall_clock_limit() -> None:
    started = time.monotonic()
    result = await run_code(
        "import time\nprint('start', flush=True)\ntime.sleep(60)\n",
        sandbox_config(code_interpreter__wall_time_s=1.0),
    )
    elapsed = time.monotonic() - started
    assert result.status == "failed"
    assert result.error == "wall-clock time limit of 1 s exceeded; the program was stopped"
    assert result.outputs == [{"type": "logs", "logs": "start\n"}]
    assert elapsed < 10  # stopped, not slept out (60 s): a bound, not a speed check
    await assert_still_serving()


async def test_output_is_capped() -> None:
    started = time.monotonic()
    result = await run_code(
        "while True:\n    print('x' * 1000)\n", sandbox_config(code_interpreter__max_output_bytes=10_000)
    )
    assert time.monotonic() - started < 10  # a bound against hanging, not a speed check
    assert result.status == "failed"
    assert result.error == "output limit of 10000 bytes exceeded; the program was stopped"
    assert result.outputs is not None and len(result.outputs[0]["logs"]) == 10_000
    await assert_still_serving()


async def test_a_big_file_hits_the_file_size_limit() -> None:
    code = (
        "f = open('big', 'wb')\n"
        "try:\n"
        "    for _ in range(100):\n"
        "        f.write(b'x' * 1024 * 1024)\n"
        "        f.flush()\n"
        "except OSError as exc:\n"
        "    print('refused:', exc.strerror)\n"
        "import os\n"
        "print(os.path.getsize('big'))\n"
    )
    result = await run_code(code, sandbox_config(code_interpreter__max_file_size_bytes=1024 * 1024))
    assert result.output == "refused: File too large\n1048576\n"
    await assert_still_serving()


async def test_the_call_timeout_kills_a_running_sandbox() -> None:
    config = sandbox_config(code_interpreter__wall_time_s=30.0, tools__call_timeout_s=0.5)
    started = time.monotonic()
    result = await run_code("import time\ntime.sleep(30)\n", config)
    assert time.monotonic() - started < 10  # stopped, not slept out (30 s): a bound, not a speed check
    assert result.status == "failed"
    assert result.error == "code_interpreter call timed out after 0.5 s"
    await assert_still_serving()


async def test_missing_code_fails_the_call() -> None:
    config = sandbox_config()
    ts = classify_tools([{"type": "code_interpreter"}], config=config)
    [result] = await run_gateway_calls([ts.make_call("c", "code_interpreter", '{"code": ""}')], config=config)
    assert result.error == "code_interpreter needs 'code': the Python program to run"


async def test_missing_bwrap_fails_the_call_clearly() -> None:
    result = await run_code("print(1)", sandbox_config(code_interpreter__bwrap="/nonexistent/bwrap"))
    assert result.status == "failed"
    assert result.error == "the sandbox is unavailable: '/nonexistent/bwrap' (bubblewrap) is not installed"


async def test_disabled_interpreter_fails_the_call() -> None:
    result = await run_code("print(1)", sandbox_config(code_interpreter__enabled=False))
    assert result.error == "the code interpreter is disabled ([code_interpreter] enabled = false)"


def test_the_sandbox_runs_under_uvloop() -> None:
    """The gateway serves on uvloop (uvicorn): in-process calls must work on its event loop too."""
    import uvloop

    result = uvloop.run(run_code("import os\nprint(os.getuid(), os.getcwd())"))
    assert result.status == "completed", result.error
    assert result.output == "1000 /tmp\n"
