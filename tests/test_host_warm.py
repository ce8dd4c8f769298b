"""Views warm before the first question (node/host/warm.py; issue 29 item 4): a running
host builds the views of its anonymous guests and of its pinned peers at start and again
after a policy change or a sync, before any of them asks."""

from __future__ import annotations

from pathlib import Path

import anyio

from node.answer.service import PeerView
from node.corpus.store import Corpus
from node.policy.store import Policy
from node.host.warm import WARM_POLL_S, ViewWarmer
from node.trust.peers import PeerRegistry
from support.homes import node_home
from support.memory import MemoryHost

ALICE_KEY = "ab" * 32


def _host_home(tmp_path: Path) -> Path:
    """A host home: notes in pub/ (public), team/ (alice only) and priv/ (private), alice pinned."""
    home = node_home(tmp_path, "host")
    notes = tmp_path / "notes"
    for rel, text in {"pub/a.md": "walrus public notes\n", "team/b.md": "walrus team plans\n",
                      "team/c.md": "walrus team budget\n", "priv/d.md": "walrus private\n"}.items():
        (notes / rel).parent.mkdir(parents=True, exist_ok=True)
        (notes / rel).write_text(text, encoding="utf-8")
    with Corpus(home) as corpus:
        corpus.add_root(notes)
        corpus.sync()
    policy = Policy.load(home)
    policy.set("/notes/pub/**", "public")
    policy.set("/notes/team/**", "peers", ["alice"])
    policy.save()
    PeerRegistry.load(home).pin("alice", ALICE_KEY)
    return home


def test_a_host_warms_a_pinned_peers_view_at_start_and_after_a_policy_change(tmp_path):
    home = _host_home(tmp_path)

    async def scenario() -> None:
        host = MemoryHost(home)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            def warmed_once() -> bool:  # the host opens its knowledge when it starts running
                knowledge = vars(host.host).get("knowledge")
                return knowledge is not None and knowledge.warmer.rounds > 0

            await host.until(warmed_once, timeout=60)
            warmer = host.host.knowledge.warmer
            assert warmer.last is not None
            assert warmer.last["peers"] == [None, "alice"] and warmer.last["views"] == 2
            service, corpus = warmer.service, warmer.corpus
            assert corpus.view_ready(service.lens_for(PeerView("alice")))

            policy = Policy.load(home)  # the owner hides one of alice's documents
            policy.set("/notes/team/c.md", "private")
            policy.save()
            await host.until(lambda: warmer.rounds > 1, timeout=60, tick_s=WARM_POLL_S)  # its period, on the clock
            lens = service.lens_for(PeerView("alice", ALICE_KEY))
            assert "/notes/team/c.md" not in lens.visible
            # built before any question: alice's first question after the change builds nothing
            assert corpus.view_ready(lens)
            builds = corpus.view_builds()
            answer = await anyio.to_thread.run_sync(
                service.answer, {"query": "walrus", "topK": 5}, PeerView("alice", ALICE_KEY))
            assert sorted(r["source"] for r in answer["envelope"]["results"]) == [
                "/notes/pub/a.md", "/notes/team/b.md"]
            assert corpus.view_builds() == builds
            host.stop.set()

    anyio.run(scenario)


def test_the_warmer_rebuilds_only_when_a_lens_changed_and_stops_at_the_view_cap(tmp_path):
    """One round per change (a policy change, a sync); the views past the cap are left to
    their first question; without a round nothing is built ahead."""
    from node.corpus import views
    from node.policy.gate import EgressGate
    from node.answer.service import AnswerService

    home = _host_home(tmp_path)
    names = [f"p{i}" for i in range(views.MAX_VIEWS + 2)]
    policy = Policy.load(home)
    for i, name in enumerate(names):  # each its own view: one more document per peer
        policy.set(f"/notes/priv/x{i}.md", "peers", [name])
        (tmp_path / "notes" / "priv" / f"x{i}.md").write_text(f"walrus {i}\n", encoding="utf-8")
    policy.save()
    with Corpus(home) as writer:
        writer.sync()
    with Corpus(home, readonly=True) as corpus:
        gate = EgressGate(corpus.roots(), Policy.load(home), home)
        service = AnswerService(corpus, gate)
        reports: list[dict] = []
        warmer = ViewWarmer(service, gate, corpus, lambda: names, on_round=reports.append)
        lens = service.lens_for(PeerView(names[0]))
        assert not corpus.view_ready(lens)  # nothing is built ahead without a round
        ev = warmer.warm_once()
        assert ev is not None and ev["views"] == views.MAX_VIEWS
        assert ev["peers"] == [None, *names[: views.MAX_VIEWS - 1]]
        assert corpus.view_ready(lens)
        assert warmer.warm_once() is None  # nothing changed: no round
        (tmp_path / "notes" / "pub" / "new.md").write_text("walrus new\n", encoding="utf-8")
        with Corpus(home) as writer:  # a sync: a new generation, every lens changes
            writer.sync()
        again = warmer.warm_once()
        assert again is not None and again["peers"] == ev["peers"]
        assert "/notes/pub/new.md" in service.lens_for(PeerView(None)).visible
        assert len(reports) == 2 and warmer.rounds == 2 and warmer.warmed.is_set()



def test_warm_says_whether_the_views_in_force_now_are_built(tmp_path):
    """``kith status``'s ``warmed`` (:meth:`ViewWarmer.is_warm`) is true only while the last
    round covered the lenses in force: a policy change or a sync makes it false until the
    next round, not just before the first one."""
    from node.policy.gate import EgressGate
    from node.answer.service import AnswerService

    home = _host_home(tmp_path)
    with Corpus(home, readonly=True) as corpus:
        gate = EgressGate(corpus.roots(), Policy.load(home), home)
        warmer = ViewWarmer(AnswerService(corpus, gate), gate, corpus, lambda: ["alice"])
        assert not warmer.is_warm()  # no round yet
        warmer.warm_once()
        assert warmer.is_warm()
        policy = Policy.load(home)  # the owner hides one of alice's documents
        policy.set("/notes/team/c.md", "private")
        policy.save()
        assert not warmer.is_warm()  # alice's view is the old one until the next round
        warmer.warm_once()
        assert warmer.is_warm()
        (tmp_path / "notes" / "pub" / "new.md").write_text("walrus new\n", encoding="utf-8")
        with Corpus(home) as writer:
            writer.sync()
        assert not warmer.is_warm()
        warmer.warm_once()
        assert warmer.is_warm()


def test_a_host_no_anonymous_guest_can_ask_does_not_warm_the_anonymous_view(tmp_path):
    """Under ``--peers-only`` or ``--presence granted`` no anonymous guest is ever answered:
    the warmer builds only the pinned peers' views (the anonymous one would take a place
    under the view cap and a build ahead of theirs after every change)."""
    home = _host_home(tmp_path)

    async def scenario(**opts) -> dict:
        host = MemoryHost(home, **opts)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)

            def warmed_once() -> bool:
                knowledge = vars(host.host).get("knowledge")
                return knowledge is not None and knowledge.warmer.rounds > 0

            await host.until(warmed_once, timeout=60)
            report = host.host.knowledge.warmer.last
            host.stop.set()
        return report

    assert anyio.run(lambda: scenario(peers_only=True))["peers"] == ["alice"]
    assert anyio.run(lambda: scenario(presence="granted"))["peers"] == ["alice"]
    assert anyio.run(lambda: scenario())["peers"] == [None, "alice"]
