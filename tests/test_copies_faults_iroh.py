"""Faults of a copy between real processes over iroh on loopback, relay disabled (issue 33
"Bad input and faults"; specs/copies.md §9): a guest SIGKILLed mid-sync resumes with only
what is missing; a host SIGKILLed mid-transfer fails the sync with a code and leaves the
previous copy whole and searchable; a full disk (the guest's `kith copies sync` under
RLIMIT_FSIZE) is ``copy-disk-full``; a hostile host (a real `kith host` whose copy answers
are rewritten in its own process) is refused with each fault's code, writes nothing outside
``<home>/copies/<peer>/`` and never changes the peer's own corpus."""

from __future__ import annotations

import hashlib
import json
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.guest.copies.checks import check_document
from node.guest.copies.store import CopyStore
from node.trust.identity import load_identity
from node.trust.peers import PeerRegistry

import support.hosts as hosts
from support.cli import kith, kith_argv, next_line
from support.homes import node_home, pin_host
from support.hosts import ENV, HostProcess, prepare_host

pytestmark = pytest.mark.iroh

PROGRESS = re.compile(r"alice: (\d+)/(\d+) document\(s\)")
#: what a `kith copies sync` / `kith ask` process may take here, seconds
RUN_S = 180


def _page(i: int, edit: str = "") -> str:
    return (f"# Page {i}\n\nTopic marker{i} is described here{edit}. "
            + " ".join(f"word{i}x{j}" for j in range(150)) + "\n")


def _setup(tmp: Path, pages: int) -> tuple[Path, Path, Path]:
    """(host home, its corpus folder, bea's home): /kb/docs/ of ``pages`` pages public,
    /kb/notes/ private, bea granted a copy of /kb/**; bea has its own small corpus."""
    kb = tmp / "kb"
    (kb / "docs").mkdir(parents=True)
    (kb / "notes").mkdir()
    for i in range(pages):
        (kb / "docs" / f"p{i:04d}.md").write_text(_page(i))
    (kb / "notes" / "salary.md").write_text("# Salary\n\nThe salary bands are private.\n")
    host = prepare_host(tmp, kb)
    assert kith(host, "policy", "set", "/kb/notes/**", "private").returncode == 0
    bea = node_home(tmp, "bea")
    PeerRegistry.load(host).add("bea", load_identity(bea).public_key)
    assert kith(host, "policy", "copy", "/kb/**", "--for", "bea").returncode == 0
    own = tmp / "bea-kb"
    own.mkdir()
    (own / "garden.md").write_text("# Garden\n\nTomatoes need sun.\n")
    assert kith(bea, "index", "add", str(own)).returncode == 0
    assert kith(bea, "index", "sync").returncode == 0
    return host, kb, bea


def _sync(bea: Path, **kw) -> tuple[int, dict]:
    r = kith(bea, "copies", "sync", "alice", "--json", timeout=RUN_S, env=ENV, **kw)
    out = json.loads(r.stdout)
    return r.returncode, out["copies"][0]


def _verified(bea: Path, host_key: str) -> dict[str, str]:
    """{source: version} of bea's copy of alice, every document checked as the peer's
    sync checks it (its file's text against the manifest entry and the host's signature),
    and docs/ holding exactly the files the manifest lists."""
    store = CopyStore(bea, "alice")
    state = store.load()
    out = {}
    for src, d in state["documents"].items():
        text = (store.docs / d["file"]).read_bytes().decode("utf-8", "surrogatepass")
        check_document({"source": src, "version": d["version"], "text": text, "citation": d["citation"]},
                       {src: d}, host_key)
        out[src] = d["version"]
    assert sorted(f.name for f in store.docs.iterdir()) == sorted(d["file"] for d in state["documents"].values())
    return out


def _ask_copy(bea: Path, query: str) -> list[str]:
    r = kith(bea, "ask", query, "--peer", "alice", "--copy", "--json", timeout=RUN_S)
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)
    assert env["peers"][0]["fromCopy"] is True
    return [x["source"] for x in env["results"]]


