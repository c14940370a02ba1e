"""The type stubs match the compiled module, and mypy checks mcr programs with them.

src/mcr/_core.pyi describes the compiled core: its names are compared with the
runtime module (both ways) and each method's parameters (names, kinds,
defaults) with the signature Cython embeds in the docstring, since stubtest
cannot read signatures from a Cython module (it checks names only).
src/mcr/MPI.pyi lists mpi4py's namespace explicitly (a star import would let
mpi4py's Comm, Request, ... shadow mcr's in either mypy or pyright) and is
regenerated with ``python tests/test_typing.py``. Then mypy checks
tests/typing_sample.py (must pass) and a program with wrong calls (must fail).
"""

import ast
import importlib.util
import inspect
import os
import subprocess
import sys

import pytest

import mcr
import mcr.MPI  # first: it loads the libmpi the core links to (through mpi4py)
import mcr._core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src", "mcr")
CORE_STUB = os.path.join(SRC, "_core.pyi")
MPI_STUB = os.path.join(SRC, "MPI.pyi")
SAMPLE = os.path.join(ROOT, "tests", "typing_sample.py")

# mcr's replacements for mpi4py's names in mcr.MPI (src/mcr/MPI.py); the classes
# there are thin subclasses of these, typed as them (MPI.Exception is mpi4py's)
MCR_NAMES = ("COMM_SELF", "COMM_WORLD", "Comm", "Prequest", "Request", "Status")
# what Cython adds to the compiled module and its classes (not in the stub)
CYTHON_NAMES = {"__test__", "__reduce_cython__", "__setstate_cython__"}
# private names that are API all the same (the tests use them)
PRIVATE_API = {"_set_persistent_emulation", "_fast_tensor_path", "__bool__"}

needs_mypy = pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                                reason="mypy is not installed (pip install '.[test]')")


# -- The stub of mcr._core against the runtime ----------------------------------

def parse(path):
    with open(path) as f:
        return ast.parse(f.read(), path)


def stub_names(body):
    """The names a stub module or class body defines: {name: node}."""
    names = {}
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


def is_api(name):
    # private names such as the _BufSpec alias exist in the stub only
    return not name.startswith("_") or name in PRIVATE_API


def runtime_names(namespace, module):
    """Public names defined by mcr itself in a module or class namespace."""
    names = set()
    for name, value in namespace.items():
        if name in CYTHON_NAMES or inspect.ismodule(value):
            continue
        if not is_api(name):
            continue
        if (isinstance(value, type) or callable(value)) and \
                getattr(value, "__module__", module) != module:
            continue                            # imported, e.g. functools.partial
        names.add(name)
    return names


CORE = stub_names(parse(CORE_STUB).body)
CLASSES = [name for name, node in CORE.items() if isinstance(node, ast.ClassDef)]


def test_stub_has_the_module_names():
    runtime = runtime_names(vars(mcr._core), "mcr._core")
    stub = {name for name in CORE if is_api(name)}
    assert runtime - stub == set(), "in mcr._core but not in src/mcr/_core.pyi"
    assert stub - runtime == set(), "in src/mcr/_core.pyi but not in mcr._core"


@pytest.mark.parametrize("cls", CLASSES)
def test_stub_has_the_class_methods(cls):
    runtime = runtime_names(vars(getattr(mcr._core, cls)), "mcr._core")
    stub = {name for name in stub_names(CORE[cls].body) if is_api(name)}
    assert runtime - stub == set(), f"methods of mcr.{cls} missing from the stub"
    assert stub - runtime == set(), f"methods in the stub that mcr.{cls} does not define"


def embedded_signature(func, name):
    """The parameters Cython writes on the docstring's first line, as ast.arguments."""
    first = (func.__doc__ or "").lstrip().split("\n", 1)[0]
    assert first.startswith(name + "("), f"{name}: no embedded signature in {first!r}"
    return ast.parse(f"def {first}: pass").body[0].args


