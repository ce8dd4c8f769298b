"""Issue 20 item 9, the owner's side: every line the CLI prints is true and reads like a
sentence, through real `kith` processes."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import kith as _kith, lines_until, readline
from support.homes import initialized
from support.hosts import HostProcess as Host
from node.community.server import run_server_in_thread


def test_the_host_log_names_its_server_and_post_not_placeholders(tmp_path: Path) -> None:
    """`could not refresh post <hex> on the server: ... at http://<host>` was a template,
    not a log line: the URL the owner gave is shown as typed, a post id by its prefix."""
    home = initialized(tmp_path / "host")
    with run_server_in_thread(tmp_path / "server" / "community.sqlite3", lease_ttl_s=3.0) as url:
        host = Host(home, "--server", url)
        post_id = host.invitation["post_id"]
    try:  # the server is gone: the next refresh fails
        line = lines_until(host.proc, host.proc.stderr, lambda seen: "could not refresh" in seen, 60)[-1]
    finally:
        host.proc.kill()
        host.proc.wait(10)
    assert "<host>" not in line and "<hex>" not in line, line
    assert f"at {url}" in line and f"post {post_id[:8]}…" in line and post_id not in line, line


def test_a_sync_says_why_it_skipped_and_index_status_lists_what(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "a.md").write_text("# A\n\nA note.\n")
    (kb / "blob.bin").write_bytes(bytes(range(256)))
    home = initialized(tmp_path / "home")
    assert _kith(home, "index", "add", str(kb)).returncode == 0
    first = _kith(home, "index", "sync")
    assert "skipped 1 (1 of a type kith does not read)" in first.stdout, first.stdout
    assert "  skipped /kb/blob.bin: of a type kith does not read" in first.stdout
    again = _kith(home, "index", "sync")
    assert "skipped 2 (1 unchanged, 1 of a type kith does not read)" in again.stdout, again.stdout
    status = _kith(home, "index", "status")
    assert "  skipped /kb/blob.bin: of a type kith does not read" in status.stdout, status.stdout
    st = json.loads(_kith(home, "index", "status", "--json").stdout)
    assert st["skippedSources"] == [{"source": "/kb/blob.bin", "reason": "unsupported-type"}]


def test_one_name_for_the_pairing_code() -> None:
    """"safety code" in one place and "pairing code" elsewhere named one thing twice."""
    repo = Path(__file__).resolve().parents[1]
    texts = [repo / "README.md", *(repo / "specs").glob("*.md"), *(repo / "node").rglob("*.py"),
             *(repo / "node").rglob("*.html")]
    said = [str(p.relative_to(repo)) for p in texts if "safety code" in p.read_text("utf-8").lower()]
    assert said == []


def test_the_agent_notice_is_not_printed_to_a_person_at_a_terminal(monkeypatch) -> None:
    import io

    from node.cli import ask_cmd
    from node.answer.fence import TEXT_NOTICE
    from node.guest.fanout import UNTRUSTED_NOTICE

    env = {"results": [{"rank": 1, "source": "/docs/a.md", "textPreview": "text", "untrusted": True,
                        "attributions": [{"peer": {"name": "alice"}}], "location": None}],
           "answered": 1, "missing": [], "notice": UNTRUSTED_NOTICE,
           "peers": [{"name": "alice", "status": "ok", "code": None, "approvalId": None, "retryAfterS": None,
                      "latencyMs": 12.0, "results": 1}]}
    for terminal in (True, False):
        buf = io.StringIO()
        # the private field: setting `file` and undoing it would pin the console to the
        # stream captured now (rich reads sys.stdout afresh only while `_file` is None)
        monkeypatch.setattr(ask_cmd.console, "_file", buf)
        monkeypatch.setattr(ask_cmd.console, "_force_terminal", terminal)
        ask_cmd.render(env)
        assert ("[alice] /docs/a.md" in buf.getvalue()) and ((TEXT_NOTICE in buf.getvalue()) is not terminal), terminal
        # the text names no JSON field it does not show (issue 32)
        assert "untrusted" not in buf.getvalue().lower(), buf.getvalue()


def test_kith_ask_text_shows_each_peers_source_id_when_they_differ(monkeypatch) -> None:
    """Two peers returned the same text under different source ids: the text output
    showed only the first one's; it names each peer's own (issue 32)."""
    import io

    from node.cli import ask_cmd
    from node.guest.fanout import PeerRow, fuse

    alice, bob = PeerRow("alice", "a" * 64, status="ok"), PeerRow("bob", "b" * 64, status="ok")
    same = "The same paragraph, word for word."
    merged = fuse([(alice, [{"source": "/alice-notes/tempfile.md", "id": "c1", "textPreview": same}], True),
                   (bob, [{"source": "/bob-docs/lib/tempfile.md", "id": "c9", "textPreview": same}], True),
                   (PeerRow("carol", "c" * 64, status="ok"),
                    [{"source": "/c/other.md", "id": "c2", "textPreview": "Something else."}], True)], 5)
    env = {"results": merged, "answered": 3, "missing": [], "notice": "",
           "peers": [alice.to_dict(), bob.to_dict()]}
    buf = io.StringIO()
    monkeypatch.setattr(ask_cmd.console, "_file", buf)
    monkeypatch.setattr(ask_cmd.console, "_force_terminal", True)
    ask_cmd.render(env)
    out = buf.getvalue()
    assert "[alice] /alice-notes/tempfile.md; [bob] /bob-docs/lib/tempfile.md" in out, out
    assert "[carol] /c/other.md" in out, out


def test_the_readme_tells_users_only_what_they_have() -> None:
    """No `../shared` (users do not have it), and one way to install extras: from the
    checkout, since kith is not on a package registry."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text("utf-8")
    assert "../shared" not in readme
    assert "not on a package registry" in readme and "kith-node[" not in readme
    assert "scripts/setup --postgres" in readme


