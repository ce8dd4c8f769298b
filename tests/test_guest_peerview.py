"""One view of the peer registry per process (node/guest/peerview.py): ``peers.json`` is read
again only when it changed, so a warm question reads nothing, and a change made by a writer
(``kith peers remove``, a block) is seen at the next read."""

from __future__ import annotations

import os

import pytest

from node.common.errors import KithError
from node.guest.peerview import PeerView
from node.trust.peers import PEERS_FILE, PeerRegistry

A, B = os.urandom(32).hex(), os.urandom(32).hex()


def test_the_registry_is_read_once_until_the_file_changes(tmp_path):
    PeerRegistry.load(tmp_path).add("alice", A)
    view = PeerView(tmp_path)
    first = view.now()
    assert view.now() is first and view.now().by_name("alice").public_key == A and view.loads == 1
    PeerRegistry.load(tmp_path).add("bob", B)  # another process pins bob
    assert view.now().by_name("bob").public_key == B and view.loads == 2
    registry = PeerRegistry.load(tmp_path)
    registry.block(B, "")
    assert view.now().is_blocked(B) and view.loads == 3


def test_a_missing_registry_is_empty_and_a_broken_one_is_refused_until_fixed(tmp_path):
    view = PeerView(tmp_path)
    assert view.now().peers == {}
    (tmp_path / PEERS_FILE).write_text('{"peers": {')
    with pytest.raises(KithError) as exc:
        view.now()
    assert exc.value.code == "config-invalid"
    PeerRegistry(tmp_path / PEERS_FILE, {}).save()
    assert view.now().peers == {}
