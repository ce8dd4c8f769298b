"""A version a peer is given never reveals an edit of a value scrubbed for it (issue 42,
specs/citations.md §2, specs/copies.md §2): bea's lens scrubs e-mail addresses, so when
the host edits only the address in ``deploy.md``, bea's copy manifest, the signed citation
of a search result and a ``check`` all name the version bea already holds, and its copy
sync fetches nothing; an edit of text bea sees changes all three. A peer whose lens
scrubs nothing keeps the version of the content hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

import anyio

from node.answer.citation import CitationSigner, keyed_version, load_version_key
from node.corpus.store import Corpus
from node.guest.copies.store import CopyStore
from node.guest.copies.sync import sync_copy
from node.host.host import open_knowledge
from node.policy.store import Policy

from support.copies import DOCS, copy_asker, copy_host, copy_server
from support.homes import node_home


def _edit(home: Path, kb: Path, old: str, new: str) -> None:
    text = (kb / "deploy.md").read_text()
    assert old in text
    (kb / "deploy.md").write_text(text.replace(old, new))
    with Corpus(home) as c:
        c.sync()


def _told(home: Path, peer: str) -> dict[str, str]:
    """What ``peer`` is told of /kb/deploy.md now: its manifest version, the version of a
    signed citation of a search result (the host's signer as ``kith host`` wires it), and
    whether a ``check`` of the manifest version says ``current``."""
    server, corpus, _key = copy_server(home)
    with corpus:
        (entry,) = [d for d in server.manifest(peer)["documents"] if d["source"] == "/kb/deploy.md"]
    vkey = load_version_key(home, create=False)
    knowledge = open_knowledge(home, lambda _m: None, version_key=vkey)
    try:
        handle = knowledge.handle_for(peer, "b" * 64)
        results = handle.search({"query": "staging server rebuilt nightly", "topK": 3})["envelope"]["results"]
        signer = CitationSigner(b"\x01" * 32, vkey, knowledge.evidence, lambda: "2026-12-05T10:00:00Z",
                                versions_for=knowledge.service.versions_for)
        cited = signer.rewrite({"action": "results", "envelope": {"results": results}}, {"citations": True}, peer)
        (citation,) = [r["citation"] for r in cited["envelope"]["results"] if r["source"] == "/kb/deploy.md"]
        (checked,) = handle.check_versions([{"source": "/kb/deploy.md", "version": entry["version"]}])["versions"]
    finally:
        knowledge.close()
    return {"manifest": entry["version"], "citation": citation["version"], "check": checked["state"]}


def test_an_edit_of_a_scrubbed_value_changes_no_version_the_peer_sees_and_its_sync_fetches_nothing(tmp_path):
    home, kb = copy_host(tmp_path)
    policy = Policy.load(home)
    policy.set_copy("/kb/**", "cat")  # cat holds a copy too, scrubbed of nothing
    policy.save()
    guest = node_home(tmp_path, "guest")

    def sync() -> tuple[dict, list[dict]]:
        calls: list[dict] = []
        server, corpus, key = copy_server(home)
        with corpus:
            report = anyio.run(lambda: sync_copy(guest, "alice", copy_asker(server, calls=calls), key))
        return report, calls

    first, _ = sync()
    assert first["fetched"] == 2
    before = _told(home, "bea")
    assert before["manifest"] == before["citation"] and before["check"] == "current"
    held = CopyStore(guest, "alice")
    kept = {f.name: f.read_text() for f in held.docs.iterdir()}
    assert any("[email]" in t for t in kept.values())

    _edit(home, kb, "ops@example.com", "night-shift@example.org")  # only the scrubbed value
    after = _told(home, "bea")
    assert after == before  # manifest, citation and check: nothing says the address changed
    report, calls = sync()
    assert (report["fetched"], report["unchanged"]) == (0, 2)
    assert [c["action"] for c in calls] == ["copy_list"]  # no document asked for
    assert {f.name: f.read_text() for f in held.docs.iterdir()} == kept
    # cat's lens scrubs nothing: its version is the keyed content hash, and it changed
    cat = _told(home, "cat")
    vkey = load_version_key(home, create=False)
    assert vkey is not None
    raw = hashlib.sha256((kb / "deploy.md").read_bytes()).hexdigest()
    assert cat["manifest"] == cat["citation"] == keyed_version(vkey, raw) != before["manifest"]

    _edit(home, kb, "rebuilt nightly", "rebuilt every hour")  # text bea sees
    edited = _told(home, "bea")
    assert edited["manifest"] == edited["citation"] != before["manifest"]
    old = _told_check(home, "bea", before["manifest"])
    assert old == "stale"
    report, calls = sync()
    assert report["fetched"] == 1 and calls[1]["sources"] == ["/kb/deploy.md"]
    assert DOCS["deploy.md"] != (kb / "deploy.md").read_text()


def _told_check(home: Path, peer: str, version: str) -> str:
    """What a ``check`` of ``version`` of /kb/deploy.md says to ``peer`` now."""
    knowledge = open_knowledge(home, lambda _m: None, version_key=load_version_key(home, create=False))
    try:
        (row,) = knowledge.handle_for(peer, "b" * 64).check_versions(
            [{"source": "/kb/deploy.md", "version": version}])["versions"]
    finally:
        knowledge.close()
    return row["state"]
