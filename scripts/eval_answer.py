#!/usr/bin/env python3
"""scripts/eval_answer.py: how often the extractive answer block quotes the right documents
(issue 20 item 5).

For each evaluation question (``scripts/eval_queries.json`` — the legacy set — and the
python-docs and generated sets of ``scripts/eval_data/``, every split; PostgreSQL when its
manual is installed), ``kith search QUESTION`` is answered the way the CLI does it
(:func:`node.answer.service.answer_local`, ``topK`` 5), over the corpora ``scripts/eval``
indexes (same cache, same roots, ``--root`` the same). Reported per corpus and overall:

- ``quoted``: sentences quoted in all answer blocks;
- ``relevant``: share of quoted sentences whose document is judged relevant to the
  question (any grade > 0), and ``answering``: judged at the set's answer grade or above;
- ``empty``: share of questions whose answer block is left out (no sentence qualified);
- ``results``: for comparison, the share of shown results (top 5) whose document is
  judged relevant — what quoting can at best be picked from;
- ``repeats``: quoted sentences that repeat an earlier one of the same block, near
  identical included (same words once lower-cased and stripped of punctuation).

Usage::

    .venv/bin/python scripts/eval_answer.py [--root python-docs=PATH] [--json]
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import eval_harness as H  # noqa: E402


def _eval_module():
    """``scripts/eval`` (no ``.py`` suffix) as a module: its corpus roots and cache."""
    loader = importlib.machinery.SourceFileLoader("kith_eval", str(REPO / "scripts" / "eval"))
    spec = importlib.util.spec_from_loader("kith_eval", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def ev_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _words(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\w+", text.lower()))


def _repeat(words: tuple[str, ...], seen: list[tuple[str, ...]]) -> bool:
    """Same words, or one's word set inside the other's with >= 80 % of its length."""
    return any(words == w or (set(words) <= set(w) or set(w) <= set(words))
               and min(len(words), len(w)) >= 0.8 * max(len(words), len(w)) for w in seen)


def measure(corpus, prefix: str, questions: list[H.Question]) -> dict:
    """The block's numbers over ``questions`` (see the module docstring)."""
    from node.answer.service import answer_local

    quoted = relevant = answering = empty = repeats = shown = shown_relevant = 0
    for q in questions:
        env = answer_local(corpus, {"query": q.query, "topK": 5})["envelope"]
        for r in env.get("results") or []:
            shown += 1
            shown_relevant += q.grades.get(r["source"][len(prefix):], 0) > 0
        sentences = (env.get("answerSynthesis") or {}).get("sentences") or []
        if not sentences:
            empty += 1
        seen: list[tuple[str, ...]] = []
        for s in sentences:
            quoted += 1
            rel = s["source"][len(prefix):] if s["source"].startswith(prefix) else ""
            grade = q.grades.get(rel, 0)
            relevant += grade > 0
            answering += grade >= q.answer_grade
            words = _words(s["text"])
            repeats += _repeat(words, seen)
            if seen and os.environ.get("KITH_SHOW_REPEATS") and _repeat(words, seen):
                ev_log(f"repeat in {q.id}: {s['text']!r}")
            seen.append(words)
    n = len(questions)
    return {"questions": n, "quoted": quoted,
            "resultsRelevant": round(shown_relevant / shown, 3) if shown else None,
            "relevant": round(relevant / quoted, 3) if quoted else None,
            "answering": round(answering / quoted, 3) if quoted else None,
            "empty": round(empty / n, 3) if n else None, "repeats": repeats}


def main() -> int:
    ev = _eval_module()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", action="append", type=ev.parse_root, metavar="NAME=PATH")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sets = {"python-docs": [ev.LEGACY, ev.DATA / "python-docs.json"],
            "generated": [ev.DATA / "generated.json"],
            "postgresql": [ev.DATA / "postgresql.json"]}
    out: dict[str, dict] = {}
    for name, files in sets.items():
        root = ev.corpus_root(name, args)
        if not root.is_dir():
            ev.log(f"skipping {name}: {ev.CORPORA[name]['missing']}")
            continue
        questions = [q for f in files for q in H.load_questions(f, legacy=f == ev.LEGACY)]
        corpus, prefix, _rep = ev.open_corpus(name, root)
        try:
            out[name] = measure(corpus, prefix, questions)
        finally:
            corpus.close()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{'corpus':<12} {'questions':>9} {'results':>7} {'quoted':>6} {'relevant':>8} "
              f"{'answering':>9} {'empty':>6} {'repeats':>7}")
        for name, r in out.items():
            print(f"{name:<12} {r['questions']:>9} {r['resultsRelevant']!s:>7} {r['quoted']:>6} "
                  f"{r['relevant']!s:>8} {r['answering']!s:>9} {r['empty']!s:>6} "
                  f"{r['repeats']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
