"""mpi4py's own test suite run through mcr.MPI (driver.py; left out: exclusions.py)."""
