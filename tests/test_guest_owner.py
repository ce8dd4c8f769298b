"""One owner of the asking side per process (node/guest/owner.py; issue 39 item 4): a
``Guest`` holds the identity, one view of ``peers.json``, the pools, the asker and the
runner. Every pool it makes reads the registry through its one view, and a real ``kith
join`` and ``kith ask`` (to a person pinned with ``--devices``) read ``peers.json`` once in
the whole process: what a user notices as speed (it was read six to eight times a join).

The counts of the real commands come from their own process: a small driver runs ``kith``
as the console script does, with a counter around :meth:`PeerRegistry.load` (every read of
the file, the view's included) and around ``Guest`` (how many were built), and prints them
when the process ends (``kith ask`` ends with ``os._exit``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from node.common.errors import KithError
from node.guest.owner import Guest
from node.trust.peers import PeerRegistry
from support.cli import kith
from support.homes import initialized, new_identity, pin_host
from support.hosts import HostProcess, notes_host, NOTES_QUESTION

#: Runs ``kith ARGS...`` in this interpreter, counting every read of ``peers.json`` and
#: every ``Guest`` built; the counts are the last stderr line, ``READS {...}``.
DRIVER = r"""
import atexit, json, os, sys
from node.guest import owner
from node.trust import peers

reads = [0]
guests = []
load = peers.PeerRegistry.load.__func__

def counted(cls, home):
    reads[0] += 1
    return load(cls, home)

peers.PeerRegistry.load = classmethod(counted)
init = owner.Guest.__init__

def made(self, *args, **kwargs):
    init(self, *args, **kwargs)
    guests.append(self)

owner.Guest.__init__ = made

def report():
    sys.stderr.write("READS " + json.dumps({"file": reads[0], "guests": len(guests),
                                            "view": [g.peers.loads for g in guests]}) + "\n")
    sys.stderr.flush()

exit_now = os._exit

def _exit(code):
    report()
    exit_now(code)

