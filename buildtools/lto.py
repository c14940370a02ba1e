"""Link-time optimization for mcr's core, where the compiler behind mpicc has GCC's."""

import os
import shutil
import subprocess
import tempfile


def lto_flags(mpicc, debug=False):
    """GCC's link-time optimization flags for the core, (compile, link); ([], []) where it is
    off or fails.

    The core is one C file of about 260k lines. Compiled whole at -O2 it keeps one core busy
    for a minute and more; with ``-flto`` the compile stops after parsing, and the link
    optimizes and generates the code in partitions, run in parallel (GCC runs them through
    ``make``; without it, one after another). On 2 cores: 43 s instead of 73. ``MCR_LTO=0``
    turns it off; a compiler that is not GCC (the probe below fails) builds without it.
    `debug`: the code is built with debug information (-g at the link too).
    """
    if os.environ.get("MCR_LTO", "").strip().lower() in ("0", "no", "off", "false"):
        print("mcr: link-time optimization off (MCR_LTO)")
        return [], []
    # at most 8 jobs: each takes a few hundred MB
    make = shutil.which(os.environ.get("MAKE") or "make")
    jobs = min(len(os.sched_getaffinity(0)), 8) if make else 1
    compile_flags = ["-flto"]
    link_flags = [f"-flto={jobs}", "-O2"] + (["-g"] if debug else [])
    with tempfile.TemporaryDirectory() as tmp:
        source, obj, lib = (os.path.join(tmp, name) for name in ("probe.c", "probe.o", "probe.so"))
        with open(source, "w") as f:
            f.write("int mcr_probe(int x) { return x + 1; }\n")
        steps = ([mpicc, "-fPIC", *compile_flags, "-c", source, "-o", obj],
                 [mpicc, "-shared", *link_flags, obj, "-o", lib])
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"mcr: no link-time optimization ({' '.join(argv)} failed: "
                      f"{(done.stderr or done.stdout).strip()[:200]})")
                return [], []
    print(f"mcr: link-time optimization, {jobs} parallel jobs" if jobs > 1 else
          "mcr: link-time optimization, one job at a time" + ("" if make else " (no make found)"))
    return compile_flags, link_flags
