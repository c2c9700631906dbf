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
PACKAGES = (
    "gateway",
    "responses_app",
    "messages_app",
    "passthrough_app",
    "conversations_app",
    "inference_app",
    "usage_app",
    "files_app",
)

# One violation of each rule of the layers contract (DESIGN.md "Where code lives"), and of vLLM's.
VIOLATIONS = {
    "conversations_app/zz_up.py": "import responses_app.models\n",
    "gateway/core/zz_app.py": "def f():\n    from inference_app.upstream import http\n",
    "messages_app/zz_sibling.py": "import passthrough_app.routes\n",
    "responses_app/zz_sibling.py": "from messages_app import routes\n",
    "inference_app/upstream/zz_engine.py": "from inference_app.engine.host import EngineHost\n",
    "inference_app/tools/zz_engine.py": "from inference_app.engine import tasks\n",
    "usage_app/zz_up.py": "import inference_app.upstream.http\n",
    "files_app/zz_up.py": "def f():\n    from inference_app.tools import dispatch\n",
    "responses_app/zz_torch.py": "import torch\n",
}


@pytest.fixture(scope="module")
def lint_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    copy = tmp_path_factory.mktemp("lint")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
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
    assert len(names) == 2
    for name in names:
        assert f"{name} BROKEN" in flat, name
    for line in (
        "conversations_app.zz_up -> responses_app.models",
        "gateway.core.zz_app -> inference_app.upstream.http",  # lazy imports count
        "messages_app.zz_sibling -> passthrough_app.routes",
        "responses_app.zz_sibling -> messages_app.routes",
        "inference_app.upstream.zz_engine -> inference_app.engine.host",
        "inference_app.tools.zz_engine -> inference_app.engine.tasks",
        "usage_app.zz_up -> inference_app.upstream.http",
        "files_app.zz_up -> inference_app.tools.dispatch",
        "responses_app.zz_torch -> torch",
    ):
        assert line in lint_output, line


@pytest.mark.process
def test_private_names_checker(tmp_path: Path) -> None:
    pkg = tmp_path / "responses_app"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "executor.py").write_text("def _db():\n    pass\n\n\ndef own():\n    return _db()\n")
    (pkg / "services.py").write_text("from responses_app.executor import _db\n")
    (pkg / "views.py").write_text(
        "from responses_app import executor\n\n\ndef f():\n    return executor._db(), executor.own()\n"
    )
    (pkg / "ok.py").write_text("from responses_app.executor import own\nfrom os import __name__ as n\n")
    proc = check_private_names(tmp_path, pkg)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1
    assert len(lines) == 2, lines
    assert lines[0].endswith("services.py:1: imports _db from responses_app.executor")
    assert lines[1].endswith("views.py:5: uses executor._db of responses_app.executor")
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
        "from responses_app.lifecycle import Lifecycle\n\n\n"
        "class Executor(Lifecycle):\n    def _run(self):\n        return self._finish()\n\n"
        "    def rounds(self):\n        return self._run()\n"
    )
    (pkg / "multi_agent.py").write_text(
        "from responses_app.executor import Executor\n\n\n"
        "class Coordinator(Executor):\n    def _run(self):\n        return self._done\n\n"
        "    def _own(self):\n        return self.settle(), self.rounds()\n"
    )
    proc = check_private_names(tmp_path, pkg)
    lines = sorted(line.split("responses_app/", 1)[1] for line in proc.stdout.splitlines())
    assert proc.returncode == 1
    assert lines == [
        "executor.py:6: Executor uses responses_app.lifecycle.Lifecycle._finish",
        "multi_agent.py:5: Coordinator overrides responses_app.executor.Executor._run",
        "multi_agent.py:6: Coordinator uses responses_app.lifecycle.Lifecycle._done",
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
