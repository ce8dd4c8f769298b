"""The host's events: one typed table (node/common/host_events.py), its JSON Schema in
specs/host-events.schema.json, and the host's check of what it emits (specs/host-events.md)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import jsonschema
import msgspec
import pytest

from node.common import host_events
from node.common.host_events import (BY_KIND, COMMAND_EVENT_TYPES, HOST_EVENT_TYPES, EventPath, SessionEnded,
                                     SessionStarted, checked)

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "specs" / "host-events.schema.json"


def test_committed_schema_is_the_tables():
    got = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert got == host_events.schema(), "specs/host-events.schema.json is stale: run scripts/host_events_schema"
    r = subprocess.run([str(REPO / "scripts" / "host_events_schema"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_kind_is_in_the_schema_and_documented():
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    mapping = schema["discriminator"]["mapping"]
    assert set(mapping) == set(BY_KIND) and len(BY_KIND) == len(HOST_EVENT_TYPES)
    commands = schema["$defs"]["CommandEvent"]["discriminator"]["mapping"]
    assert set(commands) == {t.__struct_config__.tag for t in COMMAND_EVENT_TYPES}
    spec = (REPO / "specs" / "host-events.md").read_text(encoding="utf-8")
    missing = [k for k in [*BY_KIND, *commands] if f"`{k}`" not in spec]
    assert not missing, f"kinds not described in specs/host-events.md: {missing}"
    for t in (*HOST_EVENT_TYPES, *COMMAND_EVENT_TYPES):
        assert t.__doc__, t


def test_one_session_ended_shape():
    """``session-ended`` has one shape however the session ended (it had three)."""
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    refused_in_handshake = SessionEnded(session_id=None, peer="a" * 64, reason="rejected",
                                        code="handshake-not-admitted", ended_at=1.5).to_dict()
    ended_by_owner = SessionEnded(session_id="s1", peer="a" * 64, reason="aborted", code="session-ended-by-owner",
                                  ended_at=2.0, ui_bytes_sent=10, refused=["invalid-message"]).to_dict()
    assert set(refused_in_handshake) == set(ended_by_owner)
    for ev in (refused_in_handshake, ended_by_owner):
        assert not list(validator.iter_errors(ev))


def test_an_event_outside_the_table_is_refused_in_strict_mode(monkeypatch):
    ok = SessionStarted(session_id="s", peer="b" * 64, peer_name=None, post_id="p", pairing_code="w w w w w",
                        person=None, device_name=None, via_person=False,
                        path=EventPath(kind="direct", remote="127.0.0.1:1")).to_dict()
    assert ok["path"] == {"kind": "direct", "relayUrl": None, "remote": "127.0.0.1:1"}
    assert checked(ok) is ok
    monkeypatch.setenv(host_events.STRICT_ENV, "1")
    for bad in ({"event": "session-ended", "peer": "x"},           # fields missing
                {"event": "config-invalid", "file": "peers.json", "extra": 1},  # a field not in the table
                {"event": "no-such-event"},
                {**ok, "via_person": "yes"}):                       # a field of another type
        with pytest.raises(msgspec.ValidationError):
            checked(bad)
    monkeypatch.delenv(host_events.STRICT_ENV)
    assert checked({"event": "no-such-event"}) == {"event": "no-such-event"}  # production: logged, sent on


def test_conftest_sets_strict_events_for_child_processes():
    assert os.environ.get(host_events.STRICT_ENV) == "1"


def test_command_event_lines_follow_the_table(monkeypatch):
    """The commands' JSON lines (`kith device revoke --json`, ...) are the table's
    (validated against $defs.CommandEvent, and refused in strict mode when they are not)."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/CommandEvent"})
    from node.common.host_events import DeviceRevokedHere

    line = DeviceRevokedHere(name="laptop", newly_revoked=["a" * 64], list={"seq": 0}, out=None,
                             published=False).to_dict()
    assert not list(validator.iter_errors(line))
    monkeypatch.setenv(host_events.STRICT_ENV, "1")
    with pytest.raises(msgspec.ValidationError):
        checked({"event": "device-code"}, command=True)


OUTBOX_KINDS = {"copy-synced", "copy-ended", "copy-failed", "outbox-answered", "outbox-pending", "outbox-failed", "outbox-expired", "outbox-runner-started"}


def test_the_runners_outbox_events_are_in_the_table(tmp_path, monkeypatch):
    """The home runner's delivery events (`kith outbox run --json` lines, specs/outbox.md §5)
    are the table's: each kind in $defs.CommandEvent and documented, and the runner refuses
    one the table does not describe in strict mode (tests), as a host does."""
    from node.guest.owner import Guest
    from node.guest.runner import Runner

    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    commands = schema["$defs"]["CommandEvent"]["discriminator"]["mapping"]
    assert OUTBOX_KINDS <= set(commands)
    validator = jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/CommandEvent"})
    seen: list[dict] = []
    runner = Runner(Guest(tmp_path), [], on_event=seen.append)
    good = [{"event": "outbox-answered", "id": "q1", "peer": "alice", "status": "ok"},
            {"event": "outbox-pending", "id": "q1", "peer": "alice", "approval_id": "ap1"},
            {"event": "outbox-failed", "id": "q1", "peer": "alice", "code": "peer-not-found"},
            {"event": "outbox-expired", "rows": 2},
            {"event": "outbox-runner-started"}]
    for ev in good:
        assert not list(validator.iter_errors(ev)), ev
        runner.emit(ev)
    assert seen == good
    monkeypatch.setenv(host_events.STRICT_ENV, "1")
    with pytest.raises(msgspec.ValidationError):
        runner.emit({"event": "outbox-answered", "id": "q1"})  # fields missing


#: event lines built as literal dicts on purpose: `kith index watch --json` prints the sync
#: report of specs/corpus.md under `event` (specs/host-events.md says they are not in the table)
LITERAL_EVENTS_ALLOWED = {("node/cli/index_cmd.py", "index-updated"), ("node/cli/index_cmd.py", "index-synced")}


def test_no_emitter_builds_an_event_as_a_literal_dict():
    """Every event is built from the table's classes: no ``{"event": "kind", ...}`` dict
    literal in node/ outside node/common/host_events.py (the outbox runner's were, issue 32)."""
    import ast

    found = []
    for path in sorted((REPO / "node").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "node/common/host_events.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if (isinstance(k, ast.Constant) and k.value == "event" and isinstance(v, ast.Constant)
                            and (rel, v.value) not in LITERAL_EVENTS_ALLOWED):
                        found.append(f"{rel}:{node.lineno} {v.value}")
    assert not found, f"events built outside the table (node/common/host_events.py): {found}"
