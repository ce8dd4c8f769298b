#!/usr/bin/env python3
"""Measure the cost the egress policy adds to one answer (issue 5), side by side.

Prints per-query milliseconds for: corpus search alone, search + gate.screen (no approvals), and
search + the full knowledge handle (quota, screen with approvals, envelope, leak scan),
plus the approvals lookup with many decided requests on disk, the leak scan of one 64 KiB
answer (``EgressGate.check_outgoing``, target < 20 ms) and the policy's glob matcher on
pathological globs (``**`` and ``*`` runs a backtracking regex takes minutes on; target
< 500 ms each: the matcher is O(len(id) * len(glob))). The last two were timed assertions in
tests/test_policy_gate.py and tests/test_policy.py, which failed at random on a loaded
machine. Run:
    .venv/bin/python scripts/bench_policy.py

``--scrub`` instead measures the scrubbing gate (issue 24 item 3): the host CPU
(``time.process_time``, every thread of the process) of one peer answer with
a ``[[scrub]] for = "*"`` entry off and on (all five kinds), interleaved, over real questions on
``--corpus`` (default: the Python docs in ../shared when present, else a generated corpus
holding e-mails, cards and IBANs), with the load average::

    flock /tmp/kith-bench.lock .venv/bin/python scripts/bench_policy.py --scrub

``--scrub-guard [N]`` times what ``kith policy set`` and ``kith policy scrub --off`` compute
before writing (specs/policy.md §9.5: what a change would newly serve unscrubbed) over N
synthetic source ids in folders of 100 (default 94,000) and five recipients, policy only
(no corpus)::

    flock /tmp/kith-bench.lock .venv/bin/python scripts/bench_policy.py --scrub-guard

``--false-positives DIR...`` counts each detector's hits on the readable text of every
file of the folders (the corpus parsers' text: HTML without markup) and prints a few per
kind, to judge them (the evaluation corpora hold no personal data), and the paragraphs
the guest's fence scan (node/answer/fence.py) would flag ``suspicious``::

    .venv/bin/python scripts/bench_policy.py --false-positives ../shared/corpora/python-docs-3.11 \
        /usr/share/doc/postgresql-doc-15/html
"""

from __future__ import annotations