def shape(args):
    """(kind, name, default) per parameter; annotations are left out."""
    out = []
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + args.defaults
    for arg, default in zip(positional, defaults):
        out.append(("positional", arg.arg, default and ast.unparse(default)))
    if args.vararg:
        out.append(("*args", args.vararg.arg, None))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        out.append(("keyword", arg.arg, default and ast.unparse(default)))
    if args.kwarg:
        out.append(("**kwargs", args.kwarg.arg, None))
    return out


def is_property(node):
    # a property (or its setter) has no call signature to compare
    return any(ast.unparse(d) == "property" or ast.unparse(d).endswith((".setter", ".getter"))
               for d in node.decorator_list)


def stub_functions():
    for name, node in CORE.items():
        if isinstance(node, ast.FunctionDef):
            yield pytest.param(node, mcr._core, id=name)
    for cls in CLASSES:
        for name, node in stub_names(CORE[cls].body).items():
            if isinstance(node, ast.FunctionDef) and not name.startswith("__") \
                    and not is_property(node):
                yield pytest.param(node, getattr(mcr._core, cls), id=f"{cls}.{name}")


@pytest.mark.parametrize("node,owner", list(stub_functions()))
def test_stub_signature_matches_the_source(node, owner):
    func = getattr(owner, node.name, None)
    assert func is not None, f"{node.name}: in the stub but not at run time"
    assert shape(node.args) == shape(embedded_signature(func, node.name))


def test_backend_is_keyword_only_everywhere():
    # every method that takes a backend takes it keyword-only, default None
    comm = stub_names(CORE["Comm"].body)
    with_backend = [name for name, node in comm.items() if isinstance(node, ast.FunctionDef)
                    and ("keyword", "backend", "None") in shape(node.args)]
    assert len(with_backend) >= 55, with_backend
    for name, node in comm.items():
        if isinstance(node, ast.FunctionDef):
            assert ("positional", "backend", "None") not in shape(node.args), name


@needs_mypy
def test_stubtest(tmp_path):
    # stubtest compares names (and the types of constants) with the runtime
    allowlist = tmp_path / "allowlist.txt"
    allowlist.write_text("\n".join([r"mcr\._core\.__test__",
                                    r"mcr\._core\..*\.__reduce_cython__",
                                    r"mcr\._core\..*\.__setstate_cython__",
                                    # subclasses of torch's pybind11 classes: at run
                                    # time their metaclass is pybind11's, which
                                    # torch's stubs do not declare
                                    r"mcr\.distributed\.ProcessGroupMCR",
                                    r"mcr\.distributed\.Work"]) + "\n")
    cmd = [sys.executable, "-m", "mypy.stubtest", "--concise", "--ignore-disjoint-bases",
           "--allowlist", str(allowlist), "mcr"]  # and its submodules
    # run away from the source tree, where mypy would see src/mcr twice
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- The stub of mcr.MPI -----------------------------------------------------------

def mpi4py_public_names():
    """The public names of mpi4py's own stub of mpi4py.MPI (what a star import gives)."""
    import mpi4py
    names = set()
    body = list(parse(os.path.join(os.path.dirname(mpi4py.__file__), "MPI.pyi")).body)
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {name for name in names if not name.startswith("_")}


def render_mpi_stub():
    lines = [
        "# Type stub for mcr.MPI: mpi4py's namespace with mcr's communicators, requests",
        "# and status in place of mpi4py's. MPI.py copies mpi4py's names at run time,",
        "# which a type checker cannot follow; a star import cannot be used either",
        "# (mypy keeps the first binding of a name, pyright the last). Generated by",
        "# `python tests/test_typing.py` from mpi4py's own stub; do not edit.",
        "",
    ]
    lines += [f"from mcr._core import {name} as {name}" for name in MCR_NAMES]
    lines += ["", "from mpi4py.MPI import ("]
    lines += [f"    {name} as {name}," for name in sorted(mpi4py_public_names() - set(MCR_NAMES))]
    lines += [")", ""]
    return "\n".join(lines)


