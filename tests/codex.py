"""The Codex CLI the end-to-end tests drive: ``@openai/codex`` at the version the issues name."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.servers import ROOT

CODEX_VERSION = "0.171.0"
CACHE = ROOT / "tests" / ".cache" / "codex"


def codex_cli() -> Path:
    """``$CODEX_BIN``, else the cached CLI, installed from npm when missing (skips without npm)."""
    override = os.environ.get("CODEX_BIN")
    if override:
        return Path(override)
    binary = CACHE / "node_modules" / ".bin" / "codex"
    marker = CACHE / "node_modules" / "@openai" / "codex" / "package.json"
    if marker.exists() and orjson.loads(marker.read_bytes()).get("version") == CODEX_VERSION:
        return binary
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed; the Codex end-to-end tests need it to install @openai/codex")
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", f"@openai/codex@{CODEX_VERSION}"],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return binary
