"""Benchmark the corpus: sync speed, re-sync share, peak RSS and watch latency beside their targets, then sync/query/quality per chunk size.

Usage::

    .venv/bin/python scripts/bench_corpus.py [--corpus DIR] [--sizes 1200:150]
        [--repeat 30] [--synthetic-chunks 100000] [--targets-only] [--breakdown] [--ablation]

Part 1 (issue 3 targets, one run, all timings in process — interpreter start-up excluded):

- full sync of the corpus vs a *raw* tantivy build of the same text (read each file, add
  it as one document to a one-field default-tokenizer index, commit; no parsing, no
  chunking, no SQLite): ratio, target <= 3;
- re-sync of the unchanged corpus / full sync: target <= 5 %;
- a synthetic corpus of ``--synthetic-chunks`` chunks indexed in a child process whose
  peak RSS (``VmHWM``) is reported: target <= 600 MB. The child's files live in a
  temporary folder that is removed afterwards;
- watch latency: a file written into a watched root until it is searchable.

``--breakdown`` (instead of part 1 and 2) explains the full-sync ratio (issue 10 item 6):
the raw build and a full sync interleaved ``--repeat-builds`` times (the best of each
kept), the sync's time per stage as the sync itself measures it
(:attr:`node.corpus.ingest.Writer.stages`: walk, read = bytes + SHA-256, parse = decode +
parse, chunk, record = SQLite, index = tantivy documents, commit = tantivy commit), the
floor Kith's schema sets (the chunks already in SQLite put into tantivy with Kith's
fields and analyzers, nothing else), and the unchanged re-sync. The ``exact`` field
(unstemmed, with positions) and ``ident`` serve quoted phrases and identifiers, which the
issues require: the floor is part of the product, not overhead.

``--ablation`` (instead of part 1 and 2; issue 21 item 5): the sync's index stage —
documents built in Python, added, committed — with each of Kith's fields or index
options left out or changed (:data:`ABLATIONS`), interleaved ``--repeat-builds`` times
with the raw build; what a field earns is measured by ``scripts/eval --split dev``.

Part 2 (per ``--sizes``): full sync, re-sync, warm query p50/p95 over questions with
known answers, hit@5 and MRR@10, next to a bare single-pass tantivy baseline over the
same chunks. Timings are wall-clock on this machine; nothing here is part of the product.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

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


def raw_tantivy_build(corpus_dir: Path, workdir: Path) -> tuple[float, int]:
    """Read every .txt/.rst/.md file, add it whole to a one-field index, commit: seconds."""
    files = sorted(p for p in corpus_dir.rglob("*") if p.is_file()
                   and p.suffix in (".txt", ".rst", ".md"))
    t0 = time.perf_counter()
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("body", tokenizer_name="default")
    schema = sb.build()
    workdir.mkdir(parents=True, exist_ok=True)
    index = tantivy.Index(schema, path=str(workdir))
    writer = index.writer(128_000_000)
    for p in files:
        writer.add_document(tantivy.Document(body=p.read_bytes().decode("utf-8", "replace")))
    writer.commit()
    writer.wait_merging_threads()
    return time.perf_counter() - t0, len(files)


def kith_schema_build(db_path: Path, workdir: Path) -> float:
    """Seconds to put the chunks already in SQLite into a fresh index with Kith's schema
    and analyzers, through a writer set up as the sync's (heap, indexing threads): the
    part of a sync that is tantivy's work alone."""
    from node.corpus import record, search

    workdir.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(db_path)
    rows = list(record.iter_chunks_for_index(db))
    db.close()
    t0 = time.perf_counter()
    index = tantivy.Index(search.build_schema(), path=str(workdir))
    search.register_analyzers(index)
    writer = index.writer(record._WRITER_HEAP, record._WRITER_THREADS)  # the sync's writer
    for cid, did, text, title, defines in rows:
        writer.add_document(search.make_document(cid, did, text, title, defines))
    writer.commit()
    writer.wait_merging_threads()
    return time.perf_counter() - t0


