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
    check_status(status)
    return &(<_MPI.Status>status).ob_mpi


cdef int check_status(object status) except -1:
    """Refuse a status argument that is neither None nor an MPI.Status, before
    anything is received or waited for (it would be written into)."""
    if status is not None and not isinstance(status, _MPI.Status):
        raise TypeError(f"status: expected an MPI.Status or None, got {type(status).__name__}")
    return 0


cdef int check_statuses(object statuses) except -1:
    """Refuse a statuses argument that is not None or a list or tuple of
    MPI.Status, naming the first wrong item, before anything is waited for."""
    if statuses is None:
        return 0
    if type(statuses) is not list and type(statuses) is not tuple:
        raise TypeError("statuses: expected a list or tuple of MPI.Status, or None, got "
                        f"{type(statuses).__name__}")
    for i, status in enumerate(statuses):
        if not isinstance(status, _MPI.Status):
            raise TypeError(f"statuses[{i}]: expected an MPI.Status, got "
                            f"{type(status).__name__}")
    return 0


cdef Py_ssize_t status_room(object statuses, Py_ssize_t count) except -1:
    """How many of `count` statuses `statuses` (checked) can take: a list is
    extended with new Status objects, a tuple only fills what it has (as mpi4py)."""
    if statuses is None:
        return 0
    if type(statuses) is list:
        while len(statuses) < count:
            statuses.append(Status())
    return min(len(statuses), count)


cdef inline void status_type(object status, MPI_Datatype rtype) noexcept:
    if type(status) is Status:
        (<Status>status).rtype = rtype
