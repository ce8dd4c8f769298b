"""Approvals, promotion, quotas and the peer-scoped knowledge handle (DESIGN §10, issue 5).

Real corpus (SQLite + tantivy) in tmp_path, real files under approvals/, no mocks.
"""

from __future__ import annotations

import json
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec
import pytest

from node.answer.envelope import empty_envelope
from node.answer.contract import validate as validate_search_request
from node.corpus.store import Corpus
from node.common.errors import PolicyError
from node.policy.approvals import DECISION_TTL_S, MAX_PENDING_PER_PEER, Approvals, query_key
from node.policy.gate import PENDING, VISIBLE, EgressGate
from node.answer.service import peer_knowledge
from node.policy.quota import RateLimiter
from node.policy.store import Policy, Quota

from support.homes import indexed_docs

ALICE, BOB, ANON = "a1" * 32, "b2" * 32, "c3" * 32

FILES = {
    "public/tempfiles.md": "# Temporary files\n\nUse tempfile.TemporaryDirectory as a context manager; "
                           "the directory is deleted automatically.\n",
    "ask/salary.md": "# Salary review\n\nThe salary bands for next year. Bonus pool details.\n",
    "team/roadmap.md": "# Roadmap\n\nThe quarterly roadmap milestones for the platform team.\n",
    "secret/keys.md": "# Launch codes\n\nThe zebra launch codes are kept here.\n",
    "public/wal.md": "# WAL\n\nThe write ahead log lets readers continue while a writer appends.\n",
}
FILES.update({f"public/long/n{i:02d}.md": f"# Platform note {i}\n\n" + " ".join(
    f"The platform release train number {i} ships widget {j} with telemetry." for j in range(25)) + "\n"
    for i in range(16)})


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return indexed_docs(tmp_path_factory.mktemp("kq"), FILES)


def _policy() -> Policy:
    policy = Policy()
    policy.set("/docs/public/**", "public")
    policy.set("/docs/ask/**", "ask")
    policy.set("/docs/team/**", "peers", ["alice"])
    policy.set("/docs/secret/**", "never")
    return policy


@pytest.fixture
def world(indexed, tmp_path: Path):
    """A fresh approvals folder (per test) over the shared index."""
    home, docs = indexed
    corpus = Corpus(home, readonly=True)
    state = tmp_path / "state"
    approvals = Approvals(state)
    gate = EgressGate(corpus.roots(), _policy(), home, approvals=approvals)
    yield corpus, gate, approvals, state
    corpus.close()


def _ask(corpus, gate, name, key, query, limiter=None, top_k=5):
    handle = peer_knowledge(corpus, gate, name, peer_key=key, limiter=limiter)
    return handle.search({"query": query, "topK": top_k})


def _sources(answer) -> list[str]:
    return [r["source"] for r in answer["envelope"]["results"]]


# --- the approval flow -------------------------------------------------------------------------


def test_ask_source_answers_pending_and_writes_a_request_without_text(world) -> None:
    corpus, gate, approvals, state = world
    answer = _ask(corpus, gate, None, ANON, "salary bands bonus pool")
    assert answer["status"] == "pending-approval"
    req = validate_search_request({"query": "salary bands bonus pool", "topK": 5})
    assert answer["envelope"] == empty_envelope("pending-approval", req)  # no source named
    files = list((state / "approvals" / "requests").glob("*.json"))
    assert [f.stem for f in files] == [answer["approval_id"]]
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    doc = json.loads(files[0].read_text())
    assert doc["peer"] == {"key": ANON, "name": None}
    assert doc["query"] == "salary bands bonus pool"
    assert doc["sources"] == ["/docs/ask/salary.md"]
    assert set(doc) == {"id", "peer", "query", "sources", "createdAt"}
    text = files[0].read_text()
    assert "Bonus pool details" not in text and str(corpus.roots()[0].path) not in text
    # asking again does not pile up requests
    again = _ask(corpus, gate, None, ANON, "  Salary   bands bonus POOL ")
    assert again["approval_id"] == answer["approval_id"]
    assert len(list((state / "approvals" / "requests").glob("*.json"))) == 1


