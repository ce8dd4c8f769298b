"""The owner's one open corpus for answers: opened read-only on first use, kept open, and
opened again once a corpus appears — shared by every search of a long-lived process (the
local API, the dashboard, the MCP server, the fan-out's ``local`` row) instead of one
``Corpus`` per search."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


class CorpusHolder:
    """Opens the home's corpus read-only on first use, and again once a corpus appears
    (``kith index sync`` may run after the API started)."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self._corpus: Any = None
        self._had_record = False  # the record existed when the open handle was made
        self._lock = threading.Lock()

    def start(self, warn: Callable[[str], None] | None = None) -> str:
        """Open the corpus and repair a lagging index now if the writer lock is free
        (never waits for it). Returns :meth:`Corpus.repair_lag`'s outcome; ``locked``
        is reported through ``warn``."""
        outcome = self.get().repair_lag(warn)
        if outcome == "locked" and warn is not None:
            warn("the index is behind its record and another process holds the writer "
                 "(a sync is running?); searches say index-syncing until it finishes")
        return outcome

    def get(self) -> Any:
        """The open read-only :class:`~node.corpus.store.Corpus` (made now if none is
        open, or if the one open was made before the home had a corpus record)."""
        from node.corpus.store import Corpus

        with self._lock:
            if self._corpus is None or (not self._had_record and self._corpus.db_path.exists()):
                if self._corpus is not None:
                    self._corpus.close()
                self._corpus = Corpus(self.home, readonly=True)
                # public names only: a handle made while the home had no record holds none
                self._had_record = self._corpus.db_path.exists()
            return self._corpus

    def close(self) -> None:
        """Close the open corpus, if any (the next :meth:`get` opens it again)."""
        with self._lock:
            if self._corpus is not None:
                self._corpus.close()
                self._corpus = None
