"""The damage matrix (issue 42 item 1): a file of the home put through garbage, truncation,
empty, deleted, a folder in its place and a full disk, against the commands that read or
write it. Every case passes when: the exit status is the one expected, a failure prints
``error [code]`` with a ``hint:`` line (the code among those expected), no traceback is on
either stream, and nothing else in the home changed.

The commands run in this process (``node.cli.main.main``, the real dispatcher), with one
real ``kith`` process per file as a sample; a full disk is a real one: a process whose
file-size limit (``RLIMIT_FSIZE``) is below what it must write.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import resource
import shutil
import sqlite3
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from support.cli import KITH, kith, lines_until, pending, without_root_reads
from support.homes import FIXTURE


# ----------------------------------------------------------------------------- the home
@pytest.fixture(scope="module")
def base_home(tmp_path_factory) -> Path:
    """One home, made once: a synced corpus (the knowledge-query fixture), a policy rule,
    a kept outbox question, a pinned peer. Each case works on a copy."""
    home = tmp_path_factory.mktemp("damage") / "home"
    for args in (("init",), ("index", "add", str(FIXTURE)), ("index", "sync"), ("policy", "set", "/corpus/**", "public")):
        r = kith(home, *args, timeout=300)
        assert r.returncode == 0, (args, r.stderr)
    _keep_a_question(home)
    return home


def _keep_a_question(home: Path) -> None:
    from node.guest.outbox import OutboxStore

    with OutboxStore(home) as store:
        store.add({"query": "when does the staging server restart", "topK": 5}, [("alice", "ab" * 32)])


def _snapshot(home: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in sorted(home.rglob("*")):
        rel = p.relative_to(home).as_posix()
        if p.is_symlink() or not p.is_file():
            out[rel] = "dir" if p.is_dir() else "other"
            continue
        try:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        except OSError:
            out[rel] = "unreadable"
    return out


#: files a command may rewrite whatever the damage: lock files (their owner text) and the
#: quota buckets a read touches
VOLATILE = (".lock", "-wal", "-shm")


def _changed(before: dict[str, str], after: dict[str, str], allowed: tuple[str, ...]) -> list[str]:
    keys = set(before) | set(after)
    return sorted(k for k in keys if before.get(k) != after.get(k)
                  and not k.endswith(VOLATILE) and not any(k == a or k.startswith(a + "/") for a in allowed))


# --------------------------------------------------------------------------- damage kinds
def garbage(p: Path) -> None:
    p.write_bytes(bytes((i * 97 + 13) % 256 for i in range(5000)))


def truncated(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: max(1, len(data) // 2)])


def empty(p: Path) -> None:
    p.write_bytes(b"")


def deleted(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p)
    else:
        p.unlink()


def folder(p: Path) -> None:
    deleted(p)
    p.mkdir()
    (p / "x").write_text("not the file\n")


def nested(p: Path) -> None:
    """200,000 nested arrays: deeper than Python's json reads (RecursionError, not ValueError)."""
    p.write_bytes(b"[" * 200_000)


# ------------------------------------------------------------------------------- running
@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def error_code(self) -> str | None:
        for line in self.err.splitlines():
            if line.startswith("error [") and "]" in line:
                return line[len("error ["):line.index("]")]
        return None


