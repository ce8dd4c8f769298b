"""Copies a peer may keep (issue 33; specs/copies.md): the ``[[copy]]`` grant and
``kith policy copy``; the host's manifest and signed, scrubbed documents (the real
:class:`node.answer.copies.CopyServer` over a real corpus, policy and key); the peer's
sync (:func:`node.guest.copies.sync.sync_copy`) — only what changed, what the grant no longer
covers deleted, each fault of a hostile host refused with its code and the previous copy
intact, a sync killed between batches resumed — and the search of a copy. The sync over
iroh between real processes is tests/test_copies_iroh.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from node.common.errors import KithError, PolicyError
from node.corpus.store import Corpus
from node.policy.store import Policy
from node.guest.copies.search import search_copy
from node.guest.copies.store import CopyStore
from node.guest.copies.sync import sync_copy

from support.agents import api_headers
from support.cli import invoke
from support.copies import DOCS, copy_asker, copy_host, copy_server, first_copy
from support.homes import node_home

@pytest.fixture()
def host(tmp_path):
    """A copy-granting host home (:func:`support.copies.copy_host`)."""
    return copy_host(tmp_path)


_server = copy_server
_asker = copy_asker


def _sync(guest: Path, ask, key: str, **kw):
    return anyio.run(lambda: sync_copy(guest, "alice", ask, key, **kw))


def _files(store: CopyStore) -> dict[str, str]:
    return {f.name: f.read_text() for f in sorted(store.docs.iterdir())} if store.docs.is_dir() else {}


# --- the grant ---------------------------------------------------------------------------

def test_a_grant_covers_only_what_the_peer_may_already_see(host):
    home, _ = host
    policy = Policy.load(home)
    assert policy.copy_allowed("/kb/sqlite.md", "bea") is not None
    assert policy.copy_allowed("/kb/ask.md", "bea") is None  # ask: never copied
    assert policy.copy_allowed("/kb/notes/salary.md", "bea") is None  # private: never
    assert policy.copy_allowed("/kb/sqlite.md", "cat") is None  # not granted to cat
    assert policy.copy_allowed("/kb/sqlite.md", None) is None  # never an anonymous peer
    policy.set("/kb/deploy.md", "never")
    assert policy.copy_allowed("/kb/deploy.md", "bea") is None


def test_group_grants_and_their_end(tmp_path):
    policy = Policy.from_toml('[[rule]]\nglob = "/kb/**"\ntier = "peers"\npeers = ["@team"]\n'
                              '[group.team]\nmembers = ["bea"]\n'
                              '[[copy]]\nglob = "/kb/**"\nfor = "@team"\nuntil = "2030-01-01T00:00:00Z"\nmax_bytes = 500\n')
    assert policy.copy_allowed("/kb/a.md", "bea") is not None
    assert policy.copy_budget("bea") == 500
    policy.now = lambda: 1900000000.0  # after 2030-01-01
    assert policy.copy_allowed("/kb/a.md", "bea") is None
    again = Policy.from_toml(policy.to_toml())
    assert [c.to_toml() for c in again.copy_grants] == [c.to_toml() for c in policy.copy_grants]


@pytest.mark.parametrize("table", ['glob = "/kb/**"\nfor = "bea"\nkinds = ["email"]',
                                   'glob = "/kb/**"\nfor = "not a name"',
                                   'glob = "/kb/**"\nfor = "bea"\nmax_bytes = 0',
                                   'glob = "/kb/**"\nfor = "bea"\nuntil = "tomorrow"',
                                   'for = "bea"'])
def test_a_bad_copy_table_is_refused(table):
    with pytest.raises(PolicyError) as exc:
        Policy.from_toml(f"[[copy]]\n{table}\n")
    assert exc.value.code == "policy-invalid"


def test_kith_policy_copy_tells_what_cannot_be_undone_and_is_listed_explained_checked(host):
    home, _ = host
    r = invoke(home, "policy", "copy", "/kb/*.md", "--for", "bea", "--max-bytes", "100000", "--until", "30d")
    assert r.exit_code == 0, r.output
    assert "keeps what it copied" in r.output and "signatures prove what was shared" in r.output
    listed = json.loads(invoke(home, "policy", "list", "--json").stdout)
    assert {"glob": "/kb/*.md", "for": "bea", "maxBytes": 100000} == {
        k: v for k, v in listed["copy"][1].items() if k in ("glob", "for", "maxBytes")}
    explained = json.loads(invoke(home, "policy", "explain", "/kb/sqlite.md", "--peer", "bea", "--json").stdout)
    assert explained["copy"]["for"] == "bea"
    assert json.loads(invoke(home, "policy", "explain", "/kb/ask.md", "--peer", "bea", "--json").stdout).get("copy") is None
    checked = json.loads(invoke(home, "policy", "check", "--json").stdout)["copy"]
    whole = next(c for c in checked if c["glob"] == "/kb/**")
    assert whole["matches"] == 4 and whole["copyable"] == 2
    assert sorted(whole["notCopied"]) == ["/kb/ask.md", "/kb/notes/salary.md"]
    assert invoke(home, "policy", "copy", "/kb/*.md", "--for", "bea", "--off").exit_code == 0
    assert [c["glob"] for c in json.loads(invoke(home, "policy", "list", "--json").stdout)["copy"]] == ["/kb/**"]
    assert invoke(home, "policy", "copy", "/kb/**").exception.code == "usage"  # --for missing


# --- the host's side ------------------------------------------------------------------------

def test_the_manifest_and_documents_hold_only_copyable_scrubbed_signed_text(host):
    from node.answer.citation import verify_citation

    home, _ = host
    server, corpus, key = _server(home)
    with corpus:
        manifest = server.manifest("bea")
        assert manifest["status"] == "ok"
        assert [d["source"] for d in manifest["documents"]] == ["/kb/deploy.md", "/kb/sqlite.md"]
        docs = server.documents("bea", ["/kb/deploy.md", "/kb/ask.md", "/kb/notes/salary.md"])
        assert docs["refused"] == ["/kb/ask.md", "/kb/notes/salary.md"]
        (deploy,) = docs["documents"]
        assert "ops@example.com" not in deploy["text"] and "[email]" in deploy["text"]
        row = verify_citation(deploy["citation"], text=deploy["text"], shown_sources=("/kb/deploy.md",),
                              expected_host=key)
        assert row.result == "unpinned-key"  # signature and text verify (no pinned-peer table given)
        assert server.manifest("cat")["status"] == "copy-not-granted"


def test_what_a_peer_may_keep_follows_an_override_that_ends_between_two_requests(host):
    """The host decides what a peer may keep once per policy, corpus generation and grants
    in force; an override whose ``until`` passes (no file change, no re-index) is seen at
    the next request all the same."""
    home, _ = host
    policy = Policy.load(home)
    policy.set("/kb/sqlite.md", "private")
    policy.save()
    with open(home / "policy.toml", "a") as f:
        f.write('\n[[override]]\npeer = "bea"\nglob = "/kb/sqlite.md"\ntier = "public"\n'
                'until = "2030-01-01T00:00:00Z"\n')
    server, corpus, _ = _server(home)
    with corpus:
        assert "/kb/sqlite.md" in [d["source"] for d in server.manifest("bea")["documents"]]
        assert [d["source"] for d in server.documents("bea", ["/kb/sqlite.md"])["documents"]] == ["/kb/sqlite.md"]
        server._gate.current_policy().now = lambda: 1900000000.0  # after 2030-01-01: the override ended
        assert server.documents("bea", ["/kb/sqlite.md"])["refused"] == ["/kb/sqlite.md"]
        assert "/kb/sqlite.md" not in [d["source"] for d in server.manifest("bea")["documents"]]


# --- the peer's sync -----------------------------------------------------------------------

def test_sync_fetches_only_what_changed_and_deletes_what_is_no_longer_granted(host, tmp_path):
    home, kb = host
    guest = node_home(tmp_path, "guest")
    own = Corpus(guest)
    own.close()
    server, corpus, key = _server(home)
    with corpus:
        first = _sync(guest, _asker(server), key)
        assert (first["fetched"], first["documents"]) == (2, 2)
        calls: list = []
        again = _sync(guest, _asker(server, calls=calls), key)
        assert (again["fetched"], again["unchanged"]) == (0, 2)
        assert [c["action"] for c in calls] == ["copy_list"]  # nothing changed: no document asked
    (kb / "sqlite.md").write_text(DOCS["sqlite.md"] + "\nCheckpoints move the log back.\n")
    with Corpus(home) as c:
        c.sync()
    server, corpus, key = _server(home)
    with corpus:
        calls = []
        changed = _sync(guest, _asker(server, calls=calls), key)
        assert changed["fetched"] == 1 and calls[1]["sources"] == ["/kb/sqlite.md"]
        hits = search_copy(guest, "alice", {"query": "checkpoints", "topK": 5})
        assert [r["source"] for r in hits["envelope"]["results"]] == ["/kb/sqlite.md"]
        policy = Policy.load(home)  # the grant narrows
        policy.unset_copy("/kb/**", "bea")
        policy.set_copy("/kb/sqlite.md", "bea")
        policy.save()
        narrowed = _sync(guest, _asker(server), key)
        assert narrowed["removed"] == 1 and narrowed["documents"] == 1
        assert search_copy(guest, "alice", {"query": "staging", "topK": 5})["envelope"]["results"] == []
        policy.unset_copy("/kb/sqlite.md", "bea")  # the grant ends
        policy.save()
        ended = _sync(guest, _asker(server), key)
        assert ended["status"] == "ended" and ended["removed"] == 1
        assert not CopyStore(guest, "alice").dir.exists()
    with Corpus(guest, readonly=True) as mine:  # the peer's own corpus never changed
        assert mine.stats().get("documents", 0) == 0


def test_a_document_changed_or_lost_on_this_machine_is_fetched_again(host, tmp_path):
    """The attacker's finding #4: a copied file edited or deleted here was kept as it was
    (and answered, failing `kith verify`) until its host changed it."""
    home, _kb = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    with corpus:
        _sync(guest, _asker(server), key)
        store = CopyStore(guest, "alice")
        held = store.load()["documents"]
        edited = store.docs / held["/kb/sqlite.md"]["file"]
        signed = edited.read_text()
        edited.write_text("planted text, not the host's\n")
        lost = store.docs / held["/kb/deploy.md"]["file"]
        lost.unlink()
        lost.mkdir()  # and a folder made in its place
        (lost / "inside.txt").write_text("x")
        calls: list = []
        repaired = _sync(guest, _asker(server, calls=calls), key)
        assert (repaired["fetched"], repaired["repaired"], repaired["unchanged"]) == (2, 2, 0)
        assert sorted(calls[1]["sources"]) == ["/kb/deploy.md", "/kb/sqlite.md"]
        assert edited.read_text() == signed
        assert all(store.intact(e) for e in store.load()["documents"].values())
        hits = search_copy(guest, "alice", {"query": "staging", "topK": 5})["envelope"]["results"]
        assert "/kb/deploy.md" in [r["source"] for r in hits]
        again = _sync(guest, _asker(server), key)
        assert (again["fetched"], again["repaired"]) == (0, 0)
        # an edit that keeps the size, made later than the sync wrote the file: hashed, fetched again
        before = edited.stat().st_mtime_ns
        edited.write_bytes(b"z" * len(signed.encode()))
        os.utime(edited, ns=(before + 10**9, before + 10**9))
        same_size = _sync(guest, _asker(server), key)
        assert (same_size["fetched"], same_size["repaired"]) == (1, 1) and edited.read_text() == signed


def test_a_second_sync_of_one_copy_at_once_is_refused_before_it_asks_anything(host, tmp_path):
    """The attacker's finding #15: a `kith copies sync` beside the host's background
    re-sync — each deletes the files its committed manifest does not list."""
    home, _kb = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    seen: list = []
    with corpus:
        inner = _asker(server)

        async def ask(request):
            if not seen:  # while this sync runs, another starts
                second: list = []
                with pytest.raises(KithError) as busy:
                    await sync_copy(guest, "alice", _asker(server, calls=second), key)
                seen.append((busy.value.code, second, str(busy.value)))
            return await inner(request)

        report = _sync(guest, ask, key)
        assert report["fetched"] == 2
        code, second, message = seen[0]
        assert code == "copy-sync-running" and second == [] and f"pid {os.getpid()}" in message
        assert _sync(guest, _asker(server), key)["unchanged"] == 2  # the lock went with the first sync


def test_a_copy_folder_that_is_a_symbolic_link_is_never_tidied_through(host, tmp_path):
    """The attacker's finding: docs/ moved to another disk and linked back lost every other
    file of that folder at the next sync (a sync deletes what its manifest does not list)."""
    import shutil

    home, _kb = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    with corpus:
        _sync(guest, _asker(server), key)
        store = CopyStore(guest, "alice")
        elsewhere = tmp_path / "bigger-disk"
        shutil.copytree(store.docs, elsewhere)
        (elsewhere / "precious.txt").write_text("not the copy's\n")
        shutil.rmtree(store.docs)
        store.docs.symlink_to(elsewhere)
        with pytest.raises(KithError) as refused:
            _sync(guest, _asker(server), key)
        assert refused.value.code == "io-error" and "symbolic link" in str(refused.value)
        assert (elsewhere / "precious.txt").read_text() == "not the copy's\n"


def test_a_copy_removed_while_its_sync_runs_stays_removed(host, tmp_path):
    """The attacker's finding: `kith copies remove` / `kith peers remove` during a sync in
    another process said the copy was deleted, and the sync then made it again."""
    home, _kb = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    with corpus:
        inner = _asker(server)
        asked: list = []

        async def ask(request):
            asked.append(request["action"])
            if request["action"] == "copy_fetch":  # the owner removes the copy meanwhile
                assert CopyStore(guest, "alice").remove() is True
            return await inner(request)

        _sync(guest, _asker(server), key)  # a copy to remove
        CopyStore(guest, "alice").remove()  # and removed: the next sync starts from nothing
        with pytest.raises(KithError) as stopped:
            _sync(guest, ask, key)
        assert stopped.value.code == "copy-removed" and asked == ["copy_list", "copy_fetch"]
        assert not CopyStore(guest, "alice").dir.exists()
        again = _sync(guest, _asker(server), key)  # a later sync makes it again, as asked
        assert again["fetched"] == 2


def test_a_removal_made_while_an_asleep_device_is_dialled_sticks(host, tmp_path, monkeypatch):
    """issue 42 item 3: `kith copies remove` of a person's copy while the background sync
    dials an asleep device was undone by the next device that answered — the removal mark
    was taken only once a device had answered. It is taken before the first dial now."""
    from types import SimpleNamespace

    import node.guest.asker as asker_mod
    from node.guest.copies.sync import sync_with_pool
    from node.guest.peerview import PeerView
    from node.trust.peers import PeerRegistry, pin_person

    home, _kb = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    with corpus:
        _sync(guest, _asker(server), key)  # the copy of one device of the person
        assert CopyStore(guest, "alice").exists()
        pin_person(PeerRegistry.load(guest), "alice", os.urandom(32).hex())
        served = _asker(server)
        dials: list[str] = []

        async def ask(self, peer, request):  # the asleep device is dialled; the owner removes meanwhile
            dials.append(request["action"])
            if len(dials) == 1:
                assert CopyStore(guest, "alice").remove() is True
            return {**await served(request), "device": {"key": key, "name": "desk"}}

        monkeypatch.setattr(asker_mod.Asker, "ask", ask)
        pool = SimpleNamespace(home=guest, peers=PeerView(guest), copy_states={})
        with pytest.raises(KithError) as stopped:
            anyio.run(lambda: sync_with_pool(pool, "alice"))
    assert stopped.value.code == "copy-removed"
    assert dials == ["copy_list"] and not CopyStore(guest, "alice").exists()


def test_a_removal_that_makes_a_write_of_the_sync_fail_is_copy_removed(host, tmp_path, monkeypatch):
    """The second attacker's finding: a removal landing between a batch's writes made the
    next write fail (`io-error`, the folder gone) and the fault path indexed the removed
    copy again, leaving a folder behind."""
    home, _kb = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    write = CopyStore.write_doc

    def removed_then_write(self, name, text):
        CopyStore(guest, "alice").remove()  # the owner's `kith copies remove` in another process
        write(self, name, text)
        raise KithError("io-error", "copies/alice: writing document: No such file or directory")

    with corpus:
        monkeypatch.setattr(CopyStore, "write_doc", removed_then_write)
        with pytest.raises(KithError) as stopped:
            _sync(guest, _asker(server), key)
    assert stopped.value.code == "copy-removed"
    assert not CopyStore(guest, "alice").dir.exists()


def _faulty(mutate):
    def tamper(request, reply):
        if reply["action"] == "copy_docs" and reply["documents"]:
            mutate(reply)
        return reply
    return tamper


def _bad_signature(reply):
    sig = reply["documents"][0]["citation"]["signature"]
    reply["documents"][0]["citation"]["signature"] = ("0" if sig[0] != "0" else "1") + sig[1:]


def _text_changed(reply):
    reply["documents"][0]["text"] += " (edited)"


def _other_version(reply):
    reply["documents"][0]["version"] = "a" * 64


def _outside(reply):
    reply["documents"][0]["source"] = "/kb/notes/salary.md"


@pytest.mark.parametrize("mutate,code", [(_bad_signature, "copy-bad-signature"),
                                         (_text_changed, "copy-version-mismatch"),
                                         (_other_version, "copy-version-mismatch"),
                                         (_outside, "copy-outside-grant")])
def test_a_hostile_document_is_refused_and_the_previous_copy_stays(host, tmp_path, mutate, code):
    home, kb = host
    guest, key = first_copy(home, tmp_path)
    store = CopyStore(guest, "alice")
    before, files = store.load(), _files(store)
    (kb / "sqlite.md").write_text(DOCS["sqlite.md"] + "\nA new line.\n")
    with Corpus(home) as c:
        c.sync()
    server, corpus, key = _server(home)
    with corpus:
        with pytest.raises(KithError) as exc:
            _sync(guest, _asker(server, tamper=_faulty(mutate)), key)
    assert exc.value.code == code
    assert store.load()["documents"] == before["documents"] and _files(store) == files  # the previous copy, whole
    assert search_copy(guest, "alice", {"query": "WAL", "topK": 5})["envelope"]["results"]


def test_a_document_signed_by_another_key_is_refused(host, tmp_path):
    from node.trust.identity import Identity
    import os

    home, _ = host
    guest = node_home(tmp_path, "guest")
    server, corpus, _key = _server(home)
    with corpus, pytest.raises(KithError) as exc:
        _sync(guest, _asker(server), Identity(os.urandom(32)).public_key)  # the pinned key is another
    assert exc.value.code == "copy-bad-signature"
    assert CopyStore(guest, "alice").load()["documents"] == {}


def test_over_the_budget_is_refused_with_a_code(host, tmp_path):
    home, _ = host
    guest = node_home(tmp_path, "guest")
    policy = Policy.load(home)
    policy.set_copy("/kb/**", "bea", max_bytes=50)
    policy.save()
    server, corpus, key = _server(home)
    with corpus, pytest.raises(KithError) as exc:
        _sync(guest, _asker(server), key)
    assert exc.value.code == "copy-over-budget"

    # a host that says ok but lists more than the budget it states
    policy.set_copy("/kb/**", "bea", max_bytes=10**6)
    policy.save()
    server, corpus, key = _server(home)
    manifest = server.manifest("bea")
    assert manifest["status"] == "ok" and manifest["bytes"] > 50

    async def ask(request):
        if request["action"] == "copy_list":
            return {"action": "copy_manifest", **manifest, "maxBytes": 50}
        return {"action": "copy_docs", **server.documents("bea", request["sources"])}
    with corpus, pytest.raises(KithError) as exc:
        _sync(guest, ask, key)
    assert exc.value.code == "copy-over-budget"


def test_a_grant_narrowed_as_its_budget_shrank_still_deletes_what_it_no_longer_covers(host, tmp_path):
    """Narrowing a grant while lowering its budget under what remains: the sync is refused
    copy-over-budget (nothing fetched), yet what the grant no longer covers is deleted and
    never answered from again; what remains is kept as it was."""
    home, _ = host
    guest, key = first_copy(home, tmp_path)
    assert sorted(CopyStore(guest, "alice").load()["documents"]) == ["/kb/deploy.md", "/kb/sqlite.md"]
    policy = Policy.load(home)
    policy.unset_copy("/kb/**", "bea")
    policy.set_copy("/kb/sqlite.md", "bea", max_bytes=10)  # narrower, and under what sqlite.md holds
    policy.save()
    server, corpus, key = _server(home)
    with corpus, pytest.raises(KithError) as exc:
        _sync(guest, _asker(server), key)
    assert exc.value.code == "copy-over-budget"
    assert sorted(CopyStore(guest, "alice").load()["documents"]) == ["/kb/sqlite.md"]
    assert search_copy(guest, "alice", {"query": "staging server", "topK": 5})["envelope"]["results"] == []
    assert search_copy(guest, "alice", {"query": "WAL readers", "topK": 5})["envelope"]["results"]


def test_a_killed_sync_keeps_what_was_committed_and_resumes(host, tmp_path, monkeypatch):
    import node.guest.copies.sync as copies

    home, _ = host
    guest = node_home(tmp_path, "guest")
    monkeypatch.setattr(copies, "FETCH_BATCH", 1)
    server, corpus, key = _server(home)
    asked = []

    def killed(request, reply):
        asked.append(request["action"])
        if asked.count("copy_fetch") == 2:
            raise KeyboardInterrupt  # the process is killed during the second batch
        return reply
    with corpus:
        with pytest.raises(KeyboardInterrupt):
            _sync(guest, _asker(server, tamper=killed), key)
        store = CopyStore(guest, "alice")
        state = store.load()
        assert list(state["documents"]) == ["/kb/deploy.md"] and state["syncedAt"] is None
        assert set(_files(store)) == {d["file"] for d in state["documents"].values()}
        calls: list = []
        resumed = _sync(guest, _asker(server, calls=calls), key)
    assert resumed["fetched"] == 1 and [c.get("sources") for c in calls[1:]] == [["/kb/sqlite.md"]]


def test_a_hostile_source_id_never_names_a_file(host, tmp_path):
    home, _ = host
    server, corpus, key = _server(home)
    with corpus:
        real = server.manifest("bea")["documents"][0]
    # a source id that is a path climbing out: the peer names its file by a hash
    name = CopyStore.file_for("/../../../../etc/passwd", real["version"])
    assert "/" not in name and ".." not in name and name.endswith(".txt")


def test_search_of_a_copy_never_names_a_local_file(host, tmp_path):
    home, _ = host
    guest, key = first_copy(home, tmp_path)
    answer = search_copy(guest, "alice", {"query": "staging server", "topK": 5})
    text = json.dumps(answer)
    assert "/copy/" not in text and str(guest) not in text
    assert answer["envelope"]["results"][0]["source"] == "/kb/deploy.md"
    assert answer["copyAsOf"]
    with pytest.raises(KithError) as exc:
        search_copy(guest, "nobody", {"query": "x", "topK": 1})
    assert exc.value.code == "copy-not-found"


def test_a_sync_killed_before_its_index_step_indexes_at_the_next(host, tmp_path, monkeypatch):
    home, _ = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    real_index = CopyStore.index

    def killed(self, changed=None):
        raise KeyboardInterrupt
    with corpus:
        monkeypatch.setattr(CopyStore, "index", killed)
        with pytest.raises(KeyboardInterrupt):
            _sync(guest, _asker(server), key)
        monkeypatch.setattr(CopyStore, "index", real_index)
        again = _sync(guest, _asker(server), key)  # nothing left to fetch, but the index lagged
    assert again["fetched"] == 0
    assert search_copy(guest, "alice", {"query": "WAL", "topK": 5})["envelope"]["results"]


def test_a_copy_held_open_between_questions_follows_its_syncs_and_removal(host, tmp_path):
    """A long-running process (kith api serve, kith mcp) keeps a copy's index open between
    questions in its session pool's OpenCopies; a sync, a removal and a new copy under the
    same name are each seen at the next question, and no more than OPEN_COPIES_MAX copies
    stay open. A search without one holds nothing open after it."""
    from node.guest.copies.store import OPEN_COPIES_MAX, OpenCopies

    home, kb = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    with corpus:
        _sync(guest, _asker(server), key)
    opened = OpenCopies()
    alice = CopyStore(guest, "alice").dir
    first = search_copy(guest, "alice", {"query": "staging server", "topK": 5}, copies=opened)
    held = opened.held(alice)
    assert search_copy(guest, "alice", {"query": "staging server", "topK": 5}, copies=opened) == first
    assert opened.held(alice) is held  # not opened again
    assert search_copy(guest, "alice", {"query": "staging server", "topK": 5}) == first  # its own, closed after
    (kb / "deploy.md").write_text("# Deploy\n\nThe staging server moved to the blue rack.\n")
    with Corpus(home) as c:
        c.sync()
    server, corpus, key = _server(home)
    with corpus:
        _sync(guest, _asker(server), key)
    text = json.dumps(search_copy(guest, "alice", {"query": "blue rack", "topK": 5}, copies=opened))
    assert "blue rack" in text and held.retired
    CopyStore(guest, "alice").remove()  # kith copies remove alice
    with pytest.raises(KithError) as exc:
        search_copy(guest, "alice", {"query": "staging", "topK": 5}, copies=opened)
    assert exc.value.code == "copy-not-found"
    assert opened.held(alice) is None
    for i in range(OPEN_COPIES_MAX + 2):  # many copies: the oldest are closed
        server, corpus, key = _server(home)
        with corpus:
            anyio.run(lambda: sync_copy(guest, f"peer{i}", _asker(server), key))
        search_copy(guest, f"peer{i}", {"query": "WAL", "topK": 3}, copies=opened)
    assert len(opened) <= OPEN_COPIES_MAX
    opened.close()
    assert len(opened) == 0


# --- results from a copy: a citation kith verify accepts as the host's ------------------------

def _copied(host, tmp_path) -> tuple[Path, str]:
    """A guest home keeping alice's copy (synced from ``host``), alice pinned under the
    host's key; ``(guest home, host key)``."""
    from node.trust.peers import PeerRegistry

    home, _ = host
    guest, key = first_copy(home, tmp_path)
    PeerRegistry.load(guest).add("alice", key)
    return guest, key


