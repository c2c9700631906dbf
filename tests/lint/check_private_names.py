"""No module imports another module's ``_private`` names (``make lint``).

``from pkg.mod import _name`` and ``from pkg import mod`` followed by ``mod._name`` are refused
unless the importer is ``pkg.mod`` itself; dunders (``__version__``) are public. A class that
subclasses a class of another module neither overrides nor uses (``self._name``) the private methods
and attributes that class (or its bases) defines: it uses the base's public seams. Private *modules*
(``pkg._mod``) are import-linter's ``private_modules`` contract. ruff's PLC2701 is not used: it is a
preview rule in the pinned ruff and it skips imports within the same top-level package, which is
where ours were (``responses_app.engine.executor._db`` from three modules of ``responses_app``).

Usage: ``python tests/lint/check_private_names.py [--root DIR] [paths...]`` (default: the packages
of this repository); exit 1 with one line per offence.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "gateway",
    "responses_app",
    "messages_app",
    "passthrough_app",
    "conversations_app",
    "inference_app",
)


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
    yield from subclass_offences(path, tree, importer, root)


def _class_def(module: str, name: str, root: Path) -> tuple[ast.ClassDef, dict[str, str]] | None:
    """The definition of class ``name`` in ``module`` and that module's imported names (local name ->
    defining module), or ``None`` when it is not a class of ours."""
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = {
        alias.asname or alias.name: _absolute(node, module, False)
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node, imported
    return None


def _private_members(module: str, name: str, root: Path, seen: set[tuple[str, str]]) -> dict[str, str]:
    """The private methods and ``self._x`` attributes of class ``name`` of ``module`` and of its
    bases, each with where it is defined (``module.Class``)."""
    if (module, name) in seen:
        return {}
    seen.add((module, name))
    found = _class_def(module, name, root)
    if found is None:
        return {}
    cls, imported = found
    members: dict[str, str] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name):
            members.update(_private_members(imported.get(base.id, module), base.id, root, seen))
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _private(node.name):
            members[node.name] = f"{module}.{name}"
        elif (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            members.setdefault(node.attr, f"{module}.{name}")
    return members


def subclass_offences(path: Path, tree: ast.Module, importer: str, root: Path) -> Iterator[str]:
    """Private members of a base class from another module, overridden or used by a subclass here."""
    imported = {
        alias.asname or alias.name: _absolute(node, importer, path.name == "__init__.py")
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        inherited: dict[str, str] = {}
        for base in cls.bases:
            if not isinstance(base, ast.Name):
                continue
            source = imported.get(base.id)
            if source and source != importer and source.split(".")[0] in PACKAGES:
                inherited.update(_private_members(source, base.id, root, set()))
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in inherited:
                where = inherited[node.name]
                yield f"{path}:{node.lineno}: {cls.name} overrides {where}.{node.name}|{importer}|{node.name}"
            elif (
                isinstance(node, ast.Attribute)
                and node.attr in inherited
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                where = inherited[node.attr]
                yield f"{path}:{node.lineno}: {cls.name} uses {where}.{node.attr}|{importer}|{node.attr}"


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
