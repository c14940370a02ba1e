"""The type stubs match the compiled module, and mypy checks mcr programs with them.

src/mcr/_core.pyi: names against the runtime module (both ways), each method's parameters
against the signature Cython embeds in its docstring (stubtest reads only names from Cython).
src/mcr/MPI.pyi lists mpi4py's namespace explicitly (a star import would let mpi4py's Comm,
... shadow mcr's); ``python tests/test_typing.py`` regenerates it. mypy must accept
tests/typing_sample.py and the stubs (strictly, in one run), and reject a program with wrong calls.
"""

import ast
import importlib.util
import inspect
import os
import pathlib
import sys

import pytest

import mcr
import mcr.MPI  # first: it loads the libmpi the core links to (through mpi4py)
import mcr._core
from mpiharness import Background, scratch_folder

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

HAVE_MYPY = importlib.util.find_spec("mypy") is not None
needs_mypy = pytest.mark.skipif(not HAVE_MYPY,
                                reason="mypy is not installed (pip install '.[test]')")


# -- The stub of mcr._core against the runtime ----------------------------------

def parse(path):
    return ast.parse(pathlib.Path(path).read_text(), path)


def stub_names(body):
    """The names a stub module or class body defines: {name: node}."""
    names = {}
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Assign):
            names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
    return names


def is_api(name):
    # private names such as the _BufSpec alias exist in the stub only
    return not name.startswith("_") or name in PRIVATE_API


def runtime_names(namespace, module):
    """Public names defined by mcr itself in a module or class namespace."""
    def imported(value):        # e.g. functools.partial
        return (isinstance(value, type) or callable(value)) and \
            getattr(value, "__module__", module) != module
    return {name for name, value in namespace.items() if is_api(name) and name not in CYTHON_NAMES
            and not inspect.ismodule(value) and not imported(value)}


CORE = stub_names(parse(CORE_STUB).body)
CLASSES = [name for name, node in CORE.items() if isinstance(node, ast.ClassDef)]


@pytest.mark.parametrize("cls", ["module", *CLASSES])
def test_stub_has_the_runtime_names(cls):
    where, names = ("mcr._core", CORE) if cls == "module" else \
        (f"mcr._core.{cls}", stub_names(CORE[cls].body))
    runtime = runtime_names(vars(eval(where)), "mcr._core")
    stub = {name for name in names if is_api(name)}
    assert runtime - stub == set(), f"in {where} but not in src/mcr/_core.pyi"
    assert stub - runtime == set(), f"in src/mcr/_core.pyi but not in {where}"


def shape(args):
    """(kind, name, default) per parameter; annotations are left out."""
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + args.defaults
    return ([("positional", a.arg, d and ast.unparse(d)) for a, d in zip(positional, defaults)]
            + [("*args", a.arg, None) for a in [args.vararg] if a]
            + [("keyword", a.arg, d and ast.unparse(d))
               for a, d in zip(args.kwonlyargs, args.kw_defaults)]
            + [("**kwargs", a.arg, None) for a in [args.kwarg] if a])


def stub_functions():
    for name, node in CORE.items():
        if isinstance(node, ast.FunctionDef):
            yield pytest.param(node, mcr._core, id=name)
    for cls in CLASSES:
        for name, node in stub_names(CORE[cls].body).items():
            # a property (or its setter) has no call signature to compare
            if isinstance(node, ast.FunctionDef) and not name.startswith("__") and not any(
                    ast.unparse(d) == "property" or ast.unparse(d).endswith((".setter", ".getter"))
                    for d in node.decorator_list):
                yield pytest.param(node, getattr(mcr._core, cls), id=f"{cls}.{name}")


@pytest.mark.parametrize("node,owner", list(stub_functions()))
def test_stub_signature_matches_the_source(node, owner):
    """The parameters against those Cython writes on the docstring's first line."""
    func = getattr(owner, node.name, None)
    assert func is not None, f"{node.name}: in the stub but not at run time"
    first = (func.__doc__ or "").lstrip().split("\n", 1)[0]
    assert first.startswith(node.name + "("), f"{node.name}: no embedded signature in {first!r}"
    assert shape(node.args) == shape(ast.parse(f"def {first}: pass").body[0].args)


def test_backend_is_keyword_only_everywhere():
    # every method that takes a backend takes it keyword-only, default None
    shapes = {name: shape(node.args) for name, node in stub_names(CORE["Comm"].body).items()
              if isinstance(node, ast.FunctionDef)}
    assert sum(("keyword", "backend", "None") in s for s in shapes.values()) >= 55, shapes
    assert [n for n, s in shapes.items() if ("positional", "backend", "None") in s] == []


# -- The stub of mcr.MPI -----------------------------------------------------------