def test_approve_then_the_same_query_gets_the_evidence_in_a_new_handle(world, indexed) -> None:
    corpus, gate, approvals, state = world
    rid = _ask(corpus, gate, "alice", ALICE, "salary bands bonus pool")["approval_id"]
    approvals.decide(rid, True)
    assert stat.S_IMODE((state / "approvals" / "decisions" / f"{rid}.json").stat().st_mode) == 0o600
    # a new gate + store over the same home = a restarted host / a new session
    home, _ = indexed
    gate2 = EgressGate(corpus.roots(), _policy(), home, approvals=Approvals(state))
    answer = _ask(corpus, gate2, "alice", ALICE, "salary bands bonus pool")
    assert answer["status"] == "ok" and _sources(answer)[0] == "/docs/ask/salary.md"
    # only for that peer and that query (no --remember)
    assert _ask(corpus, gate2, "bob", BOB, "salary bands bonus pool")["status"] == "pending-approval"
    assert _ask(corpus, gate2, "alice", ALICE, "bonus pool salary review")["status"] == "pending-approval"


def test_pending_answer_carries_the_results_the_peer_may_see_now(world) -> None:
    """The best hit is an undecided ``ask`` source, a public one matches too: the answer is
    ``pending-approval`` with the id AND the public result — the very envelope an ``ok``
    answer carries once the ask source is denied (nothing about the pending source in it)."""
    corpus, gate, approvals, state = world
    q = "salary bands for next year temporary directory"
    pending = _ask(corpus, gate, None, ANON, q)
    assert pending["status"] == "pending-approval" and len(pending["approval_id"]) == 16
    assert _sources(pending) == ["/docs/public/tempfiles.md"]
    assert "salary" not in json.dumps(pending["envelope"]["results"]).lower()
    approvals.decide(pending["approval_id"], False)
    denied = _ask(corpus, gate, None, ANON, q)
    assert denied["status"] == "ok"
    volatile = {"indexedAt"}

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in volatile}
        return [strip(x) for x in v] if isinstance(v, list) else v

    assert strip(denied["envelope"]) == strip(pending["envelope"])


def test_deny_withholds_without_a_new_request(world) -> None:
    corpus, gate, approvals, state = world
    rid = _ask(corpus, gate, None, ANON, "salary bands bonus pool")["approval_id"]
    approvals.decide(rid, False)
    answer = _ask(corpus, gate, None, ANON, "salary bands bonus pool")
    req = validate_search_request({"query": "salary bands bonus pool", "topK": 5})
    assert answer == {"status": "no-verified-results", "envelope": empty_envelope("no-verified-results", req)}
    assert approvals.pending() == []
    with pytest.raises(PolicyError) as exc:
        approvals.decide(rid, True)
    assert exc.value.code == "approval-decided"


def test_remember_promotes_for_every_query_and_survives_restart(world) -> None:
    corpus, gate, approvals, state = world
    rid = _ask(corpus, gate, "alice", ALICE, "salary bands")["approval_id"]
    approvals.decide(rid, True, remember=True)
    promoted = state / "approvals" / "promoted.json"
    assert stat.S_IMODE(promoted.stat().st_mode) == 0o600
    assert json.loads(promoted.read_text())["peers"][ALICE]["allow"] == ["/docs/ask/salary.md"]
    fresh = Approvals(state)
    assert fresh.promoted(ALICE).allow == {"/docs/ask/salary.md"}
    gate.approvals = fresh
    assert _ask(corpus, gate, "alice", ALICE, "bonus pool details")["status"] == "ok"
    # promotion only opens 'ask': when the owner makes the folder private, it closes again
    gate.policy.set("/docs/ask/**", "private")
    assert _ask(corpus, gate, "alice", ALICE, "bonus pool details")["status"] == "no-verified-results"


