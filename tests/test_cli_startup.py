"""What `kith` imports before it answers (issue 19, item 6), and its one registration table.

Each run is a real `kith` process (``python -X importtime -m node.cli.main``); the modules
it imported are read from the importtime lines on stderr:

- `kith --version` answers before the CLI framework (typer, click, rich) is imported;
- `kith --help` and `kith join` (against a real host on loopback, paired, answering)
  never import the community server, Starlette, uvicorn, jsonschema or pydantic, and
  `--help` not the server's store (nor sqlite3) either;
- every command of the table loads, and one that cannot load fails loudly instead of
  disappearing from `kith`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from node.cli import app as cli_app

#: Never imported by `--help` or `join`: the server side and the heavy validators.
SERVER_SIDE = ("starlette", "uvicorn", "jsonschema", "pydantic", "node.community.server", "node.common.http")
#: Never imported by `--help`: the community server's database layer (and so sqlite3).
SERVER_STORE = ("node.community.store", "sqlite3")
#: The CLI framework: not imported by `--version`.
FRAMEWORK = ("typer", "click", "rich")


def _imported(home: Path | None, *args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `kith [--home HOME] ARGS` under ``-X importtime``; (the run, modules imported)."""
    argv = [sys.executable, "-X", "importtime", "-m", "node.cli.main",
            *(["--home", str(home)] if home is not None else []), *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    mods = {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    mods.discard("package")  # the header line
    return r, mods


def _loaded(mods: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if any(m == r or m.startswith(r + ".") for r in roots))


def test_version_answers_before_the_cli_framework_loads():
    r, mods = _imported(None, "--version")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("kith ") and "(Python " in r.stdout
    assert "node.cli.main" in mods  # the parse really saw this run's imports
    assert _loaded(mods, FRAMEWORK + SERVER_SIDE) == []


def test_help_loads_every_command_but_no_server_side_module():
    r, mods = _imported(None, "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    for entry in cli_app.COMMANDS:
        assert f"  {entry.name} " in r.stdout, entry.name
    assert {e.module for e in cli_app.COMMANDS} <= mods
    assert _loaded(mods, SERVER_SIDE + SERVER_STORE) == []


def test_join_against_a_real_host_imports_no_server_side_module(tmp_path: Path):
    from support.cli import kith
    from support.hosts import HostProcess as Host

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Tools\n\nHow the cleanup of the temporary directory works.\n")
    home, guest = tmp_path / "host", tmp_path / "guest"
    for args in (("init",), ("index", "add", str(docs)), ("index", "sync"), ("policy", "set", "/docs/**", "public")):
        r = kith(home, *args, timeout=300)
        assert r.returncode == 0, (args, r.stderr)
    assert kith(guest, "init").returncode == 0
    invite = tmp_path / "invite.json"
    host = Host(home, "--invite-file", str(invite))
    try:
        r = kith(guest, "join", str(invite), "--local", "--trust", "--pin", "h", "-q", "cleanup")
        assert r.returncode == 0, r.stderr[-2000:]
        r, mods = _imported(guest, "join", str(invite), "--local", "--json", "-q", "temporary directory")
    finally:
        host.stop()
    assert r.returncode == 0, r.stderr[-3000:]
    answer = json.loads(r.stdout.splitlines()[0])
    assert answer["status"] == "ok" and answer["envelope"]["results"]
    assert "node.guest.guest" in mods
    assert _loaded(mods, SERVER_SIDE) == []
    assert _loaded(mods, ("node.cli.community_cmd", "node.cli.policy_cmd", "node.cli.index_cmd")) == []


def test_every_command_of_the_table_loads():
    cli_app.load_all()
    names = [e.name for e in cli_app.COMMANDS]
    assert len(names) == len(set(names))


def test_a_command_that_cannot_load_fails_loudly(monkeypatch: pytest.MonkeyPatch):
    broken = cli_app.Entry("broken", "node.cli.no_such_module", "broken_cmd")
    monkeypatch.setattr(cli_app, "COMMANDS", (*cli_app.COMMANDS, broken))
    import typer

    group = typer.main.get_command(cli_app.app)
    assert "broken" in group.list_commands(None)  # listed, never silently dropped
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        group.get_command(None, "broken")
    missing = cli_app.Entry("gone", "node.cli.commands", "no_such_attr")
    with pytest.raises(AttributeError, match="no_such_attr"):
        cli_app.load(missing)
    with pytest.raises(ModuleNotFoundError):
        cli_app.load_all()
