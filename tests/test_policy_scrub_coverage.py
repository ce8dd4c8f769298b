"""node/policy/scrub_coverage.py and the scrub model it guards — scrub intent that follows
the sources (issue 29 item 2; specs/policy.md §9.0, §9.5):
moving a source to another tier keeps it scrubbed, an approved ``ask`` answer is scrubbed,
and every command that would stop scrubbing indexed sources says which and asks first
(``--yes``), while ``kith policy check`` lists what was once scrubbed and no longer is.

Real corpus (SQLite + tantivy), real policy.toml, peers.json and approvals files, the real
answer path and the real CLI (typer's runner: stdin is not a terminal; a pty for the
question). The [[scrub]] table itself and the detectors are tested in test_policy_scrub.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.answer.service import peer_knowledge
from node.corpus.store import Corpus
from node.policy.approvals import Approvals
from node.policy.gate import EgressGate
from node.policy.scrub_coverage import RECORD_FILE, ScrubRecord
from node.policy.store import Group, Policy
from support.cli import invoke
from support.homes import initialized

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
    return invoke(home, *args)


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
    ending = _ok(home, "peers", "until", "alice", "7d")  # kept, but the owner is told what its end does
    assert "when the pin ends" in ending.stderr and "/contacts/keeper.md" in ending.stderr
    _ok(home, "policy", "scrub", "--for", "*", "card")  # scrubbed for every peer: removing loses nothing
    assert "when the pin ends" not in _ok(home, "peers", "until", "alice", "8d").stderr
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


# --- the property: no scrubbed value reaches a peer the owner scrubbed it for ----------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from node.policy.scrub_coverage import newly_unscrubbed, recipients  # noqa: E402

#: per source: the values of each kind it holds (each value in that source only)
VALUES = {
    "/d/a/x.md": {"email": "anna.keeper@example.org", "card": "4111 1111 1111 1111", "iban": "DE89 3704 0044 0532 0130 00"},
    "/d/b/x.md": {"email": "bert.keeper@example.org", "card": "5555 5555 5555 4444", "iban": "GB82 WEST 1234 5698 7654 32"},
    "/d/c/x.md": {"email": "cora.keeper@example.org", "card": "4012 8888 8888 1881",
                  "iban": "FR14 2004 1010 0505 0001 3M02 606"},
    "/d/c/deep/y.md": {"email": "dirk.keeper@example.org", "card": "6011 1111 1111 1117"},
}
FOLDERS = ["/d/a", "/d/b", "/d/c", "/d/c/deep"]
NAMES = ["alice", "bob", "carol"]
GROUPS = ["g1", "g2"]
PEERS = {None: ANON, "alice": ALICE, "bob": BOB, "carol": "d4" * 32}
KIND_SETS = st.sets(st.sampled_from(["email", "card", "iban"]), min_size=1).map(sorted)
PRINCIPALS = st.sampled_from(NAMES + ["@" + g for g in GROUPS])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The indexed /d corpus and an approvals store that promoted every source for every
    peer key (so each ask source is answered as an approved one)."""
    base = tmp_path_factory.mktemp("intent")
    root = base / "d"
    for source, values in VALUES.items():
        path = root / source.removeprefix("/d/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Walrus {path.stem}\n\nThe walrus record: mail {values['email']}, "
                        + ", ".join(f"{k} {v}" for k, v in values.items() if k != "email") + ".\n")
    home = base / "home"
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
    approvals = Approvals(base / "state")
    for name, key in PEERS.items():
        record = approvals.request(key, name, "walrus", sorted(VALUES))
        approvals.decide(record.id, True, remember=True)
    corpus = Corpus(home, readonly=True)
    yield home, corpus, approvals
    corpus.close()


_tier = st.sampled_from(["public", "peers", "ask", "private", "never"])
_rule = st.tuples(st.just("rule"), st.sampled_from(FOLDERS), _tier, st.sets(PRINCIPALS, min_size=1).map(sorted))
_override = st.tuples(st.just("override"), st.sampled_from(FOLDERS), PRINCIPALS,
                      st.sampled_from(["public", "ask", "private", "never"]))
_scrub = st.tuples(st.just("scrub"), st.one_of(st.none(), st.sampled_from(FOLDERS)),
                   st.sampled_from(["*"] + NAMES + ["@" + g for g in GROUPS]), KIND_SETS)
