"""Issue 12, the owner's side of the CLI: what a first-time user sees, run as a real `kith`
process whose stdout/stderr are pipes (the copy-paste case). One test per numbered
problem: 1 quotas, 2 README, 5 roots, 7 --home typos, 8 pipes, 9 the small ones."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from node.community.server import run_server_in_thread

from support.cli import KITH, kith, without_root_reads
from support.homes import initialized

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "COLUMNS": "80", "TERM": "xterm-256color"}  # an 80-column terminal's settings
ENV.pop("NO_COLOR", None)
ANSI = re.compile(r"\x1b\[")


#: `kith --home HOME ARGS` as a real process in an 80-column terminal's settings, run from the
#: repository; HOME is initialised first unless ``init=False`` (tests of an uninitialised home)
kith = functools.partial(kith, init=True, env=ENV, cwd=REPO)


@pytest.fixture()
def cli(capsys):
    """`kith --home HOME ARGS` run in this process through the real entry point
    (:func:`node.cli.main.main`: error mapping, exit codes), stdout/stderr captured — not a
    terminal, like a pipe. Much faster than a subprocess per command."""
    from node.cli.main import main

    def run(home: Path, *args: str, init: bool = True) -> subprocess.CompletedProcess:
        if init and args[:1] != ("init",):
            initialized(home)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            main(["--home", str(home), *args])
        out, err = capsys.readouterr()
        code = exit_.value.code
        return subprocess.CompletedProcess(args, 0 if code is None else code, out, err)

    return run


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r


# --------------------------------------------------------------------------- problem 1
def test_policy_quota_sets_the_quota_and_policy_list_shows_it(tmp_path: Path, cli) -> None:
    home = tmp_path / "h"
    listed = ok(cli(home, "policy", "list")).stdout
    # the defaults a guest runs into are visible before anything is set
    assert "every peer" in listed and "600 queries/hour, burst 60" in listed
    out = ok(cli(home, "policy", "quota", "--per-hour", "60", "--burst", "5", "--max-bytes", "16384"))
    assert "60 queries/hour, burst 5, at most 16384 bytes per answer" in out.stdout
    assert "next query" in out.stderr  # a running host applies it live
    ok(cli(home, "policy", "quota", "--for", "alice", "--per-hour", "1000"))
    ok(cli(home, "policy", "quota", "--anonymous", "--burst", "20"))
    listed = ok(cli(home, "policy", "list")).stdout
    lines = {ln.split("  ")[1].strip(): ln for ln in listed.splitlines() if ln.startswith("  ")}
    assert "60 queries/hour, burst 5" in lines["every peer"]
    assert "1000 queries/hour, burst 5" in lines["peer alice"]  # unset keys inherit
    assert "burst 20" in lines["anonymous, shared"]
    doc = json.loads(ok(cli(home, "policy", "list", "--json")).stdout)
    assert doc["quota"] == {"queries_per_hour": 60, "burst": 5, "max_message_bytes": 16384,
                            "peer": {"alice": {"queries_per_hour": 1000}},
                            "anonymous": {"burst": 20}}
    # the host reads the same file: what is listed is what applies
    from node.policy.store import Policy

    assert Policy.load(home).quota_for("alice").queries_per_hour == 1000
    # bad values are typed refusals and change nothing
    before = (home / "policy.toml").read_bytes()
    r = cli(home, "policy", "quota", "--max-bytes", "10")
    assert r.returncode == 1 and "[policy-invalid]" in r.stderr and "8192" in r.stderr
    r = cli(home, "policy", "quota", "--for", "b@d", "--burst", "3")
    assert r.returncode == 1 and "[peer-bad-name]" in r.stderr
    assert (home / "policy.toml").read_bytes() == before


# --------------------------------------------------------------------------- problem 5
@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    for rel, text in {
        "guide/intro.md": "# Intro\n\nKith shares what you know.\n",
        "guide/notes.log.md": "scratch notes\n",
        "build/out.md": "generated\n",
        "node_modules/pkg/readme.md": "third party\n",
        "__pycache__/x.md": "cache\n",
        "env/lib/site.md": "a virtualenv under another name\n",
        ".git/HEAD.md": "ref\n",
        "keep/build/kept.md": "not the top build folder\n",
    }.items():
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text(text)
    (docs / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (docs / ".kithignore").write_text("# generated\n/build/\n*.log.md\n")
    return docs


def test_index_add_refuses_broad_folders_and_names_the_path(tmp_path: Path, cli) -> None:
    home = tmp_path / "h"
    for folder, what in (("/", "the filesystem root"), (str(Path.home()), "your home directory")):
        r = cli(home, "index", "add", folder)
        assert r.returncode == 1 and "[root-too-broad]" in r.stderr and what in r.stderr, r.stderr
        assert "--force" in r.stderr
    assert json.loads(ok(cli(home, "index", "status", "--json")).stdout)["rootList"] == []
    missing = tmp_path / "no-such-folder"
    r = cli(home, "index", "add", str(missing))
    assert r.returncode == 1 and "[root-not-found]" in r.stderr and str(missing) in r.stderr
    for blank in ("",):  # attack of issue 42: `kith index add ''` added the working folder
        r = cli(home, "index", "add", blank)
        assert r.returncode == 1 and "[root-not-found]" in r.stderr and "empty path" in r.stderr, r.stderr
    assert json.loads(ok(cli(home, "index", "status", "--json")).stdout)["rootList"] == []


def test_index_add_excludes_ignores_names_overlaps_and_remove(tmp_path: Path, tree: Path, cli) -> None:
    home = tmp_path / "h"
    r = ok(cli(home, "index", "add", str(tree), "--name", "kb"))
    assert "added root /kb/" in r.stdout
    r = ok(cli(home, "index", "add", str(tree / "guide")))
    assert "warning:" in r.stderr and "overlaps the root /kb/" in r.stderr
    sync = json.loads(ok(cli(home, "index", "sync", "--json")).stdout)
    ids = {d for d in _sources(home)}
    assert ids == {"/kb/guide/intro.md", "/kb/keep/build/kept.md", "/guide/intro.md",
                   "/guide/notes.log.md"}  # /guide/ has no .kithignore of its own
    assert sync["ignored"] == {"default-exclude": 2, "virtualenv": 1, "kithignore": 2}
    human = ok(cli(home, "index", "sync")).stdout
    assert "not read" not in human or "kithignore" in human
    # a policy rule naming the root is listed when the root goes
    ok(cli(home, "policy", "set", "/kb/guide/**", "public"))
    r = ok(cli(home, "index", "remove", "kb"))
    assert "removed root /kb/" in r.stdout and "2 document(s)" in r.stdout
    assert "/kb/guide/** -> public" in r.stdout
    assert _sources(home) == {"/guide/intro.md", "/guide/notes.log.md"}
    search = json.loads(ok(cli(home, "search", "Kith shares", "--json")).stdout)
    assert {res["source"] for res in search["results"]} == {"/guide/intro.md"}
    # the prefix is never handed out again
    r = cli(home, "index", "add", str(tree), "--name", "kb")
    assert r.returncode == 1 and "[root-name-taken]" in r.stderr
    again = tmp_path / "kb"
    again.mkdir()
    r = ok(cli(home, "index", "add", str(again), "--json"))
    assert json.loads(r.stdout)["prefix"] == "kb-2"
    for args in (("remove", "nope"), ("config", "nope", "--chunk-size", "900")):  # both say where roots are listed
        r = cli(home, "index", *args)
        assert r.returncode == 1 and "[root-unknown]" in r.stderr and "/nope/" in r.stderr, r.stderr
        assert "kith index status" in r.stderr, r.stderr
    r = cli(home, "index", "add", str(tree), "--name", "bad/name")
    assert r.returncode == 1 and "[root-name-invalid]" in r.stderr


def _sources(home: Path) -> set[str]:
    db = sqlite3.connect(home / "corpus" / "corpus.sqlite3")
    try:
        return {r[0] for r in db.execute("SELECT source_id FROM documents WHERE status='done'")}
    finally:
        db.close()


# --------------------------------------------------------------------------- problem 7
@pytest.mark.parametrize("command", [
    ("host", "--invite-file", "inv.json", "--local"),
    ("join", "0123456789abcdef0123456789abcdef", "--server", "http://127.0.0.1:9", "--local"),
    ("community", "register", "--server", "http://127.0.0.1:9", "--name", "x"),
    ("ask", "where is it", "--peer", "alice"),
])
def test_a_home_without_identity_is_refused_not_created(tmp_path: Path, command: tuple) -> None:
    typo = tmp_path / "hmoe"
    args = [a if a != "inv.json" else str(tmp_path / "inv.json") for a in command]
    r = kith(typo, *args, init=False)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "[home-not-initialized]" in r.stderr and str(typo) in r.stderr
    assert f"kith --home {typo} init" in r.stderr
    assert not typo.exists()  # no new, empty node
    # init still creates the home, and then the same command gets past the check
    ok(kith(typo, "init"))
    assert (typo / "identity.key").is_file()


KEY = "ab" * 32


@pytest.mark.parametrize("command", [
    ("peers", "block", KEY), ("peers", "add", "alice", KEY), ("peers", "list"),
    ("policy", "set", "/docs/**", "public"), ("policy", "list"), ("policy", "quota", "--burst", "5"),
    ("policy", "explain", "/docs/a.md"), ("policy", "check"), ("audit",), ("status",), ("sessions",),
    ("index", "add", "."), ("index", "status"), ("index", "sync"), ("search", "anything"),
    ("approvals", "list"), ("dashboard", "--json"), ("api", "serve", "--port", "0"),
    ("community", "migrate"), ("community", "backup", "out.sqlite3"),
])
def test_every_command_but_init_and_serve_refuses_a_typo_home_and_creates_nothing(
        tmp_path: Path, command: tuple) -> None:
    """Issue 20 item 1: a typo in --home is refused with home-not-initialized (the path
    named, the init hint) and no folder or file appears."""
    typo = tmp_path / "kith-hots"
    args = [a if a != "out.sqlite3" else str(tmp_path / a) for a in command]
    r = kith(typo, *args, init=False, timeout=60)
    assert r.returncode == 1, (command, r.stdout, r.stderr)
    assert "error [home-not-initialized]" in r.stderr and str(typo) in r.stderr, r.stderr
    assert f"kith --home {typo} " in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing may be created"


@pytest.mark.parametrize("command", [("init",), ("policy", "list"), ("peers", "block", KEY),
                                     ("community", "serve", "--port", "0")])
def test_a_home_that_is_a_file_is_refused_as_not_a_folder(tmp_path: Path, command: tuple) -> None:
    home = tmp_path / "home"
    home.write_text("not a folder\n")
    r = kith(home, *command, init=False, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "error [home-not-a-folder]" in r.stderr and str(home) in r.stderr, r.stderr
    assert home.read_text() == "not a folder\n"


@pytest.mark.parametrize("command", [("init",), ("policy", "list"), ("community", "serve", "--port", "0")])
def test_a_home_under_a_file_is_refused_naming_the_file(tmp_path: Path, command: tuple) -> None:
    """`--home FILE/sub` was told to run `kith --home FILE/sub init`, which cannot work."""
    file = tmp_path / "notes.txt"
    file.write_text("a file\n")
    r = kith(file / "sub", *command, init=False, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "error [home-not-a-folder]" in r.stderr, r.stderr
    assert f"is under {file}, which is a file" in " ".join(r.stderr.split()), r.stderr
    assert " init` to create" not in r.stderr and file.read_text() == "a file\n"


# --------------------------------------------------------------------------- problem 8
def test_host_banner_in_a_pipe_is_one_line_per_item_without_colour(tmp_path: Path) -> None:
    home = tmp_path / "h"
    ok(kith(home, "init"))
    with run_server_in_thread(tmp_path / "server" / "community.sqlite3") as url:
        proc = subprocess.Popen([*KITH, "--home", str(home), "host", "--server", url, "--local"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env=ENV, cwd=REPO)
        try:
            lines = _read_until(proc, "Ctrl-C to stop", 60)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=30)
    join = [ln for ln in lines if "join with:" in ln]
    assert len(join) == 1 and len(join[0]) > 80, lines  # longer than the terminal, not cut
    post_id = re.search(r"post_id: (\w+)", "".join(lines)).group(1)
    assert join[0].strip() == f"join with: kith join {post_id} --server {url} --offline"  # the spelling of today (--local still works)
    assert not any(ANSI.search(ln) for ln in lines)


def _read_until(proc: subprocess.Popen, marker: str, timeout: float) -> list[str]:
    """stdout lines of ``proc`` up to the one holding ``marker`` (bounded wait; a reader
    thread, as select() cannot see lines already in the pipe object's buffer)."""
    import queue
    import threading

    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        got.append(line)
        if marker in line:
            return got
    raise AssertionError(f"no {marker!r} within {timeout}s: {got}")


def test_rich_output_never_colours_or_wraps_off_a_terminal() -> None:
    from rich.console import Console

    from node.cli.common import _KithConsole

    # the same console as a terminal would get: the highlighter must not colour digits
    tty = _KithConsole(force_terminal=True, width=80, color_system="truecolor")
    with tty.capture() as cap:
        tty.print("post_id: 0123abcd (expires 2026-12-01T10:00:00Z)")
    assert not ANSI.search(cap.get()), repr(cap.get())
    plain = Console(force_terminal=True, width=80, color_system="truecolor")
    with plain.capture() as cap:
        plain.print("post_id: 0123abcd (expires 2026-12-01T10:00:00Z)")
    assert ANSI.search(cap.get())  # (rich's default would have coloured it)
    # off a terminal: no 80-column layout, no colour codes even for markup
    pipe = _KithConsole(file=open(os.devnull, "w"))
    long = "kith join " + "a" * 200
    with pipe.capture() as cap:
        pipe.print(f"[bold]{long}[/bold]")
    assert cap.get() == long + "\n"


def test_a_table_in_a_pipe_is_not_wrapped_at_80_columns() -> None:
    # rich lays tables out to ``console.size``, not ``console.width``: `kith approvals
    # list | cat` wrapped every cell (peer key, query, source) at 80 columns (review of #12)
    from rich.table import Table

    from node.cli.common import _KithConsole

    pipe = _KithConsole(file=open(os.devnull, "w"))
    table = Table(box=None)
    for name in ("id", "peer", "query", "sources"):
        table.add_column(name)
    row = ("4d7c40fe6f407a03", "(anonymous) " + "b" * 64, "how do I make a temporary directory " * 3,
           "/plans/some/long/path/plan.md")
    table.add_row(*row)
    with pipe.capture() as cap:
        pipe.print(table)
    lines = cap.get().splitlines()
    assert len(lines) == 2, lines  # header + one row, nothing wrapped
    assert all(cell.strip() in lines[1] for cell in row)


def test_demo_writes_no_colour_codes_into_a_pipe() -> None:
    r = subprocess.run([sys.executable, "-c", "import importlib.util as u, sys; "
                        f"s = u.spec_from_file_location('d', {str(REPO / 'scripts' / 'demo.py')!r}); "
                        "m = u.module_from_spec(s); s.loader.exec_module(m); m.say('1. step')"],
                       capture_output=True, text=True, timeout=60, env=ENV, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "\n== 1. step\n"


def test_setup_ships_every_data_folder_as_a_listed_package() -> None:
    """setuptools warns "Package would be ignored" (~40 lines in setup) for every
    importable folder holding files that `packages` does not list: all are listed."""
    import tomllib

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg.get("package-dir", {})
    roots = {"node": REPO / "node", **{k: REPO / v for k, v in mapping.items()}}
    missing = []
    for pkg, base in roots.items():
        for folder in [base, *[p for p in base.rglob("*") if p.is_dir()]]:
            rel = folder.relative_to(base).parts
            if any(part == "__pycache__" or part.startswith(".") for part in rel):
                continue
            if not all(part.isidentifier() for part in rel):
                continue  # not importable (knowledge-query): shipped as package data
            name = ".".join([pkg, *rel])
            if any(f.is_file() for f in folder.iterdir()) and name not in listed:
                if any(name.startswith(other + ".") for other in mapping if other != pkg):
                    continue
                missing.append(name)
    assert not missing, f"list these in [tool.setuptools] packages: {missing}"
    assert (REPO / "scripts" / "setup").read_text().count("setup.log") >= 1


# --------------------------------------------------------------------------- problem 9
def test_version_and_protocol_test_by_name(tmp_path: Path) -> None:
    r = ok(subprocess.run([*KITH, "--version"], capture_output=True, text=True, timeout=60, env=ENV))
    from importlib.metadata import version

    assert r.stdout.strip().startswith(f"kith {version('kith-node')} ")
    r = ok(kith(tmp_path / "h", "protocol", "test", "knowledge-query", "--json"))
    assert json.loads(r.stdout)["passed"] is True
    r = ok(kith(tmp_path / "h", "protocol", "id", "echo"))
    assert r.stdout.startswith("echo ")
    r = kith(tmp_path / "h", "protocol", "test", "no-such-protocol")
    assert r.returncode == 1 and "[protocol-not-found]" in r.stderr and "no-such-protocol" in r.stderr


def test_embed_hint_and_help_keep_the_hybrid_extra_and_name_the_checkout(tmp_path: Path) -> None:
    r = ok(kith(tmp_path / "h", "index", "embed", "--help"))
    text = " ".join(r.stdout.split())  # help paragraphs wrap at 80 columns, like any CLI's
    assert "'.[hybrid]'" in text and "scripts/setup --hybrid" in text
    from node.corpus import dense

    if dense.extra_available():
        pytest.skip("the hybrid extra is installed here: the refusal cannot be seen")
    r = kith(tmp_path / "h", "index", "embed")
    assert r.returncode == 1 and "[dense-unavailable]" in r.stderr
    assert "kith-node[hybrid]" not in r.stderr and "scripts/setup --hybrid" in r.stderr


def test_too_large_names_the_limit(tmp_path: Path) -> None:
    from node.corpus import parsers

    home, docs = tmp_path / "h", tmp_path / "docs"
    docs.mkdir()
    limit = parsers.size_limit("text")
    with open(docs / "huge.txt", "wb") as fh:
        fh.truncate(limit + 1)
    ok(kith(home, "index", "add", str(docs)))
    r = ok(kith(home, "index", "sync"))
    assert "too-large /docs/huge.txt" in r.stderr
    assert f"{limit + 1:,} bytes" in r.stderr and f"{limit:,}-byte limit" in r.stderr


def test_sync_reports_an_unreadable_folder_with_the_reason() -> None:
    base = Path(tempfile.mkdtemp(prefix="kith-unreadable-"))
    try:
        os.chmod(base, 0o755)
        docs = base / "docs"
        (docs / "locked").mkdir(parents=True)
        (docs / "ok.md").write_text("readable\n")
        (docs / "locked" / "secret.md").write_text("hidden\n")
        os.chmod(docs / "locked", 0)
        home = base / "home"
        ok(kith(home, "index", "add", str(docs)))
        prefix = without_root_reads()  # root reads every folder: run kith without that capability

        def sync(*extra: str) -> subprocess.CompletedProcess:
            return ok(subprocess.run([*prefix, *KITH, "--home", str(home), "index", "sync", *extra],
                                     capture_output=True, text=True, timeout=120, env=ENV, cwd=REPO,
                                     stdin=subprocess.DEVNULL))

        r = sync()
        assert re.search(r"folder-unreadable /docs/locked: sync: folder-unreadable - Permission denied",
                         r.stderr), r.stderr
        report = json.loads(sync("--json").stdout)
        assert {e["source"] for e in report["errors"]} == {"/docs/locked"}
    finally:
        os.chmod(docs / "locked", 0o700)
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_an_interrupted_sync_says_so_and_leaves_status_true(tmp_path: Path) -> None:
    home, docs = tmp_path / "h", tmp_path / "docs"
    docs.mkdir()
    # enough text that the sync is still running seconds after its first batch is visible,
    # even on 2 loaded cores (3000 one-line files once finished before Ctrl-C arrived)
    files = 12_000
    filler = " ".join(f"term{j}" for j in range(200))
    for i in range(files):
        (docs / f"f{i:05}.md").write_text(f"# File {i}\n\nword{i} appears here. {filler}\n")
    ok(kith(home, "index", "add", str(docs)))
    proc = subprocess.Popen([*KITH, "--home", str(home), "index", "sync"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, env=ENV,
                            cwd=REPO)
    db_path = home / "corpus" / "corpus.sqlite3"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # wait until files are being indexed
        try:
            db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=0.05)  # locked: look again
            try:
                n = db.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
            finally:
                db.close()
        except sqlite3.Error:
            n = 0
        if n >= 20:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the sync finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    m = re.search(r"stopped after (\d+) files; run sync again", err)
    assert m, (out, err)
    assert "Traceback" not in err
    st = json.loads(ok(kith(home, "index", "status", "--json")).stdout)
    assert st["processing"] == 0 and st["processingDocuments"] == []
    assert 20 <= st["documents"] < files
    done = int(m.group(1))
    assert abs(st["documents"] - done) <= 1  # the file cut short is put back as it was
    r = ok(kith(home, "index", "sync"))  # run sync again: the rest is indexed
    st = json.loads(ok(kith(home, "index", "status", "--json")).stdout)
    assert st["documents"] == files and st["done"] == files and st["processing"] == 0


def test_interrupt_inside_a_file_puts_its_row_back(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C while a file is being parsed: the row opened as `processing` goes back to
    what it was (new: dropped; known: its old status), so status never says processing."""
    from node.corpus import ingest, parsers
    from node.corpus.store import Corpus

    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (docs / name).write_text(f"# {name}\n\ncontent of {name}\n")
    with Corpus(tmp_path / "h") as c:
        c.add_root(docs)
        c.sync()
        (docs / "b.md").write_text("# b\n\nchanged content\n")
        (docs / "d.md").write_text("# d\n\nnew file\n")
        real = parsers.parse_bytes

        def parse(data, kind, name):
            if name in ("b.md", "d.md"):
                raise KeyboardInterrupt
            return real(data, kind, name)

        monkeypatch.setattr(parsers, "parse_bytes", parse)
        with pytest.raises(ingest.SyncInterrupted) as stop:
            c.sync()
        assert stop.value.done == 1  # a.md unchanged, then b.md was cut short
        st = c.status_report()
        assert st["processing"] == 0 and st["done"] == 3  # b.md keeps its old chunks
        monkeypatch.setattr(parsers, "parse_bytes", real)
        rep = c.sync()
        assert rep["updated"] == 1 and rep["indexed"] == 1


def test_interrupt_after_the_last_file_is_still_a_sync_interrupted(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C while the sync removes what is gone or makes its last commit: the owner is
    told the sync stopped (`stopped after N files`), not left with a silent exit 130, and
    every file finished stays indexed and searchable."""
    from node.corpus import ingest
    from node.corpus.store import Corpus

    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (docs / name).write_text(f"# {name}\n\ncontent of {name}\n")
    with Corpus(tmp_path / "h") as c:
        c.add_root(docs)
        real = ingest.Sync.maybe_commit

        def commit_then_interrupt(self, force: bool = False) -> None:
            real(self, force)
            if force:  # the run's last commit, after every file
                monkeypatch.setattr(ingest.Sync, "maybe_commit", real)
                raise KeyboardInterrupt  # as a signal does: after the call it landed in

        monkeypatch.setattr(ingest.Sync, "maybe_commit", commit_then_interrupt)
        with pytest.raises(ingest.SyncInterrupted) as stop:
            c.sync()
        assert (stop.value.done, stop.value.total) == (3, 3)
        st = c.status_report()
        assert st["processing"] == 0 and st["done"] == 3
        assert [h.source_id for h in c.search_hits("content of b.md", limit=1)[0]] == ["/docs/b.md"]
        rep = c.sync()  # nothing left to do
        assert rep["indexed"] == 0 and rep["skipped"] == 3


def test_watch_log_lines_name_the_file_with_a_timestamp() -> None:
    from node.cli.index_cmd import watch_lines

    lines = watch_lines({"indexed": 1, "updated": 0, "skipped": 0, "removed": 1, "failed": 0,
                         "empty": 0, "chunks": 2, "seconds": 0.01,
                         "changes": [{"source": "/docs/new.md", "op": "indexed"},
                                     {"source": "/docs/old.md", "op": "removed"}]})
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    assert re.fullmatch(stamp + r" indexed /docs/new\.md", lines[0])
    assert re.fullmatch(stamp + r" removed /docs/old\.md", lines[1])
    assert re.match(stamp + r" indexed 1, updated 0", lines[2])


def test_watch_batch_report_lists_the_files(tmp_path: Path) -> None:
    from node.corpus.store import Corpus

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# a\n\nfirst\n")
    with Corpus(tmp_path / "h") as c:
        c.add_root(docs)
        c.sync()
        (docs / "b.md").write_text("# b\n\nsecond\n")
        (docs / "a.md").unlink()
        (docs / "node_modules").mkdir()
        (docs / "node_modules" / "x.md").write_text("never\n")
        rep = c.sync_paths([docs / "a.md", docs / "b.md", docs / "node_modules" / "x.md"])
    assert rep["changes"] == [{"source": "/docs/b.md", "op": "indexed"},
                              {"source": "/docs/a.md", "op": "removed"}]


def test_mcp_peer_call_prints_no_httpx_lines(tmp_path: Path) -> None:
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    home = tmp_path / "h"
    token = json.loads(ok(kith(home, "init", "--json")).stdout)["agent_token"]  # the default agent's
    errlog = tmp_path / "mcp-stderr.txt"
    with run_server_in_thread(tmp_path / "server" / "community.sqlite3") as url:
        params = StdioServerParameters(command=sys.executable, cwd=str(REPO), env={**ENV, "KITH_AGENT_TOKEN": token},
                                       args=["-m", "node.cli.main", "--home", str(home), "mcp"])

        async def main():
            with open(errlog, "w") as err:
                async with stdio_client(params, errlog=err) as (r, w):
                    async with ClientSession(r, w) as s:
                        await s.initialize()
                        return await s.call_tool("search", {
                            "query": "anything", "peer": "0123456789abcdef0123456789abcdef",
                            "server": url})

        res = anyio.run(main)
    assert res.is_error  # no such post: a typed refusal, after a real HTTP round trip
    assert res.content[0].text.startswith("[")
    text = errlog.read_text()
    assert "HTTP Request" not in text and "httpx" not in text, text
    assert "Processing request" not in text, text


def test_index_add_refuses_a_folder_of_copies_even_with_force(tmp_path: Path, cli) -> None:
    """issue 42 item 3: a copy of a peer's corpus is never this node's own corpus (it would be
    shared onward): a folder in <home>/copies/ is refused root-is-copy."""
    home = tmp_path / "h"
    ok(cli(home, "init"))
    copy = home / "copies" / "bea" / "docs"
    copy.mkdir(parents=True)
    (copy / "secret.md").write_text("bea's notes\n")
    for folder in (copy, home / "copies", home / "copies" / "bea"):
        for extra in ((), ("--force",)):
            r = cli(home, "index", "add", str(folder), *extra)
            assert r.returncode == 1 and "[root-is-copy]" in r.stderr, r.stderr
            assert str(folder.resolve()) in r.stderr
    assert json.loads(ok(cli(home, "index", "status", "--json")).stdout)["rootList"] == []
    mine = tmp_path / "mine"
    mine.mkdir()
    ok(cli(home, "index", "add", str(mine)))  # a folder beside the home is the owner's own
