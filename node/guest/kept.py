"""What a guest keeps of others, for the owner's views (``kith status``, the dashboard;
issue 42 item 6): its copies of peers' corpora and its outbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.common.errors import KithError


def kept_report(home: Path) -> dict[str, Any]:
    """What this node keeps as a guest (issue 42 item 6): ``{"copies": [kith copies list
    rows], "outbox": {"questions", "open", "bytes", ...} | {"error": code} | null}``
    (``outbox`` null when no question was ever kept: the file is not made by a look)."""
    from node.guest.copies.store import list_copies
    from node.guest.outbox import OUTBOX_FILE, OutboxStore

    try:
        copies = list_copies(home)
    except KithError as exc:
        copies = [{"peer": None, "error": {"code": exc.code, "message": exc.message, "hint": exc.hint}}]
    outbox: dict[str, Any] | None = None
    if (home / OUTBOX_FILE).exists():
        try:
            with OutboxStore(home) as store:
                outbox = store.usage()
        except KithError as exc:
            outbox = {"error": exc.code}
    return {"copies": copies, "outbox": outbox}


__all__ = ["kept_report"]