def test_a_lost_dashboard_login_link_is_replaced_without_a_restart(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    import httpx

    home = initialized(tmp_path / "home")
    r = _kith(home, "dashboard", "--login-link")
    assert r.returncode == 1 and "error [dashboard-not-running]" in r.stderr, r.stderr
    proc = subprocess.Popen([sys.executable, "-m", "node.cli.main", "--home", str(home), "dashboard", "--port", "0",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        first = json.loads(readline(proc, 60))
        with httpx.Client(base_url=first["url"], timeout=30, follow_redirects=False) as old:
            assert old.get(first["login"]).status_code == 303  # used: the link is spent
            assert old.get("/").status_code == 200
            new = _kith(home, "dashboard", "--login-link", "--json")
            assert new.returncode == 0, new.stderr
            link = json.loads(new.stdout)["login"]
            assert link != first["login"] and link.startswith(first["url"] + "/login?token=")
            # a browser signed in already stays signed in (it was logged out: issue 32)
            assert old.get("/").status_code == 200
            with httpx.Client(base_url=first["url"], timeout=30, follow_redirects=False) as fresh:
                refused = fresh.get("/")
                assert refused.status_code == 401
                assert "--login-link" in refused.text and "restart" not in refused.text, refused.text
                spent = fresh.get(first["login"])
                assert spent.status_code == 403 and "--login-link" in spent.text and "restart" not in spent.text
                assert fresh.get(link).status_code == 303 and fresh.get("/").status_code == 200
                # each session has its own CSRF token: one browser's form token is not the other's
                import re

                tokens = [re.search(r'name="?csrf"? value="([^"]+)"', c.get("/policy").text).group(1)
                          for c in (old, fresh)]
                assert tokens[0] != tokens[1]
                assert old.get("/").status_code == fresh.get("/").status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
    assert not (home / "dashboard.login").exists()
