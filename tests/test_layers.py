"""mcr's layers: the graph of which module imports which has no cycle.

The graph is read from the source files, not from an imported mcr: every
``import`` of src/mcr/**/*.py, those inside functions included, leaving out
``if TYPE_CHECKING:`` blocks, which never run. The compiled core is one module,
``mcr._core``: the Python imports of src/mcr/_core.pyx and src/mcr/core/*.pyx/*.pxi
(``cimport`` is C-level and does not count). ``from mcr import name`` is an edge
to ``mcr.name`` when that is a module, else to ``mcr``, whose ``__init__`` is the
top layer: a module below that imports a name from it closes a cycle.
"""

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

SRC = Path(__file__).resolve().parent.parent / "src"
CORE = "mcr._core"
# the Python imports of a Cython file, one statement a line (cimport excluded)
CYTHON_FROM = re.compile(r"^\s*from\s+(\.*[\w.]*)\s+import\s+(.+)$")
CYTHON_IMPORT = re.compile(r"^\s*import\s+(.+)$")


def module_name(path: Path) -> str:
    """``src/mcr/backends/base.py`` -> ``mcr.backends.base``; ``__init__.py`` -> the package."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def statements(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports of ``tree`` that can run: not under ``if TYPE_CHECKING:`` (its else is)."""
    if isinstance(tree, ast.If) and is_type_checking(tree.test):
        children: list[ast.AST] = list(tree.orelse)
    else:
        children = list(ast.iter_child_nodes(tree))
    for child in children:
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        else:
            yield from statements(child)


