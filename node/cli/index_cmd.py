"""``kith index add|sync|status`` and ``kith search`` (DESIGN §9, §11, §13).

The owner's local search sees every tier: no policy applies here (the egress gate
only guards what leaves the machine). In ``--json`` mode stdout carries only JSON
(``search`` prints the bare envelope as one document); progress goes to stderr.
"""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from node.cli.common import console, emit_json, err_console, home_of
from node.corpus.envelope import build_envelope, empty_envelope, validate_search_request
from node.corpus.store import Corpus
from node.errors import CorpusError

index_app = typer.Typer(
    name="index",
    help="Manage the local corpus: add source folders, sync them, show status.",
    no_args_is_help=True,
)


@index_app.command("add")
def add_cmd(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Folder to index (its basename becomes the source prefix)."),
    json_out: bool = typer.Option(False, "--json", help="Print the new root as JSON."),
) -> None:
    """Register a folder as a source root (run `kith index sync` next)."""
    with Corpus(home_of(ctx)) as corpus:
        root = corpus.add_root(path)
    if json_out:
        emit_json({"prefix": root.prefix, "sourcePrefix": f"/{root.prefix}/",
                   "chunker": root.chunker, "chunkSize": root.chunk_size,
                   "chunkOverlap": root.chunk_overlap})
    else:
        console.print(f"added root [bold]/{root.prefix}/[/bold] (run `kith index sync`)",
                      highlight=False)


@index_app.command("sync")
def sync_cmd(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print the sync report as JSON."),
) -> None:
    """Index new and changed files, drop removed ones. Exit 0 even when some files
    failed (they are listed); 1 only when the sync itself could not run."""
    with Corpus(home_of(ctx)) as corpus:
        with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=err_console,
                      transient=True) as bar:
            task = bar.add_task("syncing", total=None)

            def _progress(done: int, total: int, source: str) -> None:
                bar.update(task, completed=done, total=total,
                           description=(source[-40:] if source else "syncing"))

            report = corpus.sync(progress=_progress)
    if json_out:
        emit_json(report)
        return
    console.print(
        f"indexed {report['indexed']}, updated {report['updated']}, skipped "
        f"{report['skipped']}, removed {report['removed']}, failed {report['failed']}, "
        f"empty {report['empty']}; {report['chunks']} chunks written "
        f"in {report['seconds']:.2f} s", highlight=False)
    for err in report["errors"]:
        err_console.print(f"  [yellow]{err['code']}[/yellow] {escape(err['source'])}: "
                          f"{escape(err['message'])}",
                          highlight=False)


@index_app.command("status")
def status_cmd(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print status as JSON."),
) -> None:
    """Show roots, document/chunk counts and whether the index is ready."""
    with Corpus(home_of(ctx), readonly=True) as corpus:
        stats = corpus.stats()
        roots = [{"prefix": r.prefix, "path": r.path} for r in corpus.roots()]
    if json_out:
        emit_json({**stats, "rootList": roots})
        return
    for r in roots:
        console.print(f"/{r['prefix']}/  <- {r['path']}", highlight=False, markup=False)
    console.print(
        f"documents {stats['documents']} (done {stats['done']}, failed {stats['failed']}, "
        f"empty {stats['empty']}, stale {stats['stale']}), chunks {stats['chunks']}, "
        f"ready {'yes' if stats['ready'] else 'no'}, last sync {stats['last_sync'] or 'never'}",
        highlight=False)


def search_cmd(
    ctx: typer.Context,
    query: str = typer.Argument(..., help="What to look for."),
    top_k: int = typer.Option(5, "--top-k", help="Number of results (1-20)."),
    json_out: bool = typer.Option(False, "--json", help="Print the bare envelope as one JSON document."),
) -> None:
    """Search the local corpus (the owner sees everything; no policy applies)."""
    request = validate_search_request({"query": query, "topK": top_k})
    with Corpus(home_of(ctx), readonly=True) as corpus:
        try:
            hits, controller = corpus.search_hits(request["query"], limit=request["topK"],
                                                  filters=request["filters"])
        except CorpusError as exc:
            if exc.code != "index-unavailable":
                raise
            if not json_out:
                raise
            emit_json(empty_envelope("index-unavailable", request))
            err_console.print(f"[red]error[/red] {escape(f'[{exc.code}]')}: {escape(exc.message)}",
                              highlight=False)
            raise SystemExit(1) from None  # the envelope is stdout's only JSON document
        envelope = build_envelope(request, hits, controller)
    if json_out:
        emit_json(envelope)
        return
    if not envelope["results"]:
        console.print(f"no results ({envelope['reason']})", highlight=False)
        return
    for i, res in enumerate(envelope["results"], start=1):
        loc = res["provenance"]["location"]
        console.print(f"[bold]{i}. {escape(res['source'])}[/bold]:{loc.get('lineStart')}-"
                      f"{loc.get('lineEnd')}  score {res['score']:.4f}", highlight=False)
        console.print(f"   {res['textPreview']}", highlight=False, markup=False)