def breakdown(corpus_dir: Path, repeat: int) -> None:
    """Print where a full sync's time goes next to the raw build (see module doc)."""
    from node.corpus import ingest

    print(f"== full-sync breakdown of {corpus_dir.name} (best of {repeat}; wall / process "
          "CPU; ratio to the raw tantivy build)")
    with tempfile.TemporaryDirectory(prefix="kith-bench-") as tmp:
        raws, syncs, resyncs, floors = [], [], [], []
        for i in range(repeat):  # interleaved: each measure sees the same machine state
            work = Path(tmp) / f"raw{i}"
            c0 = time.process_time()
            wall, _ = raw_tantivy_build(corpus_dir, work)
            raws.append((wall, time.process_time() - c0))
            shutil.rmtree(work)
            with Corpus(Path(tmp) / f"home{i}") as c:
                c.add_root(corpus_dir)
                stages: dict[str, float] = {}
                t0, c0 = time.perf_counter(), time.process_time()
                rep = c.sync(timings=stages)
                syncs.append((time.perf_counter() - t0, time.process_time() - c0, stages, rep))
                t0 = time.perf_counter()
                c.sync()
                resyncs.append(time.perf_counter() - t0)
                db_path = c.db_path
            floors.append(kith_schema_build(db_path, Path(tmp) / f"floor{i}"))
            shutil.rmtree(Path(tmp) / f"home{i}")
            shutil.rmtree(Path(tmp) / f"floor{i}")
    rw, rc = min(w for w, _ in raws), min(c for _, c in raws)
    sw, sc, stages, rep = min(syncs, key=lambda x: x[0])
    print(f"{'raw tantivy (files, default tokenizer)':44} {rw:6.2f} s  1.00x | cpu {rc:6.2f} s")
    print(f"{'full sync':44} {sw:6.2f} s {sw / rw:5.2f}x | cpu {min(x[1] for x in syncs):6.2f} s "
          f"{min(x[1] for x in syncs) / rc:5.2f}x  ({rep['indexed']} files, "
          f"{rep['chunks']} chunks)")
    for name in ingest.STAGES:
        print(f"  {name:42} {stages[name]:6.2f} s {stages[name] / rw:5.2f}x  "
              f"({100 * stages[name] / sw:4.1f} % of the sync)")
    other = sw - sum(stages.values())
    print(f"  {'(other: bookkeeping, progress, removals)':42} {other:6.2f} s {other / rw:5.2f}x")
    fl = min(floors)
    print(f"{'kith schema only (chunks from SQLite)':44} {fl:6.2f} s {fl / rw:5.2f}x  "
          "(no parse, chunk or SQLite: the floor the schema sets)")
    print(f"{'unchanged re-sync':44} {min(resyncs):6.2f} s  = {100 * min(resyncs) / sw:.2f} % "
          "of the full sync")
    print(f"RATIOS: full sync / raw tantivy = {sw / rw:.2f}x (issue 21 target <= 5) | re-sync / full = "
          f"{100 * min(resyncs) / sw:.2f} % (target <= 5 %)")


def _variant_schema(drop: frozenset[str], options: dict[str, str]) -> Any:
    """Kith's schema (:data:`node.corpus.search.SCHEMA_FIELDS`) without the fields in
    ``drop``, with ``options`` overriding a field's index option (``{"exact": "freq"}``)."""
    from node.corpus import search

    return search.build_schema((name, tok, options.get(name, opt), stored)
                               for name, tok, opt, stored in search.SCHEMA_FIELDS if name not in drop)


#: The ablation's variants: (label, fields left out, index-option overrides).
ABLATIONS: list[tuple[str, frozenset[str], dict[str, str]]] = [
    ("kith schema (as shipped)", frozenset(), {}),
    ("- exact", frozenset({"exact"}), {}),
    ("exact without positions (freq)", frozenset(), {"exact": "freq"}),
    ("- ident", frozenset({"ident"}), {}),
    ("- section", frozenset({"section"}), {}),
    ("- title", frozenset({"title"}), {}),
    ("chunk_id basic (no positions)", frozenset(), {"chunk_id": "basic"}),
    ("body only (+ ids)", frozenset({"exact", "ident", "section", "title"}), {}),
]


