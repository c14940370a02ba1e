# Completion observers. A feature that must learn when a request's operation
# ends (the logger's record, the call's record for timeouts and the flight
# recorder) attaches an _Observer to the Request; the core tells the
# request's observers once, in finished() (Request.pyx), whichever wait or
# test saw the completion, and when the request is freed or dropped before.
# The core knows nothing of the features behind them: a Request has one
# field, `obs`, the head of a linked list.

cdef enum:                  # how an operation ended, as its observers are told
    OBS_DONE                # completed
    OBS_FAILED              # its wait raised
    OBS_FREED               # its request was freed before it completed (Request.Free)
    OBS_DROPPED             # its request was collected before it completed: the
                            # operation goes on, kept by the core till it does


cdef class _Observer:
    """Something told when a request's operation ends. Subclasses override
    `ended`, and `limit` (a wait's time limit) or `restarted` (a persistent
    request started again) where they need them."""
    cdef _Observer next_obs

    cdef bint ended(self, int how) except -1:
        """The operation ended (`how`: OBS_*); whether to stay attached:
        to the request (a persistent one starts again), or, for
        OBS_DROPPED, to what keeps the operation until it completes."""
        return False

    cdef double limit(self) noexcept:
        """The seconds a wait for the operation may last (0: no limit)."""
        return 0

    cdef int restarted(self) except -1:
        """A persistent request holding this observer was started again."""
        return 0

    cdef str describe(self):
        """What a wait for the operation waits for, to name it in a
        TimeoutError; None: nothing to say."""
        return None


cdef inline _Observer linked(_Observer head, _Observer o):
    """`head`'s list with `o` in front."""
    o.next_obs = head
    return o


cdef _Observer joined(_Observer head, _Observer tail):
    """The list `head`, then the list `tail`."""
    if head is None:
        return tail
    cdef _Observer o = head
    while o.next_obs is not None:
        o = o.next_obs
    o.next_obs = tail
    return head


cdef _Observer notify_all(_Observer head, int how):
    """Tell every observer of the list `head` how its operation ended; the
    list of those that stay attached."""
    cdef _Observer o = head, after, kept = None
    while o is not None:
        after, o.next_obs = o.next_obs, None
        if o.ended(how):
            kept = linked(kept, o)
        o = after
    return kept


cdef double least_limit(_Observer head) noexcept:
    """The shortest time limit among the observers of `head` (0: none has one)."""
    cdef double t = 0, x
    while head is not None:
        x = head.limit()
        if x > 0 and (t == 0 or x < t):
            t = x
        head = head.next_obs
    return t


cdef int restart_all(_Observer head) except -1:
    while head is not None:
        head.restarted()
        head = head.next_obs
    return 0
