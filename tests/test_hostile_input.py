"""Findings of the adversarial review of the main job, each pinned by a test: hostile
peers, hostile servers and broken local state get typed refusals, never a crash or hang."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import anyio
import pytest

from node.cli.common import safe_text
from node.community.client import CommunityClient
from node.engine.framing import decode_frame
from node.common.errors import CommunityError, ProtocolViolation

from support.homes import initialized
from support.waits import wait_for

KITH = [sys.executable, "-m", "node.cli.main"]


def test_deeply_nested_frame_is_invalid_json_not_a_crash():
    for line in (b"[" * 5000 + b"]" * 5000, b'{"a":' * 5000 + b"1" + b"}" * 5000):
        with pytest.raises(ProtocolViolation) as exc:
            decode_frame(line)
        assert exc.value.code == "frame-invalid-json"


@contextmanager
def fake_server(handler_body):
    """A real HTTP server on 127.0.0.1 whose GET handler is ``handler_body(self)``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            handler_body(self)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def nested_answer(h):
    body = b"[" * 200_000 + b"]" * 200_000
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


#: what each dripping answer came to: "cut" (the client hung up mid-drip) or "whole"
DRIPS: list[str] = []
#: how many dripping answers started
DRIPS_STARTED: list[int] = []


def dripping_answer(h):
    DRIPS_STARTED.append(1)
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", "100")
    h.end_headers()
    try:
        for _ in range(100):
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.2)  # kept: the drip's pace is the hostile server's behaviour under test, not a wait
    except OSError:
        DRIPS.append("cut")
        return
    DRIPS.append("whole")


def test_hostile_server_nested_json_is_a_server_error():
    with fake_server(nested_answer) as url:
        async def main():
            async with CommunityClient(url) as client:
                await client.get_invitation("0123456789abcdef0123456789abcdef")

        with pytest.raises(CommunityError) as exc:
            anyio.run(main)
    assert exc.value.code in ("server-error", "invitation-malformed")


def test_dripping_server_hits_one_total_deadline():
    """A server that answers one byte every 0.2 s (20 s in all): the client's 1 s total
    deadline ends the request — it hangs up mid-drip, so the server never gets to send the
    whole answer (a deadline per read would have taken all 100 bytes). Whether it ended
    within some seconds is not asserted: a bound in seconds fails at random under load."""
    DRIPS.clear()
    DRIPS_STARTED.clear()
    with fake_server(dripping_answer) as url:
        async def main():
            async with CommunityClient(url, timeout_s=1.0) as client:
                await client.get_invitation("0123456789abcdef0123456789abcdef")

        with pytest.raises(CommunityError) as exc:
            anyio.run(main)
        wait_for("every dripping answer ended", lambda: DRIPS_STARTED and len(DRIPS) == len(DRIPS_STARTED))
    assert exc.value.code == "server-unreachable"
    assert DRIPS and set(DRIPS) == {"cut"}, DRIPS


def test_join_against_a_hostile_server_prints_a_code_not_a_traceback(tmp_path):
    with fake_server(nested_answer) as url:
        r = subprocess.run([*KITH, "--home", str(initialized(tmp_path / "g")), "join", "0123456789abcdef0123456789abcdef",
                            "--server", url, "--local", "--trust", "--query", "x", "--json"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert json.loads(r.stdout)["error"]["code"] in ("server-error", "invitation-malformed")


def test_host_refusal_inside_the_task_group_is_reported_with_its_code(tmp_path):
    r = subprocess.run([*KITH, "--home", str(initialized(tmp_path / "h")), "host", "--server", "http://127.0.0.1:9",
                        "--local", "--json"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "error [server-unreachable]" in r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["error"]["code"] == "server-unreachable"


def test_unknown_protocol_for_host_is_a_coded_error(tmp_path):
    r = subprocess.run([*KITH, "--home", str(initialized(tmp_path / "h")), "host", "--invite-file", str(tmp_path / "i.json"),
                        "--protocol", "nope", "--local"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "error [protocol-not-found]" in r.stderr and "Traceback" not in r.stderr


def test_home_under_a_file_is_refused_naming_the_file(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    r = subprocess.run([*KITH, "--home", str(not_a_dir / "home"), "init"], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "error [home-not-a-folder]" in r.stderr and "Traceback" not in r.stderr
    assert f"under {not_a_dir}, which is a file" in r.stderr and not (not_a_dir.parent / "home").exists()


def test_terminal_control_sequences_are_neutralised():
    hostile = "ok\x1b]0;pwned\x07\x1b[2J\u202eevil\x9b31m"
    shown = safe_text(hostile)
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown and "\x9b" not in shown
    assert shown.startswith("ok") and "evil" in shown
    assert safe_text("line\ttab\nnext") == "line\ttab\nnext"


def test_a_hook_raising_a_kith_error_ends_as_hook_failed(host_id, guest_id):
    from node.common.errors import CorpusError
    from node.runtime.hooks import Hooks, load_hooks
    from node.protocol.spec import load_spec
    from support.homes import PROTOCOLS
    from support.engines import run_pair

    def refuses(ctx, message):
        raise CorpusError("index-unavailable")

    spec = load_spec(PROTOCOLS / "echo")
    out = anyio.run(lambda: run_pair(spec, host_id, guest_id, Hooks(on_message=refuses),
                                     load_hooks(PROTOCOLS / "echo"), {"texts": ["x"]}))
    assert out["host"].code == "hook-failed"


def test_withheld_and_missing_answers_take_the_same_time_floor(tmp_path):
    """No timing oracle: 'only private sources matched' and 'nothing matched' both wait
    for the floor, so both take at least NO_RESULT_FLOOR_S."""
    from node.corpus.store import Corpus
    from node.policy.gate import EgressGate
    from node.answer.service import NO_RESULT_FLOOR_S, peer_knowledge
    from node.policy.store import Policy

    root = tmp_path / "notes"
    root.mkdir()
    (root / "secret.md").write_text("# Salary bands\n\nThe salary bands are confidential.\n")
    home = tmp_path / "home"
    home.mkdir()
    with Corpus(home) as corpus:
        corpus.add_root(root)
        corpus.sync()
    corpus = Corpus(home, readonly=True)
    try:
        gate = EgressGate(corpus.roots(), Policy.load(home), home)  # no rules: all private
        handle = peer_knowledge(corpus, gate, None)
        for query in ("salary bands", "zzqx nothing at all"):
            t0 = time.monotonic()
            answer = handle.search({"query": query, "topK": 3})
            assert answer["status"] == "no-verified-results"
            assert time.monotonic() - t0 >= NO_RESULT_FLOOR_S
    finally:
        corpus.close()


def test_untrusted_console_never_emits_escapes_or_parses_markup(capsys):
    from node.cli.common import untrusted_console

    untrusted_console.print("[bold]name[/bold] \x1b[2J\x1b]8;;http://x\x07link")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "[bold]name[/bold]" in out  # shown literally, not interpreted