def ablation(corpus_dir: Path, repeat: int) -> None:
    """Print tantivy's cost per field: the sync's index stage (documents built and added,
    committed) with each field or option of :data:`ABLATIONS` changed, interleaved
    ``repeat`` times beside the raw build; best wall and process CPU of each."""
    from node.corpus import record, search

    print(f"== field ablation on {corpus_dir.name} (best of {repeat}; wall / process CPU; "
          "ratio to the raw tantivy build)")
    with tempfile.TemporaryDirectory(prefix="kith-bench-") as tmp:
        with Corpus(Path(tmp) / "home") as c:
            c.add_root(corpus_dir)
            c.sync()
            db = sqlite3.connect(c.db_path)
            rows = list(record.iter_chunks_for_index(db))
            db.close()
        results: dict[str, list[tuple[float, float, float]]] = {}
        raws: list[tuple[float, float]] = []
        for i in range(repeat):
            work = Path(tmp) / f"raw{i}"
            c0 = time.process_time()
            wall, _ = raw_tantivy_build(corpus_dir, work)
            raws.append((wall, time.process_time() - c0))
            shutil.rmtree(work)
            for label, drop, options in ABLATIONS:
                work = Path(tmp) / f"v{i}"
                work.mkdir()
                kept = {name for name, *_ in search.SCHEMA_FIELDS} - drop
                t0, c0 = time.perf_counter(), time.process_time()
                index = tantivy.Index(_variant_schema(drop, options), path=str(work))
                search.register_analyzers(index)
                writer = index.writer(record._WRITER_HEAP, record._WRITER_THREADS)
                build = 0.0
                for cid, did, text, title, defines in rows:
                    b0 = time.process_time()
                    doc = tantivy.Document(**search.document_fields(cid, did, text, title, kept,
                                                                         defines))
                    build += time.process_time() - b0
                    writer.add_document(doc)
                writer.commit()
                writer.wait_merging_threads()
                del writer, index
                results.setdefault(label, []).append(
                    (time.perf_counter() - t0, time.process_time() - c0, build))
                shutil.rmtree(work)
    rw, rc = min(w for w, _ in raws), min(c for _, c in raws)
    print(f"{'raw tantivy (files, default tokenizer)':40} {rw:6.2f} s  1.00x | cpu {rc:6.2f} s  1.00x")
    base = min(w for w, _, _ in results[ABLATIONS[0][0]])
    for label, _, _ in ABLATIONS:
        w = min(x[0] for x in results[label])
        cpu = min(x[1] for x in results[label])
        py = min(x[2] for x in results[label])
        print(f"{label:40} {w:6.2f} s {w / rw:5.2f}x | cpu {cpu:6.2f} s {cpu / rc:5.2f}x"
              f" | documents built {py:5.2f} s cpu | saves {base - w:+5.2f} s wall")
    print(f"({len(rows)} chunks; 'documents built' = Python's part, in the main thread)")


