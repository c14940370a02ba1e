"""Sphinx configuration for mcr's documentation.

The API reference is generated from the docstrings of the compiled module, so
mcr must be importable (installed, or built in place with
``python setup.py build_ext --inplace`` and on ``sys.path``). The build is run
with warnings as errors (``python -m sphinx -W --keep-going -b html docs
docs/_build/html``, also by ``tests/test_docs.py``), and fails when a public
class, method or constant of mcr is missing from ``api.rst``.
"""

import os
import re
import sys
import textwrap

from sphinx.util import logging

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import mcr
except ImportError as exc:
    # A source tree built in place (`python setup.py build_ext --inplace`).
    sys.path.insert(0, os.path.join(HERE, os.pardir, "src"))
    try:
        import mcr
    except ImportError:
        raise ImportError(
            "the docs need an importable mcr (its API reference is read from the "
            "compiled module): `pip install .` or `python setup.py build_ext "
            f"--inplace` first ({exc})") from exc

project = "mcr"
author = "the mcr developers"
copyright = "the mcr developers"
release = mcr.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

# numpydoc-style docstrings (STYLE.md), rendered by napoleon
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

autodoc_default_options = {"undoc-members": False}
autodoc_member_order = "bysource"
autodoc_docstring_signature = True       # Cython embeds signatures in docstrings
autodoc_typehints_format = "fully-qualified"  # "Bases: mpi4py.MPI.Request", not "Request"
add_module_names = False

# no network: no intersphinx, no remote images
intersphinx_mapping = {}

exclude_patterns = ["_build", "_generated"]
templates_path = []
html_static_path = []
html_theme = "alabaster"
html_title = f"mcr {release}"
html_theme_options = {
    "description": "mpi4py-style communicators on PyTorch tensors",
    "fixed_sidebar": False,
}

# -- signatures as Python users write them ----------------------------------

# Cython embeds C-flavoured signatures ("Send(self, buf, int dest, int
# tag=0, ...)", defaults such as MPI_ANY_SOURCE); show them as Python ones.
C_PARAM = re.compile(r"\b(?:int|bint|double|object)\s+(\w+)")
C_DEFAULTS = {"MPI_ANY_SOURCE": "ANY_SOURCE", "MPI_ANY_TAG": "ANY_TAG",
              "MPI_PROC_NULL": "PROC_NULL"}


def python_signature(app, what, name, obj, options, signature, return_annotation):
    if not signature or not name.startswith("mcr."):
        return None
    signature = re.sub(r"^\((?:self|cls)(?:, )?", "(", signature)
    signature = C_PARAM.sub(r"\1", signature)
    for c_name, py_name in C_DEFAULTS.items():
        signature = signature.replace(c_name, py_name)
    return signature, return_annotation


# -- every public name of mcr is documented in api.rst ----------------------

logger = logging.getLogger("mcr.docs")


def public_api():
    """Fully qualified names that the API reference must document."""
    names = {f"mcr.{name}" for name in mcr.__all__}
    for cls in (mcr.Comm, mcr.Request, mcr.Status):
        names.update(f"mcr.{cls.__name__}.{name}" for name in vars(cls)
                     if not name.startswith("_"))
    return names


def check_api_documented(app, env):
    documented = set(env.get_domain("py").objects)
    for name in sorted(public_api() - documented):
        logger.warning("api.rst does not document %s (every public name of mcr "
                       "must be in the API reference)", name)


# -- the backends table, from the backends' own declarations ---------------

OPERATIONS = ("Send", "Recv", "Sendrecv", "Sendrecv_replace", "Probe", "Iprobe", "Barrier",
              "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather", "Allgatherv",
              "Alltoall", "Alltoallv", "Reduce", "Allreduce", "Reduce_scatter_block",
              "Reduce_scatter", "Scan", "Exscan")


def write_backend_table():
    """docs/_generated/backends_table.rst: how each backend runs each operation
    (mcr.backends.<name>.BACKEND is the one source of truth)."""
    from mcr import backends

    found = [backends.get(name) for name in backends.names()]
    width = max(len(op) for op in OPERATIONS) + 4
    cols = [max(len(b.name), 9) for b in found]
    rule = " ".join(["=" * width] + ["=" * c for c in cols])
    lines = [rule, " ".join([f"{'Operation':<{width}}"] + [f"{b.name:<{c}}" for b, c in
                                                             zip(found, cols)]), rule]
    for op in OPERATIONS:
        cells = ["native" if op in b.native else "composed" for b in found]
        lines.append(" ".join([f"``{op}``".ljust(width)] +
                              [f"{cell:<{c}}" for cell, c in zip(cells, cols)]))
    lines.append(rule)
    lines.append("")
    lines.append("Buffers served: " + "; ".join(
        f"``{b.name}``: {', '.join(sorted(b.devices))}" for b in found) + ".")
    lines.append("")
    for b in found:
        if b.reductions:
            ops = ", ".join(f"{op} ({len(types)} types)" for op, types in b.reductions.items())
            lines.append(f"Reductions ``{b.name}`` runs itself: {ops}; mcr reduces the "
                         "other op/type pairs after gathering the operands.")
            lines.append("")
    os.makedirs(os.path.join(HERE, "_generated"), exist_ok=True)
    with open(os.path.join(HERE, "_generated", "backends_table.rst"), "w") as f:
        f.write("\n".join(lines) + "\n")


