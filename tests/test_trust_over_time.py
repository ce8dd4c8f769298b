"""Issue 11 without a network: the versioned ``peers.json`` with blocked keys, ``kith peers
block|unblock|code`` refusals, pairing codes, the audit log (rotation, corrupt and truncated
lines, 0600, keyed query hashes), and the host's peers.json watcher on a corrupt file."""

from __future__ import annotations

import functools
import json
import os
import stat

import anyio
import pytest

from node.common.errors import ConfigError, KithError
from node.engine.framing import encode_frame
from node.engine.session import OutgoingFrame
from node.host.audit import HostAudit
from node.trust.audit_log import AuditLog, AuditProblem, read_audit
from node.host.revocation import PeersWatcher
from node.host.sessions import SessionTable
from node.trust.pairing import pairing_code, wordlist
from node.trust.peers import PEERS_FILE, REGISTRY_VERSION, PeerRegistry

from support.cli import kith
from support.homes import new_identity

A, B, C = (new_identity().public_key for _ in range(3))


kith = functools.partial(kith, init=True)  # every command but init refuses an uninitialised home (issue 20)


# ----------------------------------------------------------------------------- peers.json
def test_a_version_1_registry_is_read_and_saved_as_version_2_with_blocked_keys(tmp_path):
    (tmp_path / PEERS_FILE).write_text(json.dumps({"peers": {"alice": {"publicKey": A, "note": "n"}}}))
    reg = PeerRegistry.load(tmp_path)
    assert reg.by_name("alice").public_key == A and reg.blocked == {}
    rec = reg.block("alice", "spam")
    assert (rec.public_key, rec.name, rec.note) == (A, "alice", "spam")
    reg.block(B)  # a key that is not pinned
    raw = json.loads((tmp_path / PEERS_FILE).read_text())
    assert raw["version"] == REGISTRY_VERSION == 2
    assert set(raw["blocked"]) == {A, B} and raw["peers"]["alice"]["publicKey"] == A  # still pinned
    again = PeerRegistry.load(tmp_path)
    assert again.is_blocked(A) and again.is_blocked(B) and not again.is_blocked(C)
    again.unblock("alice")
    assert not PeerRegistry.load(tmp_path).is_blocked(A)
    assert stat.S_IMODE(os.stat(tmp_path / PEERS_FILE).st_mode) == 0o600


@pytest.mark.parametrize("content", [
    '{"peers": {"alice": {"publicKey": "' + "ab" * 16,          # truncated JSON
    '{"version": 3, "peers": {}}',                               # a future format
    '{"version": 2, "peers": {}, "blocked": {"ABC": {}}}',       # a blocked key that is not hex
    '{"version": 2, "peers": {}, "blocked": {"' + "a" * 64 + '": "x"}}',  # entry not an object
    '{"version": true, "peers": {}}',
])
def test_a_corrupt_registry_is_config_invalid(tmp_path, content):
    (tmp_path / PEERS_FILE).write_text(content)
    with pytest.raises(ConfigError) as exc:
        PeerRegistry.load(tmp_path)
    assert exc.value.code == "config-invalid" and PEERS_FILE in exc.value.message


def test_block_unblock_and_code_refusals_through_the_cli(tmp_path):
    home = tmp_path / "h"
    assert kith(home, "init").returncode == 0
    r = kith(home, "peers", "block", "nobody")
    assert r.returncode == 1 and "error [peer-not-found]" in r.stderr
    r = kith(home, "peers", "block", A.upper())  # 64 characters: a KEY, and not lowercase hex
    assert r.returncode == 1 and "error [bad-hex]" in r.stderr
    r = kith(home, "peers", "code", "a" * 63 + "g")
    assert r.returncode == 1 and "error [bad-hex]" in r.stderr
    r = kith(home, "peers", "unblock", A)
    assert r.returncode == 1 and "error [peer-not-blocked]" in r.stderr
    assert kith(home, "peers", "add", "bob", B).returncode == 0
    from node.policy.approvals import Approvals

    pending = Approvals(home).request(B, "bob", "salary", ["/docs/salary.md"])
    r = kith(home, "peers", "block", "bob", "--note", "left the team", "--json")
    assert r.returncode == 0, r.stderr
    assert Approvals(home).get(pending.id).decision == "denied"  # no host needs to run for that
    assert json.loads(r.stdout) == {"publicKey": B, "name": "bob", "note": "left the team",
                                    "blockedAt": json.loads(r.stdout)["blockedAt"], "blocked": True}
    listed = json.loads(kith(home, "peers", "list", "--json").stdout)
    assert [b["publicKey"] for b in listed["blocked"]] == [B] and [p["name"] for p in listed["peers"]] == ["bob"]
    assert kith(home, "peers", "remove", "bob").returncode == 0
    assert kith(home, "peers", "unblock", "bob").returncode == 0  # by the name it was blocked under
    # the owner's actions are in the audit log
    recs = json.loads(kith(home, "audit", "--json").stdout)["records"]
    assert [r["event"] for r in recs] == ["peer-blocked", "peer-removed", "peer-unblocked"]
    assert recs[0]["approvals_cancelled"] == [pending.id] and recs[0]["note"] == "left the team"


