#!/usr/bin/env python3
"""Measure the cost the egress policy adds to one answer (issue 5), side by side.

Prints per-query milliseconds for: corpus search alone, search + gate.screen (no approvals), and
search + the full knowledge handle (quota, screen with approvals, envelope, leak scan),
plus the approvals lookup with many decided requests on disk. Run:
    .venv/bin/python scripts/bench_policy.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.corpus.store import Corpus  # noqa: E402
from node.policy.approvals import Approvals  # noqa: E402
from node.policy.gate import EgressGate  # noqa: E402
from node.answer.service import peer_knowledge  # noqa: E402
from node.policy.quota import RateLimiter  # noqa: E402
from node.policy.store import Policy  # noqa: E402


def timed(fn, n: int = 200) -> float:
    fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples)


def main() -> None:
    base = Path(tempfile.mkdtemp())
    docs = base / "docs"
    for i in range(400):
        sub = ("public", "team", "ask", "secret")[i % 4]
        (docs / sub / f"d{i // 40}").mkdir(parents=True, exist_ok=True)
        (docs / sub / f"d{i // 40}" / f"n{i}.md").write_text(
            f"# Note {i}\n\n" + " ".join(f"release train {i} widget {j} telemetry platform." for j in range(20)))
    home = base / "home"
    with Corpus(home) as c:
        c.add_root(docs)
        c.sync()
    corpus = Corpus(home, readonly=True)
    policy = Policy()
    for glob, tier, peers in (("/docs/**", "public", None), ("/docs/team/**", "peers", ["alice"]),
                              ("/docs/ask/**", "ask", None), ("/docs/secret/**", "never", None)):
        policy.set(glob, tier, peers)
    policy.quota = {"queries_per_hour": 10**9, "burst": 10**9}
    approvals = Approvals(base / "state")
    for i in range(500):  # many decided requests on disk
        req = approvals.request(f"{i:064x}", None, f"query {i}", [f"/docs/ask/d0/n{i}.md"])
        if req is not None:
            approvals.decide(req.id, True)
    gate = EgressGate(corpus.roots(), policy, home, approvals=approvals)
    handle = peer_knowledge(corpus, gate, "alice", peer_key="a1" * 32, limiter=RateLimiter())
    q = "release train widget telemetry platform"
    hits, _ = corpus.search_hits(q, limit=100)
    print(f"candidates per query: {len(hits)}")
    search = timed(lambda: corpus.search_hits(q, limit=100))
    gated = timed(lambda: gate.screen(corpus.search_hits(q, limit=100)[0], "alice", None, q))
    full = timed(lambda: handle.search({"query": q, "topK": 10}))
    screen = timed(lambda: gate.screen(hits, "alice", "a1" * 32, q))
    verdicts = timed(lambda: approvals.verdicts("a1" * 32, q))
    print(f"{'search only':32s} {search:7.2f} ms  1.00x")
    print(f"{'search + screen (no approvals)':32s} {gated:7.2f} ms  {gated / search:.2f}x")
    print(f"{'knowledge handle (full answer)':32s} {full:7.2f} ms  {full / search:.2f}x")
    print(f"{'screen 100 hits (w/ approvals)':32s} {screen:7.2f} ms")
    print(f"{'approvals.verdicts, ~500 on disk':32s} {verdicts:7.2f} ms")
    corpus.close()


if __name__ == "__main__":
    main()
