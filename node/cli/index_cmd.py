"""``kith index add|config|sync|embed|status|import|watch`` and ``kith search`` (DESIGN §9, §11, §13).

The owner's local search sees every tier: no policy applies here (the egress gate
only guards what leaves the machine). In ``--json`` mode stdout carries only JSON
(``search`` and ``sync`` print one document; ``watch`` one object per line); progress
goes to stderr, and only on a terminal.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from node.cli.common import console, emit_json, err_console, home_of, safe_text, untrusted_console, warn
from node.answer.contract import TOP_K_DEFAULT
from node.common.errors import CorpusError

index_app = typer.Typer(
    name="index",
    help="Manage the local corpus: add source folders, sync, import records, watch, show status.",
    no_args_is_help=True,
)



class SyncMode(str, Enum):
    """``kith index sync --mode`` (DESIGN §9 table)."""

    new_only = "new_only"
    update_only = "update_only"
    full = "full"


_CHUNKER_HELP = "Chunker: recursive (default), markdown or fixed."


def _say(line: str) -> None:
    """Print one line that carries the corpus's own text (paths, file names, extraction
    errors): never markup, never a control character, never wrapped."""
    untrusted_console.print(line, soft_wrap=True)


def _root_json(root: Any) -> dict[str, Any]:
    return {"prefix": root.prefix, "sourcePrefix": f"/{root.prefix}/", "chunker": root.chunker,
            "chunkSize": root.chunk_size, "chunkOverlap": root.chunk_overlap}


@index_app.command("add")
def add_cmd(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Folder to index (its basename becomes the source prefix)."),
    name: Optional[str] = typer.Option(None, "--name", metavar="PREFIX",
                                       help="Source prefix to use instead of the folder's basename."),
    force: bool = typer.Option(False, "--force", help="Accept / or your home directory as a root."),
    chunker: str = typer.Option("recursive", "--chunker", help=_CHUNKER_HELP),
    chunk_size: int = typer.Option(1200, "--chunk-size", help="Characters per chunk (a ceiling)."),
    chunk_overlap: int = typer.Option(150, "--chunk-overlap",
                                      help="Characters repeated from the previous chunk (a ceiling, < size)."),
    json_out: bool = typer.Option(False, "--json", help="Print the new root as JSON."),
) -> None:
    """Register a folder as a source root (run `kith index sync` next).

    A sync skips hidden files and folders (.git, .venv), virtualenvs, node_modules,
    __pycache__ and Kith homes, and whatever the folder's .kithignore (gitignore syntax)
    lists."""
    from node.corpus.store import Corpus

    with Corpus(home_of(ctx)) as corpus:
        root = corpus.add_root(path, chunker=chunker, chunk_size=chunk_size,
                               chunk_overlap=chunk_overlap, name=name, force=force)
        overlaps = corpus.overlapping(root.path)
    for other in overlaps:
        inside = Path(root.path).is_relative_to(other.path)
        warn(f"/{root.prefix}/ overlaps the root /{other.prefix}/ ({other.path}): "
             + ("it lies inside it" if inside else "that root lies inside it")
             + "; its files are indexed twice, under both prefixes (`kith index remove PREFIX`)")
    if json_out:
        emit_json({**_root_json(root), "overlaps": [o.prefix for o in overlaps]})
    else:
        _say(f"added root /{root.prefix}/ <- {root.path} (run `kith index sync`)")


def _rules_naming(home: Path, prefix: str) -> list[str]:
    """Policy rules and overrides whose glob names the root ``prefix`` (``/prefix`` or
    below), as ``glob -> tier`` lines; [] when the policy cannot be read."""
    from node.common.errors import KithError
    from node.policy.store import Policy

    try:
        policy = Policy.load(home)
    except KithError:
        return []
    return policy.rules_naming(prefix)


@index_app.command("remove")
def remove_cmd(
    ctx: typer.Context,
    prefix: str = typer.Argument(..., help="The root's prefix (as in `kith index status`)."),
    json_out: bool = typer.Option(False, "--json", help="Print what was removed as JSON."),
) -> None:
    """Remove a source root and every document and chunk indexed from it (the files
    themselves are not touched). Its prefix is never given to a later root; policy rules
    that named it are listed (they then match nothing)."""
    from node.corpus.store import Corpus

    home = home_of(ctx)
    with Corpus(home) as corpus:
        rep = corpus.remove_root(prefix)
    rules = _rules_naming(home, rep["prefix"])
    if json_out:
        emit_json({**rep, "policyRules": rules})
        return
    _say(f"removed root /{rep['prefix']}/ ({rep['path']}): {rep['documents']} document(s), "
         f"{rep['chunks']} chunk(s)")
    if rules:
        _say(f"policy rules naming /{rep['prefix']}/ (they match nothing now; "
             "`kith policy unset GLOB` removes one):")
        for line in rules:
            _say(f"  {line}")


class DenseSwitch(str, Enum):
    """``kith index config --dense`` (the optional dense/hybrid pass)."""

    on = "on"
    off = "off"


class DenseModel(str, Enum):
    """``kith index config --dense-model`` (the dense pass's tier, issue 21)."""

    static = "static"
    minilm = "minilm"


@index_app.command("config")
def config_cmd(
    ctx: typer.Context,
    prefix: Optional[str] = typer.Argument(None, help="The root's prefix (as in `kith index status`)."),
    chunker: Optional[str] = typer.Option(None, "--chunker", help=_CHUNKER_HELP),
    chunk_size: Optional[int] = typer.Option(None, "--chunk-size", help="Characters per chunk."),
    chunk_overlap: Optional[int] = typer.Option(None, "--chunk-overlap", help="Overlap characters."),
    dense_switch: Optional[DenseSwitch] = typer.Option(
        None, "--dense", help="Turn the optional dense/hybrid pass on or off (needs "
                              "the hybrid extra: scripts/setup --hybrid; `kith index embed` computes the vectors)."),
    dense_model: Optional[DenseModel] = typer.Option(
        None, "--dense-model", help="The dense pass's model: static (the fast token table, "
                                    "default) or minilm (the full int8 MiniLM, better, slower "
                                    "to embed); run `kith index embed` after a switch."),
    json_out: bool = typer.Option(False, "--json", help="Print the root's settings as JSON."),
) -> None:
    """Change a root's chunker settings (the next sync re-chunks its documents), or turn
    the optional dense pass on or off (`--dense on|off`) and choose its model
    (`--dense-model static|minilm`), no prefix needed."""
    from node.corpus.store import Corpus

    if prefix is None:
        if dense_switch is None and dense_model is None:
            raise typer.BadParameter("give a root prefix, or --dense on|off / --dense-model",
                                     param_hint="PREFIX")
        from node.corpus import dense

        with Corpus(home_of(ctx)) as corpus:
            if dense_model is not None:
                st = dense.set_tier(corpus, dense_model.value)
            if dense_switch is not None:
                st = dense.set_enabled(corpus, dense_switch is DenseSwitch.on)
        if json_out:
            emit_json({"dense": st})
        else:
            _say(_dense_line(st))
        return
    if dense_switch is not None or dense_model is not None:
        raise typer.BadParameter("--dense and --dense-model take no root prefix (they apply to "
                                 "the whole corpus)", param_hint="--dense")
    with Corpus(home_of(ctx)) as corpus:
        root = corpus.configure_root(prefix.strip("/"), chunker=chunker, chunk_size=chunk_size,
                                     chunk_overlap=chunk_overlap)
    if json_out:
        emit_json(_root_json(root))
    else:
        console.print(f"/{escape(root.prefix)}/: {root.chunker}, size {root.chunk_size}, "
                      f"overlap {root.chunk_overlap} (run `kith index sync`)", highlight=False, soft_wrap=True)


def _dense_line(st: dict[str, Any]) -> str:
    state = "on" if st["enabled"] else "off"
    extra = "" if st["installed"] else " (the hybrid extra is not installed: the pass is skipped; scripts/setup --hybrid)"
    todo = f"; run `kith index embed` for {st['missing']} chunk(s)" if st["enabled"] and st["missing"] else ""
    reads = {"context": "; questions read in context (the table's projection)",
             "words": "; questions read word by word (a table distilled before its projection existed: move "
                      "<home>/models/minilm-l6-static-v2*.npy aside and run `kith index embed` to distil it "
                      "with one)"}.get(st.get("staticQueries") or "", "") if st.get("tier", "static") == "static" else ""
    return (f"dense pass {state}{extra}, model {st.get('tier', 'static')}: {st['vectors']}/"
            f"{st['chunks']} chunks embedded ({st['model']}){reads}{todo}")


def _embed(corpus: Any, *, json_out: bool, batch_size: int, enable: bool) -> dict[str, Any]:
    """Embed the missing vectors, with a progress bar on a terminal (stderr)."""
    from node.corpus import dense

    if json_out or not err_console.is_terminal:
        return dense.embed_missing(corpus, batch_size=batch_size, enable=enable)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("embedding"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def _progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return dense.embed_missing(corpus, batch_size=batch_size, progress=_progress,
                                   enable=enable)


def _embed_summary(rep: dict[str, Any]) -> str:
    made = (f"distilled the static table from the installed model in "
            f"{rep['distillSeconds']:.1f} s; " if rep.get("distillSeconds") else "")
    return (f"{made}embedded {rep['embedded']} chunk(s), {rep['current']} already current, "
            f"{rep['pruned']} stale vector(s) pruned, in {rep['seconds']:.1f} s "
            f"({rep['chunksPerSecond']:.1f} chunks/s); dense pass "
            f"{'on' if rep['enabled'] else 'off'}")


@index_app.command("embed")
def embed_cmd(
    ctx: typer.Context,
    batch_size: int = typer.Option(32, "--batch-size", min=1, max=1024, help="Chunks per model call."),
    json_out: bool = typer.Option(False, "--json", help="Print the embedding report as JSON."),
) -> None:
    """Compute the missing vectors of the optional dense/hybrid pass and turn it on
    (needs the hybrid extra, installed from the checkout: `scripts/setup --hybrid` or
    `pip install '.[hybrid]'`; runs offline on the CPU)."""
    from node.corpus import dense
    from node.corpus.store import Corpus

    if not dense.extra_available():
        raise dense.unavailable_error()
    with Corpus(home_of(ctx)) as corpus:
        rep = _embed(corpus, json_out=json_out, batch_size=batch_size, enable=True)
    if json_out:
        emit_json(rep)
    else:
        _say(_embed_summary(rep))


#: What each reason a sync skips a file for means, for a person (issue 20).
SKIP_REASONS = {"unchanged": "unchanged", "unsupported-type": "of a type kith does not read",
                "new-ignored": "new, not added by --mode update_only", "kith-home": "a Kith home folder"}


def _skipped_text(report: dict[str, Any]) -> str:
    """``skipped 3 (2 unchanged, 1 of a type kith does not read)``: the count and why."""
    reasons = {k: v for k, v in (report.get("skippedReasons") or {}).items() if v}
    why = ", ".join(f"{n} {SKIP_REASONS.get(k, k)}" for k, n in sorted(reasons.items()))
    return f"skipped {report['skipped']}" + (f" ({why})" if why else "")


def skipped_lines(entries: list[dict[str, Any]], limit: int = 20) -> list[str]:
    """One line per source a sync did not index for a reason other than ``unchanged``:
    ``  skipped /kb/blob.bin: of a type kith does not read``; at most ``limit``."""
    out = [f"  skipped {e['source']}: {SKIP_REASONS.get(e['reason'], e['reason'])}" for e in entries[:limit]]
    if len(entries) > limit:
        out.append(f"  (and {len(entries) - limit} more skipped; --json lists them)")
    return out


def _summary(report: dict[str, Any]) -> str:
    arch = report.get("archives") or {}
    extra = (f", archives {arch.get('indexed', 0)} indexed / {arch.get('refused', 0)} refused"
             if arch.get("indexed") or arch.get("refused") else "")
    ign = report.get("ignored") or {}
    if ign:
        extra += (f", not read {sum(ign.values())} ("
                  + ", ".join(f"{n} {why}" for why, n in sorted(ign.items())) + ")")
    return (f"indexed {report['indexed']}, updated {report['updated']}, {_skipped_text(report)}, "
            f"removed {report['removed']}, failed {report['failed']}, "
            f"empty {report['empty']}{extra}; {report['chunks']} chunks written "
            f"in {report['seconds']:.2f} s")


def _stamp() -> str:
    """The local time of a log line, ``2026-12-01 11:40:02``."""
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S")


def watch_lines(report: dict[str, Any]) -> list[str]:
    """The log lines of one watched batch: a timestamped line per document touched
    (``<time> updated /docs/a.md``), then the batch's summary (also used by
    ``kith host --watch``)."""
    stamp = _stamp()
    lines = [f"{stamp} {c['op']} {c['source']}" for c in report.get("changes") or []]
    if report.get("changesMore"):
        lines.append(f"{stamp} ... and {report['changesMore']} more")
    lines.append(f"{stamp} " + _summary(report))
    return lines


def _print_errors(report: dict[str, Any]) -> None:
    for err in report["errors"]:
        err_console.print(f"  [yellow]{escape(err['code'])}[/yellow] {escape(err['source'])}: "
                          f"{escape(err['message'])}", highlight=False, soft_wrap=True)


@index_app.command("sync")
def sync_cmd(
    ctx: typer.Context,
    mode: SyncMode = typer.Option(SyncMode.new_only, "--mode",
                             help="new_only (default): index new, replace changed; update_only: "
                                  "only replace changed; full: re-index everything. All remove "
                                  "files that are gone."),
    json_out: bool = typer.Option(False, "--json", help="Print the sync report as JSON (no progress bar)."),
) -> None:
    """Index new and changed files, drop removed ones. Exit 0 even when some files
    failed (they are listed); 1 only when the sync itself could not run; 130 when
    interrupted (Ctrl-C: what was done is kept; run sync again for the rest)."""
    from node.corpus.ingest import SyncInterrupted

    try:
        _sync(ctx, mode, json_out)
    except SyncInterrupted as stop:
        err_console.print(f"stopped after {stop.done} files; run sync again", highlight=False,
                          markup=False, soft_wrap=True)
        raise SystemExit(130) from None


def _sync(ctx: typer.Context, mode: SyncMode, json_out: bool) -> None:
    from node.corpus.store import Corpus

    with Corpus(home_of(ctx)) as corpus, corpus.record.faults():
        st = corpus.stats()
        if st["index_missing"]:  # said on stderr: --json keeps stdout to the report
            what = "cannot be read" if st["index_unreadable"] else "is missing"
            err_console.print(f"the search index (corpus/tantivy) {what}: rebuilding it from the corpus record",
                              highlight=False, markup=False, soft_wrap=True)
        elif not json_out and corpus.index_outdated():  # one notice; the progress follows
            err_console.print("the index was built by an older Kith (index schema or chunker "
                              "changed): every document is indexed again once",
                              highlight=False, markup=False, soft_wrap=True)
        if json_out or not err_console.is_terminal:
            report = corpus.sync(mode=mode.value)
        else:
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TransferSpeedColumn)

            with Progress(TextColumn("{task.fields[files]}"), BarColumn(), DownloadColumn(),
                          TransferSpeedColumn(), TimeElapsedColumn(),
                          TextColumn("{task.description}"), console=err_console,
                          transient=True) as bar:
                task = bar.add_task("", total=None, files="files 0/?")

                def _progress(done: int, total: int, source: str, done_b: int, total_b: int) -> None:
                    bar.update(task, completed=done_b, total=total_b or None,
                               files=f"files {done}/{total}",
                               description=escape(source[-40:]) if source else "")

                report = corpus.sync(progress=_progress, mode=mode.value)
        from node.corpus import dense  # light; the model loads only when the pass is on

        if dense.enabled(corpus) and dense.extra_available():
            report["dense"] = _embed(corpus, json_out=json_out, batch_size=dense.BATCH_SIZE,
                                     enable=False)
    from node.guest.copies.store import reindex_copies

    # the copies this node keeps are indexed like its own corpus: re-indexed with it when
    # the index schema or chunker changed (specs/copies.md §5)
    report["copiesReindexed"] = reindex_copies(home_of(ctx))
    from node.policy.outbound import write_fingerprints

    # the outbound gate's fingerprints of this node's own text, written at index time
    # (specs/agents.md §6); a check finding them older than the corpus rewrites them
    write_fingerprints(home_of(ctx))
    if json_out:
        emit_json(report)
        return
    console.print(_summary(report) + f" ({report['files']} files, {report['bytes']:,} bytes read)",
                  highlight=False, soft_wrap=True)
    for peer in report["copiesReindexed"]:
        _say(f"re-indexed the copy of {safe_text(peer)} (its index was of an older schema)")
    for line in skipped_lines([*report.get("skippedSources", []), *report.get("skippedFolders", [])]):
        _say(line)
    _print_errors(report)


@index_app.command("status")
def status_cmd(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print status as JSON."),
) -> None:
    """Show roots, per-root and per-status counts, failed and stale documents with reasons."""
    from node.corpus.store import Corpus

    from node.corpus import dense

    with Corpus(home_of(ctx), readonly=True) as corpus, corpus.record.faults():
        st = corpus.status_report()
        st["dense"] = dense.status(corpus)
    if json_out:
        emit_json(st)
        return
    for r in st["rootList"]:
        bs = r["byStatus"]
        _say(f"/{r['prefix']}/  <- {r['path']}  [{r['chunker']} {r['chunkSize']}/"
             f"{r['chunkOverlap']}]  documents {r['documents']} (done {bs['done']}, "
             f"failed {r['failed']}, empty {r['empty']}, processing {bs['processing']}, "
             f"stale {r['stale']}), "
             f"chunks {r['chunks']}")
    for d in st["datasources"]:
        _say(f"/{d['kind']}/{d['instance']}/  records {d['documents']}, chunks {d['chunks']}")
    console.print(
        f"documents {st['documents']} (done {st['done']}, failed {st['failed']}, "
        f"empty {st['empty']}, processing {st['processing']}, stale {st['stale']}), "
        f"chunks {st['chunks']}, ready {'yes' if st['ready'] else 'no'}, "
        f"last sync {st['last_sync'] or 'never'}", highlight=False, soft_wrap=True)
    if st["dense"]["enabled"] or st["dense"]["vectors"]:
        _say(_dense_line(st["dense"]))
    if st.get("record_lost"):
        _say("  the corpus record (corpus/corpus.sqlite3) is missing or empty, while an index built from it "
             "is here: its folders and documents are lost — add the folders again (`kith index add "
             "FOLDER`), then `kith index sync`")
    if st.get("index_unreadable"):
        _say("  the search index (corpus/tantivy) cannot be read: run `kith index sync` to rebuild it from "
             "the corpus record (nothing is read again)")
    elif st.get("index_missing"):
        _say("  the search index (corpus/tantivy) is missing: run `kith index sync` to rebuild it from "
             "the corpus record (nothing is read again)")
    if st["interrupted"]:
        _say("  the last sync did not finish (no sync is running): run `kith index sync`")
    for f in st["failedDocuments"]:
        _say(f"  {f['code']} {f['source']}: {f['message']}")
    for s in st["staleDocuments"]:
        _say(f"  stale {s} (changed since indexing; run `kith index sync`)")
    for s in st["processingDocuments"]:
        _say(f"  processing {s} (interrupted; the next sync redoes it)")
    for line in skipped_lines(st.get("skippedSources") or []):
        _say(line)


@index_app.command("import")
def import_cmd(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="JSON Lines file: one {id, text, ...} object per line."),
    kind: str = typer.Option(..., "--kind", help="Datasource kind, e.g. tickets (ids /<kind>/<instance>/<id>)."),
    instance: str = typer.Option(..., "--instance", help="Datasource instance, e.g. acme."),
    replace: bool = typer.Option(False, "--replace",
                                 help="Remove records of this kind/instance that are not in the file."),
    json_out: bool = typer.Option(False, "--json", help="Print the import report as JSON."),
) -> None:
    """Import datasource records (id, text, optional date/tags/project/workType/lifecycle/sourceSet)."""
    from node.corpus.store import Corpus

    with Corpus(home_of(ctx)) as corpus:
        report = corpus.import_records(file, kind=kind, instance=instance, replace=replace)
    if json_out:
        emit_json(report)
        return
    _say(f"/{kind}/{instance}/: {report['records']} records; indexed {report['indexed']}, "
         f"updated {report['updated']}, unchanged {report['skipped']}, removed "
         f"{report['removed']}, failed {report['failed']}; {report['chunks']} chunks "
         f"in {report['seconds']:.2f} s")
    for err in report["errors"]:
        err_console.print(f"  line {err.get('line')}: {err['code']} - {err['message']}",
                          highlight=False, markup=False, soft_wrap=True)


