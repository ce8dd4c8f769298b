"""UI artifacts on disk (DESIGN §6, optional UI branch): the Host loads a protocol's
``ui/`` folder as a bundle (``kith host --share-ui``); the Guest installs a bundle it
received and verified into a session-scoped folder of its home
(``kith join --accept-host-ui``). The wire rules and checks are in
:mod:`node.engine.ui` (no I/O); this module does the file work around them.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from node.engine import ui as UI
from node.common.errors import HandshakeError

#: Installed session UIs kept under ``<home>/ui/sessions`` (older ones are removed).
KEEP_SESSIONS = 20
_SESSION_ID = re.compile(r"^[0-9a-f]{64}$")


def local_ui_dir(protocol_dir: Path) -> Path | None:
    """The protocol's own UI (``<protocol_dir>/ui`` with an ``index.html``), or None.

    A Guest with a local UI never asks the Host for one (DESIGN §6).
    """
    ui = Path(protocol_dir) / "ui"
    index = ui / "index.html"
    if ui.is_dir() and not ui.is_symlink() and index.is_file() and not index.is_symlink():
        return ui
    return None


def load_bundle(protocol_dir: Path) -> UI.Bundle:
    """Read ``<protocol_dir>/ui`` as a bundle to share.

    Refuses links and non-regular files anywhere in the folder, paths the Guest would
    refuse, and bundles over the limits of :mod:`node.engine.ui`.

    Returns:
        The checked :class:`node.engine.ui.Bundle` (files in memory, sorted by path).

    Raises:
        HandshakeError: ``ui-bundle-invalid`` (with the reason) when the folder is missing,
            has no ``index.html``, holds a link or special file, or breaks a limit.
    """
    root = Path(protocol_dir) / "ui"
    if root.is_symlink() or not root.is_dir():
        raise HandshakeError("ui-bundle-invalid", "the protocol has no ui/ folder to share")
    files: dict[str, bytes] = {}
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            st = os.lstat(full)
            rel = full.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                raise HandshakeError("ui-bundle-invalid", f"ui/{rel} is a link; a shared UI may only hold regular files")
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise HandshakeError("ui-bundle-invalid", f"ui/{rel} is not a regular file")
            try:
                UI.check_path(rel)
            except HandshakeError as exc:
                raise HandshakeError("ui-bundle-invalid", f"ui/{rel}: {exc.message}") from None
            if st.st_size > UI.MAX_FILE_BYTES or total + st.st_size > UI.MAX_TOTAL_BYTES or len(files) >= UI.MAX_FILES:
                raise HandshakeError("ui-bundle-invalid", "the ui/ folder is over the UI bundle limits "
                                                          f"({UI.MAX_FILES} files, {UI.MAX_TOTAL_BYTES} bytes)")
            data = full.read_bytes()
            total += len(data)
            files[rel] = data
    try:
        return UI.Bundle.from_files(files)
    except HandshakeError as exc:
        raise HandshakeError("ui-bundle-invalid", exc.message) from None


def install_bundle(home: Path, session_id: str, files: dict[str, bytes]) -> Path:
    """Install a verified bundle as ``<home>/ui/sessions/<session_id>/`` and return the
    path of its ``index.html`` (open it in a browser).

    The files are written into a fresh private temporary folder with exclusive,
    no-follow creates (nothing already on disk can redirect a write), every path is checked
    again, and the folder is renamed into place only when complete.

    Raises:
        HandshakeError: ``ui-install-failed`` (bad session id, an existing install, a
            disk error) or ``ui-path-invalid``.
    """
    if not _SESSION_ID.fullmatch(session_id or ""):
        raise HandshakeError("ui-install-failed", "the session id is not 64 lowercase hex")
    base = Path(home) / "ui" / "sessions"
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = base / session_id
        if target.exists() or target.is_symlink():
            raise HandshakeError("ui-install-failed", "a UI is already installed for this session")
        tmp = Path(tempfile.mkdtemp(prefix=".install-", dir=base))
        try:
            for rel, data in files.items():
                UI.check_path(rel)
                dest = tmp.joinpath(*rel.split("/"))
                parent = dest.parent
                parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                if not parent.resolve().is_relative_to(tmp.resolve()):
                    raise HandshakeError("ui-path-invalid", "a UI path escapes the bundle")
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except OSError:
        raise HandshakeError("ui-install-failed", "the UI could not be written under the guest's home") from None
    _prune(base)
    return target / "index.html"


def _prune(base: Path) -> None:
    dirs = sorted((p for p in base.iterdir() if p.is_dir() and _SESSION_ID.fullmatch(p.name)),
                  key=lambda p: p.stat().st_mtime)
    for old in dirs[:-KEEP_SESSIONS]:
        shutil.rmtree(old, ignore_errors=True)


def write_results_js(ui_dir: Path, messages: list[dict]) -> Path:
    """Write the session's ``results`` messages beside an installed UI as ``results.js``
    (``window.KITH_RESULTS = [...]``), so its ``index.html`` shows them when opened from
    disk. The JSON is escaped so no message text can close the script.

    Returns:
        The path written.
    """
    import json

    from node.common.home import atomic_write

    payload = json.dumps(messages, ensure_ascii=True).replace("<", "\\u003c").replace(">", "\\u003e")
    path = Path(ui_dir) / "results.js"
    atomic_write(path, f"window.KITH_RESULTS = {payload};\n".encode("ascii"), mode=0o644)
    return path