# ------------------------------------------------------------------------------ pairing
def test_pairing_code_is_five_list_words_symmetric_and_changes_with_either_key():
    code = pairing_code(A, B)
    words = code.split(" ")
    assert len(words) == 5 and all(w in wordlist() for w in words) and len(wordlist()) == 2048
    assert pairing_code(B, A) == code  # both sides compute the same words
    assert pairing_code(A, C) != code and pairing_code(C, B) != code
    with pytest.raises(KithError) as exc:
        pairing_code(A, A.upper())
    assert exc.value.code == "bad-hex"


def test_pairing_code_is_a_domain_separated_hash_of_both_keys():
    import hashlib

    lo, hi = sorted((bytes.fromhex(A), bytes.fromhex(B)))
    n = int.from_bytes(hashlib.sha256(b"kith/pairing-code/v1\x00" + lo + hi).digest(), "big")
    expected = " ".join(wordlist()[(n >> (256 - 11 * (i + 1))) & 2047] for i in range(5))
    assert pairing_code(A, B) == expected


# ---------------------------------------------------------------------------- audit log
def test_audit_log_rotates_by_size_and_reads_every_file_in_order(tmp_path):
    log = AuditLog(tmp_path, max_bytes=600, keep=2)
    for i in range(30):
        log.record("query", session_id="s" * 64, peer=A, query_id=f"q{i}", **log.query_fields(f"question {i}"))
    log.close()
    files = sorted(p.name for p in tmp_path.glob("audit.jsonl*") if not p.name.endswith(".lock"))
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]  # the oldest beyond 2 was dropped
    for p in tmp_path.glob("audit.jsonl*"):
        assert p.stat().st_size <= 600 and stat.S_IMODE(p.stat().st_mode) == 0o600
    problems: list[AuditProblem] = []
    ids = [int(r["query_id"][1:]) for r in read_audit(tmp_path, problems)]
    assert not problems and ids == sorted(ids) and ids[-1] == 29 and len(ids) < 30
    rec = next(read_audit(tmp_path, []))
    assert "query" not in rec and len(rec["query_hmac"]) == 32  # the text is not in the log by default


def test_four_batching_writers_across_rotations_lose_nothing_they_flushed(tmp_path):
    import threading

    per_writer, keep, max_bytes = 150, 20, 16 << 10

    def writer(w: int) -> None:
        log = AuditLog(tmp_path, max_bytes=max_bytes, keep=keep)
        log.start_batching(lambda flush: None)  # no tick: batches go out by size, flush and close
        for i in range(per_writer):
            log.record("query", session_id=f"{w}" * 64, peer=A, query_id=f"w{w}-{i}", **log.query_fields(f"q {i}"))
            if i % 37 == 36:
                log.flush()
        log.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    files = [p for p in tmp_path.glob("audit.jsonl*") if not p.name.endswith(".lock")]
    assert len(files) >= 4 and len(files) <= keep + 1  # at least 3 rotations, none dropped
    assert all(p.stat().st_size <= max_bytes for p in files)  # a batch is split at the rotation
    problems: list[AuditProblem] = []
    ids = [r["query_id"] for r in read_audit(tmp_path, problems)]
    assert not problems and len(ids) == 4 * per_writer
    for w in range(4):  # each writer's records whole and in its order
        assert [int(q.split("-")[1]) for q in ids if q.startswith(f"w{w}-")] == list(range(per_writer))