_join = st.tuples(st.sampled_from(["join", "leave"]), st.sampled_from(GROUPS), st.sampled_from(NAMES))
_unset = st.tuples(st.just("unset"), st.sampled_from(FOLDERS))
_unset_override = st.tuples(st.just("unset-override"), st.sampled_from(FOLDERS), PRINCIPALS)
_scrub_off = st.tuples(st.just("scrub-off"), st.one_of(st.none(), st.sampled_from(FOLDERS)),
                       st.sampled_from(["*"] + NAMES + ["@" + g for g in GROUPS]))
SETUP = st.lists(st.one_of(_rule, _override, _scrub, _join), min_size=1, max_size=10)
CHANGES = st.lists(st.one_of(_rule, _unset, _override, _unset_override, _join, _scrub, _scrub_off),
                   min_size=1, max_size=5)


def _apply(policy: Policy, op: tuple) -> None:
    kind = op[0]
    if kind == "rule":
        _, glob, tier, peers = op
        policy.set(glob, tier, peers if tier == "peers" else None)
    elif kind == "override":
        policy.set(op[1], op[3], for_peer=op[2])
    elif kind == "unset":
        policy.unset(op[1])
    elif kind == "unset-override":
        policy.unset(op[1], for_peer=op[2])
    elif kind == "scrub":
        _, glob, who, kinds = op
        have = next((s.kinds for s in policy.scrub_rules if (s.glob, s.recipient) == (glob, who)), ())
        policy.set_scrub(who, sorted({*have, *kinds}), glob=glob)
    elif kind == "scrub-off":
        policy.set_scrub(op[2], [], glob=op[1])
    elif kind == "join":
        policy.add_members(op[1], [op[2]])
    elif kind == "leave" and op[1] in policy.groups and op[2] in policy.groups[op[1]].members:
        policy.remove_members(op[1], [op[2]])


def _intended(policy: Policy) -> set[tuple[str | None, str, str]]:
    """(peer, source, kind) the owner's scrub entries cover — computed here from the
    entries and the groups' member lists, not with Policy.scrub_kinds."""
    out = set()
    for s in policy.scrub_rules:
        for peer in PEERS:
            if s.recipient == "*" or s.recipient == peer or (
                    s.recipient.startswith("@") and peer is not None
                    and peer in getattr(policy.groups.get(s.recipient[1:]), "members", {})):
                for source in VALUES:
                    if s.glob is None or source == s.glob or source.startswith(s.glob + "/"):
                        out.update((peer, source, k) for k in s.kinds)
    return out


def _leaks(world, policy: Policy, ever: set) -> list[tuple[str | None, str, str]]:
    """(peer, source, kind) whose value reached that peer though ``ever`` scrubbed it for it."""
    home, corpus, approvals = world
    gate = EgressGate(corpus.roots(), policy, home, approvals=approvals)
    out = []
    for peer, key in PEERS.items():
        answer = peer_knowledge(corpus, gate, peer, peer_key=key).search({"query": "walrus record", "topK": 10})
        wire = json.dumps({k: v for k, v in answer.items() if k != "scrubbed"}, ensure_ascii=False)
        out += [(peer, s, k) for (p, s, k) in ever if p == peer and VALUES[s].get(k, "\0") in wire]
    return out


def _run(world, setup: list, changes: list, *, guard: bool = True) -> list:
    """Apply ``setup``, then each of ``changes`` as an owner who declines every change the
    guard (``newly_unscrubbed``) reports (``guard=False``: who accepts them all); after
    each state, what leaked."""
    policy = Policy()
    for op in setup:
        _apply(policy, op)
    record = ScrubRecord()
    record.add(policy)
    ever = _intended(policy)
    leaks = _leaks(world, policy, ever)
    for op in changes:
        after = Policy.from_toml(policy.to_toml())
        _apply(after, op)
        who = recipients(after, record, NAMES)
        if guard and newly_unscrubbed(policy, after, record, sorted(VALUES), who):
            continue  # the owner said no: nothing changed
        record.add(policy)
        record.add(after)
        policy = after
        ever |= _intended(policy)
        leaks += _leaks(world, policy, ever)
    return leaks


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(setup=SETUP, changes=CHANGES)
def test_no_scrubbed_value_reaches_a_peer_it_was_scrubbed_for_whatever_changes(world, setup, changes):
    assert _run(world, setup, changes) == []


