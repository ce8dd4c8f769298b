"""A copy never holds a source the peer's view does not allow (issue 33, "Bad input and
faults"; specs/copies.md §1): for random policies — a tier per source (public, peers for
some names or groups, ask, private, never), copy grants by exact file or folder glob for a
peer or a @group, group memberships, ``until`` passed or not on grants and memberships,
scrub kinds — over random corpora, what the real host side (:class:`CopyServer`) lists and
sends, and so what the real peer side (:func:`sync_copy`, in-process ``ask``) keeps, is
exactly what an independent reading of those rules allows to be served without asking, and
every kept text is scrubbed as an answer to that peer would be."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.answer.copies import CopyServer
from node.common.scrub import scrub
from node.corpus.store import Corpus
from node.policy.gate import EgressGate
from node.policy.store import Policy
from node.runtime.clock import rfc3339
from node.guest.copies.store import CopyStore
from node.guest.copies.sync import sync_copy
from node.trust.identity import load_or_init_identity

FILES = ["a/one.md", "a/two.md", "b/three.md", "b/four.md", "five.md"]
PEERS = ["bea", "cat"]
GROUPS = ["team", "ops"]
PAST, FUTURE = "2020-01-01T00:00:00Z", "2099-01-01T00:00:00Z"


def _text(name: str) -> str:
    return f"# {name}\n\nNotes on {name}: mail someone-{name.replace('/', '-')}@example.com for it.\n"


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Three host homes, each indexing another subset of FILES under /kb."""
    out = []
    for n, subset in enumerate([FILES, FILES[:3], FILES[1:]]):
        root = tmp_path_factory.mktemp(f"corpus{n}")
        kb = root / "kb"
        for f in subset:
            (kb / f).parent.mkdir(parents=True, exist_ok=True)
            (kb / f).write_text(_text(f))
        home = root / "home"
        home.mkdir(mode=0o700)
        ident = load_or_init_identity(home)
        with Corpus(home) as c:
            c.add_root(kb)
            c.sync()
        out.append((home, ident, [f"/kb/{f}" for f in subset]))
    return out


tiers = st.sampled_from(["public", "peers", "ask", "private", "never"])
principals = st.sampled_from(PEERS + [f"@{g}" for g in GROUPS])
globs = st.sampled_from(["/kb/**", "/kb/a/**", "/kb/b/**"] + [f"/kb/{f}" for f in FILES])
policies = st.fixed_dictionaries({
    "tiers": st.fixed_dictionaries({f: st.tuples(tiers, st.lists(principals, min_size=1, max_size=2, unique=True)) for f in FILES}),
    "groups": st.fixed_dictionaries({g: st.dictionaries(st.sampled_from(PEERS), st.sampled_from([None, PAST, FUTURE]))
                                     for g in GROUPS}),
    "grants": st.lists(st.tuples(globs, principals, st.sampled_from([None, PAST, FUTURE])), min_size=1, max_size=4),
    "scrub": st.lists(st.tuples(principals, st.sampled_from([None, "/kb/a/**"])), min_size=1, max_size=2),
    "corpus": st.integers(0, 2),
    "peer": st.sampled_from(PEERS),
})


def _toml(p: dict) -> str:
    lines = []
    for f, (tier, names) in p["tiers"].items():
        lines += ["[[rule]]", f'glob = "/kb/{f}"', f'tier = "{tier}"']
        if tier == "peers":
            lines.append("peers = [" + ", ".join(f'"{n}"' for n in names) + "]")
    for g, members in p["groups"].items():
        lines += [f"[group.{g}]", "members = [" + ", ".join(f'"{m}"' for m in members) + "]"]
        ends = {m: u for m, u in members.items() if u}
        if ends:
            lines.append("until = {" + ", ".join(f'{m} = "{u}"' for m, u in ends.items()) + "}")
    seen = set()
    for glob, who, until in p["grants"]:
        if (glob, who) in seen:
            continue
        seen.add((glob, who))
        lines += ["[[copy]]", f'glob = "{glob}"', f'for = "{who}"'] + ([f'until = "{until}"'] if until else [])
    return "\n".join(lines) + "\n"


def _is(peer: str, who: str, groups: dict, *, ended_too: bool = False) -> bool:
    """``who`` (a name or @group) names ``peer`` now (a membership not ended), or with
    ``ended_too`` at all: an ended membership still scrubs (specs/policy.md §9.0)."""
    if not who.startswith("@"):
        return who == peer
    members = groups[who[1:]]
    return peer in members and (ended_too or members[peer] != PAST)


def _matches(glob: str, source: str) -> bool:
    return source == glob or (glob.endswith("/**") and source.startswith(glob[:-2]))


def _may_keep(p: dict, source: str) -> bool:
    """The oracle, read from the generated rules alone (specs/copies.md §1)."""
    peer = p["peer"]
    tier, names = p["tiers"][source.removeprefix("/kb/")]
    served = tier == "public" or (tier == "peers" and any(_is(peer, n, p["groups"]) for n in names))
    granted = any(_matches(g, source) and _is(peer, who, p["groups"]) and until != PAST
                  for g, who, until in p["grants"])
    return served and granted


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=policies)
def test_a_copy_holds_only_what_the_peer_may_be_served_and_scrubbed_as_served(corpora, p):
    home, ident, sources = corpora[p["corpus"]]
    peer = p["peer"]
    policy = Policy.from_toml(_toml(p))
    for who, glob in p["scrub"]:
        policy.set_scrub(who, ["email"], glob=glob)
    with Corpus(home, readonly=True) as corpus:
        server = CopyServer(corpus, EgressGate(corpus.roots(), policy, home), home, ident.secret,
                            lambda: rfc3339(time.time()))
        expected = sorted(s for s in sources if _may_keep(p, s))
        manifest = server.manifest(peer)
        if manifest["status"] == "copy-not-granted":
            assert not any(_is(peer, w, p["groups"]) and u != PAST for _g, w, u in p["grants"])
            assert expected == []
        else:
            assert [d["source"] for d in manifest["documents"]] == expected
        # asking for every source, whatever the manifest: only the allowed ones are sent
        sent = server.documents(peer, sources)
        assert sorted(d["source"] for d in sent["documents"]) == expected

        async def ask(request):
            if request["action"] == "copy_list":
                return {"action": "copy_manifest", **server.manifest(peer)}
            return {"action": "copy_docs", **server.documents(peer, request["sources"])}

        guest = Path(tempfile.mkdtemp(prefix="kith-prop-"))
        try:
            report = anyio.run(lambda: sync_copy(guest, "alice", ask, ident.public_key))
            store = CopyStore(guest, "alice")
            kept = store.load()["documents"] if report["status"] == "ok" else {}
            assert sorted(kept) == expected
            for src, d in kept.items():
                text = (store.docs / d["file"]).read_bytes().decode("utf-8")
                original = corpus.document_text(corpus_stored(corpus, src))[1]
                kinds = policy.scrub_kinds(src, peer)
                assert text == (scrub(original, kinds) if kinds else original)
                scrubbed = any(_is(peer, who, p["groups"], ended_too=True) and (glob is None or _matches(glob, src))
                               for who, glob in p["scrub"])
                assert ("@example.com" in text) is not scrubbed
        finally:
            shutil.rmtree(guest, ignore_errors=True)


def corpus_stored(corpus: Corpus, canonical: str) -> str:
    """The stored id of a canonical /kb/... source (one root named kb: the same)."""
    return canonical