def _ask_copy(guest: Path, query: str) -> dict:
    """The merged envelope of asking alice ``query`` from her copy only (``kith ask --copy``'s
    fan_out over a real pool that never binds: no peer is asked)."""
    from node.guest.fanout import fan_out
    from node.guest.pool import SessionPool
    from node.trust.identity import load_identity

    async def main():
        async with SessionPool(guest, load_identity(guest), local=True) as pool:
            return await fan_out(pool, {"query": query, "topK": 5}, ["alice"], copies="only")
    return anyio.run(main)


def _verify_rows(answer, home: Path):
    from node.answer.citation import known_keys, verify_answer
    from node.guest.copies.search import copy_texts

    return verify_answer(answer, known=known_keys(home), copies=copy_texts(home))


def test_a_merged_result_from_a_copy_carries_the_hosts_document_signature_and_its_span(host, tmp_path):
    from node.answer.citation import shown_in

    from support.envelopes import valid_ask

    guest, key = _copied(host, tmp_path)
    env = _ask_copy(guest, "staging server")
    valid_ask(env)
    (r,) = [x for x in env["results"] if x["source"] == "/kb/deploy.md"]
    assert r["fromCopy"] is True and r["copyAsOf"] == env["peers"][0]["copyAsOf"] is not None
    cite = r["copyCitation"]
    store = CopyStore(guest, "alice")
    entry = store.load()["documents"]["/kb/deploy.md"]
    document = (store.docs / entry["file"]).read_text()
    assert cite == entry["citation"] and cite["hostKey"] == key and cite["source"] == "/kb/deploy.md"
    assert cite["span"]["chars"] == [0, len(document)] and "[email]" in document  # the scrubbed text, signed whole
    start, end = r["copySpan"]
    assert 0 <= start < end <= len(document) and shown_in(r["textPreview"], document[start:end])
    rows = _verify_rows(env, guest)
    assert [row.result for row in rows] == ["genuine"] * len(env["results"])
    assert rows[0].copy == cite["signedAt"] and rows[0].peer == "alice"
    assert "that host's, from a copy of " + cite["signedAt"] in rows[0].detail
    assert rows[0].as_json()["fromCopy"] is True and rows[0].as_json()["copySignedAt"] == cite["signedAt"]


