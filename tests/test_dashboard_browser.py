"""``kith dashboard`` in a real headless Chromium (Debian's ``chromium`` package, driven by
Playwright with ``executable_path``; never ``playwright install``), against a real
``kith host`` and real guests over iroh on loopback (relay disabled).

What an owner does: log in with the printed token; approve a waiting request and see the
guest then receive the evidence; remove a rule and see a peer's view change; end a live
session. Screenshots go to a tmp folder (and, when ``KITH_DASHBOARD_SHOTS`` names a
folder, a copy there). Every wait is bounded (Playwright's own timeouts, a bounded read of the
guest's stdout); nothing is timed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from node.local.dashboard.app import run_dashboard_in_thread
from node.trust.identity import fingerprint, load_identity

from support.cli import KITH, kith, kith_init, next_line
from support.hosts import HostProcess as Host

CHROMIUM = Path("/usr/bin/chromium")
INSTALL = "apt-get install -y --no-install-recommends chromium (scripts/test does this as root; KITH_NO_APT=1 skips it)"
if not CHROMIUM.exists():
    pytest.skip(f"no /usr/bin/chromium: {INSTALL}", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install 'kith-node[dev]' (playwright)")

pytestmark = [pytest.mark.iroh, pytest.mark.slow]

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: Playwright's bound on each wait (ms): a page load, a click's navigation, a selector
WAIT_MS = 30_000
DOCS = {
    "public/intro.md": "# Intro\n\nHow the temporary directory cleanup works in our tools.\n",
    "ask/salary.md": "# Salary review\n\nThe salary bands for next year and the bonus pool.\n",
    "secret/launch.md": "# Launch\n\nThe zebra launch codes are kept here.\n",
    "public/broken.pdf": "%PDF-1.4 this is not a PDF",
}


class Guest:
    """An interactive ``kith join --json`` (questions on stdin, one JSON line per answer)."""

    def __init__(self, home: Path, invite: Path) -> None:
        self.proc = subprocess.Popen([*KITH, "--home", str(home), "join", str(invite), "--local", "--trust",
                                      "--json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def ask(self, question: str, timeout: float = 60) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(question + "\n")
        self.proc.stdin.flush()
        line = next_line(self.proc.stdout, timeout)
        assert line is not None, f"no answer within {timeout} s"
        assert line, f"guest exited: {self.proc.stderr.read() if self.proc.stderr else ''}"
        return json.loads(line)

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"guest still running {timeout} s later")
        return self.proc.returncode, err

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.communicate("\n", timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()


_init = kith_init


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    """A host sharing /docs (public), /docs/ask (ask), /docs/secret (never), guest alice
    pinned, the host running with an invite file, the dashboard on the same home."""
    tmp = tmp_path_factory.mktemp("dash")
    docs = tmp / "docs"
    for rel, text in DOCS.items():
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text(text)
    home = tmp / "host"
    _init(home)
    for args in (("index", "add", str(docs)), ("index", "sync"), ("policy", "set", "/docs/**", "public"),
                 ("policy", "set", "/docs/secret/**", "never"), ("policy", "set", "/docs/ask/**", "ask")):
        r = kith(home, *args, timeout=300)
        assert r.returncode == 0, (args, r.stderr)
    with (home / "policy.toml").open("a") as fh:  # no test here may run out of quota
        fh.write("\n[quota]\nqueries_per_hour = 100000\nburst = 1000\n")
    alice = tmp / "alice"
    assert kith(home, "peers", "add", "alice", _init(alice)).returncode == 0
    invite = tmp / "invite.json"
    shots = tmp / "shots"
    shots.mkdir()
    host = Host(home, "--invite-file", str(invite))
    try:
        with run_dashboard_in_thread(home) as (base, login):
            yield {"home": home, "alice": alice, "invite": invite, "base": base, "login": login,
                   "shots": shots, "host": host}
    finally:
        host.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def page(world, browser):
    """One logged-in page (the token works once: every test shares this session)."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.goto(world["login"])
    yield pg
    context.close()


