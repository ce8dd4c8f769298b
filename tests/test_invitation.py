"""Invitations: signing, and every refusal `kith join` makes before connecting (DESIGN §5)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import iroh
import pytest

from node.common.errors import InvitationError
from node.trust.invitation import create_invitation, parse_invitation, verify_invitation
from node.transport.iroh import ticket_endpoint_id

from support.homes import new_identity

PROTOCOL_ID = "ab" * 32


def ticket_for(public_key: str, port: int = 4433) -> str:
    addr = iroh.EndpointAddr(iroh.EndpointId.from_string(public_key), None, [f"127.0.0.1:{port}"])
    return str(iroh.EndpointTicket.from_addr(addr))


def make(identity=None, **kw):
    identity = identity or new_identity()
    ticket = kw.pop("ticket", None) or ticket_for(identity.public_key)
    return identity, create_invitation(identity, protocol_name="knowledge-query", protocol_version="1.0.0",
                                       protocol_id=PROTOCOL_ID, ticket=ticket, **kw)


def check(inv, local_protocol_id=PROTOCOL_ID, now=None):
    verify_invitation(inv, ticket_endpoint_id=ticket_endpoint_id, local_protocol_id=local_protocol_id, now=now)


def refusal(inv, **kw) -> str:
    with pytest.raises(InvitationError) as exc:
        check(inv, **kw)
    assert exc.value.message and "\n" not in exc.value.message
    return exc.value.code


def roundtrip(inv, mutate):
    doc = inv.to_dict()
    mutate(doc)
    return parse_invitation(json.dumps(doc))


def test_valid_invitation_verifies_and_roundtrips():
    ident, inv = make()
    check(inv)
    again = parse_invitation(json.dumps(inv.to_dict()))
    check(again)
    assert again.transport_info.endpoint_id == ident.public_key == again.host_public_key
    assert ticket_endpoint_id(again.transport_info.ticket) == ident.public_key
    assert len(again.post_id) == 32


def test_one_changed_ticket_character_is_a_bad_signature():
    _, inv = make()

    def tamper(doc):
        t = doc["transport_info"]["ticket"]
        i = len(t) // 2
        doc["transport_info"]["ticket"] = t[:i] + ("a" if t[i] != "a" else "b") + t[i + 1:]
        doc["iroh_ticket"] = doc["transport_info"]["ticket"]

    assert refusal(roundtrip(inv, tamper)) == "invitation-bad-signature"


def test_changed_expiry_or_protocol_is_a_bad_signature():
    _, inv = make()
    later = roundtrip(inv, lambda d: d.update(expires_at="2099-01-01T00:00:00Z"))
    assert refusal(later) == "invitation-bad-signature"
    other = roundtrip(inv, lambda d: d["protocol"].update(protocol_id="cd" * 32))
    assert refusal(other, local_protocol_id="cd" * 32) == "invitation-bad-signature"


def test_legacy_iroh_ticket_must_equal_transport_info_ticket():
    other = new_identity()
    _, inv = make()
    bad = roundtrip(inv, lambda d: d.update(iroh_ticket=ticket_for(other.public_key)))
    assert refusal(bad) == "invitation-ticket-mismatch"


def test_ticket_endpoint_must_equal_host_key():
    ident = new_identity()
    stranger = new_identity()
    # the host signs a ticket that points at someone else's endpoint
    _, inv = make(ident, ticket=ticket_for(stranger.public_key))
    assert refusal(inv) == "invitation-endpoint-mismatch"


def test_transport_info_endpoint_id_must_equal_host_key():
    _, inv = make()
    bad = roundtrip(inv, lambda d: d["transport_info"].update(endpoint_id=new_identity().public_key))
    assert refusal(bad) == "invitation-endpoint-mismatch"


def test_expired_invitation_is_refused():
    past = datetime.now(timezone.utc) - timedelta(days=2)
    _, inv = make(now=past, ttl_s=3600)
    assert refusal(inv) == "invitation-expired"


def test_protocol_must_match_local_protocol():
    _, inv = make()
    assert refusal(inv, local_protocol_id="ef" * 32) == "invitation-protocol-mismatch"
    assert refusal(inv, local_protocol_id=None) == "invitation-unknown-protocol"


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(host_public_key=d["host_public_key"].upper()),
    lambda d: d.update(transport_binding_signature=d["transport_binding_signature"][:-2]),
    lambda d: d.update(transport_binding_signature="0x" + d["transport_binding_signature"][2:]),
    lambda d: d.update(host_public_key=" " + d["host_public_key"][1:]),
    lambda d: d["protocol"].update(protocol_id="AB" * 32),
])
def test_hex_must_be_strict_lowercase_of_exact_length(mutate):
    _, inv = make()
    assert refusal(roundtrip(inv, mutate)) == "invitation-bad-hex"


@pytest.mark.parametrize("text", [
    "not json", "[]", "{}", '{"invitation_version": 1}',
])
def test_malformed_documents_are_refused(text):
    with pytest.raises(InvitationError) as exc:
        parse_invitation(text)
    assert exc.value.code == "invitation-malformed"


def test_unknown_fields_and_bad_post_id_are_refused():
    _, inv = make()
    for mutate in (lambda d: d.update(surprise=True), lambda d: d.update(post_id="bad id!"),
                   lambda d: d.update(invitation_version=2), lambda d: d.update(transport="tcp")):
        doc = inv.to_dict()
        mutate(doc)
        with pytest.raises(InvitationError) as exc:
            parse_invitation(json.dumps(doc))
        assert exc.value.code == "invitation-malformed"


def test_oversize_invitation_is_refused():
    with pytest.raises(InvitationError):
        parse_invitation(b"{" + b" " * (70 * 1024) + b"}")