def _kill_at_first_progress(proc: subprocess.Popen, victim: subprocess.Popen) -> tuple[int, int]:
    """Read ``proc``'s stderr until its first progress line, then SIGKILL ``victim``;
    ``(done, total)`` of that line."""
    deadline = time.monotonic() + RUN_S
    seen = ""
    while time.monotonic() < deadline:
        line = next_line(proc.stderr, 1.0)
        if line is None:
            if proc.poll() is not None:
                break
            continue
        if not line:
            break
        seen += line
        m = PROGRESS.search(line)
        if m:
            victim.send_signal(signal.SIGKILL)
            return int(m.group(1)), int(m.group(2))
    proc.kill()
    raise AssertionError(f"no progress line; stderr: {seen}")


def test_a_guest_killed_mid_sync_resumes_with_only_what_is_missing(tmp_path):
    host, _kb, bea = _setup(tmp_path, 320)
    key = load_identity(host).public_key
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        proc = subprocess.Popen(kith_argv(bea, "copies", "sync", "alice"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=ENV)
        done, total = _kill_at_first_progress(proc, proc)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert (done, total) == (64, 320)
        kept = _verified(bea, key)  # what was committed before the kill, each document whole
        assert 64 <= len(kept) < 320
        assert CopyStore(bea, "alice").load()["syncedAt"] is None  # no sync completed
        rc, report = _sync(bea)
        assert rc == 0 and report["status"] == "ok"
        assert report["fetched"] == 320 - len(kept) and report["unchanged"] == len(kept)
    finally:
        h.stop()
    final = _verified(bea, key)
    assert len(final) == 320 and all(final[s] == v for s, v in kept.items())
    assert _ask_copy(bea, "marker7") == ["/kb/docs/p0007.md"]


def test_a_guest_killed_four_times_is_not_refused_as_busy_at_its_fifth_sync(tmp_path):
    """The attacker's finding #6: each SIGKILLed sync left a session the host held until
    QUIC's idle timeout, so after four (``max_sessions_per_peer``) the next sync was
    refused ``handshake-peer-busy`` for half a minute; now its least recently answered idle
    session makes room (specs/session.md, the per-key cap). No quiet time is asked for:
    that made this test pass or fail by how fast the machine restarted the guest (it
    failed on a quiet machine, where four kills fit in two seconds)."""
    host, _kb, bea = _setup(tmp_path, 320)
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        for _ in range(4):
            proc = subprocess.Popen(kith_argv(bea, "copies", "sync", "alice"), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=ENV)
            _kill_at_first_progress(proc, proc)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        rc, report = _sync(bea)
        assert (rc, report["status"]) == (0, "ok"), report
    finally:
        h.stop()
    assert len(CopyStore(bea, "alice").load()["documents"]) == 320


def test_a_host_killed_mid_transfer_fails_the_sync_with_a_code_and_the_copy_stays(tmp_path):
    host, kb, bea = _setup(tmp_path, 320)
    key = load_identity(host).public_key
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        rc, first = _sync(bea)
        assert (rc, first["fetched"]) == (0, 320), first
        before = _verified(bea, key)
        synced_at = CopyStore(bea, "alice").load()["syncedAt"]
        for i in range(320):  # every page changes: the next sync fetches 5 batches
            (kb / "docs" / f"p{i:04d}.md").write_text(_page(i, " again"))
        assert kith(host, "index", "sync").returncode == 0
        proc = subprocess.Popen(kith_argv(bea, "copies", "sync", "alice", "--json"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=ENV)
        _kill_at_first_progress(proc, h.proc)
        out, _err = proc.communicate(timeout=RUN_S)
    finally:
        if h.proc.poll() is None:
            h.stop()
    assert proc.returncode == 1
    (row,) = json.loads(out)["copies"]
    assert row["status"] != "ok" and row["code"] in ("peer-disconnected", "peer-unresponsive", "peer-timeout",
                                                       "peer-unreachable"), row
    after = _verified(bea, key)  # whole: every document verifies, each batch committed or not
    assert sorted(after) == sorted(before)
    assert 64 <= sum(after[s] != before[s] for s in after) < 320
    assert CopyStore(bea, "alice").load()["syncedAt"] == synced_at
    assert _ask_copy(bea, "marker7") == ["/kb/docs/p0007.md"]


def _limit_file_size(limit: int):
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return pre


def test_a_full_disk_is_copy_disk_full_and_the_previous_copy_stays(tmp_path):
    host, kb, bea = _setup(tmp_path, 3)
    key = load_identity(host).public_key
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        assert _sync(bea)[0] == 0
        store = CopyStore(bea, "alice")
        before, files = store.load(), {f.name: f.read_bytes() for f in store.docs.iterdir()}
        big = "".join(f"Line {i}: the checkpoint log grows.\n" for i in range(60000))  # ~2 MB
        (kb / "docs" / "p0001.md").write_text(_page(1) + big)
        assert kith(host, "index", "sync").returncode == 0
        r = subprocess.run(kith_argv(bea, "copies", "sync", "alice", "--json"), capture_output=True, text=True,
                           timeout=RUN_S, env=ENV, stdin=subprocess.DEVNULL, preexec_fn=_limit_file_size(1 << 20))
        assert r.returncode == 1, r.stderr
        (row,) = json.loads(r.stdout)["copies"]
        assert (row["status"], row["code"]) == ("refused", "copy-disk-full"), row
        assert store.load() == before
        assert {f.name: f.read_bytes() for f in store.docs.iterdir()} == files
        assert not list(store.dir.rglob("*.tmp"))
        assert _ask_copy(bea, "marker1") == ["/kb/docs/p0001.md"]
        rc, again = _sync(bea)  # room again
        assert rc == 0 and again["fetched"] == 1
    finally:
        h.stop()
    assert "/kb/docs/p0001.md" in _verified(bea, key)


# --- a hostile host -----------------------------------------------------------------------

#: `kith` whose CopyServer answers are rewritten as the file $KITH_TEST_HOSTILE says (the
#: host's own process: its key signs what it likes, its engine sends what it likes)
HOSTILE = r'''
import os, sys
from pathlib import Path
import node.answer.copies as copies
from node.answer.citation import payload_of, text_digest
from node.trust import signing

MODE = Path(os.environ["KITH_TEST_HOSTILE"])
manifest, documents = copies.CopyServer.manifest, copies.CopyServer.documents

def resign(self, doc, sign=None):
    c = doc["citation"]
    c["textSha256"] = text_digest(doc["text"])
    c["span"]["chars"] = [0, len(doc["text"])]
    c["version"] = doc["version"]
    c["signature"] = (sign or self._sign)(payload_of(c))

def hostile_manifest(self, peer):
    out = manifest(self, peer)
    mode = MODE.read_text().strip()
    if mode == "over-budget":
        out["maxBytes"] = 10
    elif mode == "climb-manifest":
        out["documents"][0]["source"] = "/kb/../../../../escaped.md"
    elif mode in ("ill-formed-manifest", "bypass-manifest"):
        out["documents"][0]["file"] = "/tmp/escaped.md"
    return out

import node.engine.business as business
check = business.BusinessLoop.check

def lax_check(self, msg, *, sender):  # "bypass-manifest": this host's engine sends it anyway
    if (sender == "host" and isinstance(msg, dict) and msg.get("action") == "copy_manifest"
            and MODE.read_text().strip() == "bypass-manifest"):
        return False
    return check(self, msg, sender=sender)

business.BusinessLoop.check = lax_check

def hostile_documents(self, peer, sources, scrubbed=None):  # scrubbed: the audit's counts
    out = documents(self, peer, sources, scrubbed)
    mode = MODE.read_text().strip()
    if not out["documents"]:
        return out
    doc = out["documents"][0]
    if mode == "unsigned":
        doc["citation"] = {}
    elif mode == "other-key":
        other = os.urandom(32)
        doc["citation"]["hostKey"] = signing.public_key_of(other)
        resign(self, doc, signing.signer_of(other))
    elif mode == "text-hash":
        doc["text"] += "\nAn added line the manifest does not know.\n"
        resign(self, doc)
    elif mode == "version":
        doc["version"] = "0" * 64
        resign(self, doc)
    elif mode == "truncated":
        doc["text"] = doc["text"][: len(doc["text"]) // 2]
    elif mode == "outside":
        doc["source"] = doc["citation"]["source"] = "/kb/notes/salary.md"
        resign(self, doc)
    elif mode == "climb-document":
        doc["source"] = doc["citation"]["source"] = "/../../../../escaped.md"
        resign(self, doc)
    elif mode == "absolute-document":
        doc["source"] = doc["citation"]["source"] = str(Path(os.environ["KITH_TEST_HOSTILE"]).parent / "escaped.md")
        resign(self, doc)
    elif mode == "ill-formed-documents":
        del doc["text"]
    return out

copies.CopyServer.manifest = hostile_manifest
copies.CopyServer.documents = hostile_documents

from node.cli.main import main
main()
'''

CASES = [("unsigned", "copy-bad-signature"), ("other-key", "copy-bad-signature"),
         ("text-hash", "copy-version-mismatch"), ("version", "copy-version-mismatch"),
         ("truncated", "copy-version-mismatch"), ("outside", "copy-outside-grant"),
         ("over-budget", "copy-over-budget"), ("climb-manifest", "copy-manifest-invalid"),
         ("climb-document", "copy-outside-grant"), ("absolute-document", "copy-outside-grant"),
         ("ill-formed-manifest", "hook-output-invalid"), ("ill-formed-documents", "hook-output-invalid"),
         ("bypass-manifest", "peer-answer-invalid")]


def _tree(root: Path, skip: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``root`` but ``skip``'s."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and skip not in p.parents}


def test_a_hostile_host_is_refused_with_each_code_and_writes_nothing_outside_the_copy(tmp_path, monkeypatch):
    host, kb, bea = _setup(tmp_path, 3)
    key = load_identity(host).public_key
    mode = tmp_path / "hostile-mode"
    mode.write_text("honest")
    monkeypatch.setenv("KITH_TEST_HOSTILE", str(mode))
    monkeypatch.setattr(hosts, "KITH", [sys.executable, "-c", HOSTILE])
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    store = CopyStore(bea, "alice")
    try:
        pin_host(bea, "alice", h.invitation)
        rc, first = _sync(bea)
        assert rc == 0 and first["fetched"] == 3
        for i in range(3):  # every page changes: each sync below has documents to fetch
            (kb / "docs" / f"p{i:04d}.md").write_text(_page(i, " again"))
        assert kith(host, "index", "sync").returncode == 0
        before = _verified(bea, key)
        state = store.load()
        others = {"bea": _tree(bea, store.dir), "tmp": _tree(tmp_path, bea)}
        own = _tree(bea / "corpus", store.dir)
        for name, code in CASES:
            mode.write_text(name)
            rc, row = _sync(bea)
            assert rc == 1 and row["status"] != "ok", (name, row)
            assert row["code"] == code, (name, row)
            assert store.load() == state, name  # the previous copy, as committed
            assert _verified(bea, key) == before, name
            assert _tree(bea / "corpus", store.dir) == own, name  # the peer's own corpus unchanged
            now = {"bea": _tree(bea, store.dir), "tmp": _tree(tmp_path, bea)}
            changed = {k: sorted(p for p in set(now[k]) | set(others[k]) if now[k].get(p) != others[k].get(p))
                       for k in now}
            # outside the copy only bea's own session records change (its audit log)
            assert all(p.startswith("audit") for p in changed["bea"]), (name, changed)
            assert all(p.startswith("host-home/") or p == mode.name for p in changed["tmp"]), (name, changed)
        assert not list(tmp_path.rglob("escaped.md")) and not Path("/tmp/escaped.md").exists()
        assert _ask_copy(bea, "marker2") == ["/kb/docs/p0002.md"]
        mode.write_text("honest")  # the same host, honest again: the sync completes
        rc, last = _sync(bea)
        assert rc == 0 and last["fetched"] == 3, last
    finally:
        h.stop()


def test_a_first_sync_killed_after_a_batch_keeps_the_grants_end(tmp_path):
    """Attack of issue 42: a first sync SIGKILLed after its first batch left a copy that
    answers but had no end ("no end set") though the grant has an --until, so the copy
    outlived the grant on a guest that never reached the host again. The handshake's
    ``until`` is in ``grant.json`` before the first document lands."""
    host, _kb, bea = _setup(tmp_path, 320)
    r = kith(host, "policy", "copy", "/kb/**", "--for", "bea", "--until", "2027-01-31", "--json")
    assert r.returncode == 0, r.stderr
    h = HostProcess(host, "--invite-file", str(tmp_path / "inv.json"))
    try:
        pin_host(bea, "alice", h.invitation)
        proc = subprocess.Popen(kith_argv(bea, "copies", "sync", "alice"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=ENV)
        _kill_at_first_progress(proc, proc)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        h.stop()
    assert CopyStore(bea, "alice").load()["documents"]  # a committed batch answers a search
    r = kith(bea, "copies", "list", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["copies"]
    assert row["documents"] > 0 and row["syncedAt"] is None
    assert row["until"] == "2027-01-31T00:00:00Z"
