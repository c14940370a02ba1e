# Status: mpi4py's Status, plus the element type of the receive it describes.

cdef class Status(_MPI.Status):
    """Status of a receive or a completed request.

    An ``mpi4py.MPI.Status`` (``source``, ``tag``, ``error``, ``Get_source()``,
    ``Get_tag()``, ``Get_error()``, ...) that also remembers the element type of
    the receive it came from, so that ``Get_count()`` counts elements.
    """
    cdef MPI_Datatype rtype

    def __cinit__(self, *args, **kwargs):
        self.rtype = MPI_DATATYPE_NULL

    def Get_count(self, datatype=None):
        """Number of elements received.

        Parameters
        ----------
        datatype : mpi4py.MPI.Datatype or str, optional
            Unit of the count. By default, the element type of the receive this
            status came from (bytes when unknown).

        Returns
        -------
        int
            The count, or ``mcr.UNDEFINED`` if the bytes received are not a
            whole number of `datatype` elements.
        """
        cdef side x
        cdef int count = 0
        cdef MPI_Datatype dt = self.rtype if self.rtype != MPI_DATATYPE_NULL else MPI_BYTE
        if datatype is not None:
            set_datatype(&x, datatype, b"datatype")
            dt = x.dtype
        CHKERR(MPI_Get_count(&self.ob_mpi, dt, &count))
        return count


cdef inline MPI_Status *status_ptr(object status) except? NULL:
    """The MPI_Status behind a status argument (None: ignore)."""
    if status is None:
        return MPI_STATUS_IGNORE
    if not isinstance(status, _MPI.Status):
        raise TypeError(f"status: expected an MPI.Status or None, got {type(status).__name__}")
    return &(<_MPI.Status>status).ob_mpi


cdef inline void status_type(object status, MPI_Datatype rtype) noexcept:
    if type(status) is Status:
        (<Status>status).rtype = rtype
