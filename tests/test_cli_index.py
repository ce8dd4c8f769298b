"""`kith index add|sync|status` and `kith search` through the typer app (DESIGN §11, §13)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import typer
from typer.testing import CliRunner

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
        return runner.invoke(app, ["--home", str(tmp_path / "home"), *args])

    return run, root


def test_add_sync_status_search_json(env) -> None:
    run, root = env
    r = run("index", "add", str(root), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"prefix": "kb", "sourcePrefix": "/kb/", "chunker": "recursive",
                                    "chunkSize": 1200, "chunkOverlap": 150}
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


def test_search_before_any_sync(env) -> None:
    run, _ = env
    r = run("search", "staging", "--json")
    assert r.exit_code == 1
    envl = json.loads(r.stdout)
    assert envl["available"] is False and envl["reason"] == "index-unavailable"
    r = run("search", "staging")
    assert r.exit_code == 1 and getattr(r.exception, "code", None) == "index-unavailable"


def test_invalid_top_k_is_refused(env) -> None:
    run, _ = env
    r = run("search", "staging", "--top-k", "0")
    assert r.exit_code == 1 and getattr(r.exception, "code", None) == "query-invalid"