import argparse
import json
import os
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
    chunk = json.dumps({"source": "/docs/a.md", "textPreview": "lorem ipsum /usr/share/doc " * 8})
    payload = (chunk * (65536 // len(chunk) + 1))[:65536].encode()
    scan = timed(lambda: gate.check_outgoing(payload), n=50)
    print(f"{'leak scan, one 64 KiB answer':32s} {scan:7.2f} ms  (target < 20 ms)")
    def first_decision(glob: str, source: str) -> None:  # a new policy each time: nothing cached
        one = Policy()
        one.set(glob, "public")
        one.decide(source, None)

    for glob, source in PATHOLOGICAL:
        decide = timed(lambda: first_decision(glob, source), n=5)
        print(f"{'glob ' + glob[:24] + '...':32s} {decide:7.2f} ms  (target < 500 ms; id of {len(source)} chars)")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    corpus.close()


#: (glob, source id) pairs a backtracking regex takes minutes on; none of the ids matches
PATHOLOGICAL = (
    ("/" + "/".join(["**", "a"] * 8) + "/b", "/" + "/".join(["a"] * 1500)),
    ("/" + "/".join(["**", "a"] * 7) + "/**", "/" + "/".join(["a"] * 6 + ["b"] * 1500)),
    ("/x/" + "*a" * 60 + "*b", "/x/" + "a" * 3000),
)


SHARED_DOCS = Path(__file__).resolve().parents[1].parent / "shared" / "corpora" / "python-docs-3.11"
#: real questions (python docs) and the generated corpus's words, cycled
QUESTIONS = ("how do I create a temporary directory", "read and write CSV files", "send an email with smtplib",
             "parse command line arguments", "format a date as a string", "run a subprocess and capture output",
             "compare two lists of numbers", "invoice account card payment walrus", "contact address phone",
             "hash a password securely")


def _generated(base: Path) -> Path:
    """400 notes, one in four holding an e-mail address, a card number and an IBAN."""
    docs = base / "gen"
    for i in range(400):
        (docs / f"d{i // 40}").mkdir(parents=True, exist_ok=True)
        extra = (f" Write to user{i}@example.org, pay by card 4111 1111 1111 1111 or to DE89 3704 0044 0532 0130 00."
                 if i % 4 == 0 else "")
        (docs / f"d{i // 40}" / f"n{i}.md").write_text(
            f"# Note {i}\n\n" + " ".join(f"invoice {i} account walrus {j} payment contact card." for j in range(20))
            + extra + "\n")
    return docs


def scrub_bench(corpus_dir: Path | None, rounds: int) -> None:
    """Peer-answer host CPU with the scrubbing gate off and on (module docstring)."""
    from node.common.scrub import KINDS

    base = Path(tempfile.mkdtemp())
    docs = corpus_dir if corpus_dir is not None else _generated(base)
    home = base / "home"
    t0 = time.perf_counter()
    with Corpus(home) as c:
        c.add_root(docs)
        c.sync()
    print(f"corpus {docs} indexed in {time.perf_counter() - t0:.1f} s")
    corpus = Corpus(home, readonly=True)
    prefix = corpus.roots()[0].prefix
    hidden = next(iter(sorted(corpus.source_ids())))
    # off: everything public (served by the main index, as a default host does); off-ram:
    # the same but one source private, so the view has its own RAM index like a scrubbed
    # one (the like-for-like baseline of the gate's own cost); on: off-ram + scrubbing
    policies = {"off": Policy(), "off-ram": Policy(), "on": Policy()}
    for name, policy in policies.items():
        policy.set(f"/{prefix}/**", "public")
        if name != "off":
            policy.set(hidden, "private")
    policies["on"].set_scrub("*", KINDS)  # every peer, every source (specs/policy.md §9.0)
    handles = {k: peer_knowledge(corpus, EgressGate(corpus.roots(), p, home), None) for k, p in policies.items()}
    for name, handle in handles.items():  # build each view (the scrubbed one over scrubbed text)
        t0 = time.perf_counter()
        handle.search({"query": QUESTIONS[0], "topK": 10})
        print(f"view {name:7s} built + first answer in {time.perf_counter() - t0:.2f} s")
    cpu: dict[str, list[float]] = {k: [] for k in handles}
    scrubbed: dict[str, int] = {}
    for _ in range(rounds):
        for q in QUESTIONS:
            for name, handle in handles.items():
                t = time.process_time()
                answer = handle.search({"query": q, "topK": 10})
                cpu[name].append((time.process_time() - t) * 1000)
                for k, v in (answer.get("scrubbed") or {}).items():
                    scrubbed[k] = scrubbed.get(k, 0) + v
    med = {k: statistics.median(v) for k, v in cpu.items()}
    mean = {k: statistics.fmean(v) for k, v in cpu.items()}
    load = os.getloadavg()
    print(f"peer answers: {len(cpu['on'])} per setting (topK 10), load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for name in handles:
        print(f"{'scrub ' + name:14s} median {med[name]:6.2f} ms CPU  mean {mean[name]:6.2f}")
    print(f"ratio on/off-ram (the gate's own cost): median {med['on'] / med['off-ram']:.3f}  "
          f"mean {mean['on'] / mean['off-ram']:.3f}")
    print(f"ratio on/off (with the scrubbed view's RAM index): median {med['on'] / med['off']:.3f}  "
          f"mean {mean['on'] / mean['off']:.3f}")
    print(f"spans scrubbed in the 'on' answers: {scrubbed or 'none'}")
    corpus.close()


def false_positives(folders: list[Path], shown: int = 8) -> None:
    """Each detector's hits on the readable text of every file under ``folders``."""
    import re

    from node.answer.fence import REASONS, scan
    from node.corpus.parsers import kind_for, parse_bytes
    from node.common.scrub import KINDS, find

    for folder in folders:
        if not folder.is_dir():
            print(f"{folder}: not there, skipped")
            continue
        counts = {k: 0 for k in KINDS}
        samples: dict[str, list[str]] = {k: [] for k in KINDS}
        flagged = {r: 0 for r in REASONS}  # the guest's fence scan, per paragraph
        flag_samples: list[str] = []
        files = chars = paragraphs = 0
        t0 = time.perf_counter()
        for path in sorted(folder.rglob("*")):
            kind = kind_for(path.name) if path.is_file() else None
            if kind is None:
                continue
            try:
                text = parse_bytes(path.read_bytes(), kind, path.name).text
            except Exception:  # noqa: BLE001 - a file the parsers refuse is not counted
                continue
            files += 1
            chars += len(text)
            for start, end, k in find(text, KINDS):
                counts[k] += 1
                if len(samples[k]) < shown:
                    samples[k].append(f"{path.relative_to(folder)}: {text[start:end]!r}")
            for para in re.split(r"\n\s*\n", text):
                paragraphs += 1
                for reason in scan(para):
                    flagged[reason] += 1
                    if len(flag_samples) < shown:
                        flag_samples.append(f"{reason} {path.relative_to(folder)}: {para[:100]!r}")
        secs = time.perf_counter() - t0
        print(f"{folder}: {files} files, {chars / 1e6:.1f} M characters, {secs:.1f} s")
        for k in KINDS:
            print(f"  {k:7s} {counts[k]:5d}")
            for line in samples[k]:
                print(f"      {line}")
        print(f"  fence scan ({paragraphs} paragraphs): "
              + ", ".join(f"{r} {n}" for r, n in flagged.items()))
        for line in flag_samples:
            print(f"      {line}")


def scrub_guard_bench(n: int) -> None:
    """Time the scrub guard (node/policy/scrub_coverage.py) for a rule change and for a
    scrub entry removed, over ``n`` synthetic ids, with the load average."""
    from node.policy.scrub_coverage import ScrubRecord, newly_unscrubbed, recipients
    from node.policy.store import Group

    ids = [f"/docs/f{i // 100:05d}/d{i}.md" for i in range(n)]
    policy = Policy(groups={"team": Group("team", {"bob": None, "eve": None}), "ops": Group("ops", {"carol": None})})
    policy.set("/docs/**", "public")
    policy.set("/docs/f00001/**", "ask")
    policy.set("/docs/f00002/**", "peers", ["@team"])
    policy.set_scrub("*", ["email", "card"])
    policy.set_scrub("@team", ["iban"], glob="/docs/f00003/**")
    policy.set_scrub("alice", ["phone"])
    record = ScrubRecord()
    record.add(policy)
    who = recipients(policy, record, ["alice", "bob", "carol", "eve"])
    print(f"{n} source ids, {len(who)} recipients, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for label, change in (("rule change (policy set)", lambda p: p.set("/docs/f00005/**", "ask")),
                          ("scrub entry removed (scrub --off)", lambda p: p.set_scrub("*", []))):
        after = Policy.from_toml(policy.to_toml())
        change(after)
        t0 = time.perf_counter()
        lines = newly_unscrubbed(policy, after, record, ids, who)
        print(f"  {label:34s} {time.perf_counter() - t0:7.3f} s  ({sum(len(u.sources) for u in lines)} "
              "(recipient, source) pairs would lapse)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrub", action="store_true", help="scrubbing gate off/on, peer-answer host CPU")
    ap.add_argument("--corpus", type=Path, help="folder to index for --scrub")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the questions for --scrub")
    ap.add_argument("--scrub-guard", nargs="?", type=int, const=94_000, metavar="N",
                    help="time the scrub guard over N synthetic source ids (default 94000)")
    ap.add_argument("--false-positives", nargs="+", type=Path, metavar="DIR", help="count detector hits")
    args = ap.parse_args()
    if args.scrub_guard:
        scrub_guard_bench(args.scrub_guard)
    elif args.false_positives:
        false_positives(args.false_positives)
    elif args.scrub:
        default = SHARED_DOCS if SHARED_DOCS.is_dir() else None
        scrub_bench(args.corpus or default, args.rounds)
    else:
        main()
