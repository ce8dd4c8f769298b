"""The pieces of ``scripts/eval`` that need no corpus: question sets, the dev/test split,
document-level metrics and the paired bootstrap. Imported by ``scripts/eval`` and by
``tests/test_eval_harness.py`` (which checks them on hand-made examples).

Question-set files (``scripts/eval_data/*.json``) look like::

    {"corpus": "postgresql", "answerGrade": 2, "recallGrade": 1,
     "grades": {"2": "...", "1": "..."},
     "queries": [{"id": "pg001", "query": "...",
                  "judgments": {"app-pgdump.html": {"grade": 2, "reason": "..."}}}]}

Judgment keys are paths relative to the corpus root. The legacy file
``scripts/eval_queries.json`` (53 questions Kith's weights were tuned on, grades 0-3 as bare
integers) is read by the same loader and always lands in the ``legacy`` split, never in
dev or test.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

K = 10
#: the seed of the one dev/test split (scripts/eval_data/split.json) and of the bootstrap
SPLIT_SEED = 20261201
BOOTSTRAP_SEED = 10
BOOTSTRAP_RESAMPLES = 10_000
SPLITS = ("dev", "test", "legacy")


@dataclass
class Question:
    """One labelled question.

    Attributes:
        id: stable id, unique over all sets (``py001``, ``pg001``, ``gen001``, ``q01``).
        corpus: corpus name (``python-docs``, ``postgresql``, ``generated``).
        query: the user's text.
        grades: relative path -> grade (0 = not relevant; higher is better).
        answer_grade: smallest grade that counts as answering (MRR@10, hit@10).
        recall_grade: smallest grade that counts for Recall@10.
        legacy: True for the tuned-on set (split ``legacy``).
    """

    id: str
    corpus: str
    query: str
    grades: dict[str, int]
    answer_grade: int
    recall_grade: int
    legacy: bool = False
    reasons: dict[str, str] = field(default_factory=dict)


def load_questions(path: str | Path, *, legacy: bool = False) -> list[Question]:
    """Read one question-set file.

    Args:
        path: a JSON file as in the module docstring (or the legacy format); a str or a
            Path.
        legacy: mark every question as tuned-on (split ``legacy``).

    Returns:
        The questions, in file order.

    Raises:
        ValueError: a question without judgments, a judgment without a reason (new
            format), a grade outside 0..max, or a duplicate id.
    """
    path = Path(path)
    spec = json.loads(path.read_text(encoding="utf-8"))
    corpus = spec.get("corpus", "python-docs")
    if corpus == "python-docs-3.11":
        corpus = "python-docs"
    answer = int(spec.get("answerGrade", 2))
    recall = int(spec.get("recallGrade", answer))
    top = max(int(g) for g in spec["grades"])
    out: list[Question] = []
    seen: set[str] = set()
    for q in spec["queries"]:
        if q["id"] in seen:
            raise ValueError(f"{path.name}: duplicate id {q['id']}")
        seen.add(q["id"])
        grades: dict[str, int] = {}
        reasons: dict[str, str] = {}
        for rel, j in q["judgments"].items():
            if isinstance(j, int):
                if not legacy:
                    raise ValueError(f"{path.name} {q['id']}: judgment of {rel} has no reason")
                grades[rel] = j
            else:
                if not str(j.get("reason", "")).strip():
                    raise ValueError(f"{path.name} {q['id']}: judgment of {rel} has no reason")
                grades[rel] = int(j["grade"])
                reasons[rel] = j["reason"]
            if not 0 <= grades[rel] <= top:
                raise ValueError(f"{path.name} {q['id']}: grade {grades[rel]} of {rel}")
        if not any(g >= answer for g in grades.values()):
            raise ValueError(f"{path.name} {q['id']}: no answering document")
        out.append(Question(q["id"], corpus, q["query"], grades, answer, recall, legacy,
                            reasons))
    return out


# --- the split -------------------------------------------------------------------------------
def make_split(ids_by_corpus: dict[str, list[str]], seed: int = SPLIT_SEED,
               ) -> dict[str, list[str]]:
    """Split question ids into dev and test, per corpus, deterministically.

    Each corpus's ids are sorted, shuffled with ``random.Random(f"{seed}:{corpus}")`` and
    the first half (rounded up) becomes test, so every corpus has a test share of about
    50 % whatever the others hold.

    Returns:
        ``{"dev": [...], "test": [...]}``, each sorted.
    """
    dev: list[str] = []
    test: list[str] = []
    for corpus in sorted(ids_by_corpus):
        ids = sorted(ids_by_corpus[corpus])
        random.Random(f"{seed}:{corpus}").shuffle(ids)
        cut = (len(ids) + 1) // 2
        test += ids[:cut]
        dev += ids[cut:]
    return {"dev": sorted(dev), "test": sorted(test)}


def load_split(path: str | Path) -> dict[str, set[str]]:
    """Read ``split.json`` (``path``: a str or a Path): ``{"seed", "corpora": {name: [ids]},
    "dev": [...], "test": [...]}``.

    Returns:
        ``{"dev": set of ids, "test": set of ids}``.

    Raises:
        ValueError: the two parts overlap.
    """
    path = Path(path)
    spec = json.loads(path.read_text(encoding="utf-8"))
    dev, test = set(spec["dev"]), set(spec["test"])
    if dev & test:
        raise ValueError(f"{path.name}: ids in both dev and test: {sorted(dev & test)[:5]}")
    return {"dev": dev, "test": test}


def split_of(q: Question, split: dict[str, set[str]]) -> str:
    """``legacy``, ``dev`` or ``test``.

    Raises:
        ValueError: a new question the committed split does not list (the split is made
            once: a question added later must be placed by hand, in dev).
    """
    if q.legacy:
        return "legacy"
    for name in ("dev", "test"):
        if q.id in split[name]:
            return name
    raise ValueError(f"question {q.id} is in neither dev nor test of the committed split")


# --- metrics ---------------------------------------------------------------------------------
def doc_ranking(rels: list[str], k: int = K) -> list[str | None]:
    """Top-k result positions as documents; a repeat of a document already seen becomes
    None (it gains nothing, but keeps its position)."""
    out: list[str | None] = []
    seen: set[str] = set()
    for rel in rels[:k]:
        out.append(None if rel in seen else rel)
        seen.add(rel)
    return out


def metrics(ranked: list[str | None], grades: dict[str, int], *, answer_grade: int,
            recall_grade: int, k: int = K) -> dict[str, float]:
    """Document-level metrics of one ranking.

    Args:
        ranked: result positions best first (``None`` = a position that gains nothing).
        grades: judged documents -> grade; unjudged documents count as grade 0.
        answer_grade: a document with at least this grade answers (MRR, hit).
        recall_grade: a document with at least this grade counts for recall.

    Returns:
        ``{"ndcg", "recall", "mrr", "hit"}``: nDCG@k with gain ``2**grade - 1`` and a log2
        discount over the ideal ordering of the judged grades; Recall@k; reciprocal rank of
        the first answering document (0 if none in the top k); hit@k (0 or 1).
    """
    top = ranked[:k]
    dcg = sum((2 ** grades.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(top) if d)
    ideal = sorted(grades.values(), reverse=True)[:k]
    idcg = sum((2 ** g - 1) / math.log2(i + 2) for i, g in enumerate(ideal))
    relevant = {d for d, g in grades.items() if g >= recall_grade}
    found = {d for d in top if d in relevant}
    mrr = 0.0
    for i, d in enumerate(top):
        if d and grades.get(d, 0) >= answer_grade:
            mrr = 1.0 / (i + 1)
            break
    return {"ndcg": dcg / idcg if idcg else 0.0,
            "recall": len(found) / len(relevant) if relevant else 0.0,
            "mrr": mrr, "hit": 1.0 if mrr else 0.0}


def percentile(xs: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of ``xs`` by linear interpolation."""
    s = sorted(xs)
    if not s:
        return 0.0
    pos = (len(s) - 1) * p / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def paired_bootstrap(a: list[float], b: list[float], *, resamples: int = BOOTSTRAP_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """95 % paired bootstrap interval of ``mean(a) - mean(b)``.

    Args:
        a, b: per-question values of two systems on the same questions, same order.

    Returns:
        ``{"diff", "lo", "hi"}``: the observed difference and the 2.5th/97.5th
        percentiles of the resampled differences (percentile method).

    Raises:
        ValueError: different lengths or no questions.
    """
    if len(a) != len(b) or not a:
        raise ValueError("paired bootstrap needs two equally long, non-empty lists")
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        means.append(sum(d[rng.randrange(n)] for _ in range(n)) / n)
    return {"diff": sum(d) / n, "lo": percentile(means, 2.5), "hi": percentile(means, 97.5)}


def write_split(data_dir: Path, out: Path) -> dict:
    """Make the one dev/test split of every question set in ``data_dir`` and write it.

    Refuses (``FileExistsError``) when ``out`` exists: the split is made once, before any
    tuning, and committed; re-splitting would leak tuned-on questions into test.
    """
    if out.exists():
        raise FileExistsError(f"{out} exists: the split is made once and committed")
    ids: dict[str, list[str]] = {}
    for p in sorted(data_dir.glob("*.json")):
        spec = json.loads(p.read_text(encoding="utf-8"))
        if "queries" in spec:
            ids[spec["corpus"]] = [q.id for q in load_questions(p)]
    split = make_split(ids)
    doc = {"seed": SPLIT_SEED,
           "method": "eval_harness.make_split: per corpus, ids sorted, shuffled with "
                     "random.Random(f'{seed}:{corpus}'), first half (rounded up) = test",
           "corpora": {c: sorted(v) for c, v in sorted(ids.items())}, **split}
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write-split"]:
        sys.exit("usage: python scripts/eval_harness.py --write-split")
    here = Path(__file__).resolve().parent / "eval_data"
    made = write_split(here, here / "split.json")
    print(f"wrote {here / 'split.json'}: {len(made['dev'])} dev, {len(made['test'])} test")