def test_deny_remember_closes_for_every_query(world) -> None:
    corpus, gate, approvals, state = world
    rid = _ask(corpus, gate, None, ANON, "salary bands")["approval_id"]
    approvals.decide(rid, False, remember=True)
    assert _ask(corpus, gate, None, ANON, "bonus pool details")["status"] == "no-verified-results"
    assert approvals.pending() == []


def test_unremembered_approval_expires(world) -> None:
    corpus, gate, approvals, state = world
    rid = _ask(corpus, gate, None, ANON, "salary bands")["approval_id"]
    approvals.decide(rid, True)
    later = datetime.now(timezone.utc) + timedelta(seconds=DECISION_TTL_S + 60)
    assert approvals.verdicts(ANON, "salary bands", now=later).allow == frozenset()
    assert approvals.verdicts(ANON, "salary bands").allow == {"/docs/ask/salary.md"}


def test_best_evidence_public_answers_ok_without_a_request(world) -> None:
    corpus, gate, approvals, state = world
    answer = _ask(corpus, gate, None, ANON, "temporary directory deleted automatically")
    assert answer["status"] == "ok" and "/docs/public/tempfiles.md" in _sources(answer)
    assert not (state / "approvals" / "requests").exists()


def test_never_and_unlisted_peers_sources_stay_invisible(world) -> None:
    corpus, gate, approvals, state = world
    for name, key in ((None, ANON), ("bob", BOB), ("alice", ALICE)):
        assert _ask(corpus, gate, name, key, "zebra launch codes")["status"] == "no-verified-results"
    assert _ask(corpus, gate, "bob", BOB, "quarterly roadmap milestones")["status"] == "no-verified-results"
    assert _sources(_ask(corpus, gate, "alice", ALICE, "quarterly roadmap milestones")) == ["/docs/team/roadmap.md"]


def test_screen_states(world) -> None:
    corpus, gate, approvals, _ = world
    hits, _ = corpus.search_hits("salary bands temporary directory roadmap zebra", limit=50)
    states = {h.source_id: s for h, s in gate.screen(hits, "alice", ALICE, "q")}
    assert states == {"/docs/ask/salary.md": PENDING, "/docs/public/tempfiles.md": VISIBLE,
                      "/docs/team/roadmap.md": VISIBLE}


def test_pending_caps_protect_the_disk(world) -> None:
    corpus, gate, approvals, state = world
    ids = {_ask(corpus, gate, None, ANON, "salary bands " + "q" * (i + 1)).get("approval_id")
           for i in range(MAX_PENDING_PER_PEER + 3)}
    assert None in ids and len(ids - {None}) == MAX_PENDING_PER_PEER
    assert len(list((state / "approvals" / "requests").glob("*.json"))) == MAX_PENDING_PER_PEER
    # another peer still gets its own requests
    assert _ask(corpus, gate, None, BOB, "salary bands")["approval_id"]


def test_bad_ids_never_name_a_file(world) -> None:
    _, _, approvals, state = world
    for rid in ("../../peers", "ABCDEF0123456789", "0123", "", "0123456789abcdef/../x"):
        with pytest.raises(PolicyError) as exc:
            approvals.decide(rid, True)
        assert exc.value.code == "approval-not-found"
    assert not (state / "approvals" / "decisions").exists()


def test_corrupt_files_are_ignored(world) -> None:
    corpus, gate, approvals, state = world
    rid = _ask(corpus, gate, None, ANON, "salary bands")["approval_id"]
    (state / "approvals" / "requests" / "0000000000000000.json").write_text("{not json")
    (state / "approvals" / "decisions").mkdir()
    (state / "approvals" / "decisions" / f"{rid}.json").write_text('{"id": 3}')
    assert [r.id for r in approvals.pending()] == [rid]


def test_top_k_20_is_served(world) -> None:
    # candidates are bounded by the corpus search's own limit (100), not topK*10 = 200
    corpus, gate, _, _ = world
    assert _ask(corpus, gate, None, ANON, "platform release train", top_k=20)["status"] == "ok"


