"""Device cards (node/trust/card.py, node/host/card.py, node/guest/cards.py; specs/peers.md §13): a card made by a bound device verifies and is kept for
the person pinned with --devices; hostile or stale cards — a wrong signature, another
person's device, a revoked device, an old sequence, a card of another device — are refused
with their own codes, nothing is kept, and the device is never dialled; the community server
keeps the newest card per device and hands a person's cards out. The real-process test of a
person with one device asleep is tests/test_any_awake_device.py."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import httpx
import pytest

from node.common.errors import KithError
from node.community.client import CommunityClient
from node.community.server import run_server_in_thread
from node.guest.cards import accept_card, device_targets
from node.trust.binding import device_link
from node.trust.card import CardStore, check_card, make_card
from node.trust.identity import Identity
from node.trust.invitation import create_invitation
from node.trust.peers import PeerRegistry, pin_person
from node.trust.revocation_list import RevocationStore, check_list, make_list
from node.trust.signing import public_key_of

from support.community import NO_LIMITS

CREATED = "2026-12-02T10:00:00Z"


class Person:
    """A person key and the devices it binds (no home: the cards are signed here)."""

    def __init__(self) -> None:
        self.secret = os.urandom(32)
        self.key = public_key_of(self.secret)
        self.seq = 0

    def device(self, name: str) -> tuple[Identity, list[dict]]:
        ident = Identity(os.urandom(32))
        self.seq += 1
        return ident, [device_link(self.secret, ident.public_key, name, CREATED, self.seq)]


def card_of(ident: Identity, chain: list[dict], *, seq: int = 1, documents: int = 3, chunks: int = 9,
            ticket: str = "endpointticket") -> dict:
    inv = create_invitation(ident, protocol_name="knowledge-query", protocol_version="1", protocol_id="a" * 64,
                            ticket=ticket)
    return make_card(ident.secret, chain, inv.to_dict(), documents=documents, chunks=chunks, created=CREATED,
                     seq=seq)


def dialable_card(home: Path, ident: Identity, chain: list[dict]) -> dict:
    """A card whose invitation carries a real iroh ticket of ``ident`` for the installed
    knowledge-query protocol (what :func:`device_targets` verifies before dialling)."""
    from node.protocol.spec import find_protocol_dir, load_spec
    from node.transport.iroh import bind_node

    async def ticket() -> str:
        async with bind_node(ident.secret, b"kith/knowledge-query/1", local=True) as node:
            return node.ticket()

    spec = load_spec(find_protocol_dir("knowledge-query", home))
    inv = create_invitation(ident, protocol_name=spec.name, protocol_version=spec.version,
                            protocol_id=spec.protocol_id, ticket=anyio.run(ticket, backend="asyncio"))
    return make_card(ident.secret, chain, inv.to_dict(), documents=1, chunks=1, created=CREATED, seq=1)


def guest_home(tmp_path: Path, person: Person, name: str = "bea") -> Path:
    home = tmp_path / "guest"
    home.mkdir(mode=0o700)
    pin_person(PeerRegistry.load(home), name, person.key)
    return home


def refused(code: str, fn, *args, **kw) -> None:
    with pytest.raises(KithError) as info:
        fn(*args, **kw)
    assert info.value.code == code, info.value.message


def test_a_card_of_a_bound_device_verifies_and_is_kept_for_the_pinned_person(tmp_path):
    bea = Person()
    desk, chain = bea.device("desk")
    card = card_of(desk, chain)
    checked = check_card(card, device=desk.public_key)
    assert (checked.person, checked.device, checked.device_name) == (bea.key, desk.public_key, "desk")
    assert (checked.documents, checked.chunks, checked.seq) == (3, 9, 1)
    home = guest_home(tmp_path, bea)
    assert accept_card(home, card, via="handshake", device=desk.public_key)[::2] == ("bea", "new")
    assert accept_card(home, card, via="server")[2] == "same"  # the very card again: nothing changes
    kept = CardStore.load(home).devices_of(bea.key)
    assert list(kept) == [desk.public_key] and kept[desk.public_key].card == card
    # its device is now a seen device of the pin (its chain verified here)
    assert desk.public_key in PeerRegistry.load(home).by_name("bea").seen_devices


def test_a_wrong_signature_anywhere_is_card_forged_and_nothing_is_kept(tmp_path):
    bea = Person()
    desk, chain = bea.device("desk")
    home = guest_home(tmp_path, bea)
    card = card_of(desk, chain)
    more = {**card, "totals": {"documents": 1000, "chunks": 9}}  # a host inflating its totals
    refused("card-forged", accept_card, home, more, via="server")
    other_ticket = dict(card, invitation={**card["invitation"], "transport_info": {
        **card["invitation"]["transport_info"], "ticket": "elsewhere"}, "iroh_ticket": "elsewhere"})
    refused("card-forged", accept_card, home, other_ticket, via="server")  # a redirected address
    forged_link = [{**chain[0], "signature": "0" * 128}]
    refused("card-forged", accept_card, home, card_of(desk, forged_link), via="server")
    assert CardStore.load(home).devices_of(bea.key) == {}
    assert device_targets(home, PeerRegistry.load(home).by_name("bea")) == []  # never dialled


def test_another_persons_device_is_card_wrong_person(tmp_path):
    bea, mallory = Person(), Person()
    home = guest_home(tmp_path, bea)
    laptop, chain = mallory.device("bea's laptop")
    refused("card-wrong-person", accept_card, home, card_of(laptop, chain), via="server")
    # a chain of mallory's binding a device under bea's name in the card: the card must be the chain's
    doc = card_of(laptop, chain)
    refused("card-malformed", accept_card, home, {**doc, "person_key": bea.key}, via="server")
    assert CardStore.load(home).devices_of(bea.key) == {} and CardStore.load(home).devices_of(mallory.key) == {}


def test_a_card_sent_by_another_device_is_card_wrong_device(tmp_path):
    bea = Person()
    desk, chain = bea.device("desk")
    laptop, _ = bea.device("laptop")
    home = guest_home(tmp_path, bea)
    card = card_of(desk, chain)
    refused("card-wrong-device", accept_card, home, card, via="handshake", device=laptop.public_key)
    # a card whose invitation is another device's own (validly signed) invitation
    other_inv = create_invitation(laptop, protocol_name="knowledge-query", protocol_version="1",
                                  protocol_id="a" * 64, ticket="t").to_dict()
    refused("card-wrong-device", accept_card, home,
            make_card(desk.secret, chain, other_inv, documents=0, chunks=0, created=CREATED, seq=2), via="server")


def test_a_revoked_devices_card_is_ignored_and_no_longer_dialled(tmp_path):
    bea = Person()
    desk, chain = bea.device("desk")
    home = guest_home(tmp_path, bea)
    store = RevocationStore.load(home)
    store.offer(check_list(make_list(bea.secret, [desk.public_key], 1, CREATED)), via="import", now=CREATED)
    refused("card-device-revoked", accept_card, home, card_of(desk, chain), via="server")
    assert CardStore.load(home).devices_of(bea.key) == {}


def test_an_old_sequence_is_card_stale_and_the_newer_card_stays(tmp_path):
    bea = Person()
    desk, chain = bea.device("desk")
    home = guest_home(tmp_path, bea)
    newer, older = card_of(desk, chain, seq=5, ticket="new"), card_of(desk, chain, seq=4, ticket="old")
    accept_card(home, newer, via="server")
    refused("card-stale", accept_card, home, older, via="handshake", device=desk.public_key)
    refused("card-stale", accept_card, home, card_of(desk, chain, seq=5, ticket="other"), via="server")
    kept = CardStore.load(home).devices_of(bea.key)[desk.public_key].card
    assert kept == newer


@pytest.mark.parametrize("change", [
    lambda c: [1, 2],
    lambda c: {**c, "extra": 1},
    lambda c: {**c, "seq": -1},
    lambda c: {**c, "totals": {"documents": "3", "chunks": 9}},
    lambda c: {**c, "binding_chain": []},
    lambda c: {**c, "invitation": {"post_id": "x"}},
    lambda c: {**c, "device_name": "x" * 20_000},
])
def test_malformed_cards_are_card_malformed(tmp_path, change):
    bea = Person()
    desk, chain = bea.device("desk")
    refused("card-malformed", check_card, change(card_of(desk, chain)))


def test_the_server_keeps_the_newest_card_per_device_and_lists_a_persons_cards(tmp_path):
    bea = Person()
    desk, desk_chain = bea.device("desk")
    laptop, laptop_chain = bea.device("laptop")
    with run_server_in_thread(tmp_path / "server" / "community.sqlite3", rate_limits=NO_LIMITS) as url:
        async def publish(ident: Identity, doc: dict) -> dict:
            async with CommunityClient(url, ident) as client:
                return await client.publish_card(doc)

        async def cards() -> list:
            async with CommunityClient(url) as client:
                return await client.get_cards(bea.key)

        first = card_of(desk, desk_chain, seq=2)
        assert anyio.run(publish, desk, first, backend="asyncio")["stored"] is True
        assert anyio.run(publish, desk, first, backend="asyncio")["stored"] is False
        assert anyio.run(publish, laptop, card_of(laptop, laptop_chain), backend="asyncio")["stored"] is True
        with httpx.Client(base_url=url, timeout=20) as http:
            for ident, doc, code, status in (
                    (desk, card_of(desk, desk_chain, seq=1), "card-stale", 409),
                    (laptop, card_of(desk, desk_chain, seq=3), "card-wrong-device", 400),  # only its own card
                    (desk, {**first, "seq": 9}, "card-forged", 400)):
                with pytest.raises(KithError) as info:
                    anyio.run(publish, ident, doc, backend="asyncio")
                assert (info.value.code, info.value.status) == (code, status)
            assert http.get(f"/api/v1/cards/{'0' * 64}").json()["error"]["code"] == "card-not-found"
        got = anyio.run(cards, backend="asyncio")
        assert sorted(c["device_key"] for c in got) == sorted([desk.public_key, laptop.public_key])
        assert next(c for c in got if c["device_key"] == desk.public_key) == first


# ------------------------------------------------------------------------ the handshake field
def _engines(spec, host: Identity, guest: Identity, *, card, want_card: bool):
    from node.engine.session import GuestConfig, HostConfig, SessionEngine

    from support.engines import POST_ID

    h = SessionEngine("host", spec, public_key=host.public_key, sign=host.sign,
                      host=HostConfig(remote_id=guest.public_key, post_protocol={POST_ID: spec.protocol_id}.get,
                                      nonce_unseen=lambda n: True, card=lambda: card))
    g = SessionEngine("guest", spec, public_key=guest.public_key, sign=guest.sign,
                      guest=GuestConfig(remote_id=host.public_key, post_id=POST_ID, host_public_key=host.public_key,
                                        want_card=want_card))
    return h, g


def _pump(h, g) -> tuple[list, list]:
    hev, gev = [], []
    g.initiate()
    for _ in range(2):
        for _ in range(20):
            out_g, out_h = g.data_to_send(), h.data_to_send()
            if not out_g and not out_h:
                break
            hev += h.receive_data(out_g) if out_g else []
            gev += g.receive_data(out_h) if out_h else []
        if g.state.value == "await-confirm":
            gev += g.confirm_ready()
    return hev, gev


def test_the_host_sends_its_card_only_to_a_guest_that_asked_and_an_unasked_card_is_refused():
    from node.engine.events import SessionClosed, SessionReady
    from node.protocol.spec import load_spec

    from support.homes import PROTOCOLS

    spec = load_spec(PROTOCOLS / "echo")
    bea = Person()
    desk, chain = bea.device("desk")
    guest = Identity(os.urandom(32))
    card = card_of(desk, chain)
    h, g = _engines(spec, desk, guest, card=card, want_card=True)
    _hev, gev = _pump(h, g)
    ready = [e for e in gev if isinstance(e, SessionReady)]
    assert ready and ready[0].peer_card == card
    h, g = _engines(spec, desk, guest, card=card, want_card=False)  # an older guest: no card, as before
    _hev, gev = _pump(h, g)
    ready = [e for e in gev if isinstance(e, SessionReady)]
    assert ready and ready[0].peer_card is None
    # a host pushing a card the guest never asked for is refused before the session is ready
    h, g = _engines(spec, desk, guest, card=card, want_card=False)
    g.initiate()
    h.receive_data(g.data_to_send())
    import msgspec

    from node.engine.framing import encode_frame

    proof = msgspec.json.decode(h.data_to_send().splitlines()[0])
    proof["device_card"] = card
    gev = g.receive_data(encode_frame(proof))
    closed = [e for e in gev if isinstance(e, SessionClosed)]
    assert closed and closed[0].code == "handshake-malformed"


def test_a_card_kept_before_its_device_was_revoked_is_no_longer_dialled(tmp_path):
    bea = Person()
    desk, chain = bea.device("desk")
    home = guest_home(tmp_path, bea)
    accept_card(home, dialable_card(home, desk, chain), via="server")
    rec = PeerRegistry.load(home).by_name("bea")
    assert [d["key"] for d, _t in device_targets(home, rec)] == [desk.public_key]
    RevocationStore.load(home).offer(check_list(make_list(bea.secret, [desk.public_key], 1, CREATED)),
                                     via="import", now=CREATED)
    assert device_targets(home, PeerRegistry.load(home).by_name("bea")) == []


def test_two_devices_of_one_person_returning_the_same_text_are_both_attributed():
    from node.guest.fanout import PeerRow, fuse

    hit = {"source": "/notes/a.md", "id": "c1", "textPreview": "the same words"}
    desk = PeerRow("bea", "p" * 64, status="ok", device={"key": "d" * 64, "name": "desk"})
    laptop = PeerRow("bea-laptop", "p" * 64, status="ok", device={"key": "l" * 64, "name": "laptop"})
    merged = fuse([(desk, [hit], True), (laptop, [dict(hit)], True)], 5)
    assert len(merged) == 1
    assert [a["peer"]["device"]["name"] for a in merged[0]["attributions"]] == ["desk", "laptop"]


def test_a_guest_takes_the_persons_revocation_list_from_the_server_before_its_cards(tmp_path):
    from node.guest.cards import fetch_cards

    bea = Person()
    desk, desk_chain = bea.device("desk")
    stolen, stolen_chain = bea.device("stolen laptop")
    with run_server_in_thread(tmp_path / "server" / "community.sqlite3", rate_limits=NO_LIMITS) as url:
        async def publish() -> None:
            for ident, chain in ((desk, desk_chain), (stolen, stolen_chain)):
                async with CommunityClient(url, ident) as client:
                    await client.publish_card(card_of(ident, chain))
            async with CommunityClient(url, desk) as client:
                await client.publish_revocation(make_list(bea.secret, [stolen.public_key], 1, CREATED))

        anyio.run(publish, backend="asyncio")
        home = tmp_path / "guest"
        home.mkdir(mode=0o700)
        pin_person(PeerRegistry.load(home), "bea", bea.key, server=url)
        codes = anyio.run(fetch_cards, home, PeerRegistry.load(home).by_name("bea"), backend="asyncio")
    assert codes == ["card-device-revoked"]
    assert list(CardStore.load(home).devices_of(bea.key)) == [desk.public_key]


def test_resolving_a_person_pin_without_an_invitation_takes_the_card_of_its_device(tmp_path):
    from node.guest.guest import resolve_peer

    bea = Person()
    desk, chain = bea.device("desk")
    home = guest_home(tmp_path, bea)
    with pytest.raises(KithError):  # no invitation, no server, no card: nothing to reach bea by
        anyio.run(resolve_peer, "bea", home, backend="asyncio")
    accept_card(home, dialable_card(home, desk, chain), via="server")
    target = anyio.run(resolve_peer, "bea", home, backend="asyncio")
    assert target.invitation.host_public_key == desk.public_key and target.pinned_name == "bea"


def test_a_card_kept_before_its_device_was_blocked_is_no_longer_dialled(tmp_path):
    # `kith peers block KEY` on one device of a pinned person: that device is never asked
    # again as the person, while the person's other devices still are
    bea = Person()
    desk, desk_chain = bea.device("desk")
    laptop, laptop_chain = bea.device("laptop")
    home = guest_home(tmp_path, bea)
    accept_card(home, dialable_card(home, desk, desk_chain), via="server")
    accept_card(home, dialable_card(home, laptop, laptop_chain), via="server")
    PeerRegistry.load(home).block(laptop.public_key)
    rec = PeerRegistry.load(home).by_name("bea")
    assert [d["key"] for d, _t in device_targets(home, rec)] == [desk.public_key]


@pytest.mark.parametrize("corrupt", [
    {"lastSeen": 5}, {"lastFailed": ["x"]}, {"card": [["type", "device-card"]]}, {"card": "x"},
    {"via": None}, {"receivedAt": 7},
])
def test_a_hand_corrupted_cards_file_is_config_invalid_naming_the_file(tmp_path, corrupt):
    import json

    bea = Person()
    desk, chain = bea.device("desk")
    home = guest_home(tmp_path, bea)
    accept_card(home, card_of(desk, chain), via="server")
    path = home / "cards.json"
    data = json.loads(path.read_text())
    data["persons"][bea.key][desk.public_key].update(corrupt)
    path.write_text(json.dumps(data))
    with pytest.raises(KithError) as info:
        CardStore.load(home)
    assert info.value.code == "config-invalid" and "cards.json" in info.value.message
    assert info.value.hint and "cards.json" in info.value.hint  # what to do: remove it, the cards come back


def test_joining_a_device_of_a_pinned_person_again_is_not_host_key_changed(tmp_path):
    # `kith join INVITE` of bea's desk a second time (its card was taken the first time):
    # the desk is a known device of the person pin, not another host under that name
    from node.guest.guest import check_pinned_name, trust_status
    from node.trust.invitation import parse_invitation

    bea = Person()
    desk, chain = bea.device("desk")
    stranger = Identity(os.urandom(32))
    home = guest_home(tmp_path, bea)
    card = card_of(desk, chain)
    accept_card(home, card, via="handshake", device=desk.public_key)
    inv = parse_invitation(card["invitation"])
    assert trust_status(inv, home) == "bea"
    check_pinned_name("bea", inv, home)  # no refusal
    with pytest.raises(KithError) as info:  # another key under that name still is
        check_pinned_name("bea", create_invitation(stranger, protocol_name="knowledge-query", protocol_version="1",
                                                   protocol_id="a" * 64, ticket="endpointticket"), home)
    assert info.value.code == "pin-name-taken"
