"""One view of the peer registry per process: ``<home>/peers.json`` read again only when the
file changed (its inode, modification time or size: every write is a temp file renamed into
place), so a warm question reads nothing. The owner is the process's session pool
(:attr:`node.guest.pool.SessionPool.peers`); the asker, the fan-out and the copies' sync read
the registry through it. Writers load and save the registry themselves
(:class:`node.trust.peers.PeerRegistry`); the view sees their write at its next read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.trust.peers import PEERS_FILE, PeerRegistry


class PeerView:
    """``now()`` → the registry as ``peers.json`` says now (a broken file raises
    ``config-invalid`` as :meth:`node.trust.peers.PeerRegistry.load` does, each time it is
    asked, until fixed). ``loads`` counts the reads (tests, benchmarks)."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.path = self.home / PEERS_FILE
        self.loads = 0
        self._stamp: Any = None
        self._registry: PeerRegistry | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def now(self) -> PeerRegistry:
        """The registry, loaded again only when the file changed since the last read."""
        stamp = self._stat()
        if self._registry is None or stamp != self._stamp:
            registry = PeerRegistry.load(self.home)
            self.loads += 1
            self._registry, self._stamp = registry, stamp
        return self._registry


__all__ = ["PeerView"]