def shot(world, page, name: str) -> None:
    path = world["shots"] / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    extra = os.environ.get("KITH_DASHBOARD_SHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / path.name)


def test_login_with_the_token_then_the_token_is_spent(world, page, browser) -> None:
    assert page.url == world["base"] + "/"
    assert page.locator("h1").inner_text() == "This node"
    ident = load_identity(world["home"])
    assert page.locator("#fingerprint").inner_text() == fingerprint(ident.public_key)
    cookies = page.context.cookies()
    [c] = [c for c in cookies if c["name"] == "kith_dashboard"]
    assert c["httpOnly"] and c["sameSite"] == "Strict"
    shot(world, page, "01-overview")
    # another browser profile with the same URL gets no session
    other = browser.new_context()
    try:
        p2 = other.new_page()
        p2.set_default_timeout(WAIT_MS)
        p2.goto(world["login"])
        assert p2.locator("#error-code").inner_text() == "dashboard-login-invalid"
        shot(world, p2, "02-login-token-spent")
        p2.goto(world["base"] + "/approvals")
        assert p2.locator("#error-code").inner_text() == "dashboard-login-required"
    finally:
        other.close()


def test_approve_a_pending_request_then_the_guest_gets_the_evidence(world, page) -> None:
    q = "salary bands bonus pool"
    guest = Guest(world["alice"], world["invite"])
    try:
        first = guest.ask(q)
        assert first["status"] == "pending-approval", first
        rid = first["approval_id"]
        page.goto(world["base"] + "/approvals")
        row = page.locator(f'#pending tr[data-id="{rid}"]')
        assert "salary bands bonus pool" in row.inner_text() and "alice" in row.inner_text()
        shot(world, page, "03-approvals-pending")
        row.get_by_role("button", name="Approve").click()
        page.wait_for_url(world["base"] + "/approvals")
        assert f"approved {rid}" in page.locator("#notice").inner_text()
        assert page.locator(f'#pending tr[data-id="{rid}"]').count() == 0
        shot(world, page, "04-approvals-approved")
        second = guest.ask(q)
        assert second["status"] == "ok", second
        assert second["envelope"]["results"][0]["source"] == "/docs/ask/salary.md"
        assert "salary bands" in second["envelope"]["results"][0]["textPreview"]
    finally:
        guest.close()


def test_remove_a_rule_and_the_peer_view_changes(world, page) -> None:
    base = world["base"]
    page.goto(base + "/policy")
    form = page.locator('form[action="/policy/set"]')
    form.locator('input[name="glob"]').fill("/docs/public/**")
    form.locator('select[name="tier"]').select_option("never")
    form.get_by_role("button", name="Save rule").click()
    page.wait_for_url(base + "/policy")
    assert page.locator('#rules tr[data-glob="/docs/public/**"]').count() == 1
    page.goto(base + "/search?q=temporary+directory+cleanup&as=anonymous")
    assert "/docs/public/intro.md" not in page.locator("main").inner_text()
    page.goto(base + "/policy?source=/docs/public/intro.md&peer=")
    assert "never" in page.locator("#explained").inner_text()
    shot(world, page, "05-policy-with-rule-explained")
    page.locator('#rules tr[data-glob="/docs/public/**"]').get_by_role("button", name="Remove").click()
    page.wait_for_url(base + "/policy")
    assert "removed rule /docs/public/**" in page.locator("#notice").inner_text()
    assert page.locator('#rules tr[data-glob="/docs/public/**"]').count() == 0
    shot(world, page, "06-policy-rule-removed")
    listed = json.loads(kith(world["home"], "policy", "list", "--json").stdout)["rules"]
    assert "/docs/public/**" not in [r["glob"] for r in listed]
    # the view-as search: the peer would now get the public document again
    page.goto(base + "/search")
    page.locator('input[name="q"]').fill("temporary directory cleanup")
    page.locator('select[name="as"]').select_option("anonymous")
    page.get_by_role("button", name="Search").click()
    page.wait_for_selector("#answer-status")
    assert "/docs/public/intro.md" in page.locator("#results").inner_text()
    shot(world, page, "07-search-as-anonymous")


def test_roots_page_shows_failed_documents_and_removes_a_root_after_confirming(world, page, tmp_path) -> None:
    base = world["base"]
    page.goto(base + "/roots")
    assert "/docs/" in page.locator('#roots tr[data-prefix="docs"]').inner_text()
    failed = page.locator("#failed").inner_text()
    assert "/docs/public/broken.pdf" in failed  # with its code and reason
    extra = tmp_path / "scratch"
    extra.mkdir()
    (extra / "n.md").write_text("# N\n\nA scratch note about walruses.\n")
    page.locator('input[name="path"]').fill(str(extra))
    page.get_by_role("button", name="Add").click()
    page.wait_for_url(base + "/roots")
    page.get_by_role("button", name="Sync now").click()
    page.wait_for_url(base + "/roots")
    assert "indexed 1" in page.locator("#notice").inner_text()
    shot(world, page, "08-roots-failed-documents")
    row = page.locator('#roots tr[data-prefix="scratch"]')
    page.once("dialog", lambda dialog: dialog.dismiss())  # the owner says no: nothing happens
    row.get_by_role("button", name="Remove").click()
    page.goto(base + "/roots")
    assert page.locator('#roots tr[data-prefix="scratch"]').count() == 1
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Remove").click()
    page.wait_for_url(base + "/roots")
    assert "removed root /scratch/" in page.locator("#notice").inner_text()
    assert page.locator('#roots tr[data-prefix="scratch"]').count() == 0
    page.goto(base + "/peers")
    assert page.locator('#pinned tr[data-name="alice"]').count() == 1
    shot(world, page, "09-peers")


def test_end_a_live_session(world, page) -> None:
    guest = Guest(world["alice"], world["invite"])
    try:
        assert guest.ask("temporary directory cleanup")["status"] == "ok"
        page.goto(world["base"] + "/sessions")
        row = page.locator("#sessions tbody tr", has_text="alice")
        row.first.wait_for()
        assert "alice" in row.first.inner_text()
        shot(world, page, "10-sessions-live")
        row.first.get_by_role("button", name="End").click()
        page.wait_for_url(world["base"] + "/sessions")
        assert "of alice" in page.locator("#notice").inner_text()
        assert page.locator("#sessions tbody tr", has_text="alice").count() == 0
        shot(world, page, "11-sessions-ended")
        code, err = guest.wait()
        assert code == 1 and "session-ended-by-owner" in err, err
    finally:
        guest.close()