def test_query_key() -> None:
    assert query_key("  Salary\tBANDS  ") == query_key("salary bands") == "salary bands"
    assert query_key("ｓａｌａｒｙ") == "salary"  # NFKC


# --- quotas --------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_rate_limit_burst_then_retry_after(world) -> None:
    corpus, gate, _, _ = world
    gate.policy.quota = {"queries_per_hour": 60, "burst": 2}
    clock = Clock()
    limiter = RateLimiter(clock)
    statuses = [_ask(corpus, gate, "alice", ALICE, "write ahead log", limiter)["status"] for _ in range(3)]
    assert statuses == ["ok", "ok", "rate-limited"]
    limited = _ask(corpus, gate, "alice", ALICE, "write ahead log", limiter)
    assert limited["retry_after_s"] == 60
    req = validate_search_request({"query": "write ahead log", "topK": 5})
    assert limited["envelope"] == empty_envelope("rate-limited", req)
    # another peer has its own bucket; time refills
    assert _ask(corpus, gate, "bob", BOB, "write ahead log", limiter)["status"] == "ok"
    clock.t += 61
    assert _ask(corpus, gate, "alice", ALICE, "write ahead log", limiter)["status"] == "ok"
    # invalid requests are charged too (no free flooding)
    clock.t += 3600
    for _ in range(2):
        peer_knowledge(corpus, gate, "alice", peer_key=ALICE, limiter=limiter).search({"query": ""})
    assert _ask(corpus, gate, "alice", ALICE, "write ahead log", limiter)["status"] == "rate-limited"


def test_buckets_survive_a_host_restart(world, tmp_path: Path) -> None:
    """Issue 11: the host's limiter keeps its buckets in <home>/quota.sqlite, so a new host
    process on the same home does not refill a peer's quota (the anonymous pool too)."""
    corpus, gate, _, _ = world
    gate.policy.quota = {"queries_per_hour": 60, "burst": 2, "anonymous": {"queries_per_hour": 60, "burst": 3}}
    home = tmp_path / "host-home"
    home.mkdir()
    clock = Clock()
    first = RateLimiter.persistent(home, clock=clock)
    assert [_ask(corpus, gate, "alice", ALICE, "wal", first)["status"] for _ in range(2)] == ["ok", "ok"]
    assert [_ask(corpus, gate, None, ANON, "wal", first)["status"] for _ in range(2)] == ["ok", "ok"]
    first.close()
    assert oct((home / "quota.sqlite").stat().st_mode & 0o777) == "0o600"
    clock.t += 30  # half a token back
    second = RateLimiter.persistent(home, clock=clock)  # the restarted host
    limited = _ask(corpus, gate, "alice", ALICE, "wal", second)
    assert limited["status"] == "rate-limited" and limited["retry_after_s"] == 30
    other = "e" * 64  # a fresh anonymous key: its own bucket is full, the shared pool has 1 left
    assert _ask(corpus, gate, None, other, "wal", second)["status"] == "ok"
    assert _ask(corpus, gate, None, "f" * 64, "wal", second)["status"] == "rate-limited"
    clock.t += 30
    assert _ask(corpus, gate, "alice", ALICE, "wal", second)["status"] == "ok"
    second.close()


def test_buckets_are_written_within_a_second_without_a_clean_stop(world, tmp_path: Path) -> None:
    """A host killed outright (no close) loses at most FLUSH_INTERVAL_S of bucket changes."""
    from node.policy.quota import FLUSH_INTERVAL_S

    corpus, gate, _, _ = world
    gate.policy.quota = {"queries_per_hour": 1, "burst": 3}
    home = tmp_path / "killed"
    home.mkdir()
    clock = Clock()
    first = RateLimiter.persistent(home, clock=clock)
    assert _ask(corpus, gate, "alice", ALICE, "wal", first)["status"] == "ok"
    clock.t += FLUSH_INTERVAL_S
    assert _ask(corpus, gate, "alice", ALICE, "wal", first)["status"] == "ok"  # flushed with this one
    second = RateLimiter.persistent(home, clock=clock)  # `first` was never closed
    assert [_ask(corpus, gate, "alice", ALICE, "wal", second)["status"] for _ in range(2)] == ["ok", "rate-limited"]
    second.close()
    first.close()


