# Import-time check that mcr and mpi4py call the same libmpi.

cdef extern from "mcr/libcheck.h" nogil:
    const char *MCR_BUILD_MPICC
    const char *mcr_libmpi_path()
    const char *mcr_libmpi_path_of_module(const char *)
    int mcr_same_libmpi(const char *)


def build_info():
    """Return how this build of mcr was made.

    Returns
    -------
    dict
        ``mpicc``: the MPI compiler wrapper the core was built with;
        ``libmpi``: the libmpi file the core calls at run time;
        ``mpi_library_version``: what that library reports.
    """
    cdef char version[8192]
    cdef int n = 0
    MPI_Get_library_version(version, &n)
    return {
        "mpicc": MCR_BUILD_MPICC.decode(),
        "libmpi": mcr_libmpi_path().decode(),
        "mpi_library_version": version[:n].decode(errors="replace").strip("\x00 \n"),
    }


cdef int mpich = -1      # whether libmpi is MPICH (or made from it); -1: not asked yet


cdef bint library_is_mpich() except -1:
    """Whether the MPI library says it is MPICH, some of whose bugs mcr works
    around (asked once; MPI need not be initialized)."""
    global mpich
    cdef char version[8192]
    cdef int n = 0
    if mpich < 0:
        MPI_Get_library_version(version, &n)
        mpich = b"MPICH" in version[:n]
    return mpich


cdef int check_same_libmpi() except -1:
    module_path = _mpi4py.__file__.encode()
    if mcr_same_libmpi(module_path):
        return 0
    raise ImportError(
        "mcr and mpi4py use different MPI libraries: mcr was built with "
        f"{MCR_BUILD_MPICC.decode()!r} and calls {mcr_libmpi_path().decode()!r}, "
        f"mpi4py ({_mpi4py.__file__}) loaded "
        f"{mcr_libmpi_path_of_module(module_path).decode()!r}. Rebuild mcr against "
        "the MPI that mpi4py uses (pip install 'cython>=3' && "
        "MCR_MPICC=/path/to/mpicc pip install --no-build-isolation --no-deps "
        "--force-reinstall /path/to/mcr-source), or make mpi4py load mcr's "
        "(MPI4PY_LIBMPI=/path/to/libmpi.so).")