def test_a_batching_log_writes_per_tick_at_session_end_and_at_close(tmp_path):
    from node.trust.audit_log import BATCH_RECORDS

    ticks: list = []
    log = AuditLog(tmp_path)
    log.start_batching(ticks.append)

    def on_disk() -> list[str]:
        return [r["event"] for r in read_audit(tmp_path, [])]

    log.record("session-started", session_id="1" * 64, peer=A)
    log.record("query", session_id="1" * 64, peer=A, **log.query_fields("x"))
    assert on_disk() == [] and len(ticks) == 1  # waiting for the tick, armed once per batch
    ticks.pop()()
    assert on_disk() == ["session-started", "query"]
    log.record("results", session_id="1" * 64, peer=A, sources=[])
    log.record("session-ended", sync=True, session_id="1" * 64, peer=A)  # a session's end: at once
    assert on_disk()[2:] == ["results", "session-ended"]
    for i in range(BATCH_RECORDS):  # a full batch does not wait for the tick
        log.record("query", session_id="2" * 64, peer=B, query_id=str(i), **log.query_fields("y"))
    assert len(on_disk()) == 4 + BATCH_RECORDS
    log.record("session-started", session_id="3" * 64, peer=C)
    log.close()  # the host's exit writes what is waiting
    assert on_disk()[-1] == "session-started" and len(on_disk()) == 5 + BATCH_RECORDS


def test_a_crashed_batching_writer_loses_only_its_unwritten_batch(tmp_path):
    import subprocess
    import sys

    script = f"""
import os, sys
from node.trust.audit_log import AuditLog
log = AuditLog(sys.argv[1])
log.start_batching(lambda flush: None)
log.record("session-started", session_id="1" * 64)
log.record("query", session_id="1" * 64, query_hmac="0" * 32)
log.flush()
log.record("results", session_id="1" * 64, sources=[])
os._exit(9)  # killed before the next tick
"""
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 9, r.stderr
    problems: list[AuditProblem] = []
    assert [r["event"] for r in read_audit(tmp_path, problems)] == ["session-started", "query"] and not problems


def test_the_event_loop_tick_writes_records_from_the_loop_and_from_worker_threads(tmp_path):
    import asyncio

    from node.trust.audit_log import loop_schedule

    async def main() -> list[str]:
        log = AuditLog(tmp_path)
        log.start_batching(loop_schedule(asyncio.get_running_loop()))
        log.record("session-started", session_id="1" * 64)
        await asyncio.to_thread(log.record, "query", session_id="1" * 64, query_hmac="0" * 32)
        for _ in range(400):  # bounded: the tick is 50 ms, this waits up to 20 s
            events = [r["event"] for r in read_audit(tmp_path, [])]
            if len(events) == 2:
                break
            await asyncio.sleep(0.05)
        log.close()
        return events

    assert asyncio.run(main()) == ["session-started", "query"]


def test_query_text_only_with_audit_queries_and_the_hash_is_keyed(tmp_path):
    plain = AuditLog(tmp_path / "a", audit_queries=True)
    assert plain.query_fields("salary bands") == {"query": "salary bands"}
    h1 = AuditLog(tmp_path / "a").query_fields("salary bands")["query_hmac"]
    assert AuditLog(tmp_path / "a").query_fields("salary bands")["query_hmac"] == h1  # stable per home
    assert AuditLog(tmp_path / "b").query_fields("salary bands")["query_hmac"] != h1  # keyed per home
    import hashlib

    assert h1 != hashlib.sha256(b"salary bands").hexdigest()[:32]


