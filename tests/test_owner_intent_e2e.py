"""Issue 20, "Done when": the quick start run through real ``kith`` processes with the
mistakes a person makes — a typo'd home, a policy typo, a folder rule without a glob, a
cp1252 note, a file copied twice, a killed host — and nothing may claim success falsely."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from support.cli import KITH, kith, readline as _readline

pytestmark = [pytest.mark.iroh, pytest.mark.slow]

ENV = {**os.environ, "KITH_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "200"}


kith = functools.partial(kith, env=ENV)


def test_the_quick_start_with_a_person_s_mistakes_never_claims_success_falsely(tmp_path: Path) -> None:
    host = tmp_path / "kith-host"
    assert kith(host, "init").returncode == 0

    # 1. a typo'd home: refused, and nothing is created
    typo = tmp_path / "kith-hots"
    r = kith(typo, "peers", "block", "a" * 64)
    assert r.returncode != 0 and "home-not-initialized" in r.stderr and "blocked" not in r.stdout
    assert not typo.exists()

    # the corpus: a cp1252 note, a document copied into two folders, a folder to keep back
    corpus = tmp_path / "notes"
    (corpus / "legacy").mkdir(parents=True)
    (corpus / "legacy" / "memo.txt").write_bytes(
        "Reminder: the deadline is \u201cFriday\u201d \u2014 don\u2019t forget the \u20ac120 fee.\n".encode("cp1252"))
    for folder in ("team", "team-copy"):
        (corpus / folder).mkdir()
        (corpus / folder / "rotation.md").write_text(
            "# On-call rotation\n\nThe pager rotation hands over every Monday at nine.\n")
    (corpus / "odd").mkdir()
    (corpus / "odd" / "salaries.txt").write_text("Confidential salary bands for the pager team.\n")
    assert kith(host, "index", "add", str(corpus)).returncode == 0
    assert kith(host, "index", "sync").returncode == 0

    # 2. a policy typo is kept but warned about, naming the folder that exists
    r = kith(host, "policy", "set", "/notes/oddd/**", "private")
    assert r.returncode == 0 and "matches no indexed source" in r.stderr and "did you mean /notes/odd/**?" in r.stderr
    # 3. a folder rule without a glob covers everything below it
    assert kith(host, "policy", "set", "/notes/**", "public").returncode == 0
    r = kith(host, "policy", "set", "/notes/odd", "never")
    assert r.returncode == 0 and "decides 1 indexed source" in r.stdout
    r = kith(host, "policy", "explain", "/notes/odd/salaries.txt")
    assert "tier:      never" in r.stdout and "matched:   /notes/odd" in r.stdout

    # 4. the cp1252 note reads like its source
    r = kith(host, "search", "deadline Friday fee", "--json")
    env = json.loads(r.stdout)
    memo = [x for x in env["results"] if x["source"] == "/notes/legacy/memo.txt"]
    assert memo and "\u201cFriday\u201d \u2014 don\u2019t" in memo[0]["textPreview"] and "\u20ac120" in memo[0]["textPreview"]

    # 5. a file copied twice is one result that says where else it is
    env = json.loads(kith(host, "search", "pager rotation Monday", "--json").stdout)
    rotation = [x for x in env["results"] if x["source"].endswith("/rotation.md")]
    assert len(rotation) == 1
    assert {rotation[0]["source"], *(a["source"] for a in rotation[0]["alsoIn"])} == {
        "/notes/team/rotation.md", "/notes/team-copy/rotation.md"}

    # a guest asks through a real host; the kept-back folder never leaves
    invite = tmp_path / "invite.json"
    proc = subprocess.Popen([*KITH, "--home", str(host), "host", "--local", "--json", "--invite-file", str(invite)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            stdin=subprocess.DEVNULL)
    guest = tmp_path / "kith-guest"
    try:
        json.loads(_readline(proc, 60))
        assert kith(guest, "init").returncode == 0
        r = kith(guest, "join", str(invite), "--local", "--trust", "--json", "--query", "salary bands pager team")
        assert r.returncode in (0, 1), r.stderr
        answers = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        sources = {res["source"] for a in answers for res in (a.get("envelope") or {}).get("results", [])}
        assert sources and "/notes/odd/salaries.txt" not in sources
        pinned = kith(guest, "peers", "add", "office", json.loads(invite.read_text())["host_public_key"],
                      "--invite", str(invite))
        assert pinned.returncode == 0, pinned.stderr
    finally:
        # 6. the host is killed: no FIN, no QUIC close
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    r = kith(guest, "ask", "pager rotation", "--peer", "office", "--offline", "--json", "--timeout", "3")
    env = json.loads(r.stdout)
    assert r.returncode == 1 and env["complete"] is False and env["missing"] == ["office"]
