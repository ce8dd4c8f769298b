"""``kith dashboard`` over real HTTP (a real uvicorn on 127.0.0.1, a real corpus, policy and
approvals in tmp_path): every refusal of the door, and each page's change reaching the
home's files the CLI reads. The browser tests are tests/test_dashboard_browser.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from node.corpus.store import Corpus
from node.local.dashboard.app import run_dashboard_in_thread
from node.policy.approvals import Approvals
from node.policy.store import Policy
from support.cli import KITH, kith, readline
from support.dashboard import logged_in as _logged_in

DOCS = {
    "public/intro.md": "# Intro\n\nHow the temporary directory cleanup works in our tools.\n",
    "public/intro-copy.md": "# Intro\n\nHow the temporary directory cleanup works in our tools.\n",
    "ask/salary.md": "# Salary review\n\nThe salary bands for next year and the bonus pool.\n",
    "secret/launch.md": "# Launch\n\nThe zebra launch codes are kept here.\n",
    "public/cleanup.md": "# Cleanup\n\nThe okapi sweeper runs like this:\n\n```python\n"
                         "def okapi_sweep(root):\n    for path in root.iterdir():\n"
                         "        path.unlink()\n```\n",
    "public/kit.md": "# Kit\n\nThe tapir kit holds:\n\n* a tapir lamp\n* a tapir rope\n",
}
PEER_KEY = "ab" * 32


@pytest.fixture
def home(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    for rel, text in DOCS.items():
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text(text)
    (docs / "public" / "bad.pdf").write_bytes(b"%PDF-1.4 not really a pdf")
    h = tmp_path / "home"
    assert kith(h, "init").returncode == 0
    with Corpus(h) as corpus:
        corpus.add_root(docs)
        corpus.sync()
    policy = Policy.load(h)
    policy.set("/docs/**", "public")
    policy.set("/docs/secret/**", "never")
    policy.set("/docs/ask/**", "ask")
    policy.save()
    assert kith(h, "peers", "add", "alice", PEER_KEY).returncode == 0
    return h


@pytest.fixture
def dash(home: Path):
    with run_dashboard_in_thread(home) as (base, login):
        yield base, login


def _csrf(page: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', page)
    assert m, "no CSRF field in the page"
    return m.group(1)


def _code(r: httpx.Response) -> str | None:
    return r.headers.get("x-kith-error")


# --- the door -----------------------------------------------------------------------------
def test_login_token_works_once_and_pages_need_the_cookie(dash) -> None:
    base, login = dash
    anon = httpx.Client(base_url=base, timeout=30)
    for path in ("/", "/roots", "/policy", "/approvals", "/outbox", "/search?q=x"):
        r = anon.get(path)
        assert r.status_code == 401 and _code(r) == "dashboard-login-required", path
        assert "dashboard-login-required" in r.text
    assert _code(anon.get("/login?token=wrong")) == "dashboard-login-invalid"
    client = _logged_in(base, login)
    r = client.get("/")
    assert r.status_code == 200 and "This node" in r.text
    assert r.headers["x-frame-options"] == "DENY" and "default-src 'none'" in r.headers["content-security-policy"]
    # the token is spent: a second browser (or a replay of the URL) gets no session
    again = httpx.get(login)
    assert again.status_code == 403 and _code(again) == "dashboard-login-invalid"
    assert "set-cookie" not in again.headers
    # a forged cookie is no session
    assert _code(httpx.get(base + "/", cookies={"kith_dashboard": "forged"})) == "dashboard-login-required"


def test_foreign_host_and_origin_are_refused_before_the_login(home: Path, dash) -> None:
    base, login = dash
    port = base.rsplit(":", 1)[1]
    client = _logged_in(base, login)
    # DNS rebinding: a page on attacker.example resolved to 127.0.0.1
    r = client.get("/", headers={"Host": f"attacker.example:{port}"})
    assert r.status_code == 403 and _code(r) == "dashboard-bad-host"
    r = client.get("/", headers={"Host": "127.0.0.1:1"})  # another port
    assert _code(r) == "dashboard-bad-host"
    # the login URL itself is refused under a foreign Host (the token is not spent)
    r = httpx.get(login, headers={"Host": f"evil.example:{port}"})
    assert _code(r) == "dashboard-bad-host"
    # a cross-site form post, even with the cookie and the right CSRF token
    csrf = _csrf(client.get("/policy").text)
    r = client.post("/policy/unset", data={"csrf": csrf, "glob": "/docs/secret/**"},
                    headers={"Origin": "http://attacker.example"})
    assert r.status_code == 403 and _code(r) == "dashboard-bad-host"
    r = client.post("/policy/unset", data={"csrf": csrf, "glob": "/docs/secret/**"},
                    headers={"Origin": "null"})
    assert _code(r) == "dashboard-bad-host"
    assert [r.glob for r in Policy.load(home).rules].count("/docs/secret/**") == 1


def test_post_without_or_with_a_wrong_csrf_token_changes_nothing(home: Path, dash) -> None:
    base, login = dash
    client = _logged_in(base, login)
    for data in ({"glob": "/docs/secret/**"}, {"glob": "/docs/secret/**", "csrf": "nope"}):
        r = client.post("/policy/unset", data=data)
        assert r.status_code == 403 and _code(r) == "dashboard-csrf"
    r = client.post("/policy/unset", content=json.dumps({"glob": "/docs/secret/**"}),
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 415 and _code(r) == "dashboard-form-invalid"
    assert [r.glob for r in Policy.load(home).rules].count("/docs/secret/**") == 1


def test_non_loopback_bind_is_refused_with_a_typed_error(home: Path) -> None:
    from node.common.errors import KithError

    with pytest.raises(KithError) as info:
        with run_dashboard_in_thread(home, host="0.0.0.0"):
            pass
    assert info.value.code == "dashboard-loopback-only"
    r = kith(home, "dashboard", "--host", "192.168.1.10", "--port", "0")
    assert r.returncode == 2 and "dashboard-loopback-only" in r.stderr


def test_a_home_without_identity_is_refused_and_not_created(tmp_path: Path) -> None:
    # review of #12: `kith --home TYPO dashboard` made the folder and served an empty node
    typo = tmp_path / "hmoe"
    r = kith(typo, "dashboard", "--port", "0")
    assert r.returncode == 1 and "error [home-not-initialized]" in r.stderr, r.stderr
    assert not typo.exists()


# --- the pages ------------------------------------------------------------------------------
def test_roots_page_shows_failed_documents_and_removes_a_root(home: Path, dash, tmp_path: Path) -> None:
    base, login = dash
    client = _logged_in(base, login)
    page = client.get("/roots").text
    assert "/docs/" in page and "bad.pdf" in page  # the failed PDF with its reason
    csrf = _csrf(page)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "a.md").write_text("# A\n\nwalrus notes about the harbour.\n")
    r = client.post("/roots/add", data={"csrf": csrf, "path": str(other)})
    assert r.status_code == 303
    assert "added root /notes/" in client.get("/roots").text
    client.post("/roots/sync", data={"csrf": csrf, "mode": "new_only"})
    with Corpus(home, readonly=True) as corpus:
        assert corpus.search_hits("walrus harbour", limit=5)[0]
    r = client.post("/roots/remove", data={"csrf": csrf, "prefix": "docs"})
    page = client.get("/roots").text
    assert "removed root /docs/ and its" in page and "/docs/**" in page  # rules that named it are listed
    with Corpus(home, readonly=True) as corpus:
        assert [r.prefix for r in corpus.roots()] == ["notes"]
        hits, _ = corpus.search_hits("salary bands bonus pool", limit=5)
        assert not [h for h in hits if h.source_id.startswith("/docs/")]
    # a prefix once removed is never given to a later root
    r = client.post("/roots/add", data={"csrf": csrf, "path": str(tmp_path / "docs")})
    with Corpus(home, readonly=True) as corpus:
        assert [r.prefix for r in corpus.roots()] == ["notes", "docs-2"]
    # a wrong prefix is a notice with its code, not a crash
    client.post("/roots/remove", data={"csrf": csrf, "prefix": "nope"})
    assert "root-unknown" in client.get("/roots").text


def test_policy_page_explains_adds_and_removes_rules(home: Path, dash) -> None:
    base, login = dash
    client = _logged_in(base, login)
    page = client.get("/policy").text
    assert "/docs/ask/**" in page and "anonymous peers together" in page  # rules and quotas
    r = client.get("/policy", params={"source": "/docs/secret/launch.md", "peer": "alice"})
    assert re.search(r"<dt>tier</dt><dd>never</dd>", r.text) and "/docs/secret/**" in r.text
    csrf = _csrf(page)
    client.post("/policy/set", data={"csrf": csrf, "glob": "/docs/public/**", "tier": "peers", "peers": "alice"})
    assert [(r.glob, r.tier, r.peers) for r in Policy.load(home).rules if r.glob == "/docs/public/**"] == \
        [("/docs/public/**", "peers", ("alice",))]
    client.post("/policy/set", data={"csrf": csrf, "glob": "/docs/x/**", "tier": "peers"})
    assert "policy-invalid" in client.get("/policy").text  # tier peers without names: refused, shown
    client.post("/policy/unset", data={"csrf": csrf, "glob": "/docs/ask/**", "for": ""})
    assert "/docs/ask/**" not in [r.glob for r in Policy.load(home).rules]
    listed = json.loads(kith(home, "policy", "list", "--json").stdout)
    assert "/docs/ask/**" not in [r["glob"] for r in listed["rules"]]


def test_a_policy_form_that_would_stop_scrubbing_is_refused_and_writes_nothing(home: Path, dash) -> None:
    from node.policy.scrub_coverage import record_scrub

    policy = Policy.load(home)
    policy.set_scrub("*", ["email"], glob="/docs/secret/**")
    record_scrub(home, policy)  # a scrub entry once covered /docs/secret (never: sent to nobody)
    policy.set_scrub("*", [], glob="/docs/secret/**")
    policy.save()
    before = (home / "policy.toml").read_bytes()
    base, login = dash
    client = _logged_in(base, login)
    csrf = _csrf(client.get("/policy").text)
    client.post("/policy/set", data={"csrf": csrf, "glob": "/docs/secret/**", "tier": "public", "peers": ""})
    assert "scrub-would-lapse" in client.get("/policy").text
    assert (home / "policy.toml").read_bytes() == before
    client.post("/policy/set", data={"csrf": csrf, "glob": "/docs/ask/**", "tier": "public", "peers": ""})
    assert [r.tier for r in Policy.load(home).rules if r.glob == "/docs/ask/**"] == ["public"]


def test_approvals_page_approves_and_the_cli_sees_it(home: Path, dash) -> None:
    base, login = dash
    store = Approvals(home)
    req = store.request(PEER_KEY, "alice", "salary bands bonus pool", ["/docs/ask/salary.md"])
    client = _logged_in(base, login)
    page = client.get("/approvals").text
    assert req.id in page and "salary bands bonus pool" in page
    r = client.post("/approvals/decide", data={"csrf": _csrf(page), "id": req.id, "decision": "approve"})
    assert r.status_code == 303
    assert f"approved {req.id}" in client.get("/approvals").text
    listed = json.loads(kith(home, "approvals", "list", "--all", "--json").stdout)["requests"]
    assert [x["status"] for x in listed if x["id"] == req.id] == ["approved"]
    audit = (home / "audit.jsonl").read_text()
    assert '"approval-decided"' in audit and req.id in audit
    client.post("/approvals/decide", data={"csrf": _csrf(page), "id": req.id, "decision": "deny"})
    assert "approval-decided" in client.get("/approvals").text


def test_outbox_page_shows_kept_questions_and_answers_and_removes_one(home: Path, dash) -> None:
    from node.guest.outbox import OutboxStore, classify, query_id_of

    base, login = dash
    with OutboxStore(home) as store:
        waiting = store.add({"query": "nightly backup", "topK": 3}, [("bob", PEER_KEY)])["id"]
        done = store.add({"query": "staging server", "topK": 3}, [("alice", PEER_KEY)])["id"]
        answer = {"action": "results", "query_id": query_id_of(done), "status": "ok", "envelope": {"results": [
            {"source": "/kb/deploy.md", "id": "c1",
             "textPreview": "The staging server is deleted nightly. <script>alert(1)</script>"}]}}
        store.record_attempt(done, PEER_KEY, classify(answer, query_id_of(done)), message=answer)
    client = _logged_in(base, login)
    page = client.get("/outbox").text
    assert "nightly backup" in page and "bob: waiting" in page
    assert "alice: answered" in page and "/kb/deploy.md" in page and "deleted nightly" in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page  # a peer's text is shown, never run
    r = client.post("/outbox/remove", data={"csrf": _csrf(page), "id": waiting})
    assert r.status_code == 303 and f"removed {waiting[:12]}" in client.get("/outbox").text
    listed = json.loads(kith(home, "outbox", "list", "--json").stdout)["questions"]
    assert [q["id"] for q in listed] == [done]


def test_outbox_page_names_a_damaged_outbox_file(home: Path, dash) -> None:
    base, login = dash
    (home / "outbox.sqlite").write_bytes(b"not a database" * 50)
    r = _logged_in(base, login).get("/outbox")
    assert r.status_code == 200 and "outbox-corrupt" in r.text


def test_search_as_a_peer_shows_what_the_peer_would_get(home: Path, dash) -> None:
    base, login = dash
    client = _logged_in(base, login)
    owner = client.get("/search", params={"q": "zebra launch codes", "as": "owner"}).text
    assert "/docs/secret/launch.md" in owner
    anon = client.get("/search", params={"q": "zebra launch codes", "as": "anonymous"}).text
    assert "/docs/secret/launch.md" not in anon and "no-verified-results" in anon
    alice = client.get("/search", params={"q": "salary bands bonus pool", "as": "alice"}).text
    assert "pending-approval" in alice and "salary.md" not in alice
    public = client.get("/search", params={"q": "temporary directory cleanup", "as": "alice"}).text
    # the copy is one result naming the other (issue 20 item 6)
    assert public.count('<div class="source"><code>/docs/public/intro') == 1, public
    assert "also in 1 other source: <code>/docs/public/intro" in public
    # a preview never writes an approval request
    assert Approvals(home).pending() == []
    assert "peer-not-found" in client.get("/search", params={"q": "x", "as": "mallory"}).text
    # code in a preview is shown as code, its lines and indentation kept (issue 20)
    code = client.get("/search", params={"q": "okapi sweep", "as": "owner"}).text
    assert ('<pre class="code"><code>def okapi_sweep(root):\n    for path in root.iterdir():\n'
            '        path.unlink()</code></pre>') in code
    assert "```" not in code
    # each list item on a line of its own, not joined with " - "
    kit = client.get("/search", params={"q": "tapir kit", "as": "owner"}).text
    assert ('<span class="item">- a tapir lamp</span><span class="item">- a tapir rope</span>'
            in kit), kit


def test_sessions_page_without_a_host_says_so(dash) -> None:
    base, login = dash
    client = _logged_in(base, login)
    assert "host not running" in client.get("/sessions").text
    assert "host not running" in client.get("/").text


def test_remove_root_drops_archive_members_and_retires_the_prefix(tmp_path: Path) -> None:
    """Corpus.remove_root (the dashboard's remove): documents, archive members and chunks
    leave SQLite and the index; the other root stays searchable; the prefix is not reused."""
    import zipfile

    a, b = tmp_path / "a" / "notes", tmp_path / "b" / "other"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    (a / "x.md").write_text("# X\n\nquokka migration patterns in spring.\n")
    with zipfile.ZipFile(a / "bundle.zip", "w") as zf:
        zf.writestr("inner.md", "# Inner\n\nquokka burrows inside the archive.\n")
    (b / "y.md").write_text("# Y\n\nquokka facts kept elsewhere.\n")
    with Corpus(tmp_path / "home") as corpus:
        corpus.add_root(a)
        corpus.add_root(b)
        corpus.sync()
        before = {h.source_id for h in corpus.search_hits("quokka", limit=20)[0]}
        assert {"/notes/x.md", "/other/y.md"} <= before and any("bundle.zip" in s for s in before)
        out = corpus.remove_root("notes")
        assert out["prefix"] == "notes" and out["documents"] == 3  # x.md, the archive and its member
        after = {h.source_id for h in corpus.search_hits("quokka", limit=20)[0]}
        assert after == {"/other/y.md"}
        st = corpus.status_report()
        assert [r["prefix"] for r in st["rootList"]] == ["other"] and st["documents"] == 1
        again = corpus.add_root(a)
        assert again.prefix == "notes-2"
        from node.common.errors import KithError

        with pytest.raises(KithError) as info:
            corpus.remove_root("notes")
        assert info.value.code == "root-unknown"
    with Corpus(tmp_path / "home", readonly=True) as ro:  # the index agrees after reopening
        assert {h.source_id for h in ro.search_hits("quokka", limit=20)[0]} == {"/other/y.md"}


def test_the_kith_dashboard_command_prints_a_login_url_that_works(home: Path) -> None:
    import signal

    proc = subprocess.Popen([*KITH, "--home", str(home), "dashboard", "--port", "0", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        info = json.loads(readline(proc, 60))
        assert info["login"].startswith(info["url"] + "/login?token=") and info["url"].startswith("http://127.0.0.1:")
        with httpx.Client(timeout=30) as client:
            r = client.get(info["login"], follow_redirects=True)
            assert r.status_code == 200 and "This node" in r.text
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert info["login"] in err  # the URL is on stderr too, whole, on its own line
    assert info["login"] in err.splitlines()


def test_agents_page_lists_adds_and_removes_agents_and_the_sent_page_shows_the_log(home: Path, dash) -> None:
    """Issue 41: the dashboard (its own login) lists, adds and removes agents — a new token
    shown once — and shows the outbound log."""
    from node.local.agents import Operation, authorize, load_agents
    from node.policy.outbound import OWNER, gate

    base, login = dash
    client = _logged_in(base, login)
    page = client.get("/agents").text
    assert 'data-name="default"' in page and "tokenSha256" not in page
    r = client.post("/agents/add", data={"csrf": _csrf(page), "name": "reader", "sources": "/docs/public/**",
                                         "peers": "alice", "outbound": "block", "until": "7d"})
    assert r.status_code == 303
    shown = client.get("/agents").text
    token = re.search(r"(kith_agent_[A-Za-z0-9_\-]+)", shown).group(1)
    assert authorize(home, token, Operation("search")).name == "reader"
    assert token not in client.get("/agents").text  # once
    assert load_agents(home)["reader"].outbound == "block"
    r = client.post("/agents/remove", data={"csrf": _csrf(shown), "name": "reader"})
    assert r.status_code == 303 and "reader" not in load_agents(home)
    gate(home, {"query": "mail jo.smith@example.org <b>now</b>"}, ["alice"], actor=OWNER, rule="allow")
    sent = client.get("/sent").text
    assert "allowed" in sent and "email" in sent and "&lt;b&gt;now" in sent and "<b>now" not in sent


def test_overview_shows_scrub_rules_copy_grants_copies_sent_and_what_is_kept_here(home: Path, dash) -> None:
    """issue 42 item 6: the dashboard showed no scrub rules, copy grants or copies held."""
    from node.trust.audit_log import AuditLog

    policy = Policy.load(home)
    policy.set_scrub("bea", ["email"])
    policy.set_copy("/docs/**", "bea", until="2030-01-01T00:00:00Z")
    policy.save()
    log = AuditLog(home)
    log.record("copy-sent", session_id="s1", peer="b" * 64, peer_name="bea", query_id="q1",
               sources=["/docs/a.md"], versions=["0" * 64], documents=1)
    log.close()
    base, login = dash
    page = _logged_in(base, login).get("/").text
    sharing = page[page.index('id="sharing"'):page.index('id="kept"')]
    assert "<code>email</code> for bea" in sharing
    assert "<code>/docs/**</code> for bea until 2030-01-01T00:00:00Z" in sharing
    assert "bea: 1 document(s), last sent" in sharing
    kept = page[page.index('id="kept"'):]
    assert "<dt>Copies</dt><dd>none</dd>" in kept and "<dt>Outbox</dt><dd>empty" in kept


def test_outbox_page_reads_a_home_this_user_may_read_but_not_write(home: Path) -> None:
    """`kith dashboard` (a real process without root's DAC capabilities) whose home is
    made one the user may read but not write while it serves (a chmod): the outbox page
    lists the kept question — it said ``io-error``, the outbox being opened for writing —
    and nothing in the home changes (specs/dashboard.md)."""
    import signal

    from node.guest.outbox import OutboxStore
    from support.cli import without_root_reads
    from support.homes import files_of, read_only

    prefix = without_root_reads()
    with OutboxStore(home) as store:
        qid = store.add({"query": "where is the walrus", "topK": 3}, [("alice", PEER_KEY)])["id"]
    proc = subprocess.Popen([*prefix, *KITH, "--home", str(home), "dashboard", "--port", "0", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        info = json.loads(readline(proc, 60))
        client = _logged_in(info["url"], info["login"])
        with read_only(home) as before:  # the dashboard writes its login file as it starts
            page = client.get("/outbox")
            after = files_of(home)
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=30)[1]
    assert page.status_code == 200
    assert f'data-id="{qid}"' in page.text and "where is the walrus" in page.text
    assert 'id="outbox-error"' not in page.text, page.text
    assert after == before
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]


def test_kith_dashboard_starts_on_a_home_this_user_may_read_but_not_write(home: Path) -> None:
    """`kith dashboard` (a real process without root's DAC capabilities) on a home the
    user may read but not write (a chmod before it starts) refused to start ``io-error``:
    it wrote ``dashboard.login`` first. It now starts with its login URL in memory only and
    says so; the owner's search answers; ``--login-link`` says why it cannot make a new
    URL and what to do; nothing in the home changes (specs/dashboard.md §2)."""
    from support.cli import serving, without_root_reads
    from support.homes import files_of, read_only

    prefix = without_root_reads()
    with read_only(home) as before:
        with serving([*prefix, *KITH, "--home", str(home), "dashboard", "--port", "0", "--json"]) as (info, ended):
            client = _logged_in(info["url"], info["login"])
            page = client.get("/search", params={"q": "okapi sweeper", "as": "owner"})
            link = subprocess.run([*prefix, *KITH, "--home", str(home), "dashboard", "--login-link", "--json"],
                                  capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        err = ended["stderr"]
        after = files_of(home)
    assert page.status_code == 200 and "/docs/public/cleanup.md" in page.text, page.text
    assert ended["returncode"] == 0 and "Traceback" not in err, err[-3000:]
    assert "read-only for you" in err and "kept in memory only" in err, err
    assert link.returncode == 1, (link.stdout, link.stderr)
    error = json.loads(link.stdout)["error"]
    assert error["code"] == "dashboard-not-running" and "read-only for you" in error["message"], error
    assert "printed when it started" in error["hint"], error
    assert after == before


def test_a_change_the_home_cannot_take_is_a_notice_not_a_server_error(home: Path) -> None:
    """`kith dashboard` (a real process without root's DAC capabilities) on a home the
    user may read but not write: a change (a policy rule removed) answered HTTP 500 and
    printed a traceback (PermissionError on ``policy.toml.lock``). It is the page's notice
    with the write's code (``io-error``), and nothing changes."""
    from support.cli import serving, without_root_reads
    from support.homes import files_of, read_only

    prefix = without_root_reads()
    with read_only(home) as before:
        with serving([*prefix, *KITH, "--home", str(home), "dashboard", "--port", "0", "--json"]) as (info, ended):
            client = _logged_in(info["url"], info["login"])
            csrf = _csrf(client.get("/policy").text)
            posted = client.post("/policy/unset", data={"csrf": csrf, "glob": "/docs/secret/**"})
            page = client.get("/policy").text
        err = ended["stderr"]
        after = files_of(home)
    assert posted.status_code == 303, (posted.status_code, posted.text[:500])
    assert "io-error" in page and "Permission denied" in page, page
    assert "Traceback" not in err, err[-3000:]
    assert after == before
