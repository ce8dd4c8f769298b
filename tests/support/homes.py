"""Paths the tests use and node homes with an identity (`kith init`'s state)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from node.trust.identity import Identity, init_identity, load_or_init_identity
from node.trust.invitation import parse_invitation
from node.trust.peers import PeerRegistry

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS = REPO / "protocols"
#: the shipped knowledge-query protocol folder
KQ = PROTOCOLS / "knowledge-query"
#: its test corpus (a few markdown notes and a private ``notes/`` folder)
FIXTURE = KQ / "test" / "corpus"


def initialized(home: Path) -> Path:
    """``home`` with an identity, as `kith init` leaves it (commands that need one —
    join, host — refuse a home without it); returned for use inline."""
    init_identity(Path(home))
    return Path(home)


def new_identity() -> Identity:
    """A fresh random Ed25519 identity (not written anywhere)."""
    return Identity(os.urandom(32))


def node_home(tmp: Path, name: str) -> Path:
    """``tmp/name`` made (mode 0700) with an identity (`kith init`): host and join refuse a
    home without one."""
    home = tmp / name
    home.mkdir(mode=0o700)
    load_or_init_identity(home)
    return home


def pin_host(guest_home: Path, name: str, invite: Path | dict, key: str | None = None) -> None:
    """Pin the host of ``invite`` (an invitation file or dict) as ``name`` in ``guest_home``'s
    peers, with the invitation kept (``key`` instead of the host's key when given)."""
    inv = parse_invitation(invite.read_bytes() if isinstance(invite, Path) else invite)
    PeerRegistry.load(guest_home).add(name, key or inv.host_public_key, invitation=inv.to_dict())


def public_host_home(tmp: Path, docs: dict[str, str], *, home: str = "host", kb: str = "kb") -> Path:
    """A host's home ``tmp/<home>`` (:func:`node_home`) whose folder ``tmp/<kb>`` holds
    ``docs`` (file name -> text), indexed and shared ``/<kb>/**`` public — in process, no
    `kith`. Returns the home."""
    from node.corpus.store import Corpus
    from node.policy.store import Policy

    folder = tmp / kb
    folder.mkdir()
    for name, text in docs.items():
        (folder / name).write_text(text)
    path = node_home(tmp, home)
    with Corpus(path) as c:
        c.add_root(folder)
        c.sync()
    policy = Policy.load(path)
    policy.set(f"/{kb}/**", "public")
    policy.save()
    return path


def indexed_docs(base: Path, files: dict[str, str], *, folder: str = "docs") -> tuple[Path, Path]:
    """``files`` (path under the folder -> text) written to ``base/<folder>`` and indexed
    into the corpus of ``base/home`` (in process; no identity, no policy): its sources are
    ``/<folder>/...``.

    Returns:
        (home, the folder).
    """
    from node.corpus.store import Corpus

    docs = base / folder
    for rel, text in files.items():
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text(text)
    home = base / "home"
    with Corpus(home) as corpus:
        corpus.add_root(docs)
        corpus.sync()
    return home, docs


@contextlib.contextmanager
def read_only(home: Path) -> Iterator[dict[str, bytes]]:
    """``home`` and everything under it made unwritable (``chmod a-w``) for the block — a
    home the user may read but not write — and their modes put back after. A process run
    as root writes anyway unless started with :func:`support.cli.without_root_reads`.

    Yields:
        Every regular file under ``home`` (path relative to it -> its bytes) as the block
        began: compare with :func:`files_of` to show nothing changed.
    """
    home = Path(home)
    modes = {p: p.lstat().st_mode for p in [home, *home.rglob("*")] if not p.is_symlink()}
    try:
        for p, mode in modes.items():
            p.chmod(stat.S_IMODE(mode) & ~0o222)
        yield files_of(home)
    finally:
        for p, mode in modes.items():
            with contextlib.suppress(FileNotFoundError):
                os.chmod(p, stat.S_IMODE(mode))


def files_of(home: Path) -> dict[str, bytes]:
    """Every regular file under ``home``: its path relative to ``home`` -> its bytes."""
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(Path(home).rglob("*"))
            if p.is_file() and not p.is_symlink()}
