# The element types mcr knows: one table, from which buffer formats, torch
# dtypes, MPI datatypes and the allowed reduction ops are all derived.

from libc.limits cimport CHAR_MIN
from libc.stddef cimport wchar_t

cdef enum:
    CAT_BOOL = 1
    CAT_INT = 2
    CAT_FLOAT = 4
    CAT_HALF = 8        # float16/bfloat16: moved as MPI_UINT16_T, reduced by mcr's ops
    CAT_COMPLEX = 16

cdef enum:
    T_BOOL, T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32,
    T_UINT64, T_INT64, T_FLOAT16, T_BFLOAT16, T_FLOAT32, T_FLOAT64,
    T_COMPLEX64, T_COMPLEX128, T_LONGDOUBLE, T_CLONGDOUBLE, NTYPES

# name (torch.<name>, where torch has it), category, itemsize, buffer format codes
TYPE_TABLE = (
    ("bool",       CAT_BOOL,    1, "?"),
    ("uint8",      CAT_INT,     1, "B"),
    ("int8",       CAT_INT,     1, "b"),
    ("uint16",     CAT_INT,     2, "H"),
    ("int16",      CAT_INT,     2, "h"),
    ("uint32",     CAT_INT,     4, ""),
    ("int32",      CAT_INT,     4, ""),
    ("uint64",     CAT_INT,     8, ""),
    ("int64",      CAT_INT,     8, ""),
    ("float16",    CAT_HALF,    2, "e"),
    ("bfloat16",   CAT_HALF,    2, ""),
    ("float32",    CAT_FLOAT,   4, "f"),
    ("float64",    CAT_FLOAT,   8, "d"),
    ("complex64",  CAT_COMPLEX, 8, "Zf"),
    ("complex128", CAT_COMPLEX, 16, "Zd"),
    # C long double (x86-64: 80-bit extended in 16 bytes); torch has no such dtype
    ("longdouble", CAT_FLOAT,   sizeof(long double), "g"),
    ("clongdouble", CAT_COMPLEX, 2 * sizeof(long double), "Zg"),
)

cdef struct typeinfo:
    MPI_Datatype mpi
    int category
    int itemsize
    PyObject *torch_dtype    # borrowed; the dtype objects live as long as torch

cdef typeinfo TYPES[NTYPES]
cdef dict FORMAT_TO_TYPE = {}     # struct format code or typecode -> type index
cdef dict HANDLE_TO_TYPE = {}     # MPI datatype handle (as int) -> type index
cdef list TYPE_NAMES = [row[0] for row in TYPE_TABLE]


cdef inline Py_ssize_t handle_key(MPI_Datatype dt) noexcept:
    return <Py_ssize_t>dt