def _edit_document(guest, env, r):
    store = CopyStore(guest, "alice")
    path = store.docs / store.load()["documents"][r["source"]]["file"]
    path.write_text(path.read_text().replace("nightly", "weekly"))


def _move_span(guest, env, r):
    r["copySpan"] = [0, 8]  # "# Deploy": the preview is in the document, not there


def _span_outside(guest, env, r):
    r["copySpan"] = [0, r["copyCitation"]["span"]["chars"][1] + 10]


def _edit_preview(guest, env, r):
    r["textPreview"] = r["textPreview"].replace("nightly", "hourly")
    env.pop("fence")  # (the merged fence is judged on its own: only this row is looked at here)


def _other_host(guest, env, r):
    r["peer"]["key"] = "ab" * 32


def _forged_signature(guest, env, r):
    sig = r["copyCitation"]["signature"]
    r["copyCitation"] = {**r["copyCitation"], "signature": ("0" if sig[0] != "0" else "1") + sig[1:]}


def _copy_removed(guest, env, r):
    CopyStore(guest, "alice").remove()


def _re_synced(guest, env, r):
    store = CopyStore(guest, "alice")
    state = store.load()
    state["documents"][r["source"]]["textSha256"] = "0" * 64  # the copy holds another version now
    store.commit(state)


