"""peers.json keeps a pinned peer's last invitation and community server (issue 13): an
older file without them reads unchanged and gains them on save; a bad value is
config-invalid like any other bad field; an unknown key is never added."""

from __future__ import annotations

import json
import os

import pytest

from node.common.errors import ConfigError
from node.trust.identity import Identity
from node.trust.peers import MAX_SAVED_INVITATION_BYTES, PeerRegistry

KEY = Identity(os.urandom(32)).public_key


def _write(home, data) -> None:
    (home / "peers.json").write_text(json.dumps(data))


def test_a_version_1_file_reads_and_gains_the_invitation_on_save(tmp_path):
    _write(tmp_path, {"peers": {"alice": {"publicKey": KEY}}})
    reg = PeerRegistry.load(tmp_path)
    assert reg.by_name("alice").invitation is None and reg.by_name("alice").server is None
    doc = {"host_public_key": KEY, "post_id": "post-abcdefgh"}
    assert reg.remember_invitation(KEY, doc, "http://127.0.0.1:8787") is not None
    raw = json.loads((tmp_path / "peers.json").read_text())
    assert raw["version"] == 2
    assert raw["peers"]["alice"]["invitation"] == doc and raw["peers"]["alice"]["server"] == "http://127.0.0.1:8787"
    again = PeerRegistry.load(tmp_path).by_name("alice")
    assert again.invitation == doc and again.server == "http://127.0.0.1:8787"
    assert PeerRegistry.load(tmp_path).to_json(again)["invitation"] == "post-abcdefgh"


def test_an_unknown_key_a_foreign_or_oversized_invitation_is_not_kept(tmp_path):
    reg = PeerRegistry.load(tmp_path)
    reg.add("alice", KEY)
    other = Identity(os.urandom(32)).public_key
    assert reg.remember_invitation(other, {"host_public_key": other}, None) is None
    assert reg.remember_invitation(KEY, {"host_public_key": other}, None) is None
    huge = {"host_public_key": KEY, "message": "x" * MAX_SAVED_INVITATION_BYTES}
    assert reg.remember_invitation(KEY, huge, None) is None
    assert PeerRegistry.load(tmp_path).by_name("alice").invitation is None
    assert set(PeerRegistry.load(tmp_path).peers) == {"alice"}


@pytest.mark.parametrize("field,value", [("invitation", "not an object"), ("invitation", [1]),
                                         ("server", 7), ("server", "")])
def test_a_bad_saved_invitation_or_server_is_config_invalid(tmp_path, field, value):
    _write(tmp_path, {"version": 2, "peers": {"alice": {"publicKey": KEY, field: value}}})
    with pytest.raises(ConfigError) as exc:
        PeerRegistry.load(tmp_path)
    assert exc.value.code == "config-invalid"
