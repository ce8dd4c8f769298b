"""The owner's one open corpus for answers: opened read-only on first use, kept open, and
opened again once a corpus appears (the local API, the dashboard)."""

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
        self._lock = threading.Lock()

    def start(self, warn: Callable[[str], None] | None = None) -> str:
        """Open the corpus and repair a lagging index now if the writer lock is free
        (never waits for it). Returns :meth:`Corpus.repair_lag`'s outcome; ``locked``
        is reported through ``warn``."""
        outcome = self.get().repair_lag()
        if outcome == "locked" and warn is not None:
            warn("the index is behind its record and another process holds the writer "
                 "(a sync is running?); searches say index-syncing until it finishes")
        return outcome

    def get(self) -> Any:
        from node.corpus.store import Corpus

        with self._lock:
            if self._corpus is None or self._corpus._db is None:
                if self._corpus is not None:
                    self._corpus.close()
                self._corpus = Corpus(self.home, readonly=True)
            return self._corpus

    def close(self) -> None:
        with self._lock:
            if self._corpus is not None:
                self._corpus.close()
                self._corpus = None
