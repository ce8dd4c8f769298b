"""Duplicates collapse (issue 20 item 6): the same documents copied into three folders are
one result each, saying "also in N other sources", for the owner (a real ``kith search``)
and for a peer (a real host on the memory pipe) — for the peer inside its view only."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import jsonschema

from support.cli import kith as _kith
from support.homes import initialized
from support.memory import MemoryHost, connect_guest as _connect
from node.corpus.store import Corpus

VALIDATOR = jsonschema.Draft202012Validator(json.loads(
    (Path(__file__).resolve().parents[1] / "specs" / "search-envelope.schema.json").read_text()))
TEMPFILE = ("# Temporary files\n\nThe tempfile module creates a temporary directory that is "
            "deleted automatically when the context manager exits.\n\n"
            "## Names\n\nA named temporary file has a visible name in the file system.\n")
OTHER = ("# Archives\n\nThe zipfile module reads archives; a temporary copy of a member "
         "is extracted to a directory of its own.\n")


def _copies(tmp: Path, folders: tuple[str, ...]) -> list[Path]:
    """The same two notes in each folder of ``folders`` under ``tmp/kb``, plus one note
    of its own in the first; returns the folders."""
    out = []
    for name in folders:
        d = tmp / "kb" / name
        d.mkdir(parents=True)
        (d / "tempfile.md").write_text(TEMPFILE, encoding="utf-8")
        (d / "zipfile.md").write_text(OTHER, encoding="utf-8")
        out.append(d)
    (out[0] / "own.md").write_text("# Own\n\nA note about a temporary directory, only here.\n",
                                   encoding="utf-8")
    return out


def _no_repeats(results: list[dict]) -> None:
    previews = [r["textPreview"] for r in results]
    assert len(previews) == len(set(previews)), previews


def test_kith_search_collapses_copies_into_one_result_naming_the_others(tmp_path: Path) -> None:
    home = initialized(tmp_path / "home")
    _copies(tmp_path, ("a", "b", "c"))
    assert _kith(home, "index", "add", str(tmp_path / "kb")).returncode == 0
    assert _kith(home, "index", "sync").returncode == 0
    for dedupe in ("chunk", "document"):
        out = _kith(home, "search", "temporary directory deleted automatically", "--json",
                    "--dedupe", dedupe)
        assert out.returncode == 0, out.stderr
        envelope = json.loads(out.stdout)
        assert sorted(VALIDATOR.iter_errors(envelope), key=str) == []  # alsoIn is in the schema
        results = envelope["results"]
        _no_repeats(results)
        top = results[0]
        copies = {f"/kb/{d}/tempfile.md" for d in "abc"}
        # one of the three copies (equal text, equal score: the chunk id decides which)
        assert top["source"] in copies
        assert {a["source"] for a in top["alsoIn"]} == copies - {top["source"]}
        assert len(top["alsoIn"]) == 2
        assert all(a["id"] and a["id"] != top["id"] for a in top["alsoIn"])
        sources = [r["source"] for r in results]
        # the other documents still get their places (the copies do not take them)
        assert "/kb/a/own.md" in sources, sources
        for r in results:  # every copied chunk is one result naming the two other copies
            if not r["source"].endswith("/own.md"):
                name = r["source"].rsplit("/", 1)[1]
                assert {a["source"] for a in r["alsoIn"]} == {
                    f"/kb/{d}/{name}" for d in "abc"} - {r["source"]}, r
        assert len([s for s in sources if s.endswith("/zipfile.md")]) == 1, sources
        if dedupe == "document":
            assert len(sources) == len(set(sources)) == 3, sources
    human = _kith(home, "search", "temporary directory deleted automatically")
    assert human.returncode == 0, human.stderr
    assert "also in 2 other sources: /kb/" in human.stdout, human.stdout


def test_a_peer_sees_copies_collapsed_within_its_view_only(tmp_path: Path) -> None:
    """/kb/a and /kb/b are public, /kb/c is private: the anonymous peer's result names the
    one other public copy, never the private one, and takes no more places than it."""
    home = initialized(tmp_path / "host")
    _copies(tmp_path, ("a", "b", "c"))
    with Corpus(home) as corpus:
        corpus.add_root(tmp_path / "kb")
        corpus.sync()
    (home / "policy.toml").write_text("[[rule]]\nglob = '/kb/a/**'\ntier = 'public'\n"
                                      "[[rule]]\nglob = '/kb/b/**'\ntier = 'public'\n")

    async def scenario():
        host = MemoryHost(home)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            await host.ready.wait()
            guest = await _connect(tg, host)
            guest.ask("temporary directory deleted automatically")
            await guest.answered(1)
            guest.ask(None)
            host.stop.set()
        return guest

    guest = anyio.run(scenario, backend="asyncio")
    answer = guest.results[0]
    assert answer["status"] == "ok", answer
    results = answer["envelope"]["results"]
    _no_repeats(results)
    assert results[0]["source"] in {"/kb/a/tempfile.md", "/kb/b/tempfile.md"}
    for r in results:  # each copied chunk names the one other copy the peer may see
        if not r["source"].endswith("/own.md"):
            name = r["source"].rsplit("/", 1)[1]
            assert {a["source"] for a in r["alsoIn"]} == {
                f"/kb/{d}/{name}" for d in "ab"} - {r["source"]}, r
    assert "/kb/c/" not in json.dumps(answer)


def test_a_copy_waiting_for_approval_does_not_hide_the_visible_one(tmp_path: Path) -> None:
    """The best-ranked copy is in an ``ask`` source nobody decided yet: the peer is shown
    the visible copy in its place, with nothing listed it may not see."""
    from node.answer.service import peer_knowledge
    from node.policy.gate import EgressGate
    from node.policy.store import Policy

    home = initialized(tmp_path / "host")
    _copies(tmp_path, ("a", "b", "c"))
    with Corpus(home) as corpus:
        corpus.add_root(tmp_path / "kb")
        corpus.sync()
    policy = Policy()
    policy.set("/kb/a/**", "ask")
    policy.set("/kb/c/**", "public")
    with Corpus(home, readonly=True) as corpus:
        gate = EgressGate(corpus.roots(), policy, home)
        answer = peer_knowledge(corpus, gate, None).search(
            {"query": "temporary directory deleted automatically", "topK": 5})
    results = answer["envelope"]["results"]
    _no_repeats(results)
    top = results[0]
    assert top["source"] == "/kb/c/tempfile.md" and top["alsoIn"] == [], top
    assert not any(r["source"].startswith("/kb/a/") for r in results), results


def test_kith_ask_keeps_each_peers_copies_and_prints_them() -> None:
    """``kith ask`` merges peers' answers: each attribution keeps the copies that peer
    collapsed (malformed entries from an untrusted peer left out), and the human output
    says "also in N other sources"."""
    import io

    from rich.console import Console

    from node.cli import ask_cmd
    from node.guest.fanout import PeerRow, fuse

    def result(source: str, also: object) -> dict:
        return {"source": source, "id": "c1", "textPreview": "Same words here.", "alsoIn": also}

    alice, bob = PeerRow("alice", "a" * 64, status="ok"), PeerRow("bob", "b" * 64, status="ok")
    merged = fuse([(alice, [result("/x/one.md", [{"id": "c2", "source": "/x/two.md"},
                                                  {"id": "c3"}, "junk"])], True),
                   (bob, [result("/y/one.md", None)], True)], 5)
    assert len(merged) == 1
    assert [a["alsoIn"] for a in merged[0]["attributions"]] == [["/x/two.md"], []]
    out = io.StringIO()
    env = {"results": merged, "answered": 2, "peers": [alice.to_dict(), bob.to_dict()],
           "missing": [], "notice": "untrusted"}
    old = ask_cmd.console
    ask_cmd.console = Console(file=out, width=200)
    try:
        ask_cmd.render(env)
    finally:
        ask_cmd.console = old
    assert "also in 1 other source: /x/two.md" in out.getvalue(), out.getvalue()