def test_corrupt_and_truncated_lines_are_reported_and_skipped(tmp_path):
    log = AuditLog(tmp_path)
    log.record("session-started", session_id="1" * 64, peer=A)
    log.close()
    with (tmp_path / "audit.jsonl").open("ab") as fh:
        fh.write(b"{not json\n")
        fh.write(b'["a list"]\n')
        fh.write(b"\xff\xfe\n")
        fh.write(b"{" + b"x" * (200 << 10) + b"\n")  # a 200 KiB line: skipped whole, memory bounded
        fh.write(b'{"ts": "2026-12-01T00:00:00Z", "event": "session-ended", "sess')  # a crash mid-write
    problems: list[AuditProblem] = []
    assert [r["event"] for r in read_audit(tmp_path, problems)] == ["session-started"]
    assert [(p.line, p.message) for p in problems] == [
        (2, "not valid JSON"), (3, "not an audit record (no ts/event)"), (4, "not valid JSON"),
        (5, "longer than a record may be"), (6, "truncated (no end of line)")]
    # the next record starts on a line of its own: only the broken line is lost
    log = AuditLog(tmp_path)
    log.record("session-ended", session_id="1" * 64, peer=A, sync=True)
    log.close()
    problems = []
    assert [r["event"] for r in read_audit(tmp_path, problems)] == ["session-started", "session-ended"]
    assert [p.line for p in problems] == [2, 3, 4, 5, 6]
    r = kith(tmp_path, "audit", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [rec["event"] for rec in out["records"]] == ["session-started", "session-ended"]
    assert {s["code"] for s in out["skipped"]} == {"audit-line-invalid"}
    assert "warning [audit-line-invalid]: audit.jsonl line 6: not valid JSON (skipped)" in r.stderr


def test_kith_audit_filters_and_refuses_bad_options(tmp_path):
    log = AuditLog(tmp_path)
    log.record("session-started", session_id="a" * 64, peer=A, peer_name="alice")
    log.record("session-started", session_id="b" * 64, peer=B)
    (tmp_path / "audit.jsonl").open("ab").write(
        b'{"ts":"2020-01-01T00:00:00.000Z","event":"session-started","session_id":"' + b"c" * 64 + b'"}\n')
    log.close()

    def ids(*args: str) -> list[str]:
        r = kith(tmp_path, "audit", "--json", *args)
        assert r.returncode == 0, r.stderr
        return [rec["session_id"][0] for rec in json.loads(r.stdout)["records"]]

    assert ids() == ["a", "b", "c"]
    assert ids("--peer", "alice") == ["a"]  # a name no longer pinned still matches its records
    assert ids("--peer", B) == ["b"]
    assert ids("--session", "b" * 10) == ["b"]
    assert ids("--since", "1h") == ["a", "b"]
    for bad in (("--since", "1 week"), ("--since", "-5m"), ("--session", "xyz")):
        r = kith(tmp_path, "audit", *bad)
        assert r.returncode == 2 and "error [usage]" in r.stderr, bad
    r = kith(tmp_path, "audit")
    assert r.returncode == 0 and "alice" in r.stdout


def test_host_audit_records_results_frames_with_source_ids_only(tmp_path):
    audit = HostAudit(AuditLog(tmp_path))
    tap = audit.tap(A)
    tap.ready("d" * 64, "alice")
    frame = {"action": "results", "query_id": "q1", "status": "ok",
             "envelope": {"results": [{"source": "/docs/a.md", "textPreview": "SECRET CHUNK TEXT"},
                                      {"source": "/docs/a.md"}, {"source": "/docs/b.md"}]}}
    pending = {"action": "results", "query_id": "q2", "status": "pending-approval",
               "approval_id": "0123456789abcdef", "envelope": {"results": []}}
    for msg in (frame, {"action": "say", "text": "not a results frame"}, pending):
        tap.outgoing(OutgoingFrame(msg, encode_frame(msg), None))
    audit.close()
    raw = (tmp_path / "audit.jsonl").read_text()
    assert "SECRET CHUNK TEXT" not in raw
    recs = list(read_audit(tmp_path, []))
    assert [(r["event"], r.get("sources")) for r in recs] == [
        ("results", ["/docs/a.md", "/docs/b.md"]), ("results", []), ("approval-created", None)]
    assert recs[0]["peer_name"] == "alice" and recs[2]["approval_id"] == "0123456789abcdef"


# ------------------------------------------------------------------- the peers.json watcher
def test_watcher_survives_a_corrupt_registry_and_cancels_approvals_on_removal(tmp_path):
    from node.policy.approvals import Approvals

    reg = PeerRegistry.load(tmp_path)
    reg.add("alice", A)
    req = Approvals(tmp_path).request(A, "alice", "salary", ["/docs/salary.md"])
    other = Approvals(tmp_path).request(B, None, "salary", ["/docs/salary.md"])
    events: list[dict] = []
    watcher = PeersWatcher(tmp_path, SessionTable(), on_event=events.append)
    assert watcher.poll() == []
    (tmp_path / PEERS_FILE).write_text('{"peers": {')  # an editor left it half-written
    assert watcher.poll() == [] and watcher.poll() == []
    assert events == [{"event": "config-invalid", "file": PEERS_FILE}]  # said once, host keeps going
    PeerRegistry(tmp_path / PEERS_FILE, {}).save()  # fixed, and alice is gone
    (revoked,) = watcher.poll()
    assert revoked == {"event": "peer-revoked", "peer": A, "peer_name": "alice", "cause": "removed",
                       "code": "session-revoked", "sessions_ended": 0, "approvals_cancelled": [req.id]}
    store = Approvals(tmp_path)
    assert store.get(req.id).decision == "denied" and store.get(other.id).decision is None


def test_watcher_reports_policy_reloads(tmp_path):
    events: list[dict] = []
    watcher = PeersWatcher(tmp_path, SessionTable(), on_event=events.append)
    (tmp_path / "policy.toml").write_text('[[rule]]\nglob = "/docs/**"\ntier = "public"\n')
    watcher.poll()
    (tmp_path / "policy.toml").write_text("[[rule]\n")
    watcher.poll()
    assert events == [{"event": "policy-reloaded", "ok": True, "rules": 1, "code": None},
                      {"event": "policy-reloaded", "ok": False, "rules": None, "code": "policy-invalid"}]


def test_watcher_tells_its_owner_which_devices_were_revoked_and_never_touches_copies(tmp_path):
    """A list that revokes a device ends its sessions, then the keys go to the callback the
    command running both roles wires (``kith host`` ends the copies kept of them there); the
    host wing itself has no copy code."""
    from node.trust.peers import pin_person
    from node.trust.revocation_list import check_list, make_list
    from node.trust.signing import public_key_of

    secret = os.urandom(32)
    person = public_key_of(secret)
    pin_person(PeerRegistry.load(tmp_path), "alice", person)
    told: list[list[str]] = []
    events: list[dict] = []
    watcher = PeersWatcher(tmp_path, SessionTable(), on_event=events.append, on_devices_revoked=told.append)
    checked = check_list(make_list(secret, [B], 1, "2026-12-01T10:00:00Z"), person=person)
    ev = watcher.apply_list(checked, via="handshake")
    assert ev is not None and ev["devices"] == [B] and told == [[B]]
    assert watcher.apply_list(checked, via="handshake") is None and told == [[B]]  # nothing new: not told again
    assert not (tmp_path / "copies").exists()


# ------------------------------------------------- ending sessions in every state (memory pipe)
@pytest.mark.parametrize("stage", ["handshake", "ready"])
def test_end_sessions_rejects_a_handshake_and_errors_a_ready_session(stage, host_id, guest_id):
    from support.engines import EnginePair
    from node.engine.session import RemoteError, SessionClosed
    from node.protocol.spec import load_spec

    from support.homes import PROTOCOLS

    async def body() -> None:  # cancel scopes need an event loop
        pair = EnginePair(load_spec(PROTOCOLS / "echo"), host_id, guest_id)
        if stage == "handshake":  # the host has the guest's _session_init, nothing more
            pair.guest.initiate()
            pair.host_events += pair.host.receive_data(pair.guest.data_to_send())
        else:
            pair.handshake()
            assert pair.host.state.value == "ready"
        sessions = SessionTable()
        scope = anyio.CancelScope()

        def end(code: str, message: str) -> None:  # what a host connection does
            pair.host.abort(code, message or None)
            scope.cancel()

        sessions.open_session(7, guest_id.public_key, end, alive=lambda: not pair.host.closed, name="alice")
        sessions.open_session(8, A, lambda _c, _m: None, anonymous=True)  # another peer: untouched
        if stage == "ready":
            sessions.session_ready(7, pair.host.session_id)
        assert sessions.end_sessions(guest_id.public_key, "session-revoked", handshake_code="handshake-peer-blocked") == 1
        assert scope.cancel_called and sessions.ended(7) is not None and sessions.ended(8) is None
        assert sessions.end_sessions(guest_id.public_key) == 0  # idempotent
        pair.guest_events += pair.guest.receive_data(pair.host.data_to_send())
        if stage == "handshake":
            (closed,) = pair.of(pair.guest_events, SessionClosed)
            assert (closed.reason, closed.code) == ("rejected", "handshake-peer-blocked")
            assert sessions.ended(7).code == "handshake-peer-blocked" and not sessions.ended(7).ready
        else:
            assert [e.code for e in pair.of(pair.guest_events, RemoteError)] == ["session-revoked"]
            assert pair.host.close_event.reason == "aborted"
            assert (sessions.ended(7).code, sessions.ended(7).ready) == ("session-revoked", True)
        assert sessions.sessions == 1  # the ended session's slot is free at once
        sessions.close_session(7)
        assert sessions.peers() == {A: {None}}

    anyio.run(body, backend="asyncio")


def test_block_names_the_key_once(tmp_path):
    """`blocked 88092aafd66df810… (88092aafd66df810…)` said an unpinned key twice."""
    home = tmp_path / "h"
    assert kith(home, "init").returncode == 0
    r = kith(home, "peers", "block", A)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"blocked {A[:16]}…", r.stdout
    assert kith(home, "peers", "add", "bob", B).returncode == 0
    assert kith(home, "peers", "block", "bob").stdout.strip() == f"blocked bob ({B[:16]}…)"
