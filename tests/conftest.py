"""Shared fixtures: identities, protocol dirs, and the `shared` corpus skip rule. Code that
test files share (harnesses, `kith` helpers) lives in tests/support."""

from __future__ import annotations

import os
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

# Every host event must be one the table in node/common/host_events.py describes: with this
# set, a host (in this process or a `kith host` this test run starts) raises on one that is
# not (specs/host-events.md); the fixture below also checks each in-process event against
# the committed JSON Schema.
os.environ["KITH_STRICT_EVENTS"] = "1"

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


_EVENT_VIOLATIONS: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def _host_events_follow_the_schema():
    """Validate every event an in-process :class:`node.host.host.Host` emits against
    specs/host-events.schema.json (the schema the table generates; tests/test_host_events.py
    checks the file is current). Violations fail the test that caused them (below)."""
    import json

    import jsonschema

    from node.host.host import Host

    validator = jsonschema.Draft202012Validator(
        json.loads((REPO / "specs" / "host-events.schema.json").read_text(encoding="utf-8")))
    original = Host.emit

    def emit(self, ev):
        errors = [e.message for e in validator.iter_errors(ev)]
        if errors:
            _EVENT_VIOLATIONS.append(f"{ev.get('event') if isinstance(ev, dict) else ev!r}: {errors[:3]}")
        return original(self, ev)

    Host.emit = emit
    yield
    Host.emit = original


@pytest.fixture(autouse=True)
def _no_event_violations():
    """Fail a test during which a host emitted an event outside specs/host-events.schema.json."""
    _EVENT_VIOLATIONS.clear()
    yield
    bad, _EVENT_VIOLATIONS[:] = list(_EVENT_VIOLATIONS), []
    assert not bad, f"host events outside specs/host-events.schema.json: {bad}"
