"""One owner of the asking side per process (node/guest/owner.py; issue 39 item 4): a
``Guest`` holds the identity, one view of ``peers.json``, the pools, the asker and the
runner. Every pool it makes reads the registry through its one view."""

from __future__ import annotations


import anyio
import pytest

from node.common.errors import KithError
from node.guest.owner import Guest
from node.trust.peers import PeerRegistry
from support.homes import initialized, new_identity

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


def test_the_identity_is_loaded_once_and_a_home_without_one_is_refused_when_asked_for(tmp_path):
    home = initialized(tmp_path / "home")
    guest = Guest(home)
    assert guest.identity is guest.identity
    bare = Guest(tmp_path / "none")  # building it reads nothing
    with pytest.raises(KithError):
        bare.identity


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