@index_app.command("watch")
def watch_cmd(
    ctx: typer.Context,
    debounce_ms: int = typer.Option(400, "--debounce-ms", min=50, max=60000,
                                    help="Batch changes arriving within this many ms."),
    json_out: bool = typer.Option(False, "--json", help="One JSON report per line (catch-up sync, then each batch)."),
) -> None:
    """Keep the index current: sync once, then re-index added, changed and deleted files
    as they happen (holds the index writer until Ctrl-C)."""
    from node.corpus.watch import CorpusWatcher

    def on_report(report: dict[str, Any]) -> None:
        if json_out:
            emit_json({"event": "index-updated", **report})
        else:
            for line in watch_lines(report):
                _say(line)
            _print_errors(report)

    watcher = CorpusWatcher(home_of(ctx), debounce_ms=debounce_ms, on_report=on_report)
    try:
        report = watcher.start()
        if json_out:
            emit_json({"event": "index-synced", **report})
        else:
            console.print(f"{_stamp()} catch-up: " + _summary(report), highlight=False,
                          markup=False, soft_wrap=True)
            _print_errors(report)
            err_console.print(f"watching {len(watcher.paths())} root(s); Ctrl-C to stop",
                              highlight=False, soft_wrap=True)
        watcher.run()
    except KeyboardInterrupt:
        pass
    finally:
        watcher.close()


