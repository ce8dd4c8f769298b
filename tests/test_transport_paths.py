"""Path truth (issue 23 §1, specs/transport.md §3): a session's path comes from iroh's own
path data. On loopback both sides see ``direct``; the relayed case and a direct → relayed
change are fed to the path logic as constructed snapshots (no relay server runs offline)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import anyio
import pytest

from node.guest.guest import GuestOptions, ask, open_target
from node.transport.paths import PathInfo, PathTracker, path_of
from node.trust.identity import load_identity

from support.homes import node_home as _home
from support.hosts import InProcessHost


@dataclass
class Snap:
    """A path snapshot shaped like ``iroh.PathSnapshot`` (the fields path_of reads)."""

    remote_addr: str
    is_relay: bool = False
    is_selected: bool = True

    @property
    def is_ip(self) -> bool:
        return not self.is_relay


RELAY = "https://relay.example.org/"


def test_the_selected_path_decides_and_a_relay_names_its_url():
    assert path_of([Snap("192.0.2.7:4433", is_selected=False), Snap(RELAY, is_relay=True)]) == \
        PathInfo("relayed", relay_url=RELAY)
    assert path_of([Snap(RELAY, is_relay=True, is_selected=False), Snap("192.0.2.7:4433")]) == \
        PathInfo("direct", remote="192.0.2.7:4433")
    assert path_of([Snap("192.0.2.7:4433", is_selected=False)]).kind == "unknown"
    assert path_of([]).kind == "unknown" and path_of(None).kind == "unknown"
    assert PathInfo("relayed", relay_url=RELAY).describe() == f"relayed via {RELAY}"


def test_a_direct_to_relayed_change_is_reported_once_and_back_again():
    tracker = PathTracker(path_of([Snap("192.0.2.7:4433")]))
    assert tracker.update([Snap("192.0.2.7:4433")]) is None  # a stats update of the same path
    changed = tracker.update([Snap("192.0.2.7:4433", is_selected=False), Snap(RELAY, is_relay=True)])
    assert changed is not None
    before, now = changed
    assert (before.kind, now.kind, now.relay_url) == ("direct", "relayed", RELAY)
    assert tracker.update([Snap(RELAY, is_relay=True)]) is None
    assert tracker.update([]) is None  # closing: no selected path is not a change
    back = tracker.update([Snap("192.0.2.7:4433"), Snap(RELAY, is_relay=True, is_selected=False)])
    assert back is not None and back[1].kind == "direct"


@pytest.mark.iroh
def test_on_loopback_both_sides_see_a_direct_path(tmp_path):
    """The guest's ``on_path``, the host's ``session-started`` event, the session table's
    listing (what ``kith sessions``/``kith status --json``/the dashboard read) and the
    audit record all say ``direct``."""
    from node.cli.status_cmd import _session_lines

    host_home, guest_home = _home(tmp_path, "host"), _home(tmp_path, "guest")

    async def scenario():
        host = InProcessHost(host_home, tmp_path)
        seen: list = []
        listing: list = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            target = await open_target(str(host.invite), guest_home, server_url=None)

            def on_results(_message):
                listing.extend(host.host.table.listing())

            result = await ask(guest_home, load_identity(guest_home), target,
                               GuestOptions(queries=("hello",), on_results=on_results), local=True,
                               on_path=lambda now, previous: seen.append((now, previous)))
            await host.wait_for(lambda e: e["event"] == "session-ended")
            host.stop.set()
        return host, seen, listing, result

    host, seen, listing, result = anyio.run(scenario, backend="asyncio")
    assert result.outcome is not None and result.outcome.ok
    assert seen and seen[0][1] is None and seen[0][0].kind == "direct"
    assert seen[0][0].remote.startswith("127.0.0.1:")
    started = host.of("session-started")[0]
    assert started["path"]["kind"] == "direct" and started["path"]["remote"].startswith("127.0.0.1:")
    assert listing and listing[0]["path"]["kind"] == "direct"
    assert "  direct  " in _session_lines(listing)[0]
    from node.local.dashboard.app import _env  # the dashboard's own template environment

    page = _env.get_template("sessions.html").render(
        csrf="x", notice=None, page="sessions", live_why="",
        live={"node": {"startedAt": "-", "pid": 1}, "posts": [], "sessions": listing})
    assert re.search(r'<td class="path">direct <span class="muted">127\.0\.0\.1:\d+</span></td>', page)
    records = [json.loads(line) for line in (host_home / "audit.jsonl").read_text().splitlines()]
    assert [r["path"] for r in records if r["event"] == "session-started"] == ["direct"]


@pytest.mark.iroh
def test_a_direct_to_relayed_change_is_a_host_event_listed_and_audited(tmp_path, monkeypatch):
    """The host's side of a change: the real host over iroh on loopback, whose stream
    watcher is handed a constructed change (direct → relayed; no relay server runs
    offline) while the session is live. The table lists the new path, a
    ``session-path-changed`` event names both, and the audit records it (no IP)."""
    from node.transport import iroh as iroh_transport

    host_home, guest_home = _home(tmp_path, "host"), _home(tmp_path, "guest")
    watchers: list = []
    original = iroh_transport.IrohStream.watch_path

    def recording(self, on_change):
        watchers.append(on_change)
        return original(self, on_change)

    monkeypatch.setattr(iroh_transport.IrohStream, "watch_path", recording)
    relayed = PathInfo("relayed", relay_url=RELAY)

    async def scenario():
        host = InProcessHost(host_home, tmp_path)
        listing: list = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run)
            with anyio.fail_after(60):
                await host.ready.wait()
            target = await open_target(str(host.invite), guest_home, server_url=None)

            def on_results(_message):  # a guest hook thread, while the session is live
                host_side = [w for w in watchers if type(getattr(w, "__self__", None)).__name__ == "Connection"]
                anyio.from_thread.run_sync(host_side[0], PathInfo("direct", remote="127.0.0.1:1"), relayed)
                listing.extend(anyio.from_thread.run_sync(host.host.table.listing))

            await ask(guest_home, load_identity(guest_home), target,
                      GuestOptions(queries=("hello",), on_results=on_results), local=True)
            await host.wait_for(lambda e: e["event"] == "session-ended")
            host.stop.set()
        return host, listing

    host, listing = anyio.run(scenario, backend="asyncio")
    changed = host.of("session-path-changed")
    assert len(changed) == 1
    assert changed[0]["path"] == {"kind": "relayed", "relayUrl": RELAY, "remote": None}
    assert changed[0]["previous"]["kind"] == "direct"
    assert changed[0]["session_id"] == host.of("session-started")[0]["session_id"]
    assert listing[0]["path"]["kind"] == "relayed"
    records = [json.loads(line) for line in (host_home / "audit.jsonl").read_text().splitlines()]
    audited = [r for r in records if r["event"] == "session-path-changed"]
    assert [(r["path"], r["previous"]) for r in audited] == [(f"relayed {RELAY}", "direct")]
    # and `kith audit` shows it (the record's path and previous path, never an IP)
    import subprocess

    from support.cli import KITH
    from support.hosts import ENV

    shown = subprocess.run([*KITH, "--home", str(host_home), "audit"], capture_output=True, text=True, env=ENV,
                           timeout=60).stdout
    started = next(line for line in shown.splitlines() if " session-started " in line)
    changed_line = next(line for line in shown.splitlines() if " session-path-changed " in line)
    assert "path=direct" in started, shown
    assert f"path=relayed {RELAY}" in changed_line and "previous=direct" in changed_line, shown
    assert "127.0.0.1" not in shown
