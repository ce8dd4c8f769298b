"""`kith index add|sync|status` and `kith search` through the typer app (DESIGN §11, §13)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import typer
from typer.testing import CliRunner

from support.homes import initialized
from node.cli import main as cli_main
from node.cli.index_cmd import index_app, search_cmd

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[1] / "specs" / "search-envelope.schema.json").read_text())


def _app() -> typer.Typer:
    """The real root callback (--home) with only this module's commands attached, so the
    test does not depend on other command modules."""
    app = typer.Typer()
    app.callback()(cli_main._root)
    app.add_typer(index_app, name="index")
    app.command("search")(search_cmd)
    return app


@pytest.fixture()
def env(tmp_path: Path):
    root = tmp_path / "kb"
    root.mkdir()
    (root / "deploy.md").write_text("# Deploy\n\nThe staging server is deleted every night.\n")
    (root / "bad.txt").write_bytes(b"\x00\x01binary")
    runner = CliRunner()
    app = _app()

    def run(*args: str):
        return runner.invoke(app, ["--home", str(initialized(tmp_path / "home")), *args])

    return run, root


def test_add_sync_status_search_json(env) -> None:
    run, root = env
    r = run("index", "add", str(root), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"prefix": "kb", "sourcePrefix": "/kb/", "chunker": "recursive",
                                    "chunkSize": 1200, "chunkOverlap": 150, "overlaps": []}
    r = run("index", "add", str(root))
    assert r.exit_code == 1 and getattr(r.exception, "code", None) == "root-exists"

    r = run("index", "sync", "--json")
    assert r.exit_code == 0, r.output  # a failed file is reported, not a failed sync
    rep = json.loads(r.stdout)
    assert rep["indexed"] == 1 and rep["failed"] == 1
    assert rep["errors"][0]["source"] == "/kb/bad.txt" and rep["errors"][0]["code"] == "binary"

    r = run("index", "status", "--json")
    st = json.loads(r.stdout)
    assert st["ready"] is True and st["done"] == 1 and st["failed"] == 1

    r = run("search", "staging server", "--top-k", "3", "--json")
    assert r.exit_code == 0, r.output
    envl = json.loads(r.stdout)  # one bare JSON document
    jsonschema.validate(envl, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert envl["results"][0]["source"] == "/kb/deploy.md"
    assert str(root) not in r.stdout

    r = run("search", "nothing-like-this-zz", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["reason"] == "no-verified-results"


def test_human_output(env) -> None:
    run, root = env
    run("index", "add", str(root))
    r = run("index", "sync")
    assert r.exit_code == 0 and "indexed 1" in r.stdout
    r = run("search", "staging")
    assert r.exit_code == 0 and "/kb/deploy.md" in r.stdout and "staging server" in r.stdout
    r = run("index", "status")
    assert "/kb/" in r.stdout and "ready yes" in r.stdout


def test_a_home_indexed_by_an_older_kith_is_indexed_again_with_one_notice(env, tmp_path) -> None:
    """Issue 40: a new chunker (or index schema) re-indexes every document at the next
    sync, which says so once; the sync after it is quiet."""
    import sqlite3

    run, root = env
    run("index", "add", str(root))
    assert "indexed again" not in run("index", "sync").output
    db = sqlite3.connect(tmp_path / "home" / "corpus" / "corpus.sqlite3")
    with db:  # what an older chunker left behind
        db.execute("UPDATE documents SET chunker_sig = 'recursive:v1:1200:150'")
    db.close()
    r = run("index", "sync")
    assert r.exit_code == 0 and "every document is indexed again once" in r.output
    assert "updated 1" in r.stdout
    r = run("index", "sync")
    assert "indexed again" not in r.output and "updated 0" in r.stdout


def test_search_before_any_sync(env) -> None:
    run, _ = env
    r = run("search", "staging", "--json")  # the {"error"} object: the real process's test below
    assert r.exit_code == 1 and getattr(r.exception, "code", None) == "index-unavailable"
    r = run("search", "staging")
    assert r.exit_code == 1 and getattr(r.exception, "code", None) == "index-unavailable"


@pytest.mark.parametrize("damage", ["never synced", "index folder deleted"])
def test_search_json_without_an_index_prints_the_error_object(tmp_path: Path, damage: str) -> None:
    """`kith search --json` on a home whose index cannot answer: stdout is the one
    `{"error": ...}` object every failing `--json` command prints (specs/error-codes.md), exit 1.
    With and without --json the refusal is said once on stderr: no `search failed:` log
    line beside it (the answer service logs only a peer's failing search)."""
    import shutil

    from support.cli import kith
    from support.homes import indexed_docs

    if damage == "never synced":
        home = initialized(tmp_path / "home")
    else:
        home, _ = indexed_docs(tmp_path, {"deploy.md": "# Deploy\n\nThe staging server is deleted.\n"})
        initialized(home)
        shutil.rmtree(home / "corpus" / "tantivy")
    r = kith(home, "search", "staging", "--json")
    assert r.returncode == 1, r.stderr
    error = json.loads(r.stdout)  # one document: a caller parses stdout whole
    assert error["error"]["code"] == "index-unavailable" and "kith index sync" in error["error"]["hint"]
    assert r.stderr.count("error [index-unavailable]") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "search failed" not in r.stderr, r.stderr
    r = kith(home, "search", "staging")
    assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert r.stderr.count("error [index-unavailable]") == 1 and "search failed" not in r.stderr, r.stderr


def test_invalid_top_k_is_refused(env) -> None:
    run, _ = env
    r = run("search", "staging", "--top-k", "0")
    assert r.exit_code == 1 and getattr(r.exception, "code", None) == "query-invalid"


def test_add_with_chunker_config_and_refusals(env) -> None:
    run, root = env
    r = run("index", "add", str(root), "--chunker", "fixed", "--chunk-size", "300",
            "--chunk-overlap", "0", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["chunker"] == "fixed"
    r = run("index", "config", "kb", "--chunk-overlap", "300")
    assert r.exit_code == 1 and getattr(r.exception, "code", None) == "chunking-invalid"
    r = run("index", "config", "/kb/", "--chunker", "markdown", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["chunker"] == "markdown"
    r = run("index", "config", "nope", "--chunk-size", "10")
    assert r.exit_code == 1 and getattr(r.exception, "code", None) == "root-unknown"


def test_sync_modes_json_counts_and_status(env) -> None:
    run, root = env
    run("index", "add", str(root))
    r = run("index", "sync", "--mode", "bogus")
    assert r.exit_code == 2  # a usage error
    r = run("index", "sync", "--json")
    rep = json.loads(r.stdout)  # plain counts, one JSON document, no progress bar
    assert rep["mode"] == "new_only" and rep["files"] == 2 and rep["bytes"] > 0
    (root / "new.md").write_text("# New\n\nthe gerenuk\n")
    r = run("index", "sync", "--mode", "update_only", "--json")
    rep = json.loads(r.stdout)
    assert rep["indexed"] == 0 and rep["skippedReasons"]["new-ignored"] == 1
    r = run("index", "sync", "--mode", "full", "--json")
    rep = json.loads(r.stdout)
    assert rep["indexed"] == 1 and rep["updated"] == 1
    r = run("index", "status", "--json")
    st = json.loads(r.stdout)
    assert st["rootList"][0]["byStatus"] == {"processing": 0, "done": 2, "error": 1}
    assert st["failedDocuments"][0]["source"] == "/kb/bad.txt"
    r = run("index", "status")
    assert "binary /kb/bad.txt: parse: binary" in r.stdout and "done 2" in r.stdout


def test_import_command(env, tmp_path: Path) -> None:
    run, _ = env
    f = tmp_path / "t.jsonl"
    f.write_text('{"id": "1", "text": "the saola sighting", "project": "zoo"}\n{"bad": 1}\n')
    r = run("index", "import", str(f), "--kind", "tickets", "--instance", "acme", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["indexed"] == 1 and rep["errors"][0]["line"] == 2
    r = run("search", "saola", "--json")
    assert json.loads(r.stdout)["results"][0]["source"] == "/tickets/acme/1"
    r = run("index", "import", str(f), "--kind", "tickets", "--instance", "acme")
    assert r.exit_code == 0 and "unchanged 1" in r.stdout
    r = run("index", "import", str(tmp_path / "missing.jsonl"), "--kind", "t", "--instance", "a")
    assert r.exit_code == 1 and getattr(r.exception, "code", None) == "import-not-found"
    r = run("index", "status", "--json")
    assert json.loads(r.stdout)["datasources"] == [
        {"kind": "tickets", "instance": "acme", "documents": 1, "chunks": 1}]


def test_search_prints_what_join_prints(tmp_path: Path) -> None:
    """`kith search`'s plain output is `kith join`'s rendering (node/cli/render.py): rank,
    source, page and line range, heading path, a preview that does not repeat the heading,
    and the answer's sentences; --json is the envelope, rendered to the same lines."""
    from fpdf import FPDF

    from node.cli.render import answer_lines, format_lines

    root = tmp_path / "docs"
    root.mkdir()
    (root / "bike.md").write_text("# Bike\n\n## Brakes\n\nReplace brake pads when the lining is "
                                  "thinner than 3 mm. Check the cables.\n")
    pdf = FPDF()
    pdf.set_font("Helvetica", size=12)
    for text in ("Tyre pressure for the commuter bike.", "Inflate the commuter tyres to 4 bar."):
        pdf.add_page()
        pdf.multi_cell(0, 8, text)
    pdf.output(str(root / "tyres.pdf"))
    runner, app = CliRunner(), _app()

    def run(*args: str):
        return runner.invoke(app, ["--home", str(initialized(tmp_path / "home")), *args])

    assert run("index", "add", str(root)).exit_code == 0
    assert run("index", "sync").exit_code == 0
    r = run("search", "replace brake pads")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == "[search] ok: 1 result(s)"
    assert lines[1] == "  #1 /docs/bike.md  lines 1-5"
    assert lines[2] == "     Bike > Brakes"
    assert lines[3] == "     Replace brake pads when the lining is thinner than 3 mm. Check the cables."
    assert "  answer (sentences copied from the results above):" in lines
    assert "    - Replace brake pads when the lining is thinner than 3 mm. [#1]" in lines
    assert "score" not in r.stdout
    envl = json.loads(run("search", "replace brake pads", "--json").stdout)
    expect = format_lines(answer_lines({"query_id": "search", "status": "ok", "envelope": envl}), None)
    assert lines == expect

    r = run("search", "commuter tyre pressure inflate")
    loc = json.loads(run("search", "commuter tyre pressure inflate", "--json").stdout)["results"][0][
        "provenance"]["location"]
    assert (loc["page"], loc["pageEnd"]) == (1, 2)
    assert f"  #1 /docs/tyres.pdf  pages 1-2, lines {loc['lineStart']}-{loc['lineEnd']}" in r.stdout.splitlines()
    assert " p.1" not in r.stdout

    r = run("search", "nothing-like-this-zz")
    assert r.exit_code == 0 and r.stdout == "no results (no-verified-results)\n"


def test_status_per_root_and_totals_use_the_same_labels(tmp_path: Path) -> None:
    """After a file came out empty and one failed, the root's line and the totals line
    both say `failed 1, empty 1` (issue 10 review: the root said `error 2`)."""
    root = tmp_path / "kb"
    root.mkdir()
    (root / "deploy.md").write_text("# Deploy\n\nThe staging server is deleted every night.\n")
    (root / "bad.txt").write_bytes(b"\x00\x01binary")
    (root / "blank.md").write_text("   \n\n")
    runner, app = CliRunner(), _app()

    def run(*args: str):
        return runner.invoke(app, ["--home", str(initialized(tmp_path / "home")), *args])

    assert run("index", "add", str(root)).exit_code == 0
    assert "failed 1, empty 1" in run("index", "sync").stdout
    out = run("index", "status").stdout.splitlines()
    root_line = next(ln for ln in out if ln.startswith("/kb/"))
    total_line = next(ln for ln in out if ln.startswith("documents "))
    assert "documents 3 (done 1, failed 1, empty 1, processing 0, stale 0)" in root_line
    assert total_line.startswith("documents 3 (done 1, failed 1, empty 1, processing 0, stale 0)")
    st = json.loads(run("index", "status", "--json").stdout)
    r = st["rootList"][0]
    assert (r["failed"], r["empty"], r["byStatus"]["error"]) == (1, 1, 2)


_KILLED_SYNC = """
import os, signal, sys
sys.path.insert(0, sys.argv[3])
import node.corpus.ingest
from node.corpus.store import Corpus

node.corpus.ingest.BATCH_SECONDS = 0  # each file is committed as it is done: the kill finds them recorded

def progress(done, total, source, *_):
    if done == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)

Corpus(sys.argv[1]).sync(progress=progress)
"""


def test_a_killed_sync_is_named_in_status_and_search_still_finds_what_it_recorded(
        tmp_path: Path) -> None:
    """After a SIGKILL mid-sync no process holds the writer: ``index status`` says the last
    sync did not finish (``interrupted``, not "a sync is running"), ``kith search`` replays
    what the record holds and finds it, and the next sync clears the flag."""
    import subprocess
    import sys

    root = tmp_path / "kb"
    root.mkdir()
    for i in range(40):
        (root / f"n{i:02d}.md").write_text(f"# Note {i}\n\nkillword{i} appears here.\n")
    runner, app = CliRunner(), _app()

    def run(*args: str):
        return runner.invoke(app, ["--home", str(initialized(tmp_path / "home")), *args])

    assert run("index", "add", str(root)).exit_code == 0
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _KILLED_SYNC, str(tmp_path / "home"), "30",
                          str(repo)], capture_output=True, timeout=120)
    assert out.returncode == -9, out.stderr
    st = json.loads(run("index", "status", "--json").stdout)
    assert st["interrupted"] is True and st["sync_running"] is False and st["ready"] is False
    assert "the last sync did not finish" in run("index", "status").stdout
    r = run("search", "killword0", "--json")
    assert r.exit_code == 0, r.output
    assert [x["source"] for x in json.loads(r.stdout)["results"]] == ["/kb/n00.md"]
    assert run("index", "sync").exit_code == 0
    st = json.loads(run("index", "status", "--json").stdout)
    assert st["interrupted"] is False and st["ready"] is True and st["done"] == 40
    assert "did not finish" not in run("index", "status").stdout
