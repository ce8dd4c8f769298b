"""Shared fixtures: identities, protocol dirs, and the `shared` corpus skip rule. Code that
test files share (harnesses, `kith` helpers) lives in tests/support."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

# tests/support holds what test files share; its asserts are rewritten like a test's
pytest.register_assert_rewrite("support")

# PROTOCOLS and initialized: test files import them from support.homes (tests/test_support_layout.py);
# they stay importable from here for branches written before tests/support existed.
from support.homes import PROTOCOLS, REPO, initialized, new_identity  # noqa: E402,F401
from node.trust.identity import Identity  # noqa: E402

# Several tests press Ctrl-C on a real `kith` process (SIGINT) and expect exit 130. A shell
# without job control starts a background command with SIGINT ignored, and an ignored
# signal stays ignored in every program it runs — the child would never see the Ctrl-C.
# Handle it in this process (children start with the default action), whoever started us.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHARED = REPO.parent / "shared"
PYDOCS = SHARED / "corpora" / "python-docs-3.11"


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
