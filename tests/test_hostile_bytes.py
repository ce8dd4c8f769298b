"""Hostile bytes (issue 42 item 2): a question that is not valid UTF-8 (bytes Python turns
into lone surrogates) is ``query-invalid`` in ``kith search``, ``kith ask`` and ``kith join
--query`` — checked in one place, ``node.answer.contract.validate`` — and a question the
contract refuses at the interactive ``ask>`` prompt gets the same refusal as with
``--query`` while the session goes on. Real processes: argv and stdin carry raw bytes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from node.answer import contract
from node.common.errors import CorpusError

from support.cli import KITH, kith, next_line
from support.homes import initialized
from support.hosts import HostProcess, notes_host

BAD = b"temp\xff\xfefile"


def _run(home: Path, *args: bytes | str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    argv = [*KITH, "--home", str(home), *args]
    return subprocess.run(argv, capture_output=True, input=stdin, timeout=timeout,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


def _refused(proc: subprocess.CompletedProcess, code: str, status: int) -> None:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == status, (proc.returncode, err)
    assert f"error [{code}]" in err, err
    assert "Traceback" not in err and "Traceback" not in proc.stdout.decode("utf-8", "replace")


@pytest.mark.parametrize("value", ["temp\udcff\udcfefile", "a\ud800b", "\udfff"])
def test_the_contract_refuses_lone_surrogates_in_the_query_and_filters(value):
    with pytest.raises(CorpusError) as exc:
        contract.validate({"query": value})
    assert exc.value.code == "query-invalid" and "UTF-8" in exc.value.message
    with pytest.raises(CorpusError) as exc:
        contract.validate({"query": "ok", "tags": [value]})
    assert exc.value.code == "query-invalid" and "'tags'" in exc.value.message
    with pytest.raises(CorpusError) as exc:
        contract.validate({"query": "ok", "sources": ["/" + value]})
    assert exc.value.code == "query-invalid"


def test_undecodable_bytes_are_query_invalid_in_every_command(tmp_path):
    home = initialized(tmp_path / "home")
    _refused(_run(home, "search", BAD), "query-invalid", 1)
    _refused(_run(home, "search", "--json", BAD), "query-invalid", 1)
    _refused(_run(home, "search", "ok", "--source", b"/x/" + BAD), "query-invalid", 1)
    _refused(_run(home, "ask", "--local", BAD), "query-invalid", 2)
    # a bad question on the command line is a bad command line: exit 2 in both (specs/cli.md, specs/ask.md §6)
    _refused(_run(home, "join", str(tmp_path / "invite.json"), "--query", BAD), "query-invalid", 2)
    assert not (home / "outbox.sqlite").exists()


@pytest.mark.iroh
def test_a_question_refused_at_the_prompt_reads_like_query_and_keeps_the_session(tmp_path):
    host_home = notes_host(tmp_path)
    guest = initialized(tmp_path / "guest")
    invite = tmp_path / "invite.json"
    host = HostProcess(host_home, "--invite-file", str(invite))
    try:
        too_long = "x" * (contract.MAX_QUERY_CHARS + 1)
        typed = b"\n".join([too_long.encode(), b"a\x00b", BAD, b"staging server", b""])
        proc = _run(guest, "join", str(invite), "--offline", "--trust", "--json", stdin=typed, timeout=120)
        by_query = _run(guest, "join", str(invite), "--query", too_long)
    finally:
        host.stop()
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    refusals = [line for line in err.splitlines() if "error [" in line]
    assert len(refusals) == 3 and all("error [query-invalid]" in line for line in refusals), refusals
    # the same words as the refusal of --query
    first = by_query.stderr.decode().splitlines()[0]
    assert first in refusals[0], (first, refusals[0])
    # the session went on: the fourth question was asked and answered
    answers = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.strip()]
    results = [a for a in answers if a.get("action") == "results"]
    assert len(results) == 1 and results[0]["status"] == "ok", answers


def test_file_and_folder_names_that_are_not_utf8_are_skipped_and_counted(tmp_path):
    import os

    home = initialized(tmp_path / "home")
    root = tmp_path / "notes"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\nThe staging server restarts at noon.\n")
    raw = os.fsencode(root)
    with open(raw + b"/bad\xfe.md", "wb") as f:
        f.write(b"# Bad\n\nhidden words here\n")
    os.mkdir(raw + b"/dir\xff")
    with open(raw + b"/dir\xff/inside.md", "wb") as f:
        f.write(b"# Inside\n\nhidden words here\n")
    assert kith(home, "index", "add", str(root)).returncode == 0
    proc = kith(home, "index", "sync", "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["indexed"] == 1 and report["ignored"] == {"name-not-utf8": 2}, report
    found = kith(home, "search", "staging server", "--json")
    assert found.returncode == 0 and json.loads(found.stdout)["results"], found.stderr
    assert not json.loads(kith(home, "search", "hidden words", "--json").stdout)["results"]


def test_a_root_whose_path_is_not_utf8_is_refused_with_its_own_code(tmp_path):
    import os

    home = initialized(tmp_path / "home")
    bad = os.fsencode(tmp_path) + b"/folder\xff"
    os.mkdir(bad)
    _refused(_run(home, "index", "add", bad), "root-path-invalid", 1)
    assert json.loads(kith(home, "index", "status", "--json").stdout)["roots"] == 0


def test_undecodable_bytes_in_other_arguments_get_the_arguments_own_code(tmp_path):
    """Names, globs and files given as bytes that are not UTF-8: each argument's own
    refusal, never a traceback."""
    home = initialized(tmp_path / "home")
    for args, code in [(("peers", "remove", BAD), "peer-not-found"),
                       (("policy", "set", "/x/**", "peers", "--peer", BAD), "peer-bad-name"),
                       (("policy", "set", b"/x/" + BAD, "public"), "policy-bad-glob"),
                       (("verify", BAD), "file-not-found"),
                       (("join", BAD), "invitation-malformed"),
                       (("index", "add", str(tmp_path), "--name", BAD), "root-name-invalid")]:
        proc = _run(home, *args)
        err = proc.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err, (args, err)
        _refused(proc, code, proc.returncode or 1)
        if code == "policy-bad-glob":
            assert "not valid UTF-8" in err, err


def test_an_mcp_request_holding_a_lone_surrogate_is_answered_query_invalid(tmp_path):
    """`kith mcp` over real stdio: the MCP library's parser refuses a JSON ``\\udcff``
    escape and dropped the request (its client waited forever); it is answered with
    [query-invalid], and the next request is served as usual."""
    import sys

    from support.agents import mcp_env

    home = initialized(tmp_path / "home")
    proc = subprocess.Popen([sys.executable, "-c", f"from node.local.mcp import run_stdio; run_stdio({str(home)!r})"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=mcp_env(home))
    lines = [{"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    bad = ('{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"search",'
           '"arguments":{"query":"temp\\udcff\\udcfefile"}}}')
    good = {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(("\n".join([*(json.dumps(x) for x in lines), bad, json.dumps(good)]) + "\n").encode())
        proc.stdin.flush()
        answers: dict = {}
        while not {3, 4} <= set(answers):
            line = next_line(proc.stdout, 60)
            assert line is not None, f"no answer for {({3, 4} - set(answers))}; stderr: {proc.stderr.read1(65536) if proc.stderr else b''}"
            assert line, "kith mcp ended"
            msg = json.loads(line)
            answers[msg.get("id")] = msg
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert answers[3]["error"]["message"].startswith("[query-invalid]"), answers[3]
    assert "result" in answers[4] and answers[4]["result"]["tools"]
    assert b"Traceback" not in proc.stderr.read()


def test_an_mcp_line_nested_too_deep_keeps_the_server(tmp_path):
    """Attack of issue 42: a 60 KB request line of 30,000 nested arrays, which the MCP
    library's parser refuses, made kith's second reading of it (for a lone surrogate) raise
    RecursionError: `kith mcp` ended with an ExceptionGroup traceback. The library's refusal
    stands and the next request is served."""
    import sys

    from support.agents import mcp_env

    home = initialized(tmp_path / "home")
    proc = subprocess.Popen([sys.executable, "-c", f"from node.local.mcp import run_stdio; run_stdio({str(home)!r})"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=mcp_env(home))
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    deep = ('{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"search","arguments":{"query":'
            + "[" * 30000 + "]" * 30000 + "}}}")
    good = {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(("\n".join([json.dumps(init), json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                                      deep, json.dumps(good)]) + "\n").encode())
        proc.stdin.flush()
        answers: dict = {}
        while 4 not in answers:
            line = next_line(proc.stdout, 60)
            assert line is not None, "no answer to the request after the deep line"
            assert line, f"kith mcp ended; stderr: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
            msg = json.loads(line)
            answers[msg.get("id")] = msg
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert "result" in answers[4] and answers[4]["result"]["tools"]
    assert b"Traceback" not in proc.stderr.read()
