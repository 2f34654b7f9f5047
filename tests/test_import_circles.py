"""No import circle in stacx/ (issue 44): a module never imports, through any chain of imports,
a module that imports it. Imports under ``if TYPE_CHECKING:`` count too: they never run, but a
type is a dependency all the same (a circle of types is one of modules to a reader). The layer
contracts (pyproject.toml, `lint-imports`) check the arrows between packages; this checks every
module, inside a package too, and every folder taken whole (a folder is a layer: no two folders
import each other through any chain, even where the contracts split one, as stacx.harbor)."""

from __future__ import annotations

import grimp


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_stacx_has_no_import_circle() -> None:
    graph = grimp.build_graph("stacx", exclude_type_checking_imports=False)
    assert circles(graph) == []


def rooms(graph: grimp.ImportGraph) -> grimp.ImportGraph:
    """`graph` with every module folded into its room: its folder of stacx/ (stacx.harbor), or
    itself when it stands at the top (stacx.ports)."""
    folded = grimp.ImportGraph()
    for module in graph.modules:
        room = ".".join(module.split(".")[:2])
        folded.add_module(room)
        for imported in graph.find_modules_directly_imported_by(module):
            if (to := ".".join(imported.split(".")[:2])) != room:
                folded.add_import(importer=room, imported=to)
    return folded


def test_no_folder_of_stacx_imports_back_up() -> None:
    # a folder is a layer: with no circle between rooms they stand on floors, every arrow down
    graph = grimp.build_graph("stacx", exclude_type_checking_imports=False)
    assert circles(rooms(graph)) == []


def test_a_circle_is_found() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=importer, imported=imported)
    assert circles(graph) == [["p.a", "p.b", "p.c"]]
    # and between rooms: a module of one folder imports a module that imports that folder
    graph = grimp.ImportGraph()
    for importer, imported in [("p.low", "p.high.model"), ("p.high.tasks", "p.low")]:
        graph.add_import(importer=importer, imported=imported)
    assert circles(graph) == [] and circles(rooms(graph)) == [["p.high", "p.low"]]
