"""Shared fixtures: identities, protocol dirs, and the `shared` corpus skip rule."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from node.trust.identity import Identity

# Several tests press Ctrl-C on a real `kith` process (SIGINT) and expect exit 130. A shell
# without job control starts a background command with SIGINT ignored, and an ignored
# signal stays ignored in every program it runs — the child would never see the Ctrl-C.
# Handle it in this process (children start with the default action), whoever started us.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PYDOCS = SHARED / "corpora" / "python-docs-3.11"
PROTOCOLS = REPO / "protocols"


def initialized(home: Path) -> Path:
    """``home`` with an identity, as `kith init` leaves it (commands that need one —
    join, host — refuse a home without it); returned for use inline."""
    from node.trust.identity import init_identity

    init_identity(Path(home))
    return Path(home)


def new_identity() -> Identity:
    """A fresh random Ed25519 identity (not written anywhere)."""
    return Identity(os.urandom(32))


@pytest.fixture
def host_id() -> Identity:
    return new_identity()


@pytest.fixture
def guest_id() -> Identity:
    return new_identity()


@pytest.fixture
def pydocs() -> Path:
    """The real python-docs corpus from ../shared; skipped with a reason when absent."""
    if not PYDOCS.is_dir():
        pytest.skip("../shared/corpora/python-docs-3.11 is not present (only CI and dev machines have ../shared)")
    return PYDOCS