def mpi4py_public_names():
    """The public names of mpi4py's own stub of mpi4py.MPI (what a star import gives)."""
    import mpi4py
    stub = parse(os.path.join(os.path.dirname(mpi4py.__file__), "MPI.pyi"))
    return {name for name in stub_names(stub.body) if not name.startswith("_")}


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
    # imports only, each name re-exported as itself, MCR_NAMES from mcr._core
    assert pathlib.Path(MPI_STUB).read_text() == render_mpi_stub(), \
        "src/mcr/MPI.pyi is out of date with mpi4py; run python tests/test_typing.py"
    missing = [n for n in mpi4py_public_names() | set(MCR_NAMES) if not hasattr(mcr.MPI, n)]
    assert missing == [], "in the stub but not in mcr.MPI at run time"
    for name in MCR_NAMES:
        mine, core = getattr(mcr.MPI, name), getattr(mcr._core, name)
        assert mine is core or issubclass(mine, core), name


# -- mypy, stubtest and the sample program ----------------------------------------

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
WRONG_CALLS = ["import torch", "import mcr", "from mcr import MPI", "",
               "comm = mcr.COMM_WORLD", "x = torch.ones(4)", "y = torch.zeros(4)", *BAD_CALLS]
ALLOWLIST = [r"mcr\._core\.__test__", r"mcr\._core\..*\.__reduce_cython__",
             r"mcr\._core\..*\.__setstate_cython__",
             # subclasses of torch's pybind11 classes: at run time their metaclass is
             # pybind11's, which torch's stubs do not declare
             r"mcr\.distributed\.ProcessGroupMCR", r"mcr\.distributed\.Work"]


_early = {}      # the mypy checks, once started: name -> mpiharness.Background


def start_early():
    """Start the mypy checks (conftest.py calls this once the tests are chosen), each with
    its cache in a folder of its own."""
    if _early or not HAVE_MYPY:
        return
    tmp = scratch_folder("mcr-typing-")
    (tmp / "wrong_calls.py").write_text("\n".join(WRONG_CALLS) + "\n")
    (tmp / "allowlist.txt").write_text("\n".join(ALLOWLIST) + "\n")
    mypy = ["-m", "mypy", "--no-error-summary", "--show-error-codes", "--no-color-output",
            "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}", "--cache-dir"]
    commands = {
        # the sample and the wrong calls, as a user's program, and the stubs themselves:
        # errors inside an installed package's stubs are hidden from its users, so they are
        # checked directly. Strictly (the ignore[override] comments must all be needed),
        # which checks all a plain run does, in one run: mypy reads torch's stubs once
        "mypy": ([*mypy, str(tmp / "cache"), "--strict", "--warn-unused-ignores",
                  os.path.join("src", "mcr"), SAMPLE, str(tmp / "wrong_calls.py")], ROOT),
        # names (and the types of constants) against the runtime, of mcr and its
        # submodules; away from the source tree, where mypy would see src/mcr twice
        "stubtest": (["-m", "mypy.stubtest", "--concise", "--ignore-disjoint-bases",
                      "--allowlist", str(tmp / "allowlist.txt"), "mcr"], tmp)}
    _early.update({name: Background(args, cwd) for name, (args, cwd) in commands.items()})


@pytest.fixture(scope="module")
def checks():
    """checks(name): a slow check's finished process (the sample program, a real one that
    checks its results, runs now; the mypy checks started early)."""
    start_early()
    procs = {"sample": Background([SAMPLE], ROOT), **_early}

    def finished(name):
        returncode, out, err = procs[name].result(timeout=300)
        assert "error: Cannot find implementation or library stub" not in out, out
        return returncode, out, err
    yield finished
    for proc in procs.values():
        proc.stop()


@pytest.mark.parametrize("name", ["sample", pytest.param("stubtest", marks=needs_mypy)])
def test_check_passes(checks, name):
    returncode, out, err = checks(name)
    assert returncode == 0, out + err


@needs_mypy
def test_mypy_accepts_the_stubs_and_sample_and_rejects_wrong_calls(checks):
    returncode, out, err = checks("mypy")
    assert returncode == 1, out + err
    errors = {}
    for line in out.splitlines():
        path, lineno = line.split(":")[:2]
        assert os.path.basename(path) == "wrong_calls.py", out   # none in the stubs, sample
        if ": error: " in line:
            errors.setdefault(WRONG_CALLS[int(lineno) - 1], []).append(line)
    for call, code in BAD_CALLS.items():
        assert call in errors, f"mypy did not flag {call!r}:\n{out}"
        assert any(f"[{code}]" in e for e in errors[call]), (call, errors[call])


if __name__ == "__main__":
    with open(MPI_STUB, "w") as f:
        f.write(render_mpi_stub())
    print(f"wrote {MPI_STUB}")
