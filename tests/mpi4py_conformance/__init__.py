"""mpi4py's own test suite run through mcr.MPI (see driver.py; exclusions.py lists what is left out)."""