def _unpinned(guest, env, r):
    from node.trust.peers import PeerRegistry

    reg = PeerRegistry.load(guest)
    reg.remove("alice")


@pytest.mark.parametrize("tamper,result", [(_edit_document, "text-changed"), (_move_span, "span-mismatch"),
                                           (_span_outside, "span-mismatch"), (_edit_preview, "text-changed"),
                                           (_other_host, "wrong-host"), (_forged_signature, "bad-signature"),
                                           (_copy_removed, "copy-not-held"), (_re_synced, "copy-not-held"),
                                           (_unpinned, "unpinned-key")])
def test_a_result_from_a_copy_that_does_not_hold_is_refused_with_its_code(host, tmp_path, tamper, result):
    guest, _ = _copied(host, tmp_path)
    env = _ask_copy(guest, "staging server")
    (i, r), = [(i, x) for i, x in enumerate(env["results"]) if x["source"] == "/kb/deploy.md"]
    assert _verify_rows(env, guest)[i].result == "genuine"
    tamper(guest, env, r)
    row = next(row for row in _verify_rows(env, guest) if row.where == f"results[{i}]")
    assert row.result == result and row.copy is not None and row.detail.startswith("from a copy")


def test_the_copy_fields_go_with_the_peer_a_merged_result_names(host, tmp_path):
    from node.guest.fanout import PeerRow, build_envelope

    guest, key = _copied(host, tmp_path)
    found = search_copy(guest, "alice", {"query": "staging server", "topK": 5})["envelope"]["results"]
    deploy = next(x for x in found if x["source"] == "/kb/deploy.md")
    other = {**deploy, "id": "o1", "source": "/kb/other.md", "textPreview": "Something else entirely."}
    live = {k: v for k, v in deploy.items() if k not in ("copyCitation", "copySpan")}
    live = {**live, "id": "b1", "source": "/bob/deploy.md"}  # bob returned the same text live

    def merged(rows, answers):
        env = build_envelope({"query": "q", "topK": 5}, rows, answers, timeout_s=1, elapsed_ms=1, top_k=5)
        return next(m for m in env["results"] if m["textPreview"] == deploy["textPreview"])

    def copy_row():
        return PeerRow("alice", key, status="ok", from_copy=True, copy_as_of="2026-01-01T00:00:00Z")
    bob = PeerRow("bob", "cd" * 32, status="ok")
    m = merged([copy_row(), bob], {0: [other, deploy], 1: [live]})  # bob ranks it first: named bob
    assert m["peer"]["name"] == "bob" and not {"fromCopy", "copyCitation", "copySpan", "copyAsOf"} & set(m)
    m = merged([bob, copy_row()], {0: [other, live], 1: [deploy]})  # alice's copy ranks it first
    assert m["peer"]["name"] == "alice" and m["fromCopy"] is True and m["copyAsOf"] == "2026-01-01T00:00:00Z"
    assert m["copyCitation"] == deploy["copyCitation"] and m["copySpan"] == deploy["copySpan"]


