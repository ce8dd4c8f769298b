"""Scrub intent that follows the sources (issue 29 item 2; specs/policy.md §9.0, §9.5):
moving a source to another tier keeps it scrubbed, an approved ``ask`` answer is scrubbed,
and every command that would stop scrubbing indexed sources says which and asks first
(``--yes``), while ``kith policy check`` lists what was once scrubbed and no longer is.

Real corpus (SQLite + tantivy), real policy.toml, peers.json and approvals files, the real
answer path and the real CLI (typer's runner: stdin is not a terminal)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import initialized
from node.answer.service import peer_knowledge
from node.cli import main as cli_main
from node.corpus.store import Corpus
from node.policy.approvals import Approvals
from node.policy.gate import EgressGate
from node.policy.scrub_coverage import RECORD_FILE, ScrubRecord
from node.policy.store import Group, Policy

EMAIL = "walter.otterby@example.org"
PHONE = "+44 20 7946 0958"
CARD = "4111 1111 1111 1111"
ALICE, BOB, ANON = "a1" * 32, "b2" * 32, "c3" * 32


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    """A home with an identity and an index of /contacts (e-mail, phone, card) and /notes."""
    root = tmp_path / "contacts"
    root.mkdir()
    (root / "keeper.md").write_text(f"# Walrus keeper\n\nMail the walrus keeper at {EMAIL} or call {PHONE}; "
                                    f"the walrus card is {CARD}.\n")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "otter.md").write_text("# Otter\n\nThe otter sanctuary opens at nine.\n")
    home = initialized(tmp_path / "home")
    with Corpus(home) as c:
        c.add_root(root)
        c.add_root(notes)
        c.sync()
    return home


def _kith(home: Path, *args: str):
    cli_main._register()
    return CliRunner().invoke(cli_main.app, ["--home", str(home), *args])


def _ok(home: Path, *args: str):
    result = _kith(home, *args)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result


def _refused(home: Path, *args: str) -> None:
    """The command is refused with scrub-would-lapse and writes nothing."""
    files = {n: (home / n).read_bytes() if (home / n).exists() else None
             for n in ("policy.toml", "peers.json", RECORD_FILE)}
    result = _kith(home, *args)
    assert getattr(result.exception, "code", None) == "scrub-would-lapse", (args, result.output)
    assert "/contacts/keeper.md" in result.output
    for name, was in files.items():
        assert ((home / name).read_bytes() if (home / name).exists() else None) == was, name


def _answer(home: Path, name: str | None, key: str, approvals: Approvals | None = None):
    with Corpus(home, readonly=True) as corpus:
        gate = EgressGate(corpus.roots(), Policy.load(home), home, approvals=approvals)
        return peer_knowledge(corpus, gate, name, peer_key=key).search({"query": "walrus keeper", "topK": 5})


def test_moving_a_scrubbed_source_from_public_to_ask_keeps_it_scrubbed_in_the_approved_answer(home, tmp_path):
    # the steps: scrub for the public tier, then move /contacts to ask
    _ok(home, "policy", "set", "/contacts/**", "public")
    _ok(home, "policy", "scrub", "--for", "public", "email,phone,card,iban")
    moved = _ok(home, "policy", "set", "/contacts/**", "ask")
    assert "stops scrubbing" not in moved.output  # nothing lapses: nothing to confirm
    approvals = Approvals(tmp_path / "state")
    pending = _answer(home, None, ANON, approvals)
    assert pending["status"] == "pending-approval"
    approvals.decide(pending["approval_id"], True)
    answer = _answer(home, None, ANON, approvals)
    assert answer["status"] == "ok"
    wire = json.dumps(answer["envelope"], ensure_ascii=False)
    assert "/contacts/keeper.md" in wire
    for value in (EMAIL, PHONE, CARD, "4111", "7946"):
        assert value not in wire
    assert answer["scrubbed"] == {"email": 1, "phone": 1, "card": 1}


def test_removing_a_scrub_entry_names_the_sources_and_needs_yes(home):
    _ok(home, "policy", "set", "/contacts/**", "public")
    _ok(home, "policy", "scrub", "--for", "*", "email,card")
    _refused(home, "policy", "scrub", "--for", "*", "--off")
    _refused(home, "policy", "scrub", "--for", "*", "email")  # fewer kinds lapse too
    _ok(home, "policy", "scrub", "--for", "*", "email,card,phone")  # more kinds: nothing to ask
    done = _ok(home, "policy", "scrub", "--for", "*", "--off", "--yes", "--json")
    assert json.loads(done.stdout)["unscrubbed"] == [
        {"for": None, "kinds": ["email", "phone", "card"], "count": 1, "sources": ["/contacts/keeper.md"]}]
    assert Policy.load(home).scrub_rules == ()
    assert EMAIL in json.dumps(_answer(home, None, ANON)["envelope"])
    # policy check lists what a scrub entry once covered and is now served unscrubbed
    check = json.loads(_ok(home, "policy", "check", "--json").stdout)
    assert check["unscrubbed"] == [
        {"for": None, "kinds": ["email", "phone", "card"], "count": 1, "sources": ["/contacts/keeper.md"]}]
    assert "served unscrubbed" in _ok(home, "policy", "check").output
    # scrubbing it again clears the list
    _ok(home, "policy", "scrub", "--for", "*", "--glob", "/contacts", "email,card,phone")
    assert json.loads(_ok(home, "policy", "check", "--json").stdout)["unscrubbed"] == []


def test_a_rule_that_opens_a_source_once_scrubbed_for_that_peer_asks_first(home):
    _ok(home, "peers", "add", "alice", ALICE)
    _ok(home, "policy", "scrub", "--for", "alice", "--glob", "/contacts/**", "email")
    # alice sees nothing of /contacts (private): removing the entry serves nothing unscrubbed
    _ok(home, "policy", "scrub", "--for", "alice", "--glob", "/contacts/**", "--off")
    _refused(home, "policy", "set", "/contacts/**", "public")
    _refused(home, "policy", "set", "/contacts/**", "ask")
    _refused(home, "policy", "set", "/contacts/**", "public", "--for", "alice")
    _ok(home, "policy", "set", "/notes/**", "public")  # a rule that opens nothing once scrubbed
    done = json.loads(_ok(home, "policy", "set", "/contacts/**", "peers", "--peer", "alice", "--yes",
                          "--json").stdout)
    assert done["unscrubbed"] == [{"for": "alice", "kinds": ["email"], "count": 1,
                                   "sources": ["/contacts/keeper.md"]}]
    # unset of a rule that hid it from alice asks the same way
    _ok(home, "policy", "set", "/contacts/keeper.md", "private")
    _refused(home, "policy", "unset", "/contacts/keeper.md")


def test_a_group_member_removed_from_a_scrubbed_group_asks_first(home):
    _ok(home, "peers", "add", "bob", BOB)
    _ok(home, "peers", "group", "add", "team", "bob")
    _ok(home, "policy", "set", "/contacts/**", "public")
    _ok(home, "policy", "scrub", "--for", "@team", "card")
    answer = _answer(home, "bob", BOB)
    assert CARD not in json.dumps(answer["envelope"]) and answer["scrubbed"] == {"card": 1}
    assert CARD in json.dumps(_answer(home, None, ANON)["envelope"])  # scrubbed for the group only
    _refused(home, "peers", "group", "remove", "team", "bob")
    _refused(home, "peers", "group", "remove", "team")
    _ok(home, "peers", "group", "add", "team", "bob", "--until", "7d")  # a new end: it still scrubs
    _ok(home, "peers", "group", "remove", "team", "bob", "--yes")
    assert CARD in json.dumps(_answer(home, "bob", BOB)["envelope"])
    check = json.loads(_ok(home, "policy", "check", "--json").stdout)
    assert {"for": "bob", "kinds": ["card"], "count": 1, "sources": ["/contacts/keeper.md"]} in check["unscrubbed"]


def test_removing_a_pinned_peer_scrubbed_by_name_asks_first(home):
    _ok(home, "peers", "add", "alice", ALICE)
    _ok(home, "policy", "set", "/contacts/**", "public")
    _ok(home, "policy", "scrub", "--for", "alice", "card")
    _refused(home, "peers", "remove", "alice")
    assert _ok(home, "peers", "list", "--json").stdout.count("alice") >= 1
    _ok(home, "policy", "scrub", "--for", "*", "card")  # scrubbed for every peer: removing loses nothing
    _ok(home, "peers", "remove", "alice")


def test_an_ended_membership_ends_what_the_group_grants_but_not_what_it_scrubs():
    policy = Policy(groups={"team": Group("team", {"bob": "2020-01-01T00:00:00Z"})})
    policy.set("/docs/**", "public")
    policy.set("/docs/team/**", "public", for_peer="@team")
    policy.set_scrub("@team", ["card"])
    assert policy.groups_of("bob") == set()  # the membership ended
    assert policy.scrub_kinds("/docs/a.md", "bob") == {"card"}
    assert policy.scrubs_for("bob") and not policy.scrubs_for("carol") and not policy.scrubs_for(None)


def test_the_record_keeps_group_entries_as_names_and_survives_a_bad_file(tmp_path):
    policy = Policy(groups={"team": Group("team", {"bob": None, "eve": None})})
    policy.set_scrub("@team", ["card"], glob="/docs/**")
    policy.set_scrub("*", ["email"])
    record = ScrubRecord()
    assert record.add(policy) and not record.add(policy)
    record.save(tmp_path)
    again = ScrubRecord.load(tmp_path)
    assert set(again.rows) == {("/docs/**", "bob"), ("/docs/**", "eve"), (None, "*")}
    assert (tmp_path / RECORD_FILE).stat().st_mode & 0o777 == 0o600
    (tmp_path / RECORD_FILE).write_text("{not json")
    assert ScrubRecord.load(tmp_path).rows == {}