def test_per_peer_override_and_zero_quota(world) -> None:
    corpus, gate, _, _ = world
    gate.policy.quota = {"burst": 1, "peer": {"alice": {"burst": 3}, "bob": {"queries_per_hour": 0}}}
    limiter = RateLimiter(Clock())
    assert [_ask(corpus, gate, "alice", ALICE, "wal", limiter)["status"] for _ in range(4)].count("ok") == 3
    assert _ask(corpus, gate, "bob", BOB, "wal", limiter)["status"] == "policy-denied"


def test_anonymous_peers_share_a_bucket(world) -> None:
    corpus, gate, _, _ = world
    gate.policy.quota = {"burst": 5, "anonymous": {"burst": 2}}
    limiter = RateLimiter(Clock())
    keys = ["d%d" % i * 32 for i in range(4)]
    statuses = [_ask(corpus, gate, None, k[:64], "wal", limiter)["status"] for k in keys]
    assert statuses == ["ok", "ok", "rate-limited", "rate-limited"]
    # a registry peer does not draw from the anonymous pool
    assert _ask(corpus, gate, "alice", ALICE, "wal", limiter)["status"] == "ok"


def test_max_message_bytes_trims_lowest_results(world, tmp_path: Path) -> None:
    corpus, gate, _, _ = world
    full = _ask(corpus, gate, "alice", ALICE, "platform release train widget telemetry", top_k=20)
    assert full["status"] == "ok" and len(json.dumps(full["envelope"]).encode()) > 8192
    gate.policy.quota = {"max_message_bytes": 8192}
    answer = _ask(corpus, gate, "alice", ALICE, "platform release train widget telemetry", top_k=20)
    # measured as the wire frames it (node/engine/framing.py: msgspec, compact UTF-8),
    # not with json.dumps, whose ", " separators and \u escapes are ~5 % larger
    data = msgspec.json.encode({"action": "results", "query_id": "q" * 64, "status": "ok",
                                "envelope": answer["envelope"]})
    assert answer["status"] == "ok" and len(data) + 1 <= 8192  # + the newline
    kept = _sources(answer)
    assert 0 < len(kept) < len(_sources(full))
    assert kept == _sources(full)[: len(kept)]  # what is kept is the best-ranked prefix


def test_limiter_is_bounded() -> None:
    from node.policy import quota as q

    limiter = RateLimiter(Clock())
    for i in range(q.MAX_BUCKETS + 50):
        limiter.take(f"{i:064x}", Quota(10, 1, 65536))
    assert len(limiter._buckets) == q.MAX_BUCKETS


# --- no hook reaches the raw index ------------------------------------------------------------


def test_the_handle_exposes_only_search(world) -> None:
    corpus, gate, _, _ = world
    handle = peer_knowledge(corpus, gate, "alice", peer_key=ALICE)
    public = {n for n in dir(handle) if not n.startswith("_")}
    # check_versions answers only current / stale / unknown for a citation's keyed version
    # (specs/citations.md), from this peer's view; small says only where the peer's next
    # plain answer may run (node/answer/inline.py), from this view's own last answer;
    # copy_manifest / copy_documents answer only what this peer's [[copy]] grants let it keep,
    # scrubbed and signed (node/answer/copies.py, specs/copies.md)
    assert public == {"search", "check_versions", "small", "copy_manifest", "copy_documents",
                      "peer_name", "peer_key"}
    for attr in ("corpus", "gate", "index", "search_hits", "_corpus", "__dict__"):
        assert not hasattr(handle, attr), attr
    with pytest.raises(AttributeError):
        handle.corpus = corpus  # __slots__: nothing can be attached either
