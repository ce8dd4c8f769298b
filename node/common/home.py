"""The node home: where identity, policy, peers, corpus and protocols live (DESIGN §13)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the node home directory (created with mode 0700 if missing).

    Order: ``explicit`` (the ``--home`` option), then ``$KITH_HOME``, then
    ``platformdirs.user_data_dir("kith")``.
    """
    raw = explicit or os.environ.get("KITH_HOME") or platformdirs.user_data_dir("kith")
    home = Path(raw).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically: a temp file in the same folder, fsync, rename.

    The file gets ``mode`` (default 0600) before it becomes visible, so a crash leaves
    either the old file or the new one, never a half-written or world-readable one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