def test_kith_ask_and_kith_verify_mark_each_copy_result_and_mcp_and_the_api_verify_it(host, tmp_path):
    import os

    import httpx

    from node.local.api import run_api_in_thread
    from node.local.mcp import call_verify

    from support.cli import kith

    guest, _ = _copied(host, tmp_path)
    text = kith(guest, "ask", "staging server", "--peer", "alice", "--copy")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    heads = [n for n, line in enumerate(lines) if line.lstrip().startswith("#")]
    assert heads and all(lines[n + 1].strip().startswith("from alice's copy of ") for n in heads)
    saved = tmp_path / "answer.json"
    asked = kith(guest, "ask", "staging server", "--peer", "alice", "--copy", "--json")
    saved.write_text(asked.stdout)
    checked = kith(guest, "verify", str(saved), env={**os.environ, "COLUMNS": "400"})  # the table unwrapped
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "genuine (copy)" in checked.stdout and "that host's, from a copy of" in checked.stdout
    report = json.loads(kith(guest, "verify", str(saved), "--json").stdout)
    assert report["ok"] and all(r["fromCopy"] for r in report["rows"])
    answer = json.loads(asked.stdout)
    assert call_verify(guest, {"answer": answer}).structured_content == report  # MCP `verify`
    with run_api_in_thread(guest) as url, httpx.Client(timeout=30, headers=api_headers(guest)) as http:
        assert http.post(f"{url}/verify", json={"answer": answer}).json() == report  # POST /verify
    elsewhere = kith(node_home(tmp_path, "cat"), "verify", str(saved), "--json")  # no copy there
    assert elsewhere.returncode == 1 and set(json.loads(elsewhere.stdout)["counts"]) == {"copy-not-held"}


