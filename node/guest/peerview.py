"""One view per process of each home file the asking side reads on every question:
``peers.json``, and the kept device cards and revocation lists. A file is read again only
when it changed (its inode, modification time or size: every write is a temp file renamed
into place), so a warm question reads nothing. The owner is the process's
:class:`node.guest.owner.Guest` (:attr:`~node.guest.owner.Guest.peers`,
:meth:`~node.guest.owner.Guest.home_file`), and every pool it makes reads through its views
(:attr:`node.guest.pool.SessionPool.peers`); the asker, the sessions, the fan-out, the
outbox's delivery and the copies' sync read through them. Writers load and save the file
themselves, only when they change it; a view sees their write at its next read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from node.trust.peers import PEERS_FILE, PeerRegistry


class FileView:
    """``now()`` → ``load(home)`` as ``<home>/name`` says now; a file that cannot be loaded
    raises as ``load`` does, each time it is asked, until fixed. ``loads`` counts the reads
    (tests, benchmarks)."""

    def __init__(self, home: Path, name: str, load: Callable[[Path], Any]) -> None:
        self.home = Path(home)
        self.path = self.home / name
        self.load = load
        self.loads = 0
        self._stamp: Any = None
        self._value: Any = None
        self._read = False

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def now(self) -> Any:
        """The loaded file, loaded again only when it changed since the last read."""
        stamp = self._stat()
        if not self._read or stamp != self._stamp:
            value = self.load(self.home)
            self.loads += 1
            self._value, self._stamp, self._read = value, stamp, True
        return self._value


class PeerView(FileView):
    """The peer registry (:class:`node.trust.peers.PeerRegistry`) as ``peers.json`` says now."""

    def __init__(self, home: Path) -> None:
        super().__init__(home, PEERS_FILE, PeerRegistry.load)

    def now(self) -> PeerRegistry:
        return super().now()


__all__ = ["FileView", "PeerView"]
