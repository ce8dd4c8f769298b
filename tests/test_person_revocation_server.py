"""Revocation lists on the community server (issue 22 item 3; specs/community-api.md,
specs/peers.md §10), on a real server in a thread: `kith device revoke NAME --server URL`
publishes the signed list; the server keeps the newest per person and refuses an older one
(`409 revocation-stale`) and a forged one (`400 request-invalid`); a host's watcher fetches
its person pins' lists and refuses the revoked device from then on."""

from __future__ import annotations

import json
import os

import anyio
import httpx
import pytest

from node.community.client import CommunityClient
from node.community.server import run_server_in_thread
from node.host.revocation import PeersWatcher
from node.host.sessions import SessionTable
from node.trust.identity import init_identity, load_identity
from node.trust.peers import PeerRegistry, pin_person
from node.trust.person import load_person
from node.trust.revocation_list import RevocationStore, make_list

from support.cli import kith
from support.community import NO_LIMITS


@pytest.fixture
def server(tmp_path):
    with run_server_in_thread(tmp_path / "server" / "community.sqlite3", rate_limits=NO_LIMITS) as url:
        yield url


def test_a_published_list_is_kept_newest_first_and_a_host_fetches_it(tmp_path, server):
    desk = tmp_path / "desk"
    made = json.loads(kith(desk, "init", "--json", "--device-name", "desk").stdout)
    rec = load_person(desk)
    secret = bytes.fromhex((desk / "person.key").read_text().strip())
    stolen = os.urandom(32).hex()
    from node.trust.person import bind_device, save_person

    bind_device(rec, secret, stolen, "laptop")
    save_person(desk, rec)
    r = kith(desk, "device", "revoke", "laptop", "--server", server, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["published"] and out["newly_revoked"] == [stolen]

    with httpx.Client(base_url=server, timeout=20) as http:
        got = http.get(f"/api/v1/revocations/{made['person_key']}")
        assert got.status_code == 200 and got.json() == out["list"]
        assert http.get(f"/api/v1/revocations/{'0' * 64}").json()["error"]["code"] == "revocation-not-found"

    async def publish(doc):
        async with CommunityClient(server, load_identity(desk)) as client:
            return await client.publish_revocation(doc)

    newer = make_list(secret, [stolen], 3, "2026-12-01T10:00:00Z")
    assert anyio.run(publish, newer, backend="asyncio")["stored"] is True
    for doc, code in ((out["list"], "revocation-stale"), ({**newer, "seq": 9}, "request-invalid")):
        with pytest.raises(Exception) as exc:
            anyio.run(publish, doc, backend="asyncio")
        assert exc.value.code == code

    # a host that pinned the person with --devices fetches the list and refuses the device
    host = tmp_path / "host"
    host_id, _ = init_identity(host)
    pin_person(PeerRegistry.load(host), "alice", made["person_key"])
    events: list[dict] = []
    watcher = PeersWatcher(host, SessionTable(), on_event=events.append)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(watcher.watch_server, server, host_id, 3600.0)
            with anyio.fail_after(20):
                while not events:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")
    assert [(e["event"], e["peer_name"], e["devices"], e["seq"], e["via"]) for e in events] == [
        ("device-revoked", "alice", [stolen], 3, "server")]
    assert RevocationStore.load(host).revokes(stolen, [made["person_key"]]) == made["person_key"]


def test_a_host_pinned_on_an_earlier_person_key_fetches_the_list_its_successor_published(tmp_path, server):
    """After `kith person rotate`, `kith device revoke --server` publishes a list signed by
    the new person key; a host whose pin is on the old key and that followed the rotation
    fetches that list too (not only the pinned key's)."""
    from node.trust.person import bind_device, save_person
    from node.trust.rotation import RotationLedger

    desk = tmp_path / "desk"
    made = json.loads(kith(desk, "init", "--json", "--device-name", "desk").stdout)
    rec = load_person(desk)
    stolen = os.urandom(32).hex()
    bind_device(rec, bytes.fromhex((desk / "person.key").read_text().strip()), stolen, "laptop")
    save_person(desk, rec)
    r = kith(desk, "person", "rotate", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    new_key = json.loads(r.stdout)["person_key"]
    r = kith(desk, "device", "revoke", "laptop", "--server", server, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["list"]["person_key"] == new_key

    host = tmp_path / "host"
    host_id, _ = init_identity(host)
    pin_person(PeerRegistry.load(host), "alice", made["person_key"])
    ledger = RotationLedger.load(host)  # the host followed the rotation (a handshake of the desk)
    ledger.entries[made["person_key"]] = {"successor": new_key, "via": "person", "seenAt": "2026-12-02T04:00:00Z"}
    ledger.save()
    events: list[dict] = []
    watcher = PeersWatcher(host, SessionTable(), on_event=events.append)

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(watcher.watch_server, server, host_id, 3600.0)
            with anyio.fail_after(10):
                while not events:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")
    assert [(e["event"], e["peer_name"], e["devices"], e["via"]) for e in events] == [
        ("device-revoked", "alice", [stolen], "server")]
    assert RevocationStore.load(host).revokes(stolen, [made["person_key"], new_key]) == new_key
