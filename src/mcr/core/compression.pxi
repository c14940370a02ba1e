# Compression (mcr.compress) on the call path: a call that passes
# ``compress``, or on a communicator with a compression default, is parsed
# and checked here and exchanged compressed by mcr.compress, on the backend
# chosen for it.

cdef object _compress = None     # mcr.compress (services.pxi), at the first compressed call


cdef object compress_module():
    global _compress
    if _compress is None:
        _compress = service("compress")
    return _compress


def _prequest(Comm comm, start, str op, msg, args, str backend):
    """A Prequest of `op` on `comm` whose each Start calls `start()`, which
    posts the operation and returns its Request (mcr.compress); `msg`,
    `backend`: the parsed call and its backend, for the logger's record of
    each start (`args`: its arguments, which the call holds)."""
    cdef Prequest preq = emulated_prequest(comm, start, msg)
    preq.op = call_id(op) + 1
    preq.backend = backend
    return preq


@cython.final
cdef class _Compression(Interceptor):
    """Run a call that can be compressed through mcr.compress: exchanged
    compressed on its backend. A call that compression does not serve (its
    element type, its reduction) runs as it is when the compression is the
    communicator's default, and raises when the call asked for it."""

    cdef bint applies_to(self, Comm comm) except -1:
        return comm.compress_dflt is not None

    cdef object spec_of(self, Comm comm, _Call c):
        """The compression asked of `c` (its own, else the communicator's
        default) when its operation can be compressed; None: it runs as it is."""
        spec = comm.compress_dflt if c.compress is None else c.compress
        if spec is False or not OP_TABLE[c.op].flags & OP_COMPRESSIBLE:
            return None
        return spec

    cdef str reshapes(self, Comm comm, _Call c):
        spec = self.spec_of(comm, c)
        if spec is None:
            return None
        compress = compress_module()
        try:
            codec = compress.codec(spec)
        except _builtins.Exception:
            return f"compress={spec!r}"      # refused in run_call, after the agreement
        if c.compress is None and not compress.usable(CALL_NAMES[c.op], c, c.args()):
            return None
        return f"compressed {codec.name}"

    cdef object run_call(self, Comm comm, _Call c, Py_ssize_t i):
        spec = self.spec_of(comm, c)
        if spec is None:
            return proceed(comm, c, i + 1)
        compress = compress_module()
        codec = compress.codec(spec)
        comm.parse(c)
        args = c.args()
        if c.compress is not None:
            compress.check(CALL_NAMES[c.op], c, args)
        elif not compress.usable(CALL_NAMES[c.op], c, args):
            return proceed(comm, c, i + 1)
        return compress.run(comm, CALL_NAMES[c.op], FORM_NAMES[c.form], c, args, codec, c.name,
                            None if c.rec is None else (<_Rec>c.rec).set_wire)


cdef _Compression COMPRESSION = _Compression(70, "compression")
_register(COMPRESSION)
