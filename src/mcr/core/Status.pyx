# Status: mpi4py's Status, plus the element type of the receive it describes.

cdef class Status(_MPI.Status):
    """Status of a receive or a completed request.

    An ``mpi4py.MPI.Status`` (``source``, ``tag``, ``error``, ``Get_source()``,
    ``Get_tag()``, ``Get_error()``, ...) that also remembers the element type of
    the receive it came from, so that ``Get_count()`` counts elements.
    """
    cdef MPI_Datatype rtype
    cdef MPI_Status typed     # ob_mpi when rtype was set: a status written since (by
                              # mpi4py's own Wait, say) counts in bytes, not in rtype

    def __cinit__(self, *args, **kwargs):
        self.rtype = MPI_DATATYPE_NULL
        other = args[0] if args else kwargs.get("status")
        if isinstance(other, Status):       # a copy (mpi4py's copies ob_mpi): the type too
            self.rtype, self.typed = (<Status>other).rtype, (<Status>other).typed

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
        cdef MPI_Datatype dt = MPI_BYTE
        if self.rtype != MPI_DATATYPE_NULL and \
                memcmp(&self.typed, &self.ob_mpi, sizeof(MPI_Status)) == 0:
            dt = self.rtype
        if isinstance(datatype, _MPI.Datatype) and \
                (<_MPI.Datatype>datatype).ob_mpi == MPI_DATATYPE_NULL:
            dt = MPI_DATATYPE_NULL          # MPI's own error (ERR_TYPE), as mpi4py
        elif datatype is not None:
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


cdef int set_status(MPI_Status *st, int source, int tag, Py_ssize_t nbytes) except -1:
    """Fill `st` as MPI would for a message of `nbytes` bytes (the empty
    status: ANY_SOURCE, ANY_TAG, 0; a receive from PROC_NULL: PROC_NULL,
    ANY_TAG, 0)."""
    st.MPI_SOURCE = source
    st.MPI_TAG = tag
    st.MPI_ERROR = MPI_SUCCESS
    CHKERR(MPI_Status_set_elements(st, MPI_BYTE, <int>nbytes))
    return 0


cdef int raise_recv_error(int ierr, MPI_Status *sp, side *r, str arg) except -1:
    """Raise the MPI error `ierr` of a receive into `r` (NULL: unknown) whose
    status is `sp`, with the context of a truncation (note_truncation)."""
    exc = Exception(ierr)
    note_truncation(exc, ierr, sp, r, arg)
    raise exc


cdef int note_truncation(object exc, int ierr, MPI_Status *sp, side *r, str arg) except -1:
    """When `ierr` is a truncation, note on `exc` the buffer's size, the
    message's when MPI tells it, its source and tag, in the words of the
    Python backends."""
    cdef int eclass = MPI_SUCCESS
    if (sp == MPI_STATUS_IGNORE or r == NULL or MPI_Error_class(ierr, &eclass) != MPI_SUCCESS
            or eclass != MPI_ERR_TRUNCATE):
        return 0
    add_note(exc, truncation_note(sp, r, arg))
    return 0


cdef str truncation_note(MPI_Status *sp, side *r, str arg):
    cdef Py_ssize_t capacity = <Py_ssize_t>r.count * r.extent
    cdef int nbytes = 0
    # on truncation MPI (Open MPI at least) counts the whole message; a count
    # that fits the buffer is only what was written, so the size is unknown then
    if MPI_Get_count(sp, MPI_BYTE, &nbytes) != MPI_SUCCESS or nbytes == MPI_UNDEFINED \
            or nbytes <= capacity:
        message = "a message"
    else:
        message = f"message of {nbytes} bytes"
    return (f"{arg}: {message} from rank {sp.MPI_SOURCE} (tag {sp.MPI_TAG}) does not fit "
            f"the receive buffer of {capacity} bytes")


cdef int add_note(object exc, str note) except -1:
    # BaseException.add_note is Python 3.11+; __notes__ is what it fills
    notes = getattr(exc, "__notes__", None)
    if notes is None:
        notes = exc.__notes__ = []
    notes.append(note)
    return 0


cdef inline void status_type(object status, MPI_Datatype rtype) noexcept:
    # subclasses too: mcr.MPI.Status is one
    if type(status) is Status or isinstance(status, Status):
        (<Status>status).rtype = rtype
        (<Status>status).typed = (<Status>status).ob_mpi
