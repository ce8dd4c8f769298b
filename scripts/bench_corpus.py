"""Benchmark the corpus on python-docs-3.11: sync, re-sync, warm query latency, quality.

Usage::

    .venv/bin/python scripts/bench_corpus.py [--corpus DIR] [--sizes 800:100,1200:150,2000:200]
        [--repeat 50]

For each chunk size/overlap it indexes the corpus into a fresh temporary home and prints
full sync time, unchanged re-sync time, warm query p50/p95 over a small set of questions
with known answers, hit@5 and MRR@10. Side by side it builds a plain tantivy index with
the ``default`` tokenizer (lowercase, no folding, no stemming, no stopwords) over the SAME
chunks and runs a single-pass OR-of-terms query, and prints the ratios. Timings are
wall-clock on this machine; nothing here is part of the product.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tantivy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.corpus.store import Corpus  # noqa: E402

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "python-docs-3.11"
P = "/python-docs-3.11/library/"
QUERIES: list[tuple[str, str]] = [
    ("temporary directory that is deleted automatically", P + "tempfile.rst.txt"),
    ("how do I read a CSV file with a header row", P + "csv.rst.txt"),
    ("os.path.join", P + "os.path.rst.txt"),
    ('"context manager" that suppresses exceptions', P + "contextlib.rst.txt"),
    ("parse command line arguments and generate help messages", P + "argparse.rst.txt"),
    ("serialize python objects to a byte stream", P + "pickle.rst.txt"),
    ("regular expression match object groups", P + "re.rst.txt"),
    ("run a child process and capture its output", P + "subprocess.rst.txt"),
    ("dictionary that supplies default values for missing keys", P + "collections.rst.txt"),
    ("time zone aware datetime objects", P + "datetime.rst.txt"),
    ("decimal fixed point arithmetic rounding", P + "decimal.rst.txt"),
    ("send an email through an SMTP server", P + "smtplib.rst.txt"),
    ("test fixtures setUp tearDown assertions", P + "unittest.rst.txt"),
    ("cache the results of a function call lru", P + "functools.rst.txt"),
    ("read and write ZIP archives", P + "zipfile.rst.txt"),
    ("copy a whole directory tree recursively", P + "shutil.rst.txt"),
]


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _quality(ranked: list[list[str]]) -> tuple[float, float]:
    hit5 = sum(1 for (_, want), got in zip(QUERIES, ranked) if want in got[:5]) / len(QUERIES)
    mrr = 0.0
    for (_, want), got in zip(QUERIES, ranked):
        if want in got[:10]:
            mrr += 1.0 / (got.index(want) + 1)
    return hit5, mrr / len(QUERIES)


def _baseline(db_path: Path, workdir: Path, repeat: int) -> dict[str, float]:
    """Plain tantivy: default tokenizer, one OR-of-terms pass, same chunks."""
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("source", stored=True, tokenizer_name="raw")
    sb.add_text_field("body", tokenizer_name="default")
    schema = sb.build()
    workdir.mkdir(parents=True, exist_ok=True)
    index = tantivy.Index(schema, path=str(workdir))
    writer = index.writer(128_000_000)
    db = sqlite3.connect(db_path)
    t0 = time.perf_counter()
    for sid, text in db.execute("SELECT d.source_id, c.text FROM chunks c JOIN documents d "
                                "ON d.doc_id = c.doc_id"):
        writer.add_document(tantivy.Document(source=sid, body=text))
    writer.commit()
    writer.wait_merging_threads()
    build = time.perf_counter() - t0
    db.close()
    index.reload()
    searcher = index.searcher()
    analyzer = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple()).filter(
        tantivy.Filter.lowercase()).build()

    def run(q: str) -> list[str]:
        terms = list(dict.fromkeys(analyzer.analyze(q)))
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "body", t)) for t in terms])
        out: list[str] = []
        for _score, addr in searcher.search(query, 10).hits:
            out.append(searcher.doc(addr)["source"][0])
        return out

    ranked = [run(q) for q, _ in QUERIES]
    times = []
    for _ in range(repeat):
        for q, _ in QUERIES:
            t = time.perf_counter()
            run(q)
            times.append((time.perf_counter() - t) * 1000)
    hit5, mrr = _quality(ranked)
    return {"build_s": build, "p50_ms": _pct(times, 0.5), "p95_ms": _pct(times, 0.95),
            "hit5": hit5, "mrr": mrr,
            "tempfile_rank": (ranked[0].index(QUERIES[0][1]) + 1) if QUERIES[0][1] in ranked[0] else 0}


def bench(corpus_dir: Path, size: int, overlap: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="kith-bench-") as tmp:
        home = Path(tmp) / "home"
        with Corpus(home) as c:
            c.add_root(corpus_dir)
            db = sqlite3.connect(c.db_path)
            db.execute("UPDATE roots SET chunk_size=?, chunk_overlap=?", (size, overlap))
            db.commit()
            db.close()
            t0 = time.perf_counter()
            rep = c.sync()
            full = time.perf_counter() - t0
            t0 = time.perf_counter()
            c.sync()
            resync = time.perf_counter() - t0
            ranked = [[h.source_id for h in c.search_hits(q, limit=10)[0]] for q, _ in QUERIES]
            times = []
            for _ in range(repeat):
                for q, _ in QUERIES:
                    t = time.perf_counter()
                    c.search_hits(q, limit=10)
                    times.append((time.perf_counter() - t) * 1000)
            hit5, mrr = _quality(ranked)
            base = _baseline(c.db_path, Path(tmp) / "baseline", repeat)
        rank = (ranked[0].index(QUERIES[0][1]) + 1) if QUERIES[0][1] in ranked[0] else 0
        p50 = _pct(times, 0.5)
        print(f"\n== chunk_size={size} chunk_overlap={overlap}: {rep['indexed']} files, "
              f"{rep['chunks']} chunks")
        print(f"kith     : full sync {full:6.2f} s | re-sync {resync * 1000:7.1f} ms | "
              f"query p50 {p50:6.2f} ms p95 {_pct(times, 0.95):6.2f} ms | hit@5 {hit5:.2f} "
              f"MRR@10 {mrr:.2f} | tempfile rank {rank or '>10'}")
        print(f"baseline : build     {base['build_s']:6.2f} s |                    | "
              f"query p50 {base['p50_ms']:6.2f} ms p95 {base['p95_ms']:6.2f} ms | hit@5 "
              f"{base['hit5']:.2f} MRR@10 {base['mrr']:.2f} | tempfile rank "
              f"{base['tempfile_rank'] or '>10'}")
        print(f"ratio    : query p50 kith/baseline = {p50 / base['p50_ms']:.2f}x; "
              f"hit@5 {hit5:.2f} vs {base['hit5']:.2f}")
        for (q, want), got in zip(QUERIES, ranked):
            if want not in got[:5]:
                print(f"  miss@5: {q!r} -> {got[:3]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--sizes", default="1200:150", help="comma list of SIZE:OVERLAP")
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    if not args.corpus.is_dir():
        sys.exit(f"corpus folder not found: {args.corpus}")
    for spec in args.sizes.split(","):
        size, overlap = (int(x) for x in spec.split(":"))
        bench(args.corpus, size, overlap, args.repeat)


if __name__ == "__main__":
    main()
