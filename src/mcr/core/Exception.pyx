# MPI errors come back as mcr.Exception (errors return, the job never aborts).

class Exception(_mpi4py.Exception):
    """An error reported by the MPI library.

    A subclass of ``mpi4py.MPI.Exception``, which is ``mcr.MPI.Exception``
    itself: one ``except MPI.Exception`` clause catches the errors of mcr's
    methods and of mpi4py's. ``Get_error_code()`` and ``Get_error_class()``
    give the MPI error code and class; ``str()`` gives MPI's error string.
    """


cdef int CHKERR(int ierr) except -1 nogil:
    if ierr == MPI_SUCCESS:
        return 0
    with gil:
        raise Exception(ierr)
