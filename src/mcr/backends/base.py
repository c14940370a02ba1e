"""The interface every backend implements, and what each declares about itself."""

from typing import Any

__all__ = ["Backend"]


class Backend:
    """A communication backend, registered by the module that defines it.

    Attributes
    ----------
    name : str
        The name users pass as ``backend=``.
    devices : frozenset of str
        Where the buffers it serves live: ``"cpu"`` (host memory), ``"cuda"``.
    native : frozenset of str
        The Comm operations it runs as one call of its own; every other
        operation is composed (``mcr.backends.compose``).
    reductions : dict
        Reduction op name (``"SUM"`` ...) -> element type names the backend
        reduces itself; other op/type pairs are reduced by mcr (exactly, in
        rank order) after gathering the operands.
    p2p_pollable : bool
        Whether ``is_completed()`` of its send/receive works turns true on its
        own (Gloo's only does inside ``wait()``).
    """

    name: str = ""
    devices: frozenset[str] = frozenset()
    native: frozenset[str] = frozenset()
    reductions: dict[str, frozenset[str]] = {}
    p2p_pollable: bool = True

    def unavailable(self) -> str | None:
        """None when the backend can run here, else the reason it cannot."""
        return None

    def create(self, comm: Any) -> Any:
        """The sub-communicator of ``comm`` on this backend. It may defer the
        collective set-up to its first operation (the torch backends do)."""
        raise NotImplementedError

    def device_error(self, arg: str, device: int) -> ValueError | None:
        """The error for a buffer this backend cannot serve, or None."""
        where = "cuda" if device >= 0 else "cpu"
        if where in self.devices:
            return None
        place = f"CUDA device {device}" if device >= 0 else "host memory"
        served = " and ".join("CUDA" if d == "cuda" else "host (CPU)" for d in
                              sorted(self.devices))
        return ValueError(f"{arg}: backend {self.name!r} cannot serve a buffer in {place}; "
                          f"it serves {served} buffers (use backend='mpi', which serves both)")