os._exit = _exit
atexit.register(report)
from node.cli.main import main
main(sys.argv[1:])
"""


def _counted(home: Path, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, dict]:
    r = subprocess.run([sys.executable, "-c", DRIVER, "--home", str(home), *args], capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    lines = [line for line in r.stderr.splitlines() if line.startswith("READS ")]
    assert lines, r.stderr
    return r, json.loads(lines[-1][len("READS "):])


# --- the owner, no network --------------------------------------------------------------------
def test_every_pool_of_a_guest_reads_the_registry_through_its_one_view(tmp_path):
    home = initialized(tmp_path / "home")
    PeerRegistry.load(home).add("alice", new_identity().public_key)
    guest = Guest(home, local=True)
    first, second = guest.session_pool(), guest.session_pool(down_s=0.0)
    assert first.peers is guest.peers and second.peers is guest.peers and first.owner is guest
    assert second.down_s == 0.0 and first.local and first.identity is guest.identity
    assert first.home_file("cards.json", lambda h: {}) is second.home_file("cards.json", lambda h: {})
    for pool in (first, second, guest):
        assert pool.peers.now().by_name("alice") is not None
    assert guest.peers.loads == 1  # three readers, one read
    PeerRegistry.load(home).add("bob", new_identity().public_key)  # another process pins bob
    assert first.peers.now().by_name("bob") is not None and guest.peers.loads == 2


def test_kith_join_and_every_pool_read_the_person_record_through_the_guests_one_view(tmp_path):
    """``kith join`` reads ``guest.person`` before dialling and each pool's sessions read
    ``pool.person``: one view, so one read of ``person.json`` per change in the process."""
    from node.trust.person import PERSON_FILE, init_person, save_person

    home = initialized(tmp_path / "home")
    guest = Guest(home, local=True)
    assert guest.person.now() is None  # no person yet: nothing to carry
    rec, _words = init_person(home, guest.identity, "desk")
    first, second = guest.session_pool(), guest.session_pool()
    assert first.person is guest.person and second.person is guest.person
    assert first.person.now().person_key == rec.person_key == second.person.now().person_key
    assert guest.person.loads == 2  # once before, once after the record was made; three readers
    save_person(home, rec)  # rewritten (another process bound a device): read again, once
    assert guest.person.now().person_key == rec.person_key and first.person.now() is guest.person.now()
    assert guest.person.loads == 3
    (home / PERSON_FILE).write_text("{not json")
    with pytest.raises(KithError) as err:  # a damaged record refuses with its code, each time asked
        second.person.now()
    assert err.value.code == "config-invalid"


def test_the_identity_is_loaded_once_and_a_home_without_one_is_refused_when_asked_for(tmp_path):
    home = initialized(tmp_path / "home")
    guest = Guest(home)
    assert guest.load() is guest.identity is guest.identity
    bare = Guest(tmp_path / "none")  # building it reads nothing
    with pytest.raises(KithError) as err:
        bare.load()
    assert err.value.code == "home-not-initialized"


def test_one_runner_per_guest_and_none_runs_in_a_home_without_an_identity(tmp_path):
    guest = Guest(tmp_path)
    runner = guest.runner(command="test", tasks=[])
    assert guest.runner(command="other") is runner and runner.clock is guest.clock and runner.guest is guest

    async def main():
        with anyio.fail_after(10):  # no key: it returns at once, no lock taken
            await Guest(tmp_path / "bare").run_background(command="test")
    anyio.run(main)
    assert not (tmp_path / "bare" / "runner.lock").exists()


def test_a_pool_handed_in_gives_its_guest_and_a_call_without_one_gets_its_own(tmp_path):
    home = initialized(tmp_path / "home")
    guest = Guest(home, local=True)
    assert Guest.of(home, pool=guest.session_pool()) is guest
    own = Guest.of(home, local=True)
    assert own is not guest and own.local


# --- the real commands, over iroh on loopback --------------------------------------------------
@pytest.mark.iroh
def test_one_kith_join_reads_peers_json_once(tmp_path):
    host_home = notes_host(tmp_path)
    guest = initialized(tmp_path / "guest")
    host = HostProcess(host_home, "--invite-file", str(tmp_path / "invite.json"))
    try:
        pin_host(guest, "alice", tmp_path / "invite.json")
        r, reads = _counted(guest, "join", "--peer", "alice", "--offline", "--json", "--yes",
                            "--query", NOTES_QUESTION)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.splitlines()[0])["status"] == "ok"
    finally:
        host.stop()
    assert reads == {"file": 1, "guests": 1, "view": [1]}, r.stderr


@pytest.mark.iroh
def test_one_kith_ask_to_a_person_with_devices_reads_peers_json_once(tmp_path):
    desk = notes_host(tmp_path)  # `kith init`: the person key lives here; the desk is its device
    person = json.loads(kith(desk, "device", "list", "--json").stdout)
    desk_key = next(d["key"] for d in person["devices"] if d["this"])
    guest = initialized(tmp_path / "guest")
    r = kith(guest, "peers", "add", "bea", person["person_key"], "--devices")
    assert r.returncode == 0, r.stderr
    host = HostProcess(desk, "--invite-file", str(tmp_path / "desk.json"))
    try:  # the desk hands over its card in a first handshake
        r = kith(guest, "join", str(tmp_path / "desk.json"), "--local", "--trust", "--query", "staging")
        assert r.returncode in (0, 3) and "is a device of 'bea'" in r.stderr, r.stderr
        r, reads = _counted(guest, "ask", NOTES_QUESTION, "--peer", "bea", "--offline", "--json", "--yes",
                            "--timeout", "60")
        assert r.returncode == 0, r.stderr
        env = json.loads(r.stdout)
        assert env["peers"][0]["status"] == "ok" and env["peers"][0]["device"]["key"] == desk_key
    finally:
        host.stop()
    assert reads == {"file": 1, "guests": 1, "view": [1]}, r.stderr