write_backend_table()


# -- the conformance test's exclusions, from its one table ------------------

def write_conformance_exclusions(suite):
    """docs/_generated/<suite>_exclusions.rst: what a conformance test leaves out
    (tests/<suite>_conformance/exclusions.py is the one source of truth)."""
    import importlib.util

    path = os.path.join(HERE, os.pardir, "tests", f"{suite}_conformance", "exclusions.py")
    spec = importlib.util.spec_from_file_location(f"mcr_{suite}_exclusions", path)
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    tables = (("EXCLUSIONS", ""), ("MPICH_ONLY", " (on MPICH only)"),
              ("ONE_PROCESS", " (at 2 and more processes; it runs at 1)"))
    lines = [f"* ``{pattern}``{where}: {reason}." for name, where in tables
             for pattern, reason in getattr(table, name, [])]
    os.makedirs(os.path.join(HERE, "_generated"), exist_ok=True)
    with open(os.path.join(HERE, "_generated", f"{suite}_exclusions.rst"), "w") as f:
        f.write("\n".join(lines or ["* (none)"]) + "\n")


write_conformance_exclusions("mpi4py")
write_conformance_exclusions("torch")


def write_demo_tables():
    """docs/_generated/mpi4py_demos.rst, mpi4py_demos_retried.rst and
    mpi4py_demos_left_out.rst: the demos of mpi4py that the demo test runs
    ported, those whose ported run gets a second try, and those it leaves out
    (tests/mpi4py_conformance/demos.py is the one source of truth)."""
    import importlib.util

    path = os.path.join(HERE, os.pardir, "tests", "mpi4py_conformance", "demos.py")
    spec = importlib.util.spec_from_file_location("mcr_conformance_demos", path)
    table = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = table          # dataclasses look their module up
    spec.loader.exec_module(table)
    checks = {"same": "the same output", "timings": "the same lines, numbers aside",
              "close": "the same output, numbers to 1e-12", "exit": "exit status 0"}
    rows = [(f"``{demo.name}``", ", ".join(map(str, demo.sizes)),
             checks[demo.output] + (", two tries" if demo.retry else ""))
            for demo in table.DEMOS]
    widths = [max(len(row[i]) for row in rows + [("demo", "processes", "checked")])
              for i in range(3)]
    rule = "  ".join("=" * w for w in widths)
    header = "  ".join(h.ljust(w) for h, w in zip(("demo", "processes", "checked"), widths))
    lines = [rule, header.rstrip(), rule]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
              for row in rows]
    lines.append(rule)
    os.makedirs(os.path.join(HERE, "_generated"), exist_ok=True)
    with open(os.path.join(HERE, "_generated", "mpi4py_demos.rst"), "w") as f:
        f.write("\n".join(lines) + "\n")
    retried = [f"* ``{demo.name}``: {demo.retry}." for demo in table.DEMOS if demo.retry]
    with open(os.path.join(HERE, "_generated", "mpi4py_demos_retried.rst"), "w") as f:
        f.write("\n".join(retried) + "\n")
    left_out = [f"* ``{where}``: {reason}." for where, reason in table.LEFT_OUT]
    with open(os.path.join(HERE, "_generated", "mpi4py_demos_left_out.rst"), "w") as f:
        f.write("\n".join(left_out) + "\n")


write_demo_tables()


# -- the tuning page: mcr.tune's usage, and this machine's tables ------------

def write_tuning_pages():
    """docs/_generated/tune_usage.rst (the help of ``python -m mcr.tune``) and
    tuning_here.rst (the tables in _static/, measured on the machine the docs
    were written on, as mcr.tune summarizes them)."""
    os.environ["COLUMNS"] = "80"           # argparse wraps its help to the terminal
    from mcr import tuning
    from mcr.tune import cli, report

    out = os.path.join(HERE, "_generated")
    os.makedirs(out, exist_ok=True)
    usage = cli.parser().format_help().replace(tuning.cache_dir(), "~/.cache/mcr/tuning")
    with open(os.path.join(out, "tune_usage.rst"), "w") as f:
        f.write(".. code-block:: text\n\n" + textwrap.indent(usage, "   ") + "\n")
    lines = []
    for nprocs in (2, 4):
        name = f"tuning-n{nprocs}"
        path = os.path.join(HERE, "_static", f"{name}.json")
        if not os.path.exists(path):
            continue
        table = tuning.Table.load(path)
        measured = sorted({(e.op, e.device) for e in table.entries})
        text = "\n".join(report.summary(table, measured, f"_static/{name}.json"))
        lines += [f"{nprocs} processes (`{name}.json <_static/{name}.json>`_):", "",
                  ".. code-block:: text", "", textwrap.indent(text, "   "), ""]
        if os.path.exists(os.path.join(HERE, "_static", f"{name}.png")):
            lines += [f".. image:: _static/{name}.png", f"   :alt: {name}", ""]
    with open(os.path.join(out, "tuning_here.rst"), "w") as f:
        f.write("\n".join(lines) + "\n")


write_tuning_pages()


def setup(app):
    app.connect("autodoc-process-signature", python_signature)
    app.connect("env-check-consistency", check_api_documented)
