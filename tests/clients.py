"""The real clients the end-to-end tests drive, at the versions the issues name, installed from npm
into ``tests/.cache`` on first use: Codex (``@openai/codex``) and Claude Code
(``@anthropic-ai/claude-code``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.servers import ROOT

CODEX_VERSION = "0.171.0"
CLAUDE_CODE_VERSION = "2.1.332"
CACHE = ROOT / "tests" / ".cache"


def codex_cli() -> Path:
    """``$CODEX_BIN``, else the cached Codex CLI (fails without npm)."""
    return _npm_cli("CODEX_BIN", "codex", "@openai/codex", CODEX_VERSION, "codex")


def claude_code_cli() -> Path:
    """``$CLAUDE_CODE_BIN``, else the cached Claude Code CLI (fails without npm)."""
    return _npm_cli(
        "CLAUDE_CODE_BIN", "claude-code", "@anthropic-ai/claude-code", CLAUDE_CODE_VERSION, "claude"
    )


def _npm_cli(env: str, folder: str, package: str, version: str, command: str) -> Path:
    override = os.environ.get(env)
    if override:
        return Path(override)
    prefix = CACHE / folder
    binary = prefix / "node_modules" / ".bin" / command
    marker = prefix / "node_modules" / package / "package.json"
    if binary.exists() and marker.exists() and orjson.loads(marker.read_bytes()).get("version") == version:
        return binary
    npm = shutil.which("npm")
    if npm is None:
        # Not a skip: `make test` installs npm (tests/ensure_tools.sh); the test cannot run without it.
        pytest.fail(
            f"npm is not installed; this end-to-end test needs it to install {package} "
            "(tests/ensure_tools.sh installs it)"
        )
    prefix.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", f"{package}@{version}"],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return binary
