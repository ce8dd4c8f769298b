"""Any awake device of a person answers (issue 30 item 3), over real iroh on loopback
(relays off) through real `kith` processes: a person with two hosting devices (the second
paired with `kith device add/join`) each hands its card to a guest that pinned the person
with --devices; with one device asleep (its process gone) `kith ask --peer bea` gets its
answer from the awake one, naming that device; `kith peers list` shows which answered. The
unit tests of cards (format, refusals, the server route) are tests/test_trust_card.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from node.community.server import run_server_in_thread
from support.cli import KITH, kith
from support.devices import pair_device
from support.homes import FIXTURE
from support.hosts import HostProcess as Host, prepare_host
from support.waits import wait_for

pytestmark = pytest.mark.iroh


@pytest.fixture
def server(tmp_path):
    with run_server_in_thread(tmp_path / "server" / "community.sqlite3") as url:
        yield url


def _hosting_device(home: Path) -> None:
    for args in (("index", "add", str(FIXTURE)), ("index", "sync"), ("policy", "set", f"/{FIXTURE.name}/**", "public")):
        r = kith(home, *args, timeout=600)
        assert r.returncode == 0, r.stderr


def _ask(home: Path, *args: str) -> dict:
    r = subprocess.run([*KITH, "--home", str(home), "ask", "sqlite write-ahead log", *args, "--offline", "--json",
                        "--timeout", "60"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, json.dumps(json.loads(r.stdout)["peers"]) + r.stderr
    return json.loads(r.stdout)


def _person(tmp_path: Path, *pin: str) -> tuple[Path, Path, Path, dict, str, str]:
    """A desk (holds the person key) and a paired laptop, both hosting the fixture; a guest
    that pinned the person as ``bea`` with ``--devices`` (and ``pin``'s extra options)."""
    desk = prepare_host(tmp_path, FIXTURE)  # `kith init`: the person key lives here
    laptop = tmp_path / "laptop"
    laptop_key = pair_device(desk, laptop, name="laptop")
    _hosting_device(laptop)
    person = json.loads(kith(desk, "device", "list", "--json").stdout)
    desk_key = next(d["key"] for d in person["devices"] if d["this"])
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    r = kith(guest, "peers", "add", "bea", person["person_key"], "--devices", *pin)
    assert r.returncode == 0, r.stderr
    return desk, laptop, guest, person, desk_key, laptop_key


def test_a_person_with_two_devices_one_asleep_answers_from_the_awake_one(tmp_path: Path):
    desk, laptop, guest, person, desk_key, laptop_key = _person(tmp_path)

    desk_host = Host(desk, "--invite-file", str(tmp_path / "desk.json"))
    laptop_host = Host(laptop, "--invite-file", str(tmp_path / "laptop.json"))
    try:
        for invite in ("desk.json", "laptop.json"):  # each device hands over its card in the handshake
            r = kith(guest, "join", str(tmp_path / invite), "--local", "--trust", "--query", "installing")
            assert r.returncode in (0, 3), r.stderr
            assert "is a device of 'bea'" in r.stderr and "to pin this host" not in r.stderr, r.stderr
        cards = json.loads((guest / "cards.json").read_text())["persons"][person["person_key"]]
        assert set(cards) == {desk_key, laptop_key}
        # joining a device again: it is bea's known device now, not another host under that name
        r = kith(guest, "join", str(tmp_path / "desk.json"), "--local", "--trust", "--query", "installing")
        assert r.returncode in (0, 3) and "host-key-changed" not in r.stderr and "pin-name-taken" not in r.stderr, r.stderr
        assert cards[laptop_key]["card"]["totals"]["documents"] > 0

        laptop_host.stop()  # the laptop sleeps
        env = _ask(guest, "--peer", "bea")
        row = env["peers"][0]
        assert row["name"] == "bea" and row["status"] == "ok" and row["device"]["key"] == desk_key
        assert env["results"] and all(a["peer"]["device"]["key"] == desk_key
                                      for res in env["results"] for a in res["attributions"])

        # MCP `search` and the local API's POST /search ask peers by name through the same call
        import anyio

        from node.guest.fanout import peers_search
        from node.guest.owner import Guest

        merged = anyio.run(lambda: peers_search(Guest(guest, local=True), ["bea"], {"query": "sqlite write-ahead log"},
                                                timeout_s=60), backend="asyncio")
        assert merged["peers"][0]["status"] == "ok" and merged["peers"][0]["device"]["key"] == desk_key

        listed = json.loads(kith(guest, "peers", "list", "--json").stdout)["peers"][0]
        devices = {d["key"]: d for d in listed["seenDevices"]}
        assert devices[desk_key]["online"] is True and devices[desk_key]["lastSeen"]
        assert devices[laptop_key]["online"] is False
    finally:
        desk_host.stop()
        if laptop_host.proc.poll() is None:
            laptop_host.stop()


def test_the_cards_on_the_community_server_reach_a_guest_that_never_joined_either_device(tmp_path: Path, server):
    desk, laptop, guest, person, desk_key, laptop_key = _person(tmp_path, "--server", server)
    desk_host, laptop_host = Host(desk, "--server", server), Host(laptop, "--server", server)
    try:
        def both_cards():  # each host posts its card once its post is live
            got = httpx.get(f"{server}/api/v1/cards/{person['person_key']}", timeout=10)
            return got.status_code == 200 and len(got.json()["cards"]) == 2 and got.json()["cards"]
        cards = wait_for("both devices' cards on the server", both_cards, timeout_s=30)
        assert {c["device_key"] for c in cards} == {desk_key, laptop_key}
        desk_host.stop()  # now the desk sleeps: the guest has never met either device
        env = _ask(guest, "--peer", "bea")
        assert env["peers"][0]["status"] == "ok" and env["peers"][0]["device"]["key"] == laptop_key
        kept = json.loads((guest / "cards.json").read_text())["persons"][person["person_key"]]
        assert kept[desk_key]["via"] == kept[laptop_key]["via"] == "server"  # both came from the server
    finally:
        if desk_host.proc.poll() is None:
            desk_host.stop()
        laptop_host.stop()


def test_a_device_revoked_on_the_server_while_the_guest_holds_its_card_no_longer_answers(tmp_path: Path, server):
    # the guest met only the laptop (its card came in the handshake); the laptop is stolen:
    # the desk revokes it and publishes the list. The very next ask drops the laptop's
    # answer and is answered by the desk (its card from the server)
    desk, laptop, guest, person, desk_key, laptop_key = _person(tmp_path, "--server", server)
    laptop_host = Host(laptop, "--invite-file", str(tmp_path / "laptop.json"))
    desk_host = Host(desk, "--server", server)
    try:
        r = kith(guest, "join", str(tmp_path / "laptop.json"), "--local", "--trust", "--query", "installing")
        assert r.returncode in (0, 3), r.stderr
        assert set(json.loads((guest / "cards.json").read_text())["persons"][person["person_key"]]) == {laptop_key}
        assert _ask(guest, "--peer", "bea")["peers"][0]["device"]["key"] == laptop_key
        wait_for("the desk's card on the server",  # posted once its post is live
                 lambda: httpx.get(f"{server}/api/v1/cards/{person['person_key']}", timeout=10).status_code == 200,
                 timeout_s=30)
        r = kith(desk, "device", "revoke", "laptop", "--server", server)
        assert r.returncode == 0, r.stderr
        row = _ask(guest, "--peer", "bea")["peers"][0]
        assert row["status"] == "ok" and row["device"]["key"] == desk_key
    finally:
        desk_host.stop()
        laptop_host.stop()


def test_a_warm_device_that_goes_to_sleep_mid_conversation_hands_over_to_the_awake_one(tmp_path: Path):
    # one long-running guest process (as MCP or the local API): the device that answered
    # keeps a warm session; it then sleeps (SIGSTOP: it sends nothing, its session is not
    # ended). The next question is answered by the other device (the warm session's
    # in-flight keep-alive gives the sleeper up), even when the first race cancelled that
    # other device before its handshake finished (it is not left marked down)
    import os
    import signal

    import anyio

    from node.guest.asker import Asker

    from node.guest.pool import SessionPool
    from node.trust.identity import load_identity

    desk, laptop, guest, person, desk_key, laptop_key = _person(tmp_path)
    hosts = {desk_key: Host(desk, "--invite-file", str(tmp_path / "desk.json")),
             laptop_key: Host(laptop, "--invite-file", str(tmp_path / "laptop.json"))}
    stopped: list[int] = []
    try:
        for invite in ("desk.json", "laptop.json"):
            r = kith(guest, "join", str(tmp_path / invite), "--local", "--trust", "--query", "installing")
            assert r.returncode in (0, 3), r.stderr

        async def main() -> tuple[str, dict]:
            async with SessionPool(guest, load_identity(guest), local=True) as pool:
                with anyio.fail_after(60):
                    first = await Asker(pool).ask("bea", {"query": "sqlite write-ahead log", "topK": 3})
                sleeper = first["device"]["key"]
                os.kill(hosts[sleeper].proc.pid, signal.SIGSTOP)
                stopped.append(hosts[sleeper].proc.pid)
                with anyio.fail_after(20):  # well under the transport's idle timeout (30 s)
                    return sleeper, await Asker(pool).ask("bea", {"query": "sqlite write-ahead log", "topK": 3})

        sleeper, answer = anyio.run(main, backend="asyncio")
        assert answer["status"] == "ok" and answer["device"]["key"] == ({desk_key, laptop_key} - {sleeper}).pop()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        for host in hosts.values():
            host.stop()