def run_inproc(home: Path, *args: str) -> Ran:
    """``kith --home HOME ARGS`` through the real dispatcher in this process; an exception
    that escapes it is a traceback (the test fails with it)."""
    from node.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli_main.main(["--home", str(home), *args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Ran(code, out.getvalue(), err.getvalue())


def run_proc(home: Path, *args: str, fsize: int | None = None) -> Ran:
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    r = subprocess.run([*KITH, "--home", str(home), *args], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL, preexec_fn=limit)
    return Ran(r.returncode, r.stdout, r.stderr)


def check(r: Ran, codes: set[str] | None, *, ok: bool = False) -> None:
    """``codes``: the refusals allowed (None: the command must succeed)."""
    assert "Traceback" not in r.err and "Traceback" not in r.out, r.err[-3000:]
    if codes is None or ok and r.code == 0:
        assert r.code == 0, (r.code, r.err[-2000:])
        return
    assert r.code != 0, f"exit 0 where {codes} was expected; out: {r.out[-500:]}"
    assert r.error_code in codes, (r.error_code, codes, r.err[-2000:])
    assert "  hint: " in r.err, f"no hint: {r.err[-1000:]}"


# ------------------------------------------------------------------------- the matrix
CORPUS_DB = "corpus/corpus.sqlite3"
CORRUPT = {"corpus-corrupt"}
#: (file, damage, command, expected codes — None: success, ok: success allowed too)
CORPUS_CASES = [
    *[(CORPUS_DB, d, cmd, CORRUPT, False) for d in (garbage, truncated)
      for cmd in (("search", "sqlite"), ("index", "status"), ("index", "sync"), ("index", "sync", "--mode", "full"))],
    *[(CORPUS_DB, d, ("status",), None, False) for d in (garbage, truncated, empty, deleted)],
    # an empty or deleted record is an empty corpus: search has nothing to answer from
    *[(CORPUS_DB, d, ("search", "sqlite"), {"index-unavailable"}, False) for d in (empty, deleted)],
    *[(CORPUS_DB, d, ("index", "status"), None, False) for d in (empty, deleted)],
    (CORPUS_DB, folder, ("search", "sqlite"), {"io-error"}, False),
    (CORPUS_DB, folder, ("index", "status"), {"io-error"}, False),
    (CORPUS_DB, folder, ("index", "sync"), {"io-error"}, False),
    ("corpus/tantivy", deleted, ("search", "sqlite"), {"index-unavailable"}, False),
    ("corpus/tantivy", deleted, ("index", "status"), None, False),
    ("corpus/tantivy", folder, ("search", "sqlite"), {"index-unavailable"}, False),
]


def _id(case) -> str:
    target, damage, cmd, *_ = case
    return f"{target}-{damage.__name__}-{'_'.join(cmd)}"


@pytest.mark.parametrize("case", CORPUS_CASES, ids=[_id(c) for c in CORPUS_CASES])
def test_corpus_damage(base_home, tmp_path, case):
    target, damage, cmd, codes, ok = case
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    damage(home / target)
    before = _snapshot(home)
    r = run_inproc(home, *cmd)
    check(r, codes, ok=ok)
    allowed: tuple[str, ...] = (target,) if codes is None else ()
    if cmd[:2] == ("index", "sync") and codes is None:
        allowed = ("corpus",)
    assert not _changed(before, _snapshot(home), allowed), _changed(before, _snapshot(home), allowed)


def test_a_deleted_index_folder_is_named_with_its_repair_and_the_repair_works(base_home, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    shutil.rmtree(home / "corpus" / "tantivy")
    found = run_inproc(home, "search", "write-ahead log")
    check(found, {"index-unavailable"})
    assert "kith index sync" in found.err
    status = run_inproc(home, "index", "status")
    assert "missing: run `kith index sync`" in status.out, status.out
    for mode in ((), ("--mode", "full")):
        shutil.rmtree(home / "corpus" / "tantivy", ignore_errors=True)
        synced = run_inproc(home, "index", "sync", *mode)
        check(synced, None)
        assert "rebuilding it from the corpus record" in synced.err, synced.err
        answer = run_inproc(home, "search", "write-ahead log", "--json")
        check(answer, None)
        assert json.loads(answer.out)["results"], answer.out


def test_a_damaged_corpus_database_in_a_real_process(base_home, tmp_path):
    """The sample subprocess of the corpus record: `kith index status` and `kith host`."""
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    garbage(home / CORPUS_DB)
    before = _snapshot(home)
    r = run_proc(home, "index", "status")
    check(r, CORRUPT)
    assert "mv " in r.err and "kith index add FOLDER" in r.err
    assert not _changed(before, _snapshot(home), ())


def test_a_full_disk_during_a_corpus_sync_is_disk_full_not_corrupt(base_home, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    docs = tmp_path / "big"
    docs.mkdir()
    words = ["alpha", "beta", "gamma", "delta", "omega", "sqlite", "index", "kith"]
    (docs / "big.md").write_text("\n\n".join(" ".join(words[(i * 7 + j) % 8] + str(j % 50) for j in range(60))
                                             for i in range(3000)))
    check(run_inproc(home, "index", "add", str(docs)), None)
    size = (home / CORPUS_DB).stat().st_size
    r = run_proc(home, "index", "sync", fsize=size + 64 * 1024)
    check(r, {"disk-full"})
    status = run_inproc(home, "index", "status", "--json")  # the record is whole: readable, no lag
    check(status, None)
    assert json.loads(status.out)["roots"] == 2
    again = run_inproc(home, "index", "sync")  # room again: the sync completes
    check(again, None)


# ------------------------------------------------------------------------------ the outbox
OUTBOX = "outbox.sqlite"
OUTBOX_CASES = [
    *[(OUTBOX, d, cmd, {"outbox-corrupt"}, False) for d in (garbage, truncated)
      for cmd in (("outbox", "list"), ("outbox", "remove", "--done"), ("status",))],
    (OUTBOX, empty, ("outbox", "list"), None, False),
    (OUTBOX, deleted, ("outbox", "list"), None, False),
    (OUTBOX, deleted, ("outbox", "remove", "--done"), {"outbox-not-found"}, True),
    (OUTBOX, folder, ("outbox", "list"), {"io-error"}, False),
]


@pytest.mark.parametrize("case", OUTBOX_CASES, ids=[_id(c) for c in OUTBOX_CASES])
def test_outbox_damage(base_home, tmp_path, case):
    target, damage, cmd, codes, ok = case
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    damage(home / target)
    before = _snapshot(home)
    r = run_inproc(home, *cmd)
    if cmd == ("status",):  # status reports the outbox's fault on its line and goes on
        check(r, None)
        assert "outbox" in r.out
    else:
        check(r, codes, ok=ok)
    allowed = (target,) if codes is None else ()
    assert not _changed(before, _snapshot(home), allowed), _changed(before, _snapshot(home), allowed)


def test_text_in_a_time_column_is_one_bad_row_not_a_traceback(base_home, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    _keep_a_question(home)
    db = sqlite3.connect(home / OUTBOX)
    first = db.execute("SELECT id FROM questions ORDER BY rowid LIMIT 1").fetchone()[0]
    db.execute("UPDATE questions SET created_at='yesterday', expires_at='never' WHERE id=?", (first,))
    db.execute("UPDATE deliveries SET last_attempt_at='x', answered_at='y', read_at=X'00' WHERE question_id=?", (first,))
    db.commit()
    db.close()
    for args in (("outbox", "list"), ("outbox", "list", "--json"), ("outbox", "show", first[:12], "--json")):
        r = run_inproc(home, *args)
        check(r, None)
    listed = json.loads(run_inproc(home, "outbox", "list", "--json").out)["questions"]
    assert len(listed) == 2 and {q["id"] for q in listed} >= {first}
    bad = next(q for q in listed if q["id"] == first)
    assert bad["createdAt"] is None and bad["expiresAt"] is None and bad["peers"][0]["lastAttemptAt"] is None


_FULL_OUTBOX = """
import resource, sys
sys.path[:0] = {paths!r}
from pathlib import Path
from node.common.errors import KithError
from node.guest.outbox import OutboxStore
store = OutboxStore(Path({home!r}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    for i in range(5000):
        store.add({{"query": "question %d " % i + "x" * 1900, "topK": 5}}, [("alice", "ab" * 32)])
except KithError as exc:
    print(exc.code)
else:
    print("ok")
"""


def test_a_full_disk_on_the_outbox_is_disk_full_and_keeps_every_question(base_home, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    listed = json.loads(run_inproc(home, "outbox", "list", "--json").out)["questions"]
    size = max(p.stat().st_size for p in home.glob(OUTBOX + "*"))
    script = _FULL_OUTBOX.format(paths=sys.path, home=str(home), limit=size + 40_000)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "disk-full", r.stdout + r.stderr
    after = run_inproc(home, "outbox", "list", "--json")
    check(after, None)
    ids = {q["id"] for q in json.loads(after.out)["questions"]}
    assert {q["id"] for q in listed} <= ids  # the kept questions are all there: nothing to move aside


def test_a_background_fault_is_logged_once_until_it_changes(base_home, tmp_path, caplog):
    """A damaged outbox under the runner: one line with its code and hint, not a traceback
    per step; a new fault is told again, and so is the recovery."""
    import anyio

    from node.guest.outbox_task import OutboxTask
    from node.guest.runner import Runner

    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    garbage(home / OUTBOX)
    task = OutboxTask(home)
    told: dict = {}
    caplog.set_level("WARNING", logger="kith.runner")

    def step() -> None:
        try:
            anyio.run(task.step, None)
        except Exception as exc:  # noqa: BLE001 - what the runner's loop catches
            Runner._tell(task.name, exc, told, 1)

    for _ in range(5):
        step()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "[outbox-corrupt]" in lines[0] and "hint:" in lines[0], lines
    assert not any(r.exc_info for r in caplog.records)
    folder(home / OUTBOX)  # another fault: told once more
    for _ in range(3):
        step()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "[io-error]" in lines[1], lines


def test_a_damaged_peers_json_under_outbox_run_is_told_once_not_a_traceback_per_step(base_home, tmp_path):
    """`kith outbox run` with a question waiting and a ``peers.json`` that does not load:
    one line with its code and hint (the runner's step fault, backed off), not a delivery
    job failing with a traceback every 50 ms (each job died before backing the peer off, so
    the step spawned it again at once)."""
    import signal

    from support.cli import kith_argv, lines_until

    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    garbage(home / "peers.json")
    proc = subprocess.Popen(kith_argv(home, "outbox", "run", "--offline"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        seen = lines_until(proc, proc.stderr, lambda line: "Traceback" in line or "[config-invalid]" in line,
                           timeout=60)
    finally:
        proc.send_signal(signal.SIGINT)
        _out, rest = proc.communicate(timeout=20)
    err = "".join(seen) + rest
    assert "Traceback" not in err, err[:3000]
    told = [line for line in err.splitlines() if "[config-invalid]" in line]
    assert len(told) == 1 and "peers.json" in told[0] and "hint: " in told[0], err


@pytest.mark.parametrize("damage", [folder, "unreadable"], ids=lambda d: getattr(d, "__name__", d))
def test_an_outbound_log_that_cannot_be_written_under_outbox_run_is_told_once_not_a_traceback(
        base_home, tmp_path, damage):
    """`kith outbox run` with a question waiting for a pinned peer and a ``sent.jsonl`` it
    cannot append to (a folder in its place, or a file this user may not write): the outbound
    gate's log write is a typed ``io-error`` naming the file — one line with its hint, the row
    keeps its question and says the code — not a delivery job failing with a traceback at
    every step."""
    import signal

    from support.cli import kith_argv, lines_until

    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    check(run_inproc(home, "peers", "add", "alice", "ab" * 32), None)
    log = home / "sent.jsonl"
    if damage == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root writes a file whatever its mode")
        log.write_text("")
        log.chmod(0)
    else:
        damage(log) if log.exists() else log.mkdir()
    proc = subprocess.Popen(kith_argv(home, "outbox", "run", "--offline"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        seen = lines_until(proc, proc.stderr, lambda line: "Traceback" in line or "[io-error]" in line,
                           timeout=60)
        from support.waits import wait_for

        wait_for("the row to record the io-error", lambda: "io-error" in kith(home, "outbox", "list").stdout,
                 timeout_s=30)
    finally:
        proc.send_signal(signal.SIGINT)
        _out, rest = proc.communicate(timeout=20)
    err = "".join(seen) + rest
    assert "Traceback" not in err, err[:3000]
    told = [line for line in err.splitlines() if "[io-error]" in line]
    assert len(told) == 1 and "sent.jsonl" in told[0] and "hint: " in told[0], err
    assert len(json.loads(kith(home, "outbox", "list", "--json").stdout)["questions"]) == 1


@pytest.mark.parametrize("damage", [garbage, empty], ids=lambda d: d.__name__)
def test_outbox_run_on_a_damaged_identity_key_is_refused_at_start(base_home, tmp_path, damage):
    """`kith outbox run` over an identity.key that does not load: refused identity-corrupt
    with its hint, as `kith api serve`'s runner and `kith mcp` are. Since the runner opens
    its pool only when a question needs it, it said "delivering the outbox" and ran on,
    the damage unsaid until a delivery tried."""
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    damage(home / "identity.key")
    check(run_proc(home, "outbox", "run", "--offline"), {"identity-corrupt"})


# ---------------------------------------------------------- the host's posts and its port
@pytest.fixture(scope="module")
def hosted_home(base_home, tmp_path_factory) -> Path:
    """``base_home`` after one run of ``kith host --offline`` (file mode): it kept its post
    (posts.json) and its port (endpoint.json)."""
    from support.hosts import HostProcess

    home = tmp_path_factory.mktemp("hosted") / "home"
    shutil.copytree(base_home, home, symlinks=True)
    host = HostProcess(home, "--invite-file", str(home.parent / "invite.json"))
    code, _, err = host.stop()
    assert code == 0, err
    assert (home / "posts.json").is_file() and (home / "endpoint.json").is_file()
    return home


def _host_refused(home: Path, *args: str) -> Ran:
    r = subprocess.run([*KITH, "--home", str(home), "host", "--local", "--json", *args], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    return Ran(r.returncode, r.stdout, r.stderr)


@pytest.mark.iroh
@pytest.mark.parametrize("damage", [garbage, truncated, empty, folder, nested], ids=lambda d: d.__name__)
def test_damaged_posts_and_port_files_at_host_start(hosted_home, tmp_path, damage):
    """A bad posts.json refuses `kith host` with the way out in the hint; that way out,
    --new-invitation, starts and replaces it. An unreadable endpoint.json while a kept
    invitation names the old port: refused the same way, never a silent new port."""
    from support.hosts import HostProcess

    for target in ("posts.json", "endpoint.json"):
        home = tmp_path / target / "home"
        shutil.copytree(hosted_home, home, symlinks=True)
        damage(home / target)
        before = _snapshot(home)
        r = _host_refused(home, "--invite-file", str(tmp_path / "inv.json"))
        check(r, {"config-invalid"})
        assert target in r.err and "--new-invitation" in r.err
        assert not _changed(before, _snapshot(home), ("run",)), _changed(before, _snapshot(home), ("run",))
        if damage is folder:  # a folder is not replaced by a file: that start is refused io-error
            check(_host_refused(home, "--new-invitation", "--invite-file", str(tmp_path / "inv.json")), {"io-error"})
            continue
        host = HostProcess(home, "--new-invitation", "--invite-file", str(tmp_path / "inv.json"))
        code, _, err = host.stop()
        assert code == 0 and "Traceback" not in err, err
        assert f"{target}" in err and "warning" in err, err
        assert json.loads((home / target).read_text())  # replaced by a whole file


# ------------------------------------------------------------- the rest of the home
def _full_home(base: Path, where: Path) -> Path:
    """``base`` with the files a used home holds beside the corpus and the outbox: a pinned
    peer (peers.json), config.toml, an audit line."""
    home = where / "home"
    shutil.copytree(base, home, symlinks=True)
    check(run_inproc(home, "peers", "add", "bob", "ef" * 32), None)
    (home / "config.toml").write_text('[transport]\nrelay = "none"\n')
    (home / "audit.jsonl").write_text('{"ts": "2026-12-05T00:00:00Z", "event": "session-started"}\n')
    return home


@pytest.fixture(scope="module")
def full_home(hosted_home, tmp_path_factory) -> Path:
    return _full_home(hosted_home, tmp_path_factory.mktemp("full"))


#: every file of the home below, and the commands that read or write it (in this process)
READERS: dict[str, list[tuple[str, ...]]] = {
    "identity.key": [("status",), ("peers", "list"), ("device", "list"), ("person", "show"), ("outbox", "list")],
    "person.json": [("status",), ("device", "list"), ("person", "show"), ("peers", "list")],
    "person.key": [("status",), ("device", "list"), ("person", "show")],
    "policy.toml": [("status",), ("policy", "list"), ("search", "sqlite")],
    "peers.json": [("status",), ("peers", "list"), ("policy", "list"), ("outbox", "list"), ("copies", "list")],
    "config.toml": [("status",), ("policy", "list")],
    "audit.jsonl": [("status",), ("audit",)],
    "posts.json": [("status",)],
    "endpoint.json": [("status",)],
    "quota.sqlite": [("status",), ("peers", "list")],
    "seen-nonces.sqlite": [("status",)],
    "card-seq": [("status",)],
    "run": [("status",)],
    "host.lock": [("status",), ("index", "status")],
    "runner.lock": [("status",), ("outbox", "list")],
    "policy.toml.lock": [("policy", "list"), ("status",)],
    "corpus/writer.lock": [("index", "status"), ("search", "sqlite")],
    "revocations.json": [("status",), ("peers", "list"), ("device", "list")],
    "rotations.json": [("status",), ("peers", "list"), ("person", "show")],
    "cards.json": [("status",), ("peers", "list")],
    "approvals": [("status",), ("approvals", "list")],
    "approvals/promoted.json": [("status",), ("approvals", "list")],
    "agents.json": [("status",), ("agent", "list")],
    "sent.jsonl": [("sent",)],
    # read outside home.read_json_state until issue 42's review: nested JSON was a traceback
    "profile.json": [("peers", "profile")],
    "dashboard.login": [("dashboard", "--login-link")],
}
#: what a damaged file may be refused with (anything else fails the test)
CODES_OF: dict[str, set[str]] = {
    "identity.key": {"identity-corrupt", "home-not-initialized", "io-error"},
    "person.json": {"config-invalid", "io-error"},
    "person.key": {"identity-corrupt", "io-error"},
    "policy.toml": {"policy-invalid", "io-error"},
    "peers.json": {"config-invalid", "io-error"},
    "config.toml": {"transport-mode-invalid", "presence-invalid", "io-error"},
    "audit.jsonl": {"io-error"},
    "revocations.json": {"config-invalid"},
    "rotations.json": {"config-invalid"},
    "cards.json": {"config-invalid"},
    "agents.json": {"agents-file-invalid"},
    "dashboard.login": {"dashboard-not-running"},
}
DAMAGES = (garbage, truncated, empty, deleted, folder, nested)
SWEEP = [(f, d) for f in READERS for d in DAMAGES]


@pytest.mark.parametrize("target,damage", SWEEP, ids=[f"{f}-{d.__name__}" for f, d in SWEEP])
def test_home_file_damage(full_home, tmp_path, target, damage):
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    path = home / target
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and damage is not folder:
        shutil.rmtree(path)
        if damage is not deleted:
            garbage(path)  # a file where the folder was, then damaged
            damage(path)
    elif not path.is_dir():
        if not path.exists() and damage is not deleted:
            garbage(path)  # a file this home does not hold yet: made, then damaged
        if path.exists():
            damage(path)
    before = _snapshot(home)
    for cmd in READERS[target]:
        r = run_inproc(home, *cmd)
        check(r, CODES_OF.get(target, set()) | {"io-error", "control-dir-unsafe"}, ok=True)
        assert not _changed(before, _snapshot(home), (target,)), (cmd, _changed(before, _snapshot(home), (target,)))


def _host(home: Path) -> Ran:
    """``kith host --local --json`` as a real process: its refusal, or (started) exit 0
    after SIGINT."""
    from support.hosts import HostProcess

    try:
        host = HostProcess(home, "--invite-file", str(home.parent / "inv.json"))
    except AssertionError as exc:
        return Ran(1, "", str(exc))
    code, out, err = host.stop()
    return Ran(code, out, err)


@pytest.mark.iroh
@pytest.mark.parametrize("target,codes", [("quota.sqlite", {"config-invalid"}), ("seen-nonces.sqlite", {"config-invalid"}),
                                          ("identity.key", {"identity-corrupt"}), ("peers.json", {"config-invalid"}),
                                          ("policy.toml", {"policy-invalid"}), ("person.json", {"config-invalid"}),
                                          ("config.toml", {"transport-mode-invalid", "presence-invalid"})])
def test_host_start_on_a_damaged_file_in_a_real_process(full_home, tmp_path, target, codes):
    """The sample subprocess of each file `kith host` reads at start: garbage is refused
    with the file's code and a hint, and no traceback."""
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    garbage(home / target)
    r = subprocess.run([*KITH, "--home", str(home), "host", "--offline", "--invite-file", str(tmp_path / "inv.json")],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    check(Ran(r.returncode, r.stdout, r.stderr), codes)


# ------------------------------------------------------------------ a full disk on write
@pytest.mark.parametrize("cmd", [("policy", "set", "/corpus/notes/**", "private"), ("peers", "add", "zed", "cd" * 32),
                                 ("peers", "group", "add", "team", "bob"), ("peers", "remove", "bob"),
                                 ("outbox", "remove", "--done")],
                         ids=lambda c: "_".join(c[:2]))
def test_a_full_disk_on_write_is_disk_full_and_changes_nothing(full_home, tmp_path, cmd):
    """A real full disk: the command runs with a file-size limit of one byte, so any
    write that grows a file fails (EFBIG, SIGXFSZ ignored as Python does)."""
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    before = _snapshot(home)
    r = run_proc(home, *cmd, fsize=1)
    check(r, {"disk-full"}, ok=True)
    assert not _changed(before, _snapshot(home), ()), _changed(before, _snapshot(home), ())


# ----------------------------------------------------------------------- no permission
@pytest.mark.parametrize("target,cmd,codes", [
    ("corpus/corpus.sqlite3", ("index", "status"), {"io-error"}),
    ("outbox.sqlite", ("outbox", "list"), {"io-error"}),
    ("peers.json", ("peers", "list"), {"io-error"}),
    ("person.json", ("person", "show"), {"io-error"}),
    ("person.key", ("person", "show"), {"io-error"}),
    ("identity.key", ("status",), {"io-error"}),
    ("policy.toml", ("policy", "list"), {"policy-invalid"}),  # its message says "Permission denied"
], ids=lambda v: v if isinstance(v, str) else None)
def test_an_unreadable_file_is_an_io_error_never_corrupt(full_home, tmp_path, target, cmd, codes):
    """No permission, in a real process: as root it runs without the capabilities that
    read every file (setpriv), as tests/test_cli_owner.py does."""
    prefix = without_root_reads()
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    os.chmod(home / target, 0)
    before = _snapshot(home)
    r = subprocess.run([*prefix, *KITH, "--home", str(home), *cmd], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    ran = Ran(r.returncode, r.stdout, r.stderr)
    check(ran, codes)
    assert "permission denied" in r.stderr.lower() or "cannot be opened" in r.stderr, r.stderr
    assert not _changed(before, _snapshot(home), ()), _changed(before, _snapshot(home), ())


def test_an_emptied_index_folder_is_said_and_rebuilt_too(base_home, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    shutil.rmtree(home / "corpus" / "tantivy")
    (home / "corpus" / "tantivy").mkdir()  # recreated by hand, empty
    assert "missing: run `kith index sync`" in run_inproc(home, "index", "status").out
    synced = run_inproc(home, "index", "sync")
    check(synced, None)
    assert "rebuilding it from the corpus record" in synced.err
    assert json.loads(run_inproc(home, "search", "write-ahead log", "--json").out)["results"]


@pytest.mark.parametrize("lock", [".tantivy-writer.lock", ".tantivy-meta.lock"])
def test_a_tantivy_lock_file_replaced_by_a_folder_is_rebuilt_by_sync(base_home, tmp_path, lock):
    """Attack of issue 42: the index's writer lock file replaced by a folder made `kith
    index sync` a traceback (tantivy's "Failed to acquire Lockfile"), and the hint `kith
    index sync` could never work. Sync (holding writer.lock, so no other Kith writes the
    index) rebuilds the index from the corpus record; search then answers."""
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    p = home / "corpus" / "tantivy" / lock
    p.unlink(missing_ok=True)
    p.mkdir()
    check(run_inproc(home, "index", "sync"), None)
    assert json.loads(run_inproc(home, "search", "write-ahead log", "--json").out)["results"]
    check(run_inproc(home, "index", "sync"), None)


@pytest.mark.parametrize("damage", [empty, deleted], ids=lambda d: d.__name__)
def test_a_lost_corpus_record_is_said_with_the_way_out(base_home, tmp_path, damage):
    """corpus.sqlite3 emptied or deleted beside its index: index status says the folders
    are lost and how to add them again; that way out works."""
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    damage(home / CORPUS_DB)
    status = run_inproc(home, "index", "status")
    check(status, None)
    assert "missing or empty" in status.out and "kith index add FOLDER" in status.out, status.out
    check(run_inproc(home, "index", "add", str(FIXTURE)), None)
    check(run_inproc(home, "index", "sync"), None)
    assert json.loads(run_inproc(home, "search", "write-ahead log", "--json").out)["results"]
    assert "missing or empty" not in run_inproc(home, "index", "status").out


@pytest.mark.parametrize("cmd", [("api", "serve"), ("mcp",)], ids=lambda c: c[0])
def test_a_long_running_reader_of_a_damaged_corpus_refuses_at_start(base_home, tmp_path, cmd):
    """`kith api serve` and `kith mcp` over a corpus database of random bytes: refused at
    start with its code and repair, never a traceback."""
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    from support.agents import TEST_AGENT, mcp_env

    env = mcp_env(home)  # a valid agent token: the refusal must be the corpus's, not the door's
    if cmd == ("mcp",):
        cmd = ("mcp", "--agent", TEST_AGENT)
    garbage(home / CORPUS_DB)
    proc = subprocess.Popen([*KITH, "--home", str(home), *cmd], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    check(Ran(proc.returncode, out, err), CORRUPT)


def test_the_dashboard_shows_a_damaged_corpus_with_its_code_and_way_out(base_home, tmp_path):
    """`kith dashboard` over a corpus database of random bytes: the overview and the roots
    page say corpus-corrupt and its repair (they said "no corpus yet: add a root")."""
    from node.local.dashboard.app import run_dashboard_in_thread
    from support.dashboard import logged_in

    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    garbage(home / CORPUS_DB)
    with run_dashboard_in_thread(home) as (base, login):
        client = logged_in(base, login)
        for page in ("/", "/roots"):
            r = client.get(page)
            assert r.status_code == 200, (page, r.status_code)
            assert 'id="corpus-fault"' in r.text and "corpus-corrupt" in r.text, r.text[-2000:]
            assert "no corpus yet" not in r.text


@pytest.mark.parametrize("target", list(READERS))
def test_each_home_file_damaged_in_a_real_process(full_home, tmp_path, target):
    """The sample real process of every file the sweep damages: garbage in its place, its
    first reader as `kith` itself (the in-process runs share this interpreter)."""
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    path = home / target
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        shutil.rmtree(path)
    garbage(path)
    before = _snapshot(home)
    r = run_proc(home, *READERS[target][0])
    check(r, CODES_OF.get(target, set()) | {"io-error", "control-dir-unsafe"}, ok=True)
    assert not _changed(before, _snapshot(home), (target,)), _changed(before, _snapshot(home), (target,))


# ------------------------------------------------------------ files only the host writes
@pytest.mark.iroh
@pytest.mark.parametrize("damage", [folder, "unreadable"], ids=lambda d: getattr(d, "__name__", d))
def test_a_bad_audit_key_refuses_the_host_at_start_with_its_way_out(full_home, tmp_path, damage):
    """``audit.key`` (the key of the audit's query hashes) that cannot be read: `kith host`
    is refused at start with io-error naming the file and what moving it aside loses. It
    started, and every guest query ended ``hook-failed`` (the log said only
    "hook on_message raised IsADirectoryError")."""
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    key = home / "audit.key"
    key.write_bytes(os.urandom(32))  # made by the first query a host audits
    prefix: list[str] = []
    if damage == "unreadable":
        prefix = without_root_reads()
        os.chmod(key, 0)
    else:
        damage(key)
    before = _snapshot(home)
    r = subprocess.run([*prefix, *KITH, "--home", str(home), "host", "--local", "--invite-file",
                        str(tmp_path / "inv.json")], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    ran = Ran(r.returncode, r.stdout, r.stderr)
    check(ran, {"io-error"})
    assert "audit.key" in r.stderr and "mv " in r.stderr, r.stderr
    assert not (tmp_path / "inv.json").exists()
    assert not _changed(before, _snapshot(home), ("run",)), _changed(before, _snapshot(home), ("run",))


def test_a_folder_in_place_of_a_file_written_whole_is_named_with_its_way_out(full_home, tmp_path):
    """A file Kith replaces whole (atomic_write: a temp file, then rename) with a folder in
    its place: io-error names that file, not the temp file beside it, and says to move
    the folder aside (it named `.card-seq.x1y2.tmp`, with "check that it is writable")."""
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    from node.common.home import atomic_write

    folder(home / "card-seq")
    with pytest.raises(OSError) as exc:
        atomic_write(home / "card-seq", b"1")
    assert exc.value.filename == str(home / "card-seq"), exc.value.filename
    from node.common.dbfaults import refusal_of

    err = refusal_of(exc.value)
    assert err.code == "io-error" and str(home / "card-seq") in err.message and ".tmp" not in err.message
    assert "mv " in (err.hint or ""), err.hint
    assert not [p for p in home.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("part", ["meta.json", "*.store", "*.term"])
def test_a_damaged_index_file_is_said_with_its_repair_not_ready(base_home, tmp_path, part):
    """A file of corpus/tantivy that is garbage (its meta.json, a segment's store or term
    file): search is index-unavailable naming `kith index sync`; `kith index status` and
    `kith status` say the index cannot be read and name that command (they said "ready
    yes"); the sync says it rebuilds, and the search answers again."""
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    garbage(sorted((home / "corpus" / "tantivy").glob(part))[0])
    check(run_inproc(home, "search", "write-ahead log"), {"index-unavailable"})
    status = run_inproc(home, "index", "status")
    check(status, None)
    assert "ready no" in status.out and "cannot be read: run `kith index sync`" in status.out, status.out
    overview = run_inproc(home, "status")
    check(overview, None)
    assert "index: not ready" in overview.out, overview.out
    synced = run_inproc(home, "index", "sync")
    check(synced, None)
    assert "rebuilding it from the corpus record" in synced.err, synced.err
    assert json.loads(run_inproc(home, "search", "write-ahead log", "--json").out)["results"]
    assert "ready yes" in run_inproc(home, "index", "status").out


_FULL_STATE = """
import resource, sys, os
sys.path[:0] = {paths!r}
from pathlib import Path
from node.common.errors import KithError
from node.policy.quota import QuotaStore
from node.trust.seen_nonces import SeenNonces
home = Path({home!r})
store = SeenNonces(home) if {which!r} == "nonces" else QuotaStore(home)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    for i in range(20000):
        if {which!r} == "nonces":
            store.record("p" * 32, os.urandom(16).hex() + "n" * 200, 4e9)
        else:
            store.save([(os.urandom(16).hex() + "k" * 200, 1.0, 1.0) for _ in range(20)])
except KithError as exc:
    print(exc.code, "|", exc.hint)
except Exception as exc:
    print("raw", type(exc).__name__, exc)
else:
    print("ok")
"""


@pytest.mark.parametrize("which,name", [("nonces", "seen-nonces.sqlite"), ("quota", "quota.sqlite")])
def test_a_full_disk_on_a_host_state_database_is_disk_full(full_home, tmp_path, which, name):
    """The seen nonces (written at each handshake) and the quota buckets (at each query)
    under a real file-size limit: a write that finds it full is disk-full naming the file,
    never a bare sqlite3 'disk I/O error' (`kith host` logged only "a connection of … failed"
    and the guest saw remote-error)."""
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    limit = max([p.stat().st_size for p in home.glob(name + "*")] + [32768]) + 20_000
    script = _FULL_STATE.format(paths=sys.path, home=str(home), which=which, limit=limit)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("disk-full |"), r.stdout + r.stderr[-2000:]


def test_a_connection_ended_by_a_fault_of_the_home_is_told_with_its_code():
    """What `kith host` logs for a connection that ended with a fault of the home (raised
    inside the connection's task group): its code and hint, not a bare "failed"."""
    from node.common.dbfaults import disk_full, refusal_of

    inner = disk_full("seen-nonces.sqlite")
    found = refusal_of(ExceptionGroup("unhandled errors in a TaskGroup", [ValueError("x"), inner]))
    assert found is inner and found.hint
    assert refusal_of(ExceptionGroup("g", [OSError(28, "No space left on device", "quota.sqlite")])).code == "disk-full"
    assert refusal_of(ValueError("a bug")) is None


def _as_a_killed_first_sync_leaves_it(home: Path) -> None:
    """The record a `kith index sync` killed in its first run leaves: no sync completed
    (no last_sync), documents still ``processing``."""
    db = sqlite3.connect(home / CORPUS_DB)
    db.execute("DELETE FROM meta WHERE key = 'last_sync'")
    db.execute("UPDATE documents SET status = 'processing'")
    db.commit()
    db.close()


def test_a_search_after_a_killed_first_sync_names_its_way_out(base_home, tmp_path):
    """A first sync killed midway: search said "no results (index-syncing)" and exit 0 while
    no sync ran, with nothing saying what to do; it now says the sync did not finish and
    names `kith index sync`, which finishes it."""
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    _as_a_killed_first_sync_leaves_it(home)
    r = run_inproc(home, "search", "zzzqqq nothing matches this")
    check(r, None)
    assert "did not finish" in r.err and "kith index sync" in r.err, (r.out, r.err)
    check(run_inproc(home, "index", "sync"), None)
    again = run_inproc(home, "search", "zzzqqq nothing matches this")
    assert "did not finish" not in again.err, again.err


@pytest.mark.parametrize("how", ["deleted", "garbage"])
def test_an_index_lost_under_a_running_reader_is_unavailable_then_recovers(base_home, tmp_path, how):
    """`kith host` (a long-running reader of the corpus) after corpus/tantivy is deleted or
    its meta.json made garbage under it: the answer is index-unavailable (the guest's
    envelope says so) and, once `kith index sync` rebuilt it, the same reader answers
    again. It was a ValueError out of tantivy's reload: every query ended hook-failed,
    logged as "hook on_message raised ValueError"."""
    from node.answer.service import answer_local
    from node.corpus.store import Corpus

    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    corpus = Corpus(home, readonly=True)
    try:
        assert answer_local(corpus, {"query": "write-ahead log", "topK": 1})["status"] == "ok"
        if how == "deleted":
            shutil.rmtree(home / "corpus" / "tantivy")
        else:
            garbage(home / "corpus" / "tantivy" / "meta.json")
        lost = answer_local(corpus, {"query": "write-ahead log", "topK": 1})
        assert lost["status"] == "index-unavailable", lost["status"]
        check(run_inproc(home, "index", "sync"), None)
        again = answer_local(corpus, {"query": "write-ahead log", "topK": 1})
        assert again["status"] == "ok" and again["envelope"]["results"], again["status"]
    finally:
        corpus.close()


@pytest.mark.parametrize("raised", ["disk-full", "oserror"])
def test_a_hook_ended_by_a_fault_of_the_home_logs_its_code_and_hint(tmp_path, caplog, raised):
    """A protocol hook (the host's answer to a query) that meets a fault of the home — a
    full disk under the quota buckets, a file that cannot be read — is logged with the
    code and its hint: it was "hook on_message refused: disk-full" with no way out, or
    "hook on_message raised PermissionError"."""
    import anyio

    from node.common.dbfaults import disk_full
    from node.runtime.driver import HookError, _call_hook

    bad = tmp_path / "quota.sqlite"

    def on_message(*_a):
        if raised == "disk-full":
            raise disk_full(str(bad))
        raise PermissionError(13, "Permission denied", str(bad))

    caplog.set_level("WARNING", logger="kith")
    with pytest.raises(HookError) as exc:
        anyio.run(_call_hook, on_message, (), 5.0)
    want = "disk-full" if raised == "disk-full" else "io-error"
    assert want in exc.value.message
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"[{want}]" in line and "hint:" in line and "quota.sqlite" in line for line in lines), lines


def test_status_says_a_person_record_lost_beside_its_key(base_home, tmp_path):
    """person.json deleted beside person.key: `kith status` said nothing of the person at
    all (no line, exit 0), while `kith person show` is refused config-invalid; it now says
    the person cannot be read, with the code and where the repair is said."""
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    (home / "person.json").unlink()
    r = run_inproc(home, "status")
    check(r, None)
    assert "person: unreadable [config-invalid] (`kith person show`" in r.out, r.out
    doc = json.loads(run_inproc(home, "status", "--json").out)
    assert doc["identity"]["personError"] == "config-invalid"
    shown = run_inproc(home, "person", "show")
    check(shown, {"config-invalid"})


def test_the_background_runner_of_api_serve_stops_with_a_code_not_a_traceback(full_home, tmp_path):
    """`kith api serve` over an identity.key of random bytes: the API serves on, and its
    background runner (the outbox and copies) stops with one line naming the code and
    hint — it printed a 20-line traceback. (A config.toml that is a folder is refused at
    start, as `kith mcp` refuses it: tests/test_transport_modes.py.)"""
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    garbage(home / "identity.key")
    proc = subprocess.Popen([*KITH, "--home", str(home), "api", "serve", "--port", "0"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = lines_until(proc, proc.stderr, lambda line: "background runner stopped" in line, 60)
    finally:
        proc.terminate()
        try:
            rest = proc.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            rest = proc.communicate()[1]
    err = "".join(lines) + pending(proc.stderr) + rest
    assert "Traceback" not in err, err[-3000:]
    stopped = next(line for line in lines if "background runner stopped" in line)
    assert "[identity-corrupt]" in stopped, stopped
    assert "hint:" in stopped, stopped


@pytest.mark.parametrize("cmd", [("index", "status"), ("index", "sync"), ("status",), ("search", "write-ahead log")],
                         ids=lambda c: "_".join(c))
def test_an_unreadable_index_folder_is_io_error_not_a_traceback(base_home, tmp_path, cmd):
    """corpus/tantivy with no permission, in a real process without root's read
    capabilities: index status, index sync (and kith host) were a ValueError traceback out
    of tantivy's Index.exists; now io-error naming the folder (status: its index line),
    search index-unavailable; nothing in the home changes."""
    prefix = without_root_reads()
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    index = home / "corpus" / "tantivy"
    before = _snapshot(home)
    os.chmod(index, 0)
    try:
        r = subprocess.run([*prefix, *KITH, "--home", str(home), *cmd], capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    finally:
        os.chmod(index, 0o700)
    ran = Ran(r.returncode, r.stdout, r.stderr)
    if cmd == ("status",):
        check(ran, None)
        assert "index: unreadable [io-error]" in r.stdout, r.stdout
    elif cmd[0] == "search":
        check(ran, {"index-unavailable", "io-error"})
    else:
        check(ran, {"io-error"})
        assert "corpus/tantivy" in r.stderr, r.stderr
    assert not _changed(before, _snapshot(home), ()), _changed(before, _snapshot(home), ())


def test_a_control_folder_this_user_cannot_reach_is_refused_with_a_hint(full_home, tmp_path):
    """<home>/run with no permission (as another user would meet it): `kith status` and
    `kith sessions` were refused control-forbidden with no hint at all."""
    prefix = without_root_reads()
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    (home / "run").mkdir(mode=0o700, exist_ok=True)
    os.chmod(home / "run", 0)
    try:
        for cmd in (("status",), ("sessions",)):
            r = subprocess.run([*prefix, *KITH, "--home", str(home), *cmd], capture_output=True, text=True,
                               timeout=120, stdin=subprocess.DEVNULL)
            check(Ran(r.returncode, r.stdout, r.stderr), {"control-forbidden"})
            assert "chmod 700" in r.stderr, r.stderr
    finally:
        os.chmod(home / "run", 0o700)


@pytest.mark.iroh
def test_an_audit_key_of_garbage_is_replaced_and_said(full_home, tmp_path):
    """audit.key that is not a 32-byte key (random bytes): `kith host` replaces it, as
    before, and now says so at start — earlier query hashes no longer match new ones (it
    was replaced without a word)."""
    from support.hosts import HostProcess

    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    garbage(home / "audit.key")
    host = HostProcess(home, "--invite-file", str(tmp_path / "inv.json"))
    code, _, err = host.stop()
    assert code == 0 and "Traceback" not in err, err
    assert "audit.key" in err and "no longer match" in err, err
    assert len((home / "audit.key").read_bytes()) == 32


def test_ask_later_that_keeps_nothing_makes_no_outbox(base_home, tmp_path):
    """`kith ask --later` whose every peer is refused (an unknown name) keeps nothing and
    exits 1: the home is left as it was (its room check made an empty outbox.sqlite)."""
    home = tmp_path / "home"
    shutil.copytree(base_home, home, symlinks=True)
    for p in home.glob(OUTBOX + "*"):
        p.unlink()
    before = _snapshot(home)
    r = run_proc(home, "ask", "--peer", "nobody", "when does the staging server restart", "--later")
    assert r.code == 1 and "peer-not-found" in r.out + r.err, (r.code, r.out, r.err)
    assert "Traceback" not in r.err
    assert not (home / OUTBOX).exists()
    assert not _changed(before, _snapshot(home), ()), _changed(before, _snapshot(home), ())


@pytest.mark.parametrize("target", ["manifest.json", "grant.json"])
def test_a_copy_file_nested_too_deep_is_a_damaged_copy_not_a_traceback(full_home, tmp_path, target):
    """Attack of issue 42: a copy's manifest.json or grant.json of 200,000 nested arrays made
    `kith copies list` and `kith status` a RecursionError traceback (the loaders caught only
    ValueError). A manifest is then a damaged copy with its way out; a grant is unread."""
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    copy = home / "copies" / "bob"
    copy.mkdir(parents=True)
    (copy / "manifest.json").write_text(json.dumps({"v": 1, "peer": "bob", "hostKey": "ef" * 32, "syncedAt": None,
                                                    "maxBytes": None, "documents": {}}))
    nested(copy / target)
    for cmd in (("copies", "list"), ("status",)):
        r = run_inproc(home, *cmd)
        assert "Traceback" not in r.out + r.err, (cmd, r.err[-2000:])
        assert r.code in (0, 1), (cmd, r.code, r.err)
    listed = run_inproc(home, "copies", "list")
    if target == "manifest.json":
        check(listed, {"config-invalid"})  # error [config-invalid] and its hint on stderr
        assert "kith copies remove bob" in listed.err
    else:
        assert listed.code == 0, listed.err


@pytest.mark.parametrize("damage", [b"[[[[", b"\xff\xfe not json"])
def test_a_damaged_person_record_fails_ask_and_join_with_its_hint_not_as_the_peers_refusal(tmp_path, damage):
    """Found by the attack pass of issue 42: `kith ask` showed a damaged own person.json as
    the peer's row ("refused config-invalid", exit 1) with no hint naming the file; ask and
    join now fail before dialling, with the record's own code and way out."""
    from support.homes import initialized

    home = initialized(tmp_path / "g")
    other = initialized(tmp_path / "other")
    key = json.loads(kith(other, "status", "--json").stdout)["identity"]["key"]
    assert kith(home, "peers", "add", "alice", key).returncode == 0
    (home / "person.json").write_bytes(damage)
    for args in (("ask", "hello there", "--peer", "alice", "--offline", "--timeout", "3"),
                 ("join", str(tmp_path / "missing-invite.json"), "--offline", "--trust")):
        r = kith(home, *args, timeout=60)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "error [config-invalid]: person.json" in r.stderr and "hint:" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "alice" not in r.stdout


def test_a_file_where_the_copies_folder_goes_is_refused_with_the_mv_that_moves_it(tmp_path):
    """Found by the attack pass of issue 42: `kith copies sync` over a home whose copies/
    folder is a file said "io-error ... File exists" with no way out."""
    from support.homes import initialized

    home = initialized(tmp_path / "g")
    other = initialized(tmp_path / "other")
    key = json.loads(kith(other, "status", "--json").stdout)["identity"]["key"]
    assert kith(home, "peers", "add", "alice", key).returncode == 0
    (home / "copies").write_text("not a folder\n")
    r = kith(home, "copies", "sync", "alice", "--offline", timeout=60)
    assert r.returncode == 1 and "io-error" in r.stderr and "Traceback" not in r.stderr, r.stderr
    hint = f"`mv {home / 'copies'} {home / 'copies'}.bad`"
    assert hint in r.stderr, r.stderr
    shutil.move(str(home / "copies"), str(home / "copies.bad"))  # the way out works
    r = kith(home, "copies", "sync", "alice", "--offline", "--timeout", "3", timeout=60)
    assert "File exists" not in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.iroh
@pytest.mark.parametrize("damage", ["garbage", "folder"])
def test_damaged_held_mail_refuses_the_holders_start_with_the_mv_that_moves_it(tmp_path, damage):
    """Issue 42's matrix covers the sealed mail this round adds: a device's held mail
    (``kith host --hold-mail``, ``<home>/mailbox.sqlite3``) that cannot be opened refuses the
    start with its code, its file and the way out, no traceback; following it, the host starts."""
    from support.homes import initialized
    from support.hosts import HostProcess

    home = initialized(tmp_path / "h")
    held = home / "mailbox.sqlite3"
    if damage == "folder":
        held.mkdir()
    else:
        held.write_bytes(os.urandom(5000))
    args = ("host", "--offline", "--hold-mail", "127.0.0.1:0", "--invite-file", str(tmp_path / "inv.json"))
    r = kith(home, *args, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "error [database-unavailable]" in r.stderr and f"`mv {held} {held}.bad`" in r.stderr, r.stderr
    shutil.move(str(held), str(held) + ".bad")
    h = HostProcess(home, "--hold-mail", "127.0.0.1:0", "--invite-file", str(tmp_path / "inv.json"))
    code, _out, err = h.stop()
    assert code == 0 and "Traceback" not in err, err


#: the host's state databases ``kith status`` probes (``hostFiles``, node/cli/status_cmd.py::_host_files):
#: file name -> (its table as the host makes it, one row of it from a number)
STATE_DBS: dict[str, tuple[str, Callable[[int], tuple]]] = {
    "sealed-seen.sqlite": ("CREATE TABLE sealed_seen (key TEXT PRIMARY KEY, until INTEGER NOT NULL, reply TEXT, "
                           "done INTEGER NOT NULL)",
                           lambda i: (f"question:{i:064x}:{i:032x}", 4_000_000_000, None, 1)),
    "quota.sqlite": ("CREATE TABLE bucket (key TEXT PRIMARY KEY, tokens REAL NOT NULL, stamp REAL NOT NULL)",
                     lambda i: (f"peer:{i:064x}", 10.0, 4_000_000_000.0)),
    "seen-nonces.sqlite": ("CREATE TABLE seen_nonce (nonce TEXT PRIMARY KEY, post_id TEXT NOT NULL, "
                           "expires_at REAL NOT NULL)",
                           lambda i: (f"{i:064x}", f"post-{i}", 4_000_000_000.0)),
}


def _state_rows(path: Path) -> None:
    """``path`` as the host's state database of its name (:data:`STATE_DBS`) with rows in
    it (pages enough that a truncated copy loses some)."""
    table, row = STATE_DBS[path.name]
    db = sqlite3.connect(path)
    db.execute(table)
    rows = [row(i) for i in range(2000)]
    db.executemany(f"INSERT INTO {table.split()[2]} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    db.commit()
    db.close()


def _damaged_state_db(tmp_path: Path, name: str, damage: Callable[[Path], None]) -> tuple[Path, Path, dict[str, str]]:
    """A fresh home whose state database ``name`` holds rows and is then put through
    ``damage``: ``(home, the file, the home's snapshot after the damage)``."""
    from support.homes import initialized

    home = initialized(tmp_path / "h")
    path = home / name
    _state_rows(path)
    damage(path)
    return home, path, _snapshot(home)


def _same_file(home: Path, before: dict[str, str], name: str) -> bool:
    """Whether ``name`` (with its -wal/-shm) is as ``before`` had it: other files may
    change (the first command makes agents.json)."""
    return ({k: v for k, v in _snapshot(home).items() if k.startswith(name)}
            == {k: v for k, v in before.items() if k.startswith(name)})


@pytest.mark.iroh
@pytest.mark.parametrize("damage", [garbage, truncated, folder], ids=lambda d: d.__name__)
def test_a_damaged_sealed_seen_set_refuses_the_mailbox_hosts_start_with_its_way_out(tmp_path, damage):
    """``<home>/sealed-seen.sqlite`` (the sealed questions a host answered, specs/sealed.md
    §5) that cannot be read refuses ``kith host`` with a mailbox at start: its code, a hint
    with the ``mv`` that moves it aside, no traceback, the file left as it was; following the
    hint, the host starts (a folder in its place said "disk I/O error" with no way out)."""
    from support.hosts import HostProcess

    home, seen, before = _damaged_state_db(tmp_path, "sealed-seen.sqlite", damage)
    args = ("host", "--offline", "--hold-mail", "127.0.0.1:0", "--invite-file", str(tmp_path / "inv.json"))
    r = kith(home, *args, timeout=60)
    check(Ran(r.returncode, r.stdout, r.stderr), {"config-invalid"} if damage is not folder else {"io-error"})
    assert f"mv {seen} {seen}.bad" in r.stderr, r.stderr
    assert _same_file(home, before, seen.name)
    shutil.move(str(seen), str(seen) + ".bad")
    h = HostProcess(home, "--hold-mail", "127.0.0.1:0", "--invite-file", str(tmp_path / "inv.json"))
    code, _out, err = h.stop()
    assert code == 0 and "Traceback" not in err, err


def test_a_folder_in_a_files_place_under_the_runner_is_told_with_the_mv_that_moves_it(tmp_path, caplog):
    """A runner task whose step meets a folder where a file of the home goes (a real
    ``IsADirectoryError``): the one line it is told with names the folder and the ``mv``
    that moves it aside, as every other command says it (node/common/dbfaults.py::os_fault)."""
    from node.guest.runner import Runner

    spot = tmp_path / "sent.jsonl"
    spot.mkdir()
    caplog.set_level("WARNING", logger="kith.runner")
    told: dict = {}
    for _ in range(3):
        try:
            spot.open("a").close()
        except OSError as exc:
            Runner._tell("outbox", exc, told, 1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "[io-error]" in lines[0], lines
    assert f"`mv {spot} {spot}.bad`" in lines[0], lines


def test_a_spawned_job_failing_at_every_step_is_told_once_and_its_recovery_said(tmp_path, caplog):
    """A job the runner spawns at every step that fails each time (a bug: the first with
    its traceback; then a typed refusal: one line with its code) is told once per fault,
    not once per step, and ``works again`` is said once it ends well."""
    import anyio

    from node.common.errors import ConfigError
    from node.guest.owner import Guest
    from node.guest.runner import Runner

    faults = [RuntimeError("boom")] * 4 + [ConfigError("io-error", "sent.jsonl cannot be written", hint="fix it")] * 3
    done = anyio.Event()
    busy: set[str] = set()

    async def deliver(_runner, peer: str) -> None:
        try:
            if faults:
                raise faults.pop(0)
            done.set()
        finally:
            busy.discard(peer)

    class Flaky:
        name = "flaky"

        async def step(self, runner) -> float:
            if "alice" not in busy and not done.is_set():
                busy.add("alice")
                runner.spawn(deliver, runner, "alice")
            return 0.01

    caplog.set_level("WARNING", logger="kith.runner")

    async def main() -> None:
        runner = Runner(Guest(tmp_path), [Flaky()], command="test")
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run)
            with anyio.fail_after(60):  # a hang guard, not a timing
                await done.wait()
                while not any("works again" in r.getMessage() for r in caplog.records):
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main)
    records = [r for r in caplog.records if "deliver" in r.getMessage()]
    lines = [r.getMessage() for r in records]
    assert len(lines) == 3, lines
    assert "runner job deliver failed" in lines[0] and records[0].exc_info, lines
    assert "[io-error]" in lines[1] and "hint: fix it" in lines[1] and not records[1].exc_info, lines
    assert lines[2] == "runner job deliver works again", lines


@pytest.mark.parametrize("name", list(STATE_DBS))
@pytest.mark.parametrize("damage", [garbage, truncated, folder], ids=lambda d: d.__name__)
def test_status_names_a_damaged_host_state_db_the_host_would_refuse(tmp_path, name, damage):
    """``kith status`` over a host state database (``sealed-seen.sqlite``, ``quota.sqlite``,
    ``seen-nonces.sqlite``) that ``kith host`` refuses to start on: one ``host file:`` line
    with its code and the ``mv`` that moves it aside (and ``hostFiles`` in ``--json``),
    exit 0, the file left as it was; once moved aside, status says nothing of it."""
    home, path, before = _damaged_state_db(tmp_path, name, damage)
    r = kith(home, "status", timeout=60)
    code = "io-error" if damage is folder else "config-invalid"
    check(Ran(r.returncode, r.stdout, r.stderr), None)
    told = [line for line in r.stdout.splitlines() if line.startswith("host file:")]
    assert len(told) == 1 and name in told[0] and f"[{code}]" in told[0], r.stdout
    assert f"mv {path} {path}.bad" in told[0], told
    as_json = json.loads(kith(home, "status", "--json", timeout=60).stdout)["hostFiles"]
    assert [(f["file"], f["code"]) for f in as_json] == [(name, code)]
    assert _same_file(home, before, name)
    shutil.move(str(path), str(path) + ".bad")
    r = kith(home, "status", timeout=60)
    assert r.returncode == 0 and "host file:" not in r.stdout, r.stdout


# ---------------------------------------------------------- a FIFO where a file should be
def fifo(p: Path) -> None:
    """A named pipe in the file's place: opening it to read blocks until a writer comes,
    which never does — a command must say the file is not a regular one, never hang."""
    if p.exists():
        deleted(p)
    os.mkfifo(p)


#: the readers of each file that opened it with a blocking open (hung on a FIFO)
FIFO_READERS = [(target, cmd) for target in ("agents.json", "peers.json", "person.json", "person.key", "policy.toml",
                                             "config.toml", "revocations.json", "profile.json", "corpus/tantivy/meta.json",
                                             "audit.jsonl", "quota.sqlite", "seen-nonces.sqlite")
                for cmd in READERS.get(target, [("status",), ("index", "status"), ("search", "sqlite")])]
FIFO_READERS.append(("sent-approvals.json", ("sent", "approve", "0123456789abcdef")))


@pytest.mark.parametrize("target,cmd", FIFO_READERS, ids=[f"{t}-{'_'.join(c)}" for t, c in FIFO_READERS])
def test_a_fifo_in_place_of_a_home_file_never_hangs_a_command(full_home, tmp_path, target, cmd):
    """A real process (a hang in this one would hang the suite): it ends within its
    timeout with exit 0 (the file is not needed) or a typed refusal naming the file, and
    the FIFO is left as it is."""
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    fifo(home / target)
    before = _snapshot(home)
    try:
        r = subprocess.run([*KITH, "--home", str(home), *cmd], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kith {' '.join(cmd)} hung on a FIFO at {target}")
    ran = Ran(r.returncode, r.stdout, r.stderr)
    check(ran, CODES_OF.get(target, set()) | {"io-error", "index-unavailable"}, ok=True)
    if ran.code:
        assert Path(target).name in r.stderr or "index" in r.stderr, r.stderr
    assert not _changed(before, _snapshot(home), ()), _changed(before, _snapshot(home), ())


@pytest.mark.parametrize("whole_home", [False, True], ids=["index-folder", "whole-home"])
def test_an_index_it_may_read_but_not_write_is_searched_and_left_as_it_is(full_home, tmp_path, whole_home):
    """tantivy takes its lock file (``.tantivy-meta.lock``) even to read: an index folder
    (or a whole home) this user may read but not write (a read-only copy, a chmod; real
    processes without root's DAC capabilities) could not be searched — `kith search` said
    ``index-unavailable``, `kith index status` ``io-error``. It is opened through a private
    folder of links in the temporary folder: search answers, both statuses say the index is
    ready, nothing in the home changes and no temporary folder is left behind."""
    from support.homes import files_of, read_only

    prefix = without_root_reads()
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}

    def kith_ro(*cmd: str) -> Ran:
        r = subprocess.run([*prefix, *KITH, "--home", str(home), *cmd], capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL, env=env)
        return Ran(r.returncode, r.stdout, r.stderr)

    with read_only(home if whole_home else home / "corpus" / "tantivy") as before:
        found = kith_ro("search", "write-ahead log", "--json")
        status = kith_ro("index", "status")
        home_status = kith_ro("status")
        after = files_of(home if whole_home else home / "corpus" / "tantivy")
    for ran in (found, status, home_status):
        check(ran, None)
    assert json.loads(found.out)["results"], found.out
    assert "ready yes" in status.out, status.out
    assert "index: ready" in home_status.out, home_status.out
    assert after == before
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("target", ["sent.jsonl", "outbound.fp"])
def test_a_fifo_in_place_of_the_outbound_log_or_fingerprints_never_hangs_kith_ask(full_home, tmp_path, target):
    """`kith ask` checks a question against outbound.fp (the private text's fingerprints)
    and logs it to sent.jsonl (opened to append): a FIFO in either place ends the command
    within its timeout — never a command blocked in open() until a reader or writer comes.
    A FIFO log is a typed refusal naming it; FIFO fingerprints are rewritten, and the gate
    still holds a question carrying private text."""
    home = tmp_path / "home"
    shutil.copytree(full_home, home, symlinks=True)
    check(run_inproc(home, "policy", "set", "/corpus/notes/**", "private"), None)
    fifo(home / target)
    private = "The salary bands for next year are confidential. Bonus pool: see the spreadsheet."
    try:
        r = subprocess.run([*KITH, "--home", str(home), "ask", private, "--peer", "bob"],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kith ask hung on a FIFO at {target}")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, (r.returncode, r.stderr)
    if target == "sent.jsonl":
        assert "error [io-error]" in r.stderr and "sent.jsonl" in r.stderr, r.stderr
        assert stat.S_ISFIFO(os.lstat(home / target).st_mode)
    else:
        assert "error [outbound-needs-confirmation]" in r.stderr and "private-text" in r.stderr, r.stderr
        assert (home / target).is_file()