# --- faults: the previous copy stays whole (specs/copies.md §9) -------------------------------

def _copy_state(store: CopyStore) -> tuple[dict, dict[str, str], list[str]]:
    """(manifest, docs/ files, what a search of it answers): the copy as a user sees it."""
    hits = search_copy(store.home, store.peer, {"query": "WAL journal staging", "topK": 5})["envelope"]["results"]
    return store.load(), _files(store), sorted(r["source"] for r in hits)


def _changed_host(home: Path, kb: Path, text: str) -> None:
    (kb / "sqlite.md").write_text(text)
    (kb / "deploy.md").write_text(DOCS["deploy.md"] + "\nRebuilt at two.\n")
    with Corpus(home) as c:
        c.sync()


def test_a_fault_in_a_batch_writes_nothing_of_it_and_keeps_the_index_flag(host, tmp_path):
    """Every document of a batch is checked before any is written: a bad second document
    leaves no file of the first; a sync refused before anything changed keeps
    ``indexed: true`` (the next sync re-indexes only what changes)."""
    home, kb = host
    guest, key = first_copy(home, tmp_path)
    store = CopyStore(guest, "alice")
    before = _copy_state(store)
    assert before[0]["indexed"] is True
    _changed_host(home, kb, DOCS["sqlite.md"] + "\nA new line.\n")

    def second_bad(reply):
        assert len(reply["documents"]) == 2
        reply["documents"][1]["text"] += " (edited)"
    server, corpus, key = _server(home)
    with corpus, pytest.raises(KithError) as exc:
        _sync(guest, _asker(server, tamper=_faulty(second_bad)), key)
    assert exc.value.code == "copy-version-mismatch"
    assert _copy_state(store) == before  # manifest (indexed still true), files, answers


@pytest.mark.parametrize("source", ["/kb/../../etc/passwd", "kb/relative.md", "/kb/./x.md", "/kb//x.md",
                                    "/kb\\..\\x.md", "/kb/x\x00.md"])
def test_a_manifest_naming_a_path_that_climbs_is_refused(host, tmp_path, source):
    home, _ = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    with corpus:
        _sync(guest, _asker(server), key)
        store = CopyStore(guest, "alice")
        before = _copy_state(store)

        def climb(request, reply):
            if reply["action"] == "copy_manifest":
                reply["documents"][0]["source"] = source
            return reply
        with pytest.raises(KithError) as exc:
            _sync(guest, _asker(server, tamper=climb), key)
    assert exc.value.code == "copy-manifest-invalid"
    assert _copy_state(store) == before


def test_a_manifest_that_cannot_be_written_is_io_error_and_leaves_no_temp_file(host, tmp_path):
    """Any OSError but a full disk is the home's ``io-error``, as a KithError (the sync's
    row says it), and the temp file is removed."""
    home, _ = host
    guest = node_home(tmp_path, "guest")
    store = CopyStore(guest, "alice")
    store.path.mkdir(parents=True)  # manifest.json is a folder: the rename fails (EISDIR)
    server, corpus, key = _server(home)
    with corpus, pytest.raises(KithError) as exc:
        _sync(guest, _asker(server), key)
    assert exc.value.code == "io-error" and "copies/alice" in exc.value.message
    assert [p.name for p in store.dir.iterdir()] == ["manifest.json"]  # no .manifest.json.*.tmp
    store.path.rmdir()
    store.docs.parent.mkdir(parents=True, exist_ok=True)
    store.docs.write_text("a file where the folder should be")
    with pytest.raises(KithError) as exc:
        store.write_doc("x.md", "text")
    assert exc.value.code == "io-error"


_FULL_DISK_SYNC = """
import resource, signal, sys, time
sys.path[:0] = {paths!r}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
from pathlib import Path
import anyio
from node.common.errors import KithError
from test_copies import _asker, _server
from node.guest.copies.sync import sync_copy
server, corpus, key = _server(Path({host!r}))
try:
    anyio.run(lambda: sync_copy(Path({guest!r}), "alice", _asker(server), key))
except KithError as exc:
    print(exc.code, exc.message)
else:
    print("ok")
"""