def test_mpi_stub_lists_mpi4py_namespace():
    tree = parse(MPI_STUB)
    imported = {}
    for node in tree.body:
        assert isinstance(node, ast.ImportFrom), "src/mcr/MPI.pyi: imports only"
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export as itself"
            imported[alias.name] = node.module
    assert {name for name, module in imported.items() if module == "mcr._core"} == \
        set(MCR_NAMES)
    stale = "src/mcr/MPI.pyi is out of date with mpi4py; run python tests/test_typing.py"
    assert set(imported) == mpi4py_public_names() | set(MCR_NAMES), stale
    missing = [name for name in imported if not hasattr(mcr.MPI, name)]
    assert missing == [], "in the stub but not in mcr.MPI at run time"
    for name in MCR_NAMES:
        mine, core = getattr(mcr.MPI, name), getattr(mcr._core, name)
        assert mine is core or issubclass(mine, core), name


# -- mypy on programs that use mcr -------------------------------------------------

def run_mypy(path, cache, *options):
    cmd = [sys.executable, "-m", "mypy", *options, "--no-error-summary", "--show-error-codes",
           "--no-color-output", "--cache-dir", str(cache), "--python-version",
           f"{sys.version_info[0]}.{sys.version_info[1]}", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert "error: Cannot find implementation or library stub" not in proc.stdout, proc.stdout
    return proc


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("mypy_cache")


@needs_mypy
def test_mypy_accepts_the_sample(mypy_cache):
    proc = run_mypy(SAMPLE, mypy_cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "", proc.stdout


@needs_mypy
def test_mypy_accepts_the_stubs(mypy_cache):
    # errors inside an installed package's stubs are hidden from its users: check
    # them directly, strictly (the ignore[override] comments must all be needed)
    proc = run_mypy(os.path.join("src", "mcr"), mypy_cache, "--strict", "--warn-unused-ignores")
    assert proc.returncode == 0, proc.stdout + proc.stderr


BAD_CALLS = {
    "comm.Allreduce(x, y, op=MPI.SUM, backend=3)": "arg-type",
    "comm.Allreduce(x, y, MPI.SUM, 'mpi')": "call-arg",          # backend is keyword-only
    "comm.Allredcue(x, y)": "attr-defined",
    "comm.Allreduce(x)": "call-arg",
    "comm.Igatherv(x, [y, [1], [0]], root=0).Wait(status=3)": "arg-type",
    "MPI.COMM_WORLD.Bcast(x, root='0')": "arg-type",
    "n: str = MPI.Status().Get_count(MPI.DOUBLE)": "assignment",
    "req: mcr.Request = comm.Allreduce_init(x, y); mcr.Prequest.Startall([req])": "list-item",
    "MPI.DUBLE": "attr-defined",
}


@needs_mypy
def test_mypy_rejects_wrong_calls(tmp_path, mypy_cache):
    header = ["import torch", "import mcr", "from mcr import MPI", "",
              "comm = mcr.COMM_WORLD", "x = torch.ones(4)", "y = torch.zeros(4)"]
    lines = header + list(BAD_CALLS)
    program = tmp_path / "wrong_calls.py"
    program.write_text("\n".join(lines) + "\n")
    proc = run_mypy(program, mypy_cache)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = {}
    for line in proc.stdout.splitlines():
        if ": error: " in line:
            lineno = int(line.split(":")[1])
            errors.setdefault(lines[lineno - 1], []).append(line)
    for call, code in BAD_CALLS.items():
        assert call in errors, f"mypy did not flag {call!r}:\n{proc.stdout}"
        assert any(f"[{code}]" in e for e in errors[call]), (call, errors[call])


def test_sample_runs():
    # the sample is a real program: it runs (one process) and checks its results
    proc = subprocess.run([sys.executable, SAMPLE], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


if __name__ == "__main__":
    with open(MPI_STUB, "w") as f:
        f.write(render_mpi_stub())
    print(f"wrote {MPI_STUB}")
