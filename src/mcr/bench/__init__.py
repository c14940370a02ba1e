"""OSU-style benchmarks of mcr's communication: ``python -m mcr.bench <name>``.

:mod:`mcr.bench.ops` is the table of benchmarked operations (buffers, calls in
each form, result checks); :mod:`mcr.bench.osu` is the command line that times
them and prints OSU Micro-Benchmarks output.
"""
