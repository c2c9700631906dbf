"""import-linter contract types of our own (registered in pyproject.toml's ``[tool.importlinter]``).

``no_cycles``: no module of the root packages takes part in an import cycle, however long, lazy
(function-level) and ``TYPE_CHECKING`` imports included. import-linter's own ``acyclic_siblings``
only compares siblings under one parent; a cycle can run across our four packages
(``gateway.fastpath`` <-> ``responses_app.api.fastpath``), so this one looks at the whole graph.

``only_imports``: a package imports nothing but what its row of DESIGN.md's "may import" column
names (and the standard library). import-linter's ``forbidden`` lists what may not be imported; this
lists what may, so a new dependency has to be added on purpose.

Only the public custom-contract API is used (``importlinter.Contract``, ``fields``, ``output``).
"""

from __future__ import annotations

import sys
from typing import Any

from importlinter import Contract, ContractCheck, fields, output


def _cycles(graph: Any, modules: set[str]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root) & modules)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child) & modules)))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


class NoCyclesContract(Contract):
    """No import cycles among the modules of ``containers``.

    Options: ``containers`` (the packages to look in), ``ignore_imports`` (exact ``a -> b`` imports
    left out, each one still present or a warning says it can go).
    """

    type_name = "no_cycles"

    containers = fields.ListField(subfield=fields.StringField())
    ignore_imports = fields.ListField(subfield=fields.StringField(), required=False)

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        warnings: list[str] = []
        for expression in self.ignore_imports or []:  # type: ignore[attr-defined,union-attr]
            importer, _, imported = (part.strip() for part in str(expression).partition("->"))
            if graph.direct_import_exists(importer=importer, imported=imported):
                graph.remove_import(importer=importer, imported=imported)
            else:
                warnings.append(f"No matches for ignored import {importer} -> {imported}.")
        containers = [str(c) for c in self.containers]  # type: ignore[attr-defined,union-attr]
        modules = {m for m in graph.modules if any(m == c or m.startswith(c + ".") for c in containers)}
        cycles = []
        for component in _cycles(graph, modules):
            edges = []
            for importer in component:
                for imported in sorted(graph.find_modules_directly_imported_by(importer) & set(component)):
                    lines = [
                        d["line_number"]
                        for d in graph.get_import_details(importer=importer, imported=imported)
                    ]
                    edges.append((importer, imported, lines))
            cycles.append({"modules": component, "imports": edges})
        return ContractCheck(kept=not cycles, warnings=warnings, metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"Import cycle: {', '.join(cycle['modules'])}", bold=True)
            output.indent_cursor()
            for importer, imported, lines in cycle["imports"]:
                output.print_error(f"{importer} -> {imported} (l. {', '.join(map(str, lines))})", bold=False)
            output.new_line()


def _within(module: str, packages: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


class OnlyImportsContract(Contract):
    """The modules of ``source_modules`` (packages, descendants included) import directly only
    ``allowed_modules`` (each with its descendants), the standard library and one another; lazy and
    ``TYPE_CHECKING`` imports included."""

    type_name = "only_imports"

    source_modules = fields.ListField(subfield=fields.StringField())
    allowed_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        sources = [str(m) for m in self.source_modules]  # type: ignore[attr-defined,union-attr]
        allowed = [str(m) for m in self.allowed_modules]  # type: ignore[attr-defined,union-attr]
        stdlib = sys.stdlib_module_names
        imports = []
        for importer in sorted(m for m in graph.modules if _within(m, sources)):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if imported.split(".")[0] in stdlib or _within(imported, sources + allowed):
                    continue
                lines = [
                    d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)
                ]
                imports.append((importer, imported, lines))
        return ContractCheck(kept=not imports, warnings=[], metadata={"imports": imports})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, lines in check.metadata["imports"]:
            output.print_error(f"{importer} -> {imported} (l. {', '.join(map(str, lines))})", bold=True)
        output.new_line()
