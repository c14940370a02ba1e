"""``MCR_LOG``: what the logger is asked for (read without loading MPI)."""

import os

from mcr._outputs import unwritable

__all__ = ["Config"]


class Config:
    """What ``MCR_LOG`` asks for (``parse``)."""

    def __init__(self) -> None:
        self.summary = False          # print a table at exit
        self.ranks = False            # ... every rank's own (else rank 0's)
        self.stragglers = False       # ... and the cross-rank table (collective)
        self.json: str | None = None  # the JSON log's path
        self.trace: str | None = None  # the trace's path

    @property
    def keep(self) -> bool:
        """Whether every record must be kept (not only the totals)."""
        return self.json is not None or self.trace is not None

    @classmethod
    def parse(cls, text: str) -> "Config":
        """Parse ``MCR_LOG``'s value: comma-separated ``summary``,
        ``summary:ranks``, ``summary:stragglers``, ``json:PATH``, ``trace:PATH``.

        Raises
        ------
        ValueError
            Naming ``MCR_LOG``, the item and what is accepted.
        """
        cfg = cls()
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            kind, _, arg = item.partition(":")
            if kind == "summary" and arg in ("", "ranks", "stragglers"):
                cfg.summary = True
                cfg.ranks = cfg.ranks or arg == "ranks"
                cfg.stragglers = cfg.stragglers or arg == "stragglers"
            elif kind in ("json", "trace") and arg:
                setattr(cfg, kind, arg)
            else:
                raise ValueError(
                    f"MCR_LOG: {item!r} is not understood; expected comma-separated "
                    "'summary', 'summary:ranks', 'summary:stragglers', 'json:PATH' or "
                    "'trace:PATH'")
        return cfg

    @classmethod
    def from_env(cls) -> "Config | None":
        """The configuration ``MCR_LOG`` asks for; None when it is unset, empty,
        ``0``, ``off`` or ``none``."""
        text = os.environ.get("MCR_LOG", "").strip()
        if not text or text.lower() in ("0", "off", "none"):
            return None
        cfg = cls.parse(text)
        for kind in ("json", "trace"):
            path = getattr(cfg, kind)
            if path is not None:
                _check_writable(f"{kind}:{path}", path)
        return cfg


def _check_writable(item: str, path: str) -> None:
    """Raise ValueError naming MCR_LOG's `item` unless the log can be written at
    `path` at exit (the command-line tools' check of their output files)."""
    problem = unwritable(path)
    if problem is not None:
        raise ValueError(f"MCR_LOG: {item!r}: cannot write the file: {problem}")