def test_the_property_sees_a_leak_when_a_confirmed_change_stops_scrubbing(world):
    setup = [("rule", "/d/a", "public", []), ("join", "g1", "bob"), ("scrub", None, "@g1", ["card"])]
    change = [("leave", "g1", "bob")]
    assert _run(world, setup, change) == []
    assert _run(world, setup, change, guard=False) == [("bob", "/d/a/x.md", "card")]
    # and a tier move never needs the guard: the entry follows the source
    moved = [("rule", "/d/a", "ask", []), ("rule", "/d/a", "peers", ["bob"]), ("override", "/d/a", "bob", "public")]
    assert _run(world, setup, moved, guard=False) == []


def test_a_running_host_records_what_a_hand_edit_later_removes_and_policy_check_lists_it(home):
    from node.host.sessions import SessionTable
    from node.host.revocation import PeersWatcher

    (home / "policy.toml").write_text('[[rule]]\nglob = "/contacts/**"\ntier = "public"\n'
                                      '[[scrub]]\nfor = "*"\nkinds = ["email"]\n')
    watcher = PeersWatcher(home, SessionTable(), on_event=lambda ev: None)  # a host starting
    assert ScrubRecord.load(home).rows == {(None, "*"): ScrubRecord.load(home).rows[(None, "*")]}
    (home / "policy.toml").write_text('[[rule]]\nglob = "/contacts/**"\ntier = "public"\n'
                                      '[[scrub]]\nglob = "/notes"\nfor = "bob"\nkinds = ["card"]\n')
    watcher.poll()  # the host reloads the edited file
    assert set(ScrubRecord.load(home).rows) == {(None, "*"), ("/notes", "bob")}
    (home / "policy.toml").write_text('[[rule]]\nglob = "/contacts/**"\ntier = "public"\n')
    check = json.loads(_ok(home, "policy", "check", "--json").stdout)
    # per recipient: the anonymous peer, and bob (a name the record knows), both see it
    assert check["unscrubbed"] == [{"for": None, "kinds": ["email"], "count": 1, "sources": ["/contacts/keeper.md"]},
                                   {"for": "bob", "kinds": ["email"], "count": 1, "sources": ["/contacts/keeper.md"]}]


@pytest.mark.parametrize("reply,done", [("y\n", True), ("n\n", False), ("\n", False)])
def test_on_a_terminal_the_change_is_asked_about_and_made_only_on_yes(home, reply, done):
    import os
    import subprocess
    import sys

    _ok(home, "policy", "set", "/contacts/**", "public")
    _ok(home, "policy", "scrub", "--for", "*", "card")
    before = (home / "policy.toml").read_bytes()
    master, slave = os.openpty()  # a real terminal on stdin: the command asks
    try:
        os.write(master, reply.encode())
        proc = subprocess.run([sys.executable, "-m", "node", "--home", str(home), "policy", "scrub", "--for", "*",
                               "--off"], stdin=slave, capture_output=True, text=True, timeout=120)
    finally:
        os.close(slave)
        os.close(master)
    assert "/contacts/keeper.md" in proc.stderr and "stop scrubbing them? [y/N]" in proc.stderr
    if done:
        assert proc.returncode == 0 and Policy.load(home).scrub_rules == ()
    else:
        assert proc.returncode == 1 and "scrub-would-lapse" in proc.stderr
        assert (home / "policy.toml").read_bytes() == before


def test_a_scrub_glob_that_matches_no_indexed_source_is_warned_about_and_listed_by_check(home, tmp_path):
    """A real path (``/tmp/…/contacts/**``) or a typo as --glob scrubs nothing: the owner is
    told at once and by ``policy check`` (as for a rule), with the folder meant."""
    _ok(home, "policy", "set", "/contacts/**", "public")
    real = str(tmp_path / "contacts") + "/**"
    result = _ok(home, "policy", "scrub", "--for", "*", "--glob", real, "email")
    assert f"warning: {real} matches no indexed source" in result.output
    assert "/contacts/**" in result.output.split("warning:")[1]  # did you mean …
    result = _ok(home, "policy", "scrub", "--for", "*", "--glob", "/contacts/**", "card")
    assert "matches no indexed source" not in result.output
    check = json.loads(_ok(home, "policy", "check", "--json").stdout)
    assert check["unmatchedScrub"] == [{"glob": real, "for": "*", "kinds": ["email"], "suggestions": ["/contacts/**"]}]
    text = _ok(home, "policy", "check").output
    assert "scrub entries that match no indexed source (they scrub nothing):" in text and real in text