def test_a_full_disk_is_copy_disk_full_and_the_previous_copy_stays(host, tmp_path):
    """A real full disk: the sync runs in a child process whose file-size limit
    (RLIMIT_FSIZE, SIGXFSZ ignored) is below the new document's size."""
    import subprocess
    import sys

    home, kb = host
    guest, key = first_copy(home, tmp_path)
    store = CopyStore(guest, "alice")
    before = _copy_state(store)
    _changed_host(home, kb, DOCS["sqlite.md"] + "".join(f"\nLine {i} of a long log about checkpoints.\n"
                                                        for i in range(6000)))
    script = _FULL_DISK_SYNC.format(paths=[str(Path(__file__).parent)] + sys.path, limit=150_000,
                                    host=str(home), guest=str(guest))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("copy-disk-full "), r.stdout + r.stderr
    assert _copy_state(store) == before
    assert not [p for p in store.dir.rglob("*.tmp")]
    again = _sync(guest, _asker(_server(home)[0]), key)  # room again: the sync completes
    assert again["fetched"] == 2


def test_a_copy_indexed_under_an_older_schema_is_rebuilt_locally(host, tmp_path):
    """A copy's index of another index schema (search answers nothing) or chunker is
    rebuilt from docs/ — at a search of it, at its sync, at `kith index sync` — asking no one."""
    import sqlite3

    home, _ = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    with corpus:
        _sync(guest, _asker(server), key)
    store = CopyStore(guest, "alice")
    before = _copy_state(store)
    db = store.dir / "corpus" / "corpus.sqlite3"
    assert db.is_file()

    def older(sql: str) -> None:
        with sqlite3.connect(db) as c:
            c.execute(sql)
        import os
        os.utime(store.path)  # as a new process would see it (the check is cached per manifest)
    older("UPDATE meta SET value = '1' WHERE key = 'index_schema_version'")
    assert _copy_state(store) == before  # search_copy rebuilt it first
    assert store.reindex_if_outdated() is False  # current now
    older("UPDATE documents SET chunker_sig = 'recursive:v1:1200:150'")

    async def nobody(request):
        raise AssertionError("a re-index asks no one")
    with pytest.raises(AssertionError):
        _sync(guest, nobody, key)  # the sync re-indexes before it asks
    with sqlite3.connect(db) as c:
        assert {r[0] for r in c.execute("SELECT chunker_sig FROM documents")} != {"recursive:v1:1200:150"}
    older("UPDATE meta SET value = '1' WHERE key = 'index_schema_version'")
    r = invoke(guest, "index", "sync", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["copiesReindexed"] == ["alice"]
    assert _copy_state(store) == before


def test_a_damaged_or_lost_copy_index_is_rebuilt_from_the_copy_with_no_one_asked(host, tmp_path):
    """The attacker's findings: a copy index that is not a database was a traceback in
    `kith copies sync` and `kith index sync`; a deleted one made the copy unanswerable
    (`copy-not-found`) while its host slept, its text still in docs/."""
    from node.guest.copies.store import reindex_copies

    home, _ = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    with corpus:
        _sync(guest, _asker(server), key)
    store = CopyStore(guest, "alice")
    question = {"query": "WAL journal readers", "topK": 5}
    want = [r["source"] for r in search_copy(guest, "alice", question)["envelope"]["results"]]
    assert "/kb/sqlite.md" in want
    (store.dir / "corpus" / "corpus.sqlite3").write_bytes(b"not a database" * 400)
    for suffix in ("-wal", "-shm"):
        (store.dir / "corpus" / f"corpus.sqlite3{suffix}").unlink(missing_ok=True)
    from node.common.home import acquire_owner_lock, release_owner_lock

    syncing = acquire_owner_lock(store.sync_lock, "another process's sync")  # its index is that sync's
    try:
        assert reindex_copies(guest) == []
        assert (store.dir / "corpus" / "corpus.sqlite3").read_bytes().startswith(b"not a database")
    finally:
        release_owner_lock(syncing)
    assert reindex_copies(guest) == ["alice"]  # `kith index sync`: rebuilt, not a traceback
    assert [r["source"] for r in search_copy(guest, "alice", question)["envelope"]["results"]] == want
    import shutil

    lost = store.dir / "corpus"  # a link to the live build (`rm -rf` removes the link): lost, rebuilt
    lost.unlink() if lost.is_symlink() else shutil.rmtree(lost)
    assert [r["source"] for r in search_copy(guest, "alice", question)["envelope"]["results"]] == want
    (store.dir / "corpus" / "corpus.sqlite3").write_bytes(b"not a database" * 400)  # under a search held open
    for suffix in ("-wal", "-shm"):
        (store.dir / "corpus" / f"corpus.sqlite3{suffix}").unlink(missing_ok=True)
    try:
        first = [r["source"] for r in search_copy(guest, "alice", question)["envelope"]["results"]]
    except KithError as exc:  # refused with its code, never a traceback; the next one rebuilds
        assert exc.code == "index-unavailable" and "rebuilds it" in str(exc)
        first = None
    assert first in (None, want)
    assert [r["source"] for r in search_copy(guest, "alice", question)["envelope"]["results"]] == want


def test_policy_check_names_a_copy_grant_for_a_peer_that_is_not_pinned(host):
    home, _ = host
    assert invoke(home, "policy", "copy", "/kb/**", "--for", "nobody").exit_code == 0
    checked = json.loads(invoke(home, "policy", "check", "--json").stdout)
    assert {"where": "copy grant /kb/**", "name": "nobody"} in checked["notPinned"]
    assert "copy grant /kb/**: nobody" in invoke(home, "policy", "check").stdout


def test_policy_copy_warns_when_another_grant_decides_the_budget(host):
    home, _ = host  # the fixture's /kb/** grant for bea sets no --max-bytes
    r = invoke(home, "policy", "copy", "/kb/*.md", "--for", "bea", "--max-bytes", "100000")
    assert r.exit_code == 0, r.output
    assert "bea's copy may hold any number of bytes, not 100,000" in r.output
    assert "bea's copy may hold" not in invoke(home, "policy", "copy", "/kb/**", "--for", "bea",
                                               "--max-bytes", "200000").output
    r = invoke(home, "policy", "copy", "/kb/**", "--for", "bea", "--max-bytes", str(10**20))
    assert r.exit_code == 2 and "--max-bytes" in r.output


def test_a_damaged_manifest_is_refused_with_the_way_out(host, tmp_path):
    home, _ = host
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    with corpus:
        _sync(guest, _asker(server), key)
        anyio.run(lambda: sync_copy(guest, "carl", _asker(server), key))  # a second, healthy copy
    assert invoke(guest, "peers", "add", "alice", key).exit_code == 0
    CopyStore(guest, "alice").path.write_text("{not json")
    way_out = "`kith copies remove alice` deletes this copy; `kith copies sync alice` then makes it again"
    listed = invoke(guest, "copies", "list")  # the damaged one says what it is; the other is listed as usual
    assert listed.exit_code == 1
    assert f"alice: damaged — config-invalid: copies/alice/manifest.json cannot be read ({way_out})" in listed.stdout
    assert "carl: 2 document(s)" in listed.stdout
    # said on stderr as every refusal of kith is (it exited 1 with nothing there)
    said = "error [config-invalid]: copies/alice/manifest.json cannot be read\n  hint: " + way_out
    assert said in listed.stderr, listed.stderr
    as_json = invoke(guest, "copies", "list", "--json")
    assert as_json.exit_code == 1 and said in as_json.stderr, as_json.stderr
    rows = {r["peer"]: r for r in json.loads(as_json.stdout)["copies"]}
    assert rows["alice"]["error"] == {"code": "config-invalid", "message": "copies/alice/manifest.json cannot be read",
                                      "hint": way_out}
    assert rows["carl"]["documents"] == 2 and "error" not in rows["carl"]
    synced = invoke(guest, "copies", "sync", "alice", "--offline", "--json")
    assert synced.exit_code == 1
    assert json.loads(synced.stdout)["copies"][0] == {
        "peer": "alice", "status": "refused", "code": "config-invalid",
        "message": "copies/alice/manifest.json cannot be read", "hint": way_out}
    assert way_out in synced.stderr
    assert invoke(guest, "copies", "remove", "alice").exit_code == 0


def test_a_source_whose_id_holds_a_scrubbed_value_is_never_copied(host, tmp_path):
    home, kb = host  # e-mail is scrubbed for bea; a live answer shows this id as /kb/[email]
    (kb / "carol.private@example.com.md").write_text("# Carol\n\nMeeting notes for carol.\n")
    with Corpus(home) as c:
        c.sync()
    guest = node_home(tmp_path, "guest")
    server, corpus, key = _server(home)
    with corpus:
        assert all("example.com" not in d["source"] for d in server.manifest("bea")["documents"])
        _sync(guest, _asker(server), key)
    store = CopyStore(guest, "alice")
    assert "example.com" not in store.path.read_text()
    assert all("example.com" not in t for t in _files(store).values())
    explained = json.loads(invoke(home, "policy", "explain", "/kb/carol.private@example.com.md",
                                  "--peer", "bea", "--json").stdout)
    assert explained["allowed"] and explained.get("copy") is None


def test_a_refused_first_sync_does_not_claim_a_previous_copy(tmp_path):
    guest = node_home(tmp_path, "guest")
    assert invoke(guest, "peers", "add", "alice", "ab" * 32).exit_code == 0
    for name in ("alice", "../x"):
        r = invoke(guest, "copies", "sync", name, "--offline")
        assert r.exit_code == 1
        assert "no copy is kept here" in r.stderr and "previous copy" not in r.stderr, r.stderr


def test_policy_copy_for_a_group_that_does_not_exist_warns(host):
    home, _ = host
    r = invoke(home, "policy", "copy", "/kb/**", "--for", "@nobody")
    assert r.exit_code == 0 and "--for @nobody: no group has that name" in r.output


def test_policy_copy_warns_when_the_grant_copies_nothing(host):
    home, _ = host
    r = invoke(home, "policy", "copy", "/kbb/**", "--for", "bea")  # a typo
    assert r.exit_code == 0 and "/kbb/** matches no indexed source: nothing is copied" in r.output, r.output
    r = invoke(home, "policy", "copy", "/kb/notes/**", "--for", "bea")  # private: never copied
    assert "bea may keep none of the 1 source(s) /kb/notes/** matches" in r.output, r.output
    r = invoke(home, "policy", "copy", "/kb/*.md", "--for", "bea")
    assert "matches no indexed source" not in r.output and "may keep none" not in r.output


def test_status_shows_scrub_rules_copy_grants_copies_sent_held_and_the_outbox(host, tmp_path):
    """issue 42 item 6: neither `kith status` nor the dashboard showed scrub rules, copy
    grants or which peers hold copies; a guest's status said nothing of its copies or outbox."""
    from node.guest.outbox import OutboxStore
    from node.trust.audit_log import AuditLog

    home, _kb = host
    log = AuditLog(home)
    log.record("copy-sent", session_id="s1", peer="b" * 64, peer_name="bea", query_id="q1",
               sources=["/kb/sqlite.md", "/kb/deploy.md"], versions=["0" * 64] * 2, documents=2)
    log.record("copy-sent", session_id="s1", peer="b" * 64, peer_name="bea", query_id="q2",
               sources=["/kb/sqlite.md"], versions=["1" * 64], documents=1)
    log.close()
    owner = invoke(home, "status", "--json")
    assert owner.exit_code == 0, owner.output
    sharing = json.loads(owner.stdout)["sharing"]
    assert sharing["scrubs"] == [{"for": "bea", "kinds": ["email"], "glob": None}]
    assert [(c["glob"], c["for"], c["until"]) for c in sharing["copyGrants"]] == [("/kb/**", "bea", None)]
    assert [(r["peer_name"], r["documents"]) for r in sharing["copiesSent"]] == [("bea", 2)]
    text = invoke(home, "status").stdout
    assert "scrub rules: 1\n  email for bea" in text and "copy grants: 1\n  /kb/** for bea" in text
    assert "copies sent (peers that may hold them): 1\n  bea: 2 document(s)" in text

    guest = node_home(tmp_path, "guest")
    assert json.loads(invoke(guest, "status", "--json").stdout)["kept"] == {"copies": [], "outbox": None}
    assert not (guest / "outbox.sqlite").exists()  # a look makes no file
    server, corpus, key = _server(home)
    with corpus:
        _sync(guest, _asker(server), key)
    with OutboxStore(guest) as box:
        box.add({"query": "WAL", "topK": 5}, [("alice", key)])
    kept = json.loads(invoke(guest, "status", "--json").stdout)["kept"]
    assert [(c["peer"], c["documents"]) for c in kept["copies"]] == [("alice", 2)]
    assert (kept["outbox"]["questions"], kept["outbox"]["open"]) == (1, 1)
    text = invoke(guest, "status").stdout
    assert "copies kept here: 1\n  alice: 2 document(s)" in text
    assert "outbox: 1 question(s) kept, 1 delivery(ies) waiting" in text
