"""The mpi4py namespace with mcr's communicators, requests and status.

``from mcr import MPI`` in place of ``from mpi4py import MPI``. ``COMM_WORLD``
and ``COMM_SELF`` are mcr communicators; ``Comm``, ``Request``, ``Prequest``
and ``Status`` are mcr's classes; every other name (``MPI.DOUBLE``,
``MPI.Wtime``, ``MPI.SUM``, ``MPI.Intracomm``, ``MPI.Exception``, ...) is
mpi4py's own object, but for ``_handleof`` and ``_addressof``, mpi4py's
functions noting that an mcr request's handle was read. mcr raises
``mcr.Exception``, a subclass of ``MPI.Exception``, so one ``except
MPI.Exception`` catches the errors of both.
The topology communicators that mcr's communicators make (``Create_cart``,
``Create_graph``, ...) are mcr's (``mcr.Cartcomm``, ...), subclasses of
mpi4py's: ``isinstance(cart, MPI.Cartcomm)`` holds.

The class relations are mpi4py's. mcr's classes are Cython classes that
extend mpi4py's (``mcr.Comm`` an ``Intracomm``, ``mcr.Request`` a
``Request``, ``mcr.Prequest`` an ``mcr.Request``); such classes take no
metaclass, and their methods refuse mpi4py's objects as ``self``. So the
names here are thin Python subclasses of them whose metaclass makes
``isinstance``/``issubclass`` also accept mpi4py's counterpart
(``isinstance(MPI.COMM_NULL, MPI.Comm)``, ``isinstance(comm.isend(...),
MPI.Request)``) and the compiled class (``isinstance(comm.Send_init(...),
MPI.Prequest)``), and makes an unbound method taken from the class
(``MPI.Request.Wait(req)``, ``MPI.Comm.Isend(comm, ...)``) run mpi4py's
implementation when ``self`` is not an mcr object. Only attribute access on
the class goes through the metaclass: the objects mcr makes (``COMM_WORLD``,
``Dup``, ``Isend``, ...) stay instances of the compiled classes, and their
method calls pay nothing for it. The class methods (``Request.Waitall``,
...) are mcr's, for lists that mix mcr's and mpi4py's requests.
"""

from mpi4py import MPI as _mpi4py

globals().update({name: value for name, value in vars(_mpi4py).items()
                  if not name.startswith("__")})

from mcr._core import COMM_SELF, COMM_WORLD  # noqa: E402,F401  (replace mpi4py's)
from mcr._core import Cartcomm as _Cartcomm  # noqa: E402
from mcr._core import Comm as _Comm  # noqa: E402
from mcr._core import Distgraphcomm as _Distgraphcomm  # noqa: E402
from mcr._core import Graphcomm as _Graphcomm  # noqa: E402
from mcr._core import Prequest as _Prequest  # noqa: E402
from mcr._core import Request as _Request  # noqa: E402
from mcr._core import Status as _Status  # noqa: E402
from mcr._core import _lend_handle  # noqa: E402
from mcr.log import _from_env as _log_from_env  # noqa: E402

_log_from_env()

_MethodDescriptor = type(_Comm.__dict__["Send"])

# mpi4py's class of a topology communicator -> mcr's
_TOPOLOGIES = {_mpi4py.Cartcomm: _Cartcomm, _mpi4py.Graphcomm: _Graphcomm,
               _mpi4py.Distgraphcomm: _Distgraphcomm}

# the class of mcr.MPI -> the classes whose objects it also accepts: mpi4py's, and the
# compiled one behind it, whose objects mcr makes (a Prequest is no mpi4py Prequest)
_PEERS = {}
# an mcr method -> a function running it, or mpi4py's, by the type of self
_UNBOUND = {}
# mcr's classes behind them (a method is dispatched by the class defining it)
_CORES = set()


class _Namespaced(type):
    """Metaclass of ``mcr.MPI``'s classes: mpi4py's relations (see the module
    docstring)."""

    def __instancecheck__(cls, obj):
        if type.__instancecheck__(cls, obj):
            return True
        peer = _PEERS.get(cls)    # the namespace's own class, not a user's subclass
        return peer is not None and isinstance(obj, peer)

    def __subclasscheck__(cls, sub):
        if type.__subclasscheck__(cls, sub):
            return True
        peer = _PEERS.get(cls)
        return peer is not None and issubclass(sub, peer)

    def __getattribute__(cls, name):
        value = type.__getattribute__(cls, name)
        if type(value) is _MethodDescriptor:
            return _UNBOUND.get(value, value)
        return value


def _dispatcher(core, mine, theirs):
    def method(self, *args, **kwargs):
        if isinstance(self, core):
            return mine(self, *args, **kwargs)
        return theirs(self, *args, **kwargs)
    method.__name__ = mine.__name__
    method.__qualname__ = f"{core.__name__}.{mine.__name__}"
    method.__doc__ = mine.__doc__
    return method


