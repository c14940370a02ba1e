"""Runs the MPI cases of one test module on this rank (see mpiharness.py).

usage: mpiworker.py TEST_MODULE_PATH RESULT_DIR
"""

import importlib.util
import json
import os
import sys
import time


def main():
    path, outdir = sys.argv[1], sys.argv[2]
    import mcr
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    spec = importlib.util.spec_from_file_location(
        "mcr_case_" + os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from mpiharness import format_exception

    comm = mcr.COMM_WORLD
    with open(os.path.join(outdir, f"rank{rank}.jsonl"), "w") as out:
        for name, fn in module._mpi_cases.items():
            start = time.perf_counter()
            try:
                fn(comm)
                rec = {"case": name, "ok": True}
            except BaseException as exc:  # noqa: B902 - report everything, keep going
                rec = {"case": name, "ok": False, "error": format_exception(exc)}
            rec["seconds"] = round(time.perf_counter() - start, 3)
            # keep ranks in step between cases (mpi4py's own barrier, not mcr's)
            world.Barrier()
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
