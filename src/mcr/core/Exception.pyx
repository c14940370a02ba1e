# MPI errors come back as mcr.Exception (errors return, the job never aborts).

class Exception(_mpi4py.Exception):
    """An error reported by the MPI library.

    A subclass of ``mpi4py.MPI.Exception``: ``except MPI.Exception`` clauses
    written for mpi4py catch it. ``Get_error_code()`` and ``Get_error_class()``
    give the MPI error code and class; ``str()`` gives MPI's error string.
    """


cdef int CHKERR(int ierr) except -1 nogil:
    if ierr == MPI_SUCCESS:
        return 0
    with gil:
        raise Exception(ierr)
