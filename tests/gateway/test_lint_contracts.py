"""`make lint`'s architecture rules fail when broken: every import-linter contract of pyproject.toml
against a copy of the packages with one violation each, and the private-names checker; and the
executor stays split by job (its size bound)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "responses_app", "conversations_app", "inference_app", "tests/lint")

VIOLATIONS = {
    "conversations_app/zz_cycle_a.py": "from conversations_app import zz_cycle_b\n",
    "conversations_app/zz_cycle_b.py": "def f():\n    from conversations_app import zz_cycle_a\n",
    "conversations_app/zz_layer.py": "import responses_app.models\n",
    "inference_app/zz_layer.py": "def f():\n    from gateway import views\n",
    "responses_app/zz_engine.py": "from inference_app.engine.host import EngineHost\n",
    "responses_app/zz_http.py": "from conversations_app.views import ConversationDetailView\n",
    "gateway/zz_torch.py": "import torch\n",
    "responses_app/zz_uvicorn.py": "from uvicorn.protocols.http import httptools_impl\n",
    "gateway/zz_client.py": "import httpx\n",
    "inference_app/zz_client.py": "import httptools\n",
    "gateway/_zz_private.py": "X = 1\n",
    "responses_app/zz_private.py": "from gateway import _zz_private\n",
}


@pytest.fixture(scope="module")
def lint_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    copy = tmp_path_factory.mktemp("lint")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tests" / "__init__.py").write_text("")  # the custom contract type: tests.lint.import_contracts
    for path, text in VIOLATIONS.items():
        (copy / path).write_text(text)
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("lint-imports")),
            "--config",
            str(ROOT / "pyproject.toml"),
            "--no-cache",
        ],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc.stdout


def check_private_names(root: Path, pkg: Path) -> subprocess.CompletedProcess[str]:
    """The private-names check run over ``pkg`` in a scratch tree rooted at ``root``."""
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "lint" / "check_private_names.py"),
            "--root",
            str(root),
            str(pkg),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.process
@pytest.mark.timeout(600)  # lint-imports over the whole project
def test_the_real_packages_keep_every_contract() -> None:
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.process
@pytest.mark.timeout(600)  # lint-imports over the whole project
def test_every_contract_fails_when_violated(lint_output: str) -> None:
    import tomllib

    names = [
        c["name"]
        for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    ]
    summary = lint_output.split("Broken contracts")[0]
    flat = " ".join(summary.split())  # import-linter wraps long names
    assert len(names) == 10
    for name in names:
        assert f"{name} BROKEN" in flat, name
    assert "Import cycle: conversations_app.zz_cycle_a, conversations_app.zz_cycle_b" in lint_output


@pytest.mark.process
def test_private_names_checker(tmp_path: Path) -> None:
    pkg = tmp_path / "responses_app"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "executor.py").write_text("def _db():\n    pass\n\n\ndef own():\n    return _db()\n")
    (pkg / "services.py").write_text("from responses_app.engine.executor import _db\n")
    (pkg / "views.py").write_text(
        "from responses_app import executor\n\n\ndef f():\n    return executor._db(), executor.own()\n"
    )
    (pkg / "ok.py").write_text(
        "from responses_app.engine.executor import own\nfrom os import __name__ as n\n"
    )
    proc = check_private_names(tmp_path, pkg)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1
    assert len(lines) == 2, lines
    assert lines[0].endswith("services.py:1: imports _db from responses_app.engine.executor")
    assert lines[1].endswith("views.py:5: uses executor._db of responses_app.engine.executor")
    clean = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "lint" / "check_private_names.py")], cwd=ROOT, timeout=60
    )
    assert clean.returncode == 0


@pytest.mark.process
def test_private_names_checker_refuses_a_subclass_using_its_bases_privates(tmp_path: Path) -> None:
    """A subclass in another module uses its base's public seams: overriding or calling a private
    method (or using a private attribute) of the base, or of the base's own base, is an offence."""
    pkg = tmp_path / "responses_app"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "lifecycle.py").write_text(
        "class Lifecycle:\n    def _finish(self):\n        self._done = True\n\n    def settle(self):\n        pass\n"
    )
    (pkg / "executor.py").write_text(
        "from responses_app.engine.lifecycle import Lifecycle\n\n\n"
        "class Executor(Lifecycle):\n    def _run(self):\n        return self._finish()\n\n"
        "    def rounds(self):\n        return self._run()\n"
    )
    (pkg / "multi_agent.py").write_text(
        "from responses_app.engine.executor import Executor\n\n\n"
        "class Coordinator(Executor):\n    def _run(self):\n        return self._done\n\n"
        "    def _own(self):\n        return self.settle(), self.rounds()\n"
    )
    proc = check_private_names(tmp_path, pkg)
    lines = sorted(line.split("responses_app/", 1)[1] for line in proc.stdout.splitlines())
    assert proc.returncode == 1
    assert lines == [
        "executor.py:6: Executor uses responses_app.engine.lifecycle.Lifecycle._finish",
        "multi_agent.py:5: Coordinator overrides responses_app.engine.executor.Executor._run",
        "multi_agent.py:6: Coordinator uses responses_app.engine.lifecycle.Lifecycle._done",
    ], lines


# The executor keeps the round loop and storage only (docs/responses.md, "Code layout"); what else
# lands in it goes to the module that owns the job.
LINE_BOUNDS = {"responses_app/engine/executor.py": 300}


def over_bound(path: Path, bound: int) -> str | None:
    lines = len(path.read_text().splitlines())
    if lines <= bound:
        return None
    return f"{path}: {lines} lines, over its bound of {bound}"


def test_the_executor_stays_within_its_line_bound(tmp_path: Path) -> None:
    for relative, bound in LINE_BOUNDS.items():
        assert over_bound(ROOT / relative, bound) is None
    grown = tmp_path / "executor.py"
    grown.write_text("x = 1\n" * 301)
    assert over_bound(grown, 300) == f"{grown}: 301 lines, over its bound of 300"