def test_hand_edited_rows_of_the_record_that_name_no_kind_or_recipient_are_left_out(home):
    """A row whose kinds are not scrub kinds, or whose ``for`` is a group, empty or no
    registry name, is dropped on read (the record stores names, never groups): ``policy
    check`` lists no ``an anonymous peer:  no longer scrubbed`` line for it."""
    _ok(home, "policy", "set", "/contacts/**", "public")
    rows = [{"glob": None, "for": "*", "kinds": ["foo"], "first": "", "last": ""},
            {"glob": None, "for": "*", "kinds": ["EMAIL", "card"], "first": "", "last": ""},
            {"glob": "/contacts/**", "for": "@team", "kinds": ["email"], "first": "", "last": ""},
            {"glob": None, "for": "bad name!", "kinds": ["card"], "first": "", "last": ""},
            {"glob": None, "for": "", "kinds": ["phone"], "first": 1, "last": None}]
    (home / RECORD_FILE).write_text(json.dumps({"version": 1, "rows": rows}))
    record = ScrubRecord.load(home)
    assert {k: v["kinds"] for k, v in record.rows.items()} == {(None, "*"): ["card"]}
    check = json.loads(_ok(home, "policy", "check", "--json").stdout)
    assert check["unscrubbed"] == [{"for": None, "kinds": ["card"], "count": 1, "sources": ["/contacts/keeper.md"]}]


def test_two_writers_of_the_record_keep_both_their_rows(tmp_path):
    """A command that read the record before a running host added a reloaded policy's rows
    (or another command) must not write them away when it saves its own."""
    first = Policy()
    first.set_scrub("bob", ["card"], glob="/docs/**")
    second = Policy()
    second.set_scrub("*", ["email"])
    stale = ScrubRecord.load(tmp_path)  # e.g. `kith policy scrub` scanning the corpus ...
    host = ScrubRecord.load(tmp_path)   # ... while the host reloads a hand edit
    host.add(first)
    host.save(tmp_path)
    stale.add(second)
    stale.save(tmp_path)
    kept = ScrubRecord.load(tmp_path)
    assert {k: v["kinds"] for k, v in kept.rows.items()} == {("/docs/**", "bob"): ["card"], (None, "*"): ["email"]}


def test_a_change_measured_on_a_policy_that_changed_meanwhile_is_refused(home):
    """Two commands at once: the second one's guard measured the file as it was, so writing
    its copy would drop what the first one wrote (here a scrub entry, silently): refused
    with policy-changed, nothing written."""
    from node.common.errors import PolicyError
    from node.policy.scrub_coverage import change_unscrubs, commit_change

    _ok(home, "policy", "set", "/contacts/**", "public")
    before, after = Policy.load(home), Policy.load(home)
    after.set("/notes/**", "public")
    lapsed, record = change_unscrubs(home, before, after)
    assert lapsed == []
    _ok(home, "policy", "scrub", "--for", "*", "card")  # another command, meanwhile
    written = (home / "policy.toml").read_bytes()
    with pytest.raises(PolicyError) as err:
        commit_change(home, record, before, after, after.save)
    assert err.value.code == "policy-changed"
    assert (home / "policy.toml").read_bytes() == written
    assert Policy.load(home).scrub_kinds("/contacts/keeper.md", None) == {"card"}


def test_policy_check_lists_what_a_pin_that_ended_serves_unscrubbed(home):
    """A pin whose --until passed makes its key an anonymous peer (specs/policy.md §9.0):
    what was scrubbed for that name only now reaches the key unscrubbed, and ``policy
    check`` says so (it said "nothing … is served unscrubbed")."""
    from node.trust.peers import PeerRegistry

    _ok(home, "policy", "set", "/contacts/**", "public")
    _ok(home, "peers", "add", "carol", ALICE, "--until", "1h")
    _ok(home, "policy", "scrub", "--for", "carol", "card")
    assert json.loads(_ok(home, "policy", "check", "--json").stdout)["unscrubbed"] == []
    doc = json.loads((home / "peers.json").read_text())
    doc["peers"]["carol"]["until"] = "2020-01-01T00:00:00Z"  # the pin ended (a clock that moved on)
    (home / "peers.json").write_text(json.dumps(doc))
    assert PeerRegistry.load(home).by_name("carol") is not None
    check = json.loads(_ok(home, "policy", "check", "--json").stdout)
    assert check["unscrubbed"] == [{"for": "carol", "kinds": ["card"], "count": 1, "sources": ["/contacts/keeper.md"]}]
    assert "carol (pin ended, now an anonymous peer): card no longer scrubbed" in _ok(home, "policy", "check").output
