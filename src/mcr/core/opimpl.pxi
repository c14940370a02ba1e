# Reduction operations: which op applies to which element type, and the
# user-defined ops that reduce float16/bfloat16 (include/mcr/halfops.h).

cdef extern from "mcr/halfops.h" nogil:
    void mcr_f16_sum(void*, void*, int*, MPI_Datatype*)
    void mcr_f16_prod(void*, void*, int*, MPI_Datatype*)
    void mcr_f16_max(void*, void*, int*, MPI_Datatype*)
    void mcr_f16_min(void*, void*, int*, MPI_Datatype*)
    void mcr_bf16_sum(void*, void*, int*, MPI_Datatype*)
    void mcr_bf16_prod(void*, void*, int*, MPI_Datatype*)
    void mcr_bf16_max(void*, void*, int*, MPI_Datatype*)
    void mcr_bf16_min(void*, void*, int*, MPI_Datatype*)

cdef enum:
    OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_LAND, OP_LOR, OP_LXOR,
    OP_BAND, OP_BOR, OP_BXOR, NOPS

OP_NAMES = ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR")

cdef enum:
    ARITH_OPS = (1 << OP_SUM) | (1 << OP_PROD)
    ORDER_OPS = (1 << OP_MAX) | (1 << OP_MIN)
    LOGICAL_OPS = (1 << OP_LAND) | (1 << OP_LOR) | (1 << OP_LXOR)
    BITWISE_OPS = (1 << OP_BAND) | (1 << OP_BOR) | (1 << OP_BXOR)


cdef inline int ops_for_category(int category) noexcept:
    # As the MPI standard's table of op/type pairs, with the half types as floats.
    if category == CAT_INT:
        return ARITH_OPS | ORDER_OPS | LOGICAL_OPS | BITWISE_OPS
    if category == CAT_FLOAT or category == CAT_HALF:
        return ARITH_OPS | ORDER_OPS
    if category == CAT_COMPLEX:
        return ARITH_OPS
    if category == CAT_BOOL:
        return LOGICAL_OPS
    return 0


cdef MPI_Op OPS[NOPS]
cdef MPI_Op HALF_OPS[2][4]      # [float16, bfloat16][SUM, PROD, MAX, MIN]


cdef int init_ops() noexcept:
    # MPI's predefined ops are link-time constants: no MPI call, safe at import
    OPS[:] = [MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN, MPI_LAND, MPI_LOR,
              MPI_LXOR, MPI_BAND, MPI_BOR, MPI_BXOR]
    return 0


cdef bint half_ops_ready = False


cdef int create_half_ops() except -1:
    """Create the float16/bfloat16 ops, at the first reduction on those types:
    MPI_Op_create needs MPI initialized, which importing mcr must not assume
    (``mpi4py.rc.initialize = False``). They are never freed, as MPI frees
    user ops at MPI_Finalize; freeing them at exit could come after it."""
    global half_ops_ready
    if half_ops_ready:
        return 0
    cdef MPI_User_function *fns[8]
    fns[:] = [mcr_f16_sum, mcr_f16_prod, mcr_f16_max, mcr_f16_min,
              mcr_bf16_sum, mcr_bf16_prod, mcr_bf16_max, mcr_bf16_min]
    cdef int i
    for i in range(8):
        CHKERR(MPI_Op_create(fns[i], 1, &HALF_OPS[i // 4][i % 4]))
    half_ops_ready = True
    return 0


cdef int resolve_op(object op, side *x, MPI_Op *out) except -1:
    """The MPI_Op to use for `op` on the elements of operand `x` (their type
    x.tindex, -1: unknown)."""
    if not isinstance(op, _MPI.Op):
        raise TypeError(f"op: expected an MPI.Op such as MPI.SUM, got {type(op).__name__}")
    cdef MPI_Op handle = (<_MPI.Op>op).ob_mpi
    cdef int k = 0, tindex = x.tindex
    while k < NOPS and OPS[k] != handle:
        k += 1
    if k < NOPS and x.dtype == MPI_WCHAR and MPI_WCHAR != MPI_DATATYPE_NULL:
        # (moved as its bytes, as uint32; MPI reduces no characters: MPI_ERR_OP)
        raise TypeError(f"op: MPI.{OP_NAMES[k]} does not apply to MPI.WCHAR elements "
                        "(characters: no predefined operation reduces them)")
    if k == NOPS or tindex < 0:         # user-defined op or datatype: MPI decides
        if k == NOPS:
            check_reduction(handle, tindex)
        out[0] = handle
        return 0
    cdef int category = TYPES[tindex].category
    if not (ops_for_category(category) & (1 << k)):
        allowed = [OP_NAMES[j] for j in range(NOPS) if ops_for_category(category) & (1 << j)]
        raise TypeError(f"op: MPI.{OP_NAMES[k]} does not apply to {TYPE_NAMES[tindex]} "
                        f"elements (it takes: {', '.join(allowed)})")
    if category == CAT_HALF:
        create_half_ops()
        out[0] = HALF_OPS[tindex == T_BFLOAT16][k]
    else:
        out[0] = handle
    return 0


cdef int check_reduction(MPI_Op handle, int tindex) except -1:
    """Refuse the predefined ops that are not reductions of `tindex` elements
    (-1: a datatype mcr does not know), which MPI would only call invalid."""
    elements = f"{TYPE_NAMES[tindex]} elements" if tindex >= 0 else "elements of this datatype"
    if handle == MPI_OP_NULL:
        raise ValueError(f"op: MPI.OP_NULL is not an operation; cannot reduce {elements}")
    if handle == MPI_REPLACE or handle == MPI_NO_OP:
        name = "REPLACE" if handle == MPI_REPLACE else "NO_OP"
        raise TypeError(f"op: MPI.{name} is not a reduction (it is for one-sided "
                        f"accumulate operations only); cannot reduce {elements}")
    if (handle == MPI_MAXLOC or handle == MPI_MINLOC) and tindex >= 0:
        name = "MAXLOC" if handle == MPI_MAXLOC else "MINLOC"
        raise TypeError(f"op: MPI.{name} does not apply to {elements}: it takes "
                        "(value, index) pairs such as MPI.DOUBLE_INT or MPI.FLOAT_INT")
    return 0
