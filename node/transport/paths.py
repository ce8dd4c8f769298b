"""Path truth: is a session direct or relayed, and through which relay (specs/transport.md §3).

iroh keeps every open network path of a connection and marks the one it selected for
application data. :func:`path_of` turns that snapshot — a list of objects with
``is_selected``, ``is_relay``, ``is_ip`` and ``remote_addr``, as the binding's
``Connection.paths()`` and ``watch_paths`` callback give them — into one
:class:`PathInfo`; :class:`PathTracker` remembers the last one of a session and reports a
change (direct → relayed or back, a new relay) once. Nothing here imports iroh, so the
relayed case and a change are tested by feeding constructed snapshots
(``tests/test_transport_modes.py``); the iroh side is :meth:`node.transport.iroh.IrohStream.path`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

#: The kinds a path can be (``PathInfo.kind``).
PATH_KINDS = ("direct", "relayed", "unknown")


@dataclass(frozen=True)
class PathInfo:
    """The path a session's data takes now.

    Attributes:
        kind: ``"direct"`` (UDP straight between the two endpoints), ``"relayed"``
            (through a relay server, which sees both endpoints' IPs and the traffic
            volume but not its content) or ``"unknown"`` (no path selected yet, the
            connection closed, or a transport that does not say: the memory pipe).
        relay_url: the relay's URL when ``kind`` is ``"relayed"``, else None.
        remote: the peer's socket address of a direct path (``"127.0.0.1:50913"``), else
            None. Shown to the owner only (the host's events, ``kith sessions``).
    """

    kind: str = "unknown"
    relay_url: str | None = None
    remote: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "relayUrl", "remote"}`` (the control channel's and events' shape)."""
        return {"kind": self.kind, "relayUrl": self.relay_url, "remote": self.remote}

    def describe(self) -> str:
        """One line for people: ``direct (127.0.0.1:50913)``, ``relayed via URL``, ``unknown``."""
        if self.kind == "relayed":
            return f"relayed via {self.relay_url or 'an unnamed relay'}"
        if self.kind == "direct":
            return f"direct ({self.remote})" if self.remote else "direct"
        return "unknown"


UNKNOWN = PathInfo()


def _relay_url(remote_addr: str) -> str:
    """The relay URL in a relay path's ``remote_addr`` (iroh prints the URL; a wrapped
    form such as ``Relay(https://…)`` is unwrapped)."""
    text = str(remote_addr).strip()
    start = text.find("http")
    if start > 0 and text.endswith(")"):
        return text[start:-1]
    return text


def path_of(snapshots: Iterable[Any] | None) -> PathInfo:
    """The selected path of one connection snapshot.

    Args:
        snapshots: the connection's open paths (``iroh.PathSnapshot`` or anything with
            ``is_selected``, ``is_relay``, ``is_ip`` and ``remote_addr``), or None.

    Returns:
        :class:`PathInfo`: the selected path's kind; ``unknown`` when none is selected.
    """
    for snap in snapshots or ():
        if not getattr(snap, "is_selected", False):
            continue
        if getattr(snap, "is_relay", False):
            return PathInfo("relayed", relay_url=_relay_url(getattr(snap, "remote_addr", "")))
        if getattr(snap, "is_ip", False):
            return PathInfo("direct", remote=str(getattr(snap, "remote_addr", "")) or None)
    return UNKNOWN


class PathTracker:
    """The last known path of one session, and its changes.

    Args:
        initial: the path when the session started (default ``unknown``).
    """

    def __init__(self, initial: PathInfo = UNKNOWN) -> None:
        self.current = initial

    def update(self, snapshots: Iterable[Any] | None) -> tuple[PathInfo, PathInfo] | None:
        """Feed one snapshot; returns ``(previous, now)`` when the path changed (kind,
        relay or direct address), None when it did not (iroh reports stats changes of the
        same path too). A snapshot with no selected path (the connection closing) is not
        a change: the last known path stays."""
        now = path_of(snapshots)
        if now.kind == "unknown" or now == self.current:
            return None
        previous, self.current = self.current, now
        return previous, now


def watch(stream: Any, on_change: Any) -> PathInfo:
    """Start watching ``stream``'s path: ``on_change(previous, now)`` is called on each
    change (:meth:`node.transport.iroh.IrohStream.watch_path`). Returns the path now;
    ``unknown`` (and no watching) for a transport that has no paths (the memory pipe)."""
    start = getattr(stream, "watch_path", None)
    return start(on_change) if start is not None else UNKNOWN


__all__ = ["PATH_KINDS", "PathInfo", "PathTracker", "UNKNOWN", "path_of", "watch"]