def _peer(cls, core, peer, methods):
    """Make `cls` (over mcr's `core` class) accept `peer`, mpi4py's class, and
    run the methods of `methods`, mpi4py's class, on mpi4py's objects."""
    _PEERS[cls] = (peer, core)
    _CORES.add(core)
    for klass in core.__mro__:          # mcr's classes (Comm and its base _CommBase)
        if klass.__module__ != "mcr._core" or (klass is not core and klass in _CORES):
            continue                    # (Request's methods are Request's, not Prequest's)
        for name, value in vars(klass).items():
            if type(value) is _MethodDescriptor and not name.startswith("__") \
                    and hasattr(methods, name):
                _UNBOUND[value] = _dispatcher(core, value, getattr(methods, name))
    return cls


def _from(peer):
    """The classmethods making objects of a request class from handles, as
    mpi4py's, but of the class they are called on."""
    # the first docstring line is the signature, as Cython writes mpi4py's
    def fromhandle(cls, handle):
        """fromhandle(handle)
        Create object from MPI handle."""
        return cls(peer.fromhandle(handle))

    def fromint(cls, arg):
        """fromint(arg)
        Translate integer handle to object."""
        return cls(peer.fromint(arg))

    def f2py(cls, arg):
        """f2py(arg)
        Create object from Fortran handle."""
        return cls(peer.f2py(arg))
    return classmethod(fromhandle), classmethod(fromint), classmethod(f2py)


def _comm_from():
    """The classmethods making communicators from handles: as mpi4py's
    ``Comm.fromhandle``, a topology handle gives mcr's class of its topology
    (``mcr.Cartcomm``, ...), an intercommunicator handle mpi4py's
    ``Intercomm``, which mcr does not extend, and a plain intracommunicator
    an object of the class they are called on."""
    def convert(make):
        def method(cls, arg):
            comm = make(arg)
            if type(comm) is _mpi4py.Intracomm or comm == _mpi4py.COMM_NULL:
                return cls(comm)
            if cls is not Comm:
                raise TypeError(f"handle: {cls.__name__} is an intracommunicator, the "
                                f"handle is a {type(comm).__name__}")
            topology = _TOPOLOGIES.get(type(comm))
            if topology is not None:
                return topology(comm)
            return comm
        method.__name__ = make.__name__
        method.__doc__ = make.__doc__
        return classmethod(method)
    return (convert(_mpi4py.Comm.fromhandle), convert(_mpi4py.Comm.fromint),
            convert(_mpi4py.Comm.f2py))


class Comm(_Comm, metaclass=_Namespaced):
    """
    Communicator: ``mcr.Comm``, whose buffer methods run on tensors and any buffer.
    """

    __slots__ = ()
    fromhandle, fromint, f2py = _comm_from()


class Request(_Request, metaclass=_Namespaced):
    """
    Request handle: ``mcr.Request``, completing mcr's and mpi4py's operations.
    """

    __slots__ = ()
    fromhandle, fromint, f2py = _from(_mpi4py.Request)


class Prequest(_Prequest, Request):
    """
    Persistent request handle: ``mcr.Prequest``.
    """

    __slots__ = ()
    fromhandle, fromint, f2py = _from(_mpi4py.Prequest)

    def __new__(cls, request=None):
        # as mpi4py's: only a persistent request (or a null one) converts
        if isinstance(request, _mpi4py.Request) and request != _mpi4py.REQUEST_NULL \
                and not isinstance(request, (_Prequest, _mpi4py.Prequest)):
            raise TypeError(f"request: expected a persistent request, got "
                            f"{type(request).__name__}")
        return super().__new__(cls, request)


class Status(_Status, metaclass=_Namespaced):
    """
    Status object: ``mcr.Status``, whose ``Get_count`` counts received elements.
    """

    __slots__ = ()


def _handleof(obj):
    """As mpi4py's ``_handleof``; for an mcr request, the handle leaves it as
    through ``handle``: mcr no longer completes its operation when it is
    collected."""
    if isinstance(obj, _Request):
        _lend_handle(obj)
    return _mpi4py._handleof(obj)


def _addressof(obj):
    """As mpi4py's ``_addressof``; for an mcr request, as ``_handleof``."""
    if isinstance(obj, _Request):
        _lend_handle(obj)
    return _mpi4py._addressof(obj)


# MPI.Comm is mpi4py's base class (COMM_NULL, Cartcomm, Intercomm, ... are
# communicators); mcr's Comm is an intracommunicator, so its methods that
# mpi4py's objects may take are Intracomm's
_peer(Comm, _Comm, _mpi4py.Comm, _mpi4py.Intracomm)
_peer(Request, _Request, _mpi4py.Request, _mpi4py.Request)
_peer(Prequest, _Prequest, _mpi4py.Prequest, _mpi4py.Prequest)
_peer(Status, _Status, _mpi4py.Status, _mpi4py.Status)
