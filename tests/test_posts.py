"""The host's kept posts (node/host/posts.py, issue 30 item 1): ``<home>/posts.json``
keeps each live file-mode post and its uses; a restart honours it until its own expiry or
use count, hands the use count back to the session table, writes the same document again
only when its ticket still describes the endpoint, and refuses a file it did not write
(``config-invalid``). A :class:`ManualClock` drives expiry; no network."""

from __future__ import annotations

import json
import os

import iroh
import pytest

from node.common.errors import ConfigError, HandshakeError
from node.runtime.clock import ManualClock
from node.host.posts import POSTS_FILE, Posts
from node.host.sessions import AdmissionLimits, SessionTable
from node.trust.identity import Identity
from node.trust.invitation import create_invitation

PROTOCOL_ID = "a" * 64


def _ticket(ident: Identity, port: int) -> str:
    key = iroh.SecretKey.from_bytes(ident.secret).public()
    return str(iroh.EndpointTicket.from_addr(iroh.EndpointAddr(key, None, [f"127.0.0.1:{port}"])))


def _invitation(ident: Identity, port: int = 50913, **kw):
    return create_invitation(ident, protocol_name="knowledge-query", protocol_version="1.2.0",
                             protocol_id=PROTOCOL_ID, ticket=_ticket(ident, port), **kw)


def _posts(home, clock) -> Posts:
    return Posts(PROTOCOL_ID, server_url=None, identity=None, invite_file=None, emit=lambda _e: None,
                 warn=lambda _m: None, clock=clock, keep_in=home)


def test_a_post_and_its_uses_outlive_the_process_until_its_use_count(tmp_path):
    ident, clock = Identity(os.urandom(32)), ManualClock()
    first = _posts(tmp_path, clock)
    inv = _invitation(ident, max_sessions=3)
    first.add(inv)
    first.used(inv.post_id)
    first.used(inv.post_id)
    kept = json.loads((tmp_path / POSTS_FILE).read_text())
    assert kept["posts"] == [{"invitation": inv.to_dict(), "uses": 2}]

    table = SessionTable(AdmissionLimits(post_max_sessions=None), clock=clock)
    again = _posts(tmp_path, clock)
    restored = again.restore(table, ident.public_key)
    assert restored == [{"post_id": inv.post_id, "uses": 2, "max_sessions": 3, "expires_at": inv.expires_at}]
    assert again.protocol_for(inv.post_id) == PROTOCOL_ID
    assert table.claimed(inv.post_id) == 2 and table.post_limit(inv.post_id) == 3  # its own limit, not the run's
    assert again.reusable(_invitation(ident, max_sessions=3)) == inv  # same addresses: written again, not re-signed
    assert again.reusable(_invitation(ident, port=50914, max_sessions=3)) is None  # another port: a new one
    assert again.reusable(_invitation(ident, max_sessions=5)) is None  # other settings: a new one
    again.used(inv.post_id)  # the third and last use
    assert json.loads((tmp_path / POSTS_FILE).read_text())["posts"] == []  # used up: not kept
    assert _posts(tmp_path, clock).restore(SessionTable(clock=clock), ident.public_key) == []


def test_an_expired_post_is_not_honoured_after_a_restart(tmp_path):
    ident, clock = Identity(os.urandom(32)), ManualClock()
    inv = _invitation(ident, ttl_s=60)
    _posts(tmp_path, clock).add(inv)
    clock.jump_wall(61)
    again = _posts(tmp_path, clock)
    assert again.restore(SessionTable(clock=clock), ident.public_key) == []
    assert again.protocol_for(inv.post_id) is None
    kept = json.loads((tmp_path / POSTS_FILE).read_text())["posts"]
    assert [p["invitation"]["post_id"] for p in kept] == [inv.post_id]  # read only: a refused start writes nothing
    fresh = _invitation(ident, port=50914)
    again.add(fresh)  # this run publishes: the expired one is dropped from the file
    assert [p["invitation"]["post_id"] for p in json.loads((tmp_path / POSTS_FILE).read_text())["posts"]] \
        == [fresh.post_id]


def test_forgetting_the_kept_posts_withdraws_them(tmp_path):
    ident, clock = Identity(os.urandom(32)), ManualClock()
    inv = _invitation(ident)
    _posts(tmp_path, clock).add(inv)
    again = _posts(tmp_path, clock)
    again.restore(SessionTable(clock=clock), ident.public_key)
    assert again.forget_kept() == [inv.post_id]
    assert again.protocol_for(inv.post_id) is None  # handshake-unknown-post: the guest says invitation-gone
    fresh = _invitation(ident, port=50914)
    again.add(fresh)  # the file is rewritten with the new invitation (a start refused before keeps it)
    assert [p["invitation"]["post_id"] for p in json.loads((tmp_path / POSTS_FILE).read_text())["posts"]] \
        == [fresh.post_id]


@pytest.mark.parametrize("content", [
    "not json", json.dumps({"version": 2, "posts": []}), json.dumps({"version": 1, "posts": [{"uses": 1}]}),
    json.dumps({"version": 1, "posts": [{"invitation": {"post_id": "x"}, "uses": 0}]}),
    json.dumps({"version": 1, "posts": [], "extra": 1}),
])
def test_a_posts_file_the_host_did_not_write_is_config_invalid(tmp_path, content):
    (tmp_path / POSTS_FILE).write_text(content)
    with pytest.raises(ConfigError) as exc:
        _posts(tmp_path, ManualClock()).restore(SessionTable(), Identity(os.urandom(32)).public_key)
    assert exc.value.code == "config-invalid" and POSTS_FILE in exc.value.message


def test_another_hosts_invitation_in_the_file_is_refused(tmp_path):
    other = Identity(os.urandom(32))
    doc = {"version": 1, "posts": [{"invitation": _invitation(other).to_dict(), "uses": 0}]}
    (tmp_path / POSTS_FILE).write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as exc:
        _posts(tmp_path, ManualClock()).restore(SessionTable(), Identity(os.urandom(32)).public_key)
    assert "another host's" in exc.value.message


def test_a_hand_edited_kept_invitation_is_refused_not_honoured(tmp_path):
    # a later expiry typed into posts.json: the signed document no longer verifies, so the
    # host must not honour it to 2030 nor hand guests a document their join refuses
    ident = Identity(os.urandom(32))
    _posts(tmp_path, ManualClock()).add(_invitation(ident))
    doc = json.loads((tmp_path / POSTS_FILE).read_text())
    doc["posts"][0]["invitation"]["expires_at"] = "2030-01-01T00:00:00Z"
    (tmp_path / POSTS_FILE).write_text(json.dumps(doc))
    before = (tmp_path / POSTS_FILE).read_bytes()
    with pytest.raises(ConfigError) as exc:
        _posts(tmp_path, ManualClock()).restore(SessionTable(), ident.public_key)
    assert exc.value.code == "config-invalid" and "invitation-bad-signature" in exc.value.message
    assert (tmp_path / POSTS_FILE).read_bytes() == before  # refused, not rewritten


def test_a_post_expired_while_serving_is_still_refused_as_expired(tmp_path):
    ident, clock = Identity(os.urandom(32)), ManualClock()
    posts = _posts(tmp_path, clock)
    inv = _invitation(ident, ttl_s=60)
    posts.add(inv)
    clock.jump_wall(61)
    with pytest.raises(HandshakeError) as exc:
        posts.protocol_for(inv.post_id)
    assert exc.value.code == "handshake-post-expired"
