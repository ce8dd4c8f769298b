"""The UDP port a home's host keeps across restarts (issue 30; specs/transport.md §7).

In the modes where a guest can reach a host only at the addresses its ticket names —
offline (loopback), LAN and ``--relay none`` (direct only, nothing published) — a host
that came back on another port would break every invitation written before. So
``kith host`` binds the port it bound last time (``<home>/endpoint.json``,
``{"version": 1, "port": N}``, written 0600 tmp+rename), tried again for a few seconds
when it is taken, and takes another one only when it stays taken — for that run only: the
kept port is not replaced, so the next start is back where the invitations say (and it says
so). The modes with relays or n0's address lookup find a host by
its endpoint id whatever its port, and keep none. No iroh import here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from node.common.home import atomic_write

#: The file under the home that keeps the host's port.
PORT_FILE = "endpoint.json"


def keeps_port(mode: Any) -> bool:
    """Does ``mode`` (a :class:`node.transport.modes.TransportMode`) keep the home's port?
    True for the direct-only modes: offline, LAN and ``none``."""
    return not mode.relays


def load_port(home: Path) -> int | None:
    """The port this home's host bound last, or None (no file, or one that is not a
    ``{"version": 1, "port": 1-65535}`` object: a bad file is ignored and rewritten at the
    next bind — it holds nothing that could not be chosen again)."""
    from node.common.errors import ConfigError
    from node.common.home import read_json_state

    try:
        data = read_json_state(Path(home) / PORT_FILE)
    except (OSError, ConfigError):
        return None
    port = data.get("port") if isinstance(data, dict) and data.get("version") == 1 else None
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else None


def port_file_damaged(home: Path) -> bool:
    """True when ``<home>/endpoint.json`` exists but :func:`load_port` cannot read a port
    from it (garbage, truncated, empty, a folder in its place, no permission): the port
    of the last run is then unknown."""
    path = Path(home) / PORT_FILE
    return (path.exists() or path.is_symlink()) and load_port(home) is None


def save_port(home: Path, port: int) -> None:
    """Keep ``port`` as this home's host port (atomically; unchanged files are not rewritten)."""
    if load_port(home) == port:
        return
    atomic_write(Path(home) / PORT_FILE, (json.dumps({"version": 1, "port": int(port)}) + "\n").encode())


def with_port(bind_addr: str, port: int) -> str:
    """``bind_addr`` (``HOST:0``) with ``port`` in place of its port."""
    host = bind_addr.rsplit(":", 1)[0]
    return f"{host}:{int(port)}"


__all__ = ["PORT_FILE", "keeps_port", "load_port", "port_file_damaged", "save_port", "with_port"]
