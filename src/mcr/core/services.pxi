# The Python modules the core calls (the backends' registry, mcr.stages,
# mcr.tuning, mcr.compress, mcr.device, mcr.launch, the backends' message
# sides) lie above it: they import the core. It imports none of them; the
# top layer (mcr/__init__.py) provides each to mcr._services by name, and
# the core asks for it there, once.

from mcr import _services


cdef inline object service(str name):
    """The module provided as `name` (see mcr._services)."""
    return _services.get(name)