cdef void init_type_table() noexcept:
    cdef MPI_Datatype handles[NTYPES]
    handles[:] = [MPI_C_BOOL, MPI_UINT8_T, MPI_INT8_T, MPI_UINT16_T,
                  MPI_INT16_T, MPI_UINT32_T, MPI_INT32_T, MPI_UINT64_T,
                  MPI_INT64_T, MPI_UINT16_T, MPI_UINT16_T, MPI_FLOAT,
                  MPI_DOUBLE, MPI_C_FLOAT_COMPLEX, MPI_C_DOUBLE_COMPLEX,
                  MPI_LONG_DOUBLE, MPI_C_LONG_DOUBLE_COMPLEX]
    cdef int i
    for i, (name, category, itemsize, codes) in enumerate(TYPE_TABLE):
        TYPES[i].mpi = handles[i]
        TYPES[i].category = category
        TYPES[i].itemsize = itemsize
        TYPES[i].torch_dtype = NULL
        if codes:
            FORMAT_TO_TYPE[codes] = i
        if category != CAT_HALF and handles[i] != MPI_DATATYPE_NULL:
            HANDLE_TO_TYPE[handle_key(handles[i])] = i
    # numpy's typecodes, kind and item size ("f2", "u8", "c16"), as mpi4py's typedict has
    # them: through its MPI datatypes "f2" would be MPI_SHORT_FLOAT, which is no handle
    # of TYPES (float16 moves as MPI_UINT16_T)
    kinds = {CAT_BOOL: "b", CAT_FLOAT: "f", CAT_HALF: "f", CAT_COMPLEX: "c"}
    for i, (name, category, itemsize, codes) in enumerate(TYPE_TABLE):
        if name != "bfloat16":                     # (numpy has none)
            kind = "u" if name.startswith("uint") else kinds.get(category, "i")
            FORMAT_TO_TYPE.setdefault(f"{kind}{itemsize}", i)
    # C integer codes whose size depends on the platform
    import struct
    ints = {(1, True): T_INT8, (2, True): T_INT16, (4, True): T_INT32, (8, True): T_INT64,
            (1, False): T_UINT8, (2, False): T_UINT16, (4, False): T_UINT32, (8, False): T_UINT64}
    for code in "bhilqn":
        FORMAT_TO_TYPE[code] = ints[struct.calcsize(code), True]
        FORMAT_TO_TYPE[code.upper()] = ints[struct.calcsize(code), False]
    # struct's "c" and mpi4py's typecode "c" are C char, as MPI_CHAR is
    FORMAT_TO_TYPE["c"] = T_INT8 if CHAR_MIN < 0 else T_UINT8
    # characters as mpi4py maps them: "s" (numpy's bytes "S1": "1s") is C char; "u" is
    # UCS-2 (MPI_UINT16_T); "w" (array "u", numpy's str "U1": "1w") is UCS-4, MPI_WCHAR
    # in mpi4py, moved here as uint32, its 4 bytes
    FORMAT_TO_TYPE["s"] = FORMAT_TO_TYPE["c"]
    FORMAT_TO_TYPE["u"] = T_UINT16
    FORMAT_TO_TYPE["w"] = T_UINT32
    # pointers: "P" is void* (ctypes' c_void_p), unsigned as in mpi4py; mpi4py's
    # typecode "p" is MPI_AINT, signed (struct's "p", a Pascal string, is no buffer's)
    FORMAT_TO_TYPE["P"] = ints[struct.calcsize("P"), False]
    FORMAT_TO_TYPE["p"] = ints[struct.calcsize("P"), True]
    # Named MPI datatypes a user may pass explicitly, with the same meaning.
    cdef MPI_Datatype aliases[21]
    cdef int alias_types[21]
    aliases[:] = [MPI_CHAR, MPI_SIGNED_CHAR, MPI_UNSIGNED_CHAR, MPI_SHORT,
                  MPI_UNSIGNED_SHORT, MPI_INT, MPI_UNSIGNED, MPI_LONG,
                  MPI_UNSIGNED_LONG, MPI_LONG_LONG, MPI_UNSIGNED_LONG_LONG,
                  MPI_CXX_BOOL, MPI_C_COMPLEX, MPI_CXX_FLOAT_COMPLEX,
                  MPI_CXX_DOUBLE_COMPLEX, MPI_SHORT, MPI_INT, MPI_LONG,
                  MPI_LONG_LONG, MPI_FLOAT, MPI_CXX_LONG_DOUBLE_COMPLEX]
    alias_types[:] = [FORMAT_TO_TYPE["c"], T_INT8, T_UINT8, FORMAT_TO_TYPE["h"],
                      FORMAT_TO_TYPE["H"], FORMAT_TO_TYPE["i"], FORMAT_TO_TYPE["I"],
                      FORMAT_TO_TYPE["l"], FORMAT_TO_TYPE["L"], FORMAT_TO_TYPE["q"],
                      FORMAT_TO_TYPE["Q"], T_BOOL, T_COMPLEX64, T_COMPLEX64,
                      T_COMPLEX128, FORMAT_TO_TYPE["h"], FORMAT_TO_TYPE["i"],
                      FORMAT_TO_TYPE["l"], FORMAT_TO_TYPE["q"], T_FLOAT32, T_CLONGDOUBLE]
    for i in range(21):
        if aliases[i] != MPI_DATATYPE_NULL:
            HANDLE_TO_TYPE.setdefault(handle_key(aliases[i]), alias_types[i])
    # MPI_WCHAR (mpi4py's typecode "U"), C's wchar_t: its bytes, as format "w" moves
    if MPI_WCHAR != MPI_DATATYPE_NULL and sizeof(wchar_t) in (2, 4):
        HANDLE_TO_TYPE.setdefault(handle_key(MPI_WCHAR),
                                  T_UINT32 if sizeof(wchar_t) == 4 else T_UINT16)


cdef int bind_torch_dtypes(object torch) except -1:
    cdef int i
    for i in range(NTYPES):
        dtype = getattr(torch, TYPE_TABLE[i][0], None)
        TYPES[i].torch_dtype = <PyObject*>dtype if dtype is not None else NULL
    return 0


cdef inline int torch_type_index(object dtype) noexcept:
    # float32 and int64 come first in practice; a scan of 17 pointers beats a dict
    cdef PyObject *p = <PyObject*>dtype
    if p == TYPES[T_FLOAT32].torch_dtype:
        return T_FLOAT32
    cdef int i
    for i in range(NTYPES):
        if p == TYPES[i].torch_dtype:
            return i
    return -1


cdef int format_type_index(str fmt, Py_ssize_t itemsize, const char *arg) except -2:
    """Type index of a struct format string (buffer protocol) for items of
    `itemsize` bytes."""
    code = fmt
    if code and code[0] in "@=<>!":
        if code[0] in ">!" and _LITTLE_ENDIAN or code[0] == "<" and not _LITTLE_ENDIAN:
            raise BufferError(f"{arg.decode()}: byte order of buffer format {fmt!r} "
                              "is not the machine's")
        code = code[1:]
    repeat = code[:len(code) - len(code.lstrip("0123456789"))]
    if repeat and int(repeat) != 1:
        # (numpy's "S3", "U3": mpi4py has no MPI datatype for them either)
        raise TypeError(f"{arg.decode()}: buffer format {fmt!r} has {repeat} values per "
                        "element, which no MPI datatype matches; give the datatype of one "
                        "value, counted in values: [buf, MPI.CHAR] for numpy's 'S', "
                        "[buf, MPI.WCHAR] for 'U'")
    index = FORMAT_TO_TYPE.get(code[len(repeat):])
    if index is None:
        raise TypeError(f"{arg.decode()}: buffer format {fmt!r} is not supported; "
                        f"supported formats: {' '.join(sorted(FORMAT_TO_TYPE))}")
    if index == T_UINT16 and code == "u" and itemsize == 4:
        return T_UINT32         # ctypes' c_wchar: "u" for a 4-byte wchar_t, not UCS-2
    return index


cdef int datatype_type_index(MPI_Datatype dt) noexcept:
    """Type index of a named MPI datatype, or -1 for others (derived, BYTE ...)."""
    index = HANDLE_TO_TYPE.get(handle_key(dt))
    return -1 if index is None else index


import sys as _sys
cdef bint _LITTLE_ENDIAN = _sys.byteorder == "little"