class Graph:
    """mcr's modules and, for each, the mcr modules it imports."""

    def __init__(self) -> None:
        self.files = {module_name(p): p for p in sorted((SRC / "mcr").rglob("*.py"))}
        self.modules = set(self.files) | {CORE}
        self.edges: dict[str, set[str]] = {name: set() for name in self.modules}
        for name, path in self.files.items():
            for node in statements(ast.parse(path.read_text(), str(path))):
                self.add(name, path.name == "__init__.py", node)
        core = SRC / "mcr" / "core"
        for path in [SRC / "mcr" / "_core.pyx", *sorted(core.glob("*.pyx")),
                     *sorted(core.glob("*.pxi"))]:
            for line in path.read_text().splitlines():
                self.add_cython_line(line)

    def package_of(self, module: str, is_package: bool, level: int) -> str:
        """The package a relative import of ``level`` dots in ``module`` starts from."""
        parts = module.split(".") if is_package else module.split(".")[:-1]
        return ".".join(parts[:len(parts) - (level - 1)])

    def link(self, source: str, dotted: str) -> None:
        """An edge to the deepest mcr module that ``dotted`` names or is inside of."""
        parts = dotted.split(".")
        while parts and ".".join(parts) not in self.modules:
            parts.pop()
        if parts and ".".join(parts) != source:
            self.edges[source].add(".".join(parts))

    def link_from(self, source: str, origin: str, names: list[str]) -> None:
        """``from origin import names``: each name a module, else origin itself."""
        for name in names:
            self.link(source, f"{origin}.{name}" if f"{origin}.{name}" in self.modules else origin)

    def add(self, source: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                self.link(source, alias.name)
            return
        origin = node.module or ""
        if node.level:
            base = self.package_of(source, is_package, node.level)
            origin = f"{base}.{origin}" if origin else base
        self.link_from(source, origin, [alias.name for alias in node.names])

    def add_cython_line(self, line: str) -> None:
        if line.lstrip().startswith("#") or "cimport" in line:
            return
        line = line.split("#", 1)[0]
        if found := CYTHON_FROM.match(line):
            origin, rest = found.group(1), found.group(1).lstrip(".")
            if origin.startswith("."):         # relative to the package mcr
                base = self.package_of(CORE, False, len(origin) - len(rest))
                origin = f"{base}.{rest}" if rest else base
            names = [n.split(" as ")[0].strip(" ()") for n in found.group(2).split(",")]
            self.link_from(CORE, origin, [n for n in names if n])
        elif found := CYTHON_IMPORT.match(line):
            for name in found.group(1).split(","):
                self.link(CORE, name.split(" as ")[0].strip())

    def without(self, module: str) -> "Graph":
        """This graph less ``module`` and the imports to and from it."""
        less = object.__new__(Graph)
        less.files, less.modules = self.files, self.modules - {module}
        less.edges = {name: targets - {module} for name, targets in self.edges.items()
                      if name != module}
        return less

    def cycles(self) -> list[list[str]]:
        """For each import on a cycle, a shortest cycle through it, from its least module."""
        found: list[list[str]] = []
        for source in sorted(self.modules):
            for target in sorted(self.edges[source]):
                back = self.path(target, source)
                if back is None:
                    continue
                ring = [source, *back[:-1]]
                first = ring.index(min(ring))
                cycle = ring[first:] + ring[:first] + [min(ring)]
                if cycle not in found:
                    found.append(cycle)
        return found

    def path(self, start: str, goal: str) -> list[str] | None:
        """A shortest import path from ``start`` to ``goal`` (both included), or None."""
        before: dict[str, str] = {start: start}
        frontier = [start]
        while frontier and goal not in before:
            following = []
            for module in frontier:
                for target in sorted(self.edges[module] - before.keys()):
                    before[target] = module
                    following.append(target)
            frontier = following
        if goal not in before:
            return None
        found = [goal]
        while found[-1] != start:
            found.append(before[found[-1]])
        return found[::-1]


@pytest.fixture(scope="module")
def graph() -> Graph:
    return Graph()


def test_the_graph_is_read_from_every_module(graph):
    # the parts this check relies on are where it looks for them
    assert {"mcr", "mcr.backends", "mcr.backends.base", CORE} <= graph.modules
    assert len(graph.files) > 40
    assert "mcr._core" in graph.edges["mcr.backends.base"]      # a module-level import
    assert {"mcr.errors", "mcr._services"} <= graph.edges[CORE]  # the core's (.pxi) imports
    assert "mcr.log.config" in graph.edges["mcr"]        # in a function: from .log.config
    assert "mcr.backends.compose" in graph.edges["mcr.backends.torchpg"]   # relative


def cycles_text(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_import_cycles_among_the_python_modules(graph):
    cycles = graph.without(CORE).cycles()
    assert not cycles, f"import cycles (each a path of imports):\n{cycles_text(cycles)}"


def test_the_core_imports_no_module_that_imports_it(graph):
    # the core calls down: a module it imports at call time must not reach it
    cycles = [cycle for cycle in graph.cycles() if CORE in cycle]
    assert not cycles, f"import cycles through {CORE}:\n{cycles_text(cycles)}"


def test_the_core_imports_only_leaves(graph):
    # what the core imports imports nothing of mcr's: the modules above the
    # core are provided to it (mcr._services), never imported by it
    above = {module: sorted(graph.edges[module]) for module in graph.edges[CORE]
             if graph.edges[module]}
    assert not above, f"{CORE} imports modules that import mcr's: {above}"


def test_the_core_catches_python_errors_by_the_builtins_name():
    # in the core, ``Exception`` is mcr.Exception (MPI's errors): an ``except Exception``
    # there lets every other error through (``_builtins.Exception`` is Python's)
    core = sorted((SRC / "mcr" / "core").glob("*.px[id]")) + sorted(
        (SRC / "mcr" / "core").glob("*.pyx"))
    assert core, "no core sources found"
    found = [f"{path.name}:{number}: {line.strip()}" for path in core
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"except\s*\(?[^:]*(?<![\w.])Exception\b", line)]
    assert not found, found


def test_every_public_submodule_is_an_attribute_of_mcr():
    # ``mcr.backends.names()`` after a plain ``import mcr``, as the docs write it
    public = sorted(path.stem if path.is_file() else path.name
                    for path in (SRC / "mcr").iterdir()
                    if not path.name.startswith("_") and path.name != "core"
                    and (path.suffix == ".py" and path.stem != "MPI"
                         or (path / "__init__.py").exists()))
    code = ("import mcr, sys; names = sys.argv[1:]; "
            "assert set(names) == set(mcr._SUBMODULES), sorted(mcr._SUBMODULES); "
            "assert all(getattr(mcr, n).__name__ == 'mcr.' + n for n in names)")
    done = subprocess.run([sys.executable, "-c", code, *public], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