def search_cmd(
    ctx: typer.Context,
    query: str = typer.Argument(..., help="What to look for."),
    top_k: int = typer.Option(TOP_K_DEFAULT, "--top-k", help="Number of results (1-20)."),
    json_out: bool = typer.Option(False, "--json", help="Print the bare envelope as one JSON document (when the index cannot answer: the {\"error\": ...} object instead, exit 1)."),
    dedupe: str = typer.Option("chunk", "--dedupe", help="'chunk' (at most 2 per document) or 'document' (one)."),
    budget_ms: Optional[int] = typer.Option(None, "--budget-ms", help="remainingBudgetMs: search time allowed (ms; 0 = none)."),
    sources: Optional[list[str]] = typer.Option(None, "--source", help="Only sources matching this glob (repeatable)."),
) -> None:
    """Search the local corpus (the owner sees everything; no policy applies).

    Answered by the one answer service as the owner, with the same statuses, budgets,
    dedupe and index-syncing rules as the local API's POST /search. Results are printed
    like `kith join` prints a host's answer; --json prints the envelope instead. When the
    index cannot answer (index-unavailable, exit 1), --json prints the one
    {"error": {"code", "message", "hint"}} object every failing --json command prints.
    """
    from node.answer.service import answer_local
    from node.corpus.store import Corpus, index_denied

    body: dict[str, Any] = {"query": query, "topK": top_k, "dedupe": dedupe}
    if budget_ms is not None:
        body["remainingBudgetMs"] = budget_ms
    if sources:
        body["sources"] = list(sources)
    opened: CorpusError | None = None
    try:
        corpus = Corpus(home_of(ctx), readonly=True)
    except CorpusError as exc:
        corpus, opened = None, exc  # answered as index-unavailable, like the local API
    if corpus is not None:
        try:  # a killed sync's record is replayed, an older schema rebuilt, when no writer runs
            corpus.repair_lag(warn)
        except CorpusError:
            pass  # a corrupt index: the search below answers index-unavailable
    interrupted = False
    try:
        if corpus is not None:
            with corpus.record.faults():  # a damaged record read mid-search: corpus-corrupt
                answer = answer_local(corpus, body)
                if answer["envelope"].get("reason") == "index-syncing" or answer["envelope"].get("indexSyncing"):
                    interrupted = not corpus.stats().get("sync_running")  # and no sync runs to finish it
        else:
            answer = answer_local(corpus, body)
    finally:
        if corpus is not None:
            corpus.close()
    if interrupted:  # said on stderr: --json keeps stdout to the envelope
        err_console.print("note: the last sync did not finish (no sync is running): run `kith index sync` to "
                          "finish it", highlight=False, markup=False, soft_wrap=True)
    envelope = answer["envelope"]
    status = answer["status"]
    if status == "invalid-request":
        err = answer.get("error") or {"code": "query-invalid", "message": "invalid request"}
        raise CorpusError(err["code"], err["message"])
    if status == "index-unavailable":
        exc = opened or CorpusError("index-unavailable")
        denied = None if corpus is None else index_denied(corpus.index_dir)
        if denied is not None:  # a permission: `kith index sync` would fail the same way
            exc = CorpusError("index-unavailable", denied.message, hint=denied.hint)
        raise exc  # under --json the dispatcher prints the one {"error": ...} object
    if json_out:
        emit_json(envelope)
        return
    if not envelope["results"]:
        console.print(f"no results ({envelope['reason']})", highlight=False, soft_wrap=True)
        return
    from node.cli.render import print_answer

    # the same lines as `kith join` / `kith ask` (node/cli/render.py): rank, source, page and
    # line range, heading path, preview, the extractive answer
    print_answer({"query_id": "search", "status": status, "envelope": envelope}, console)