def _rss_child(n_chunks: int, workdir: Path) -> None:
    """(child process) Build a synthetic corpus of about ``n_chunks`` chunks, sync it,
    print ``chunks peak_rss_mb seconds``."""
    rnd = random.Random(42)
    vocab = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ra", "su", "ti", "vo", "ze")
             for b in ("bar", "cen", "dil", "fom", "gur", "hax", "jin", "kel", "lum", "mor",
                       "nep", "oth", "pra", "quil", "ros", "sab", "tor", "ulm", "vex", "wyn")]
    root = workdir / "synthetic"
    root.mkdir()
    size = 300  # chunk size of the synthetic root: ~260-char paragraphs, one per chunk
    per_file = 100
    files = max(1, n_chunks // per_file)
    for f in range(files):
        paras = [" ".join(rnd.choice(vocab) for _ in range(40))[:260] for _ in range(per_file)]
        (root / f"doc{f:05d}.txt").write_text("\n\n".join(paras), "utf-8")
    with Corpus(workdir / "home") as c:
        c.add_root(root, chunk_size=size, chunk_overlap=0)
        t0 = time.perf_counter()
        rep = c.sync()
        secs = time.perf_counter() - t0
    peak_kb = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                peak_kb = int(line.split()[1])
    print(f"{rep['chunks']} {peak_kb / 1024:.1f} {secs:.2f}")


def synthetic_rss(n_chunks: int) -> tuple[int, float, float]:
    with tempfile.TemporaryDirectory(prefix="kith-bench-rss-") as tmp:
        out = subprocess.run([sys.executable, __file__, "--rss-child", str(n_chunks), tmp],
                             check=True, capture_output=True, text=True, timeout=1800)
    chunks, mb, secs = out.stdout.split()
    return int(chunks), float(mb), float(secs)


def watch_latency(tries: int = 5) -> list[float]:
    from node.corpus.watch import CorpusWatcher

    out = []
    with tempfile.TemporaryDirectory(prefix="kith-bench-watch-") as tmp:
        root = Path(tmp) / "w"
        root.mkdir()
        (root / "seed.txt").write_text("seed\n")
        with Corpus(Path(tmp) / "home") as c:
            c.add_root(root)
        w = CorpusWatcher(Path(tmp) / "home", debounce_ms=200)
        w.start()
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        time.sleep(0.5)
        ro = Corpus(Path(tmp) / "home", readonly=True)
        try:
            for i in range(tries):
                word = f"watchword{i}x"
                t0 = time.perf_counter()
                (root / f"n{i}.txt").write_text(f"the {word}\n")
                while not ro.search_hits(word, limit=1)[0]:
                    if time.perf_counter() - t0 > 30:
                        break
                    time.sleep(0.02)
                out.append(time.perf_counter() - t0)
        finally:
            ro.close()
            w.stop()
            t.join(10)
            w.close()
    return out


def targets(corpus_dir: Path, n_chunks: int) -> None:
    print("== issue 3 targets (in-process timings)")
    with tempfile.TemporaryDirectory(prefix="kith-bench-") as tmp:
        raw, nfiles = raw_tantivy_build(corpus_dir, Path(tmp) / "raw")
        with Corpus(Path(tmp) / "home") as c:
            c.add_root(corpus_dir)
            t0 = time.perf_counter()
            rep = c.sync()
            full = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = c.sync()
            resync = time.perf_counter() - t0
            floor = kith_schema_build(c.db_path, Path(tmp) / "schema-only")
    assert again["chunks"] == 0
    print(f"full sync      : {full:6.2f} s ({rep['indexed']} files, {rep['chunks']} chunks)")
    print(f"raw tantivy    : {raw:6.2f} s ({nfiles} files read+add+commit, no parsing)")
    print(f"kith schema    : {floor:6.2f} s (the same chunks into tantivy with Kith's "
          f"analyzers/fields only: no parse, chunk or SQLite = {floor / raw:.2f}x raw)")
    print(f"re-sync        : {resync * 1000:6.1f} ms (unchanged corpus)")
    lat = watch_latency()
    print(f"watch latency  : median {statistics.median(lat):.2f} s, max {max(lat):.2f} s "
          f"(file written -> searchable, debounce 200 ms)")
    chunks, mb, secs = synthetic_rss(n_chunks)
    print(f"synthetic      : {chunks} chunks in {secs:.1f} s, peak RSS {mb:.0f} MB")
    print(f"RATIOS         : full sync / raw tantivy = {full / raw:.2f} (issue 21 target <= 5) | "
          f"re-sync / full sync = {100 * resync / full:.2f} % (target <= 5 %) | "
          f"peak RSS {mb:.0f} MB / 600 MB = {mb / 600:.2f} (target <= 1)")


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Benchmark the corpus. Part 1: a full sync of --corpus beside a raw tantivy "
                    "build of the same text (issue 21 target <= 5x), the unchanged re-sync's share (<= 5 %), "
                    "the peak RSS of indexing --synthetic-chunks chunks (<= 600 MB) and watch "
                    "latency. Part 2: per --sizes, sync, re-sync, warm query p50/p95, hit@5 and "
                    "MRR@10 beside a bare tantivy baseline. Timings are wall-clock on this machine: "
                    "run under the shared benchmark lock (flock /tmp/kith-bench.lock).")
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                    help="folder of documents to index (default: %(default)s)")
    ap.add_argument("--sizes", default="1200:150",
                    help="part 2's chunker settings, a comma list of SIZE:OVERLAP in characters, "
                         "e.g. 800:100,1200:150 (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=30,
                    help="part 2: timed passes over the query set per size, for p50/p95 "
                         "(default: %(default)s)")
    ap.add_argument("--synthetic-chunks", type=int, default=100_000,
                    help="part 1: chunks in the synthetic corpus whose indexing peak RSS is "
                         "measured (default: 100,000)")
    ap.add_argument("--targets-only", action="store_true", help="only part 1")
    ap.add_argument("--breakdown", action="store_true",
                    help="instead of parts 1 and 2: the full sync's time per stage (walk, read, "
                         "parse, chunk, SQLite record, tantivy documents, commit) beside the raw "
                         "build, the Kith-schema floor and the re-sync")
    ap.add_argument("--ablation", action="store_true",
                    help="instead of parts 1 and 2: the sync's index stage (documents built, "
                         "added, committed) with each of Kith's tantivy fields or index options "
                         "left out or changed, beside the raw build (ABLATIONS)")
    ap.add_argument("--repeat-builds", type=int, default=3,
                    help="--breakdown, --ablation: interleaved runs of each build (the best is kept; "
                         "default: %(default)s)")
    ap.add_argument("--rss-child", nargs=2, metavar=("CHUNKS", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        _rss_child(int(args.rss_child[0]), Path(args.rss_child[1]))
        return
    if not args.corpus.is_dir():
        sys.exit(f"corpus folder not found: {args.corpus}")
    if args.breakdown:
        breakdown(args.corpus, args.repeat_builds)
        return
    if args.ablation:
        ablation(args.corpus, args.repeat_builds)
        return
    targets(args.corpus, args.synthetic_chunks)
    if args.targets_only:
        return
    for spec in args.sizes.split(","):
        size, overlap = (int(x) for x in spec.split(":"))
        bench(args.corpus, size, overlap, args.repeat)


if __name__ == "__main__":
    main()
