"""No module imports another module's ``_private`` names (``make lint``).

``from pkg.mod import _name`` and ``from pkg import mod`` followed by ``mod._name`` are refused
unless the importer is ``pkg.mod`` itself; dunders (``__version__``) are public. Private *modules*
(``pkg._mod``) are import-linter's ``private_modules`` contract. ruff's PLC2701 is not used: it is a
preview rule in the pinned ruff and it skips imports within the same top-level package, which is
where ours were (``responses_app.executor._db`` from three modules of ``responses_app``).

Usage: ``python tests/lint/check_private_names.py [--root DIR] [paths...]`` (default: the four packages
of this repository); exit 1 with one line per offence.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "responses_app", "conversations_app", "inference_app")


# Known offences that another branch removes, as (importer module, imported name): each must still
# exist (a stale entry is reported too), so the list only shrinks.
ALLOWED: set[tuple[str, str]] = set()


def _is_module(dotted: str, root: Path) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.resolve().relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def offences(path: Path, root: Path = ROOT) -> Iterator[str]:
    importer = module_name(path, root)
    tree = ast.parse(path.read_text(), filename=str(path))
    imported_modules: dict[str, str] = {}  # local name -> module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node, importer, path.name == "__init__.py")
            for alias in node.names:
                if _private(alias.name) and source != importer:
                    yield f"{path}:{node.lineno}: imports {alias.name} from {source}|{importer}|{alias.name}"
                elif not _private(alias.name) and _is_module(f"{source}.{alias.name}", root):
                    imported_modules[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    imported_modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported_modules
            and imported_modules[node.value.id].split(".")[0] in PACKAGES
        ):
            where = imported_modules[node.value.id]
            yield f"{path}:{node.lineno}: uses {node.value.id}.{node.attr} of {where}|{importer}|{node.attr}"


def main(argv: list[str]) -> int:
    root = ROOT
    if argv[:1] == ["--root"]:
        root, argv = Path(argv[1]).resolve(), argv[2:]
    paths = [Path(p) for p in argv] or [root / p for p in PACKAGES]
    files = [f for p in paths for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])]
    found: list[str] = []
    allowed_seen: set[tuple[str, str]] = set()
    for f in files:
        if "migrations" in f.parts:
            continue
        for line in offences(f, root):
            message, importer, name = line.rsplit("|", 2)
            if (importer, name) in ALLOWED:
                allowed_seen.add((importer, name))
            else:
                found.append(message)
    if not argv:
        found += [
            f"ALLOWED entry {entry} no longer occurs: remove it" for entry in sorted(ALLOWED - allowed_seen)
        ]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
