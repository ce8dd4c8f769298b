"""The card field ``mailboxes`` (card format 2; specs/sealed.md §6, signed-payloads.md §3b):
a host says in its signed card where it takes sealed questions. A format-1 card is signed
and checked exactly as before; a format-2 card is signed over its own domain, so neither
signature stands for the other; older guests' exact field check refuses it."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from node.common.errors import KithError
from node.community.requests import signed_headers
from node.community.server import run_server_in_thread
from node.trust.binding import device_link
from node.trust.card import _FIELDS, check_card, make_card
from node.trust.identity import Identity
from node.trust.invitation import create_invitation
from node.trust.signing import public_key_of

from support.community import NO_LIMITS

CREATED = "2026-12-02T10:00:00Z"
BOX = "https://community.example/kith"


def card(mailboxes: list[str] | None = None, **kw) -> tuple[Identity, dict]:
    person = os.urandom(32)
    ident = Identity(os.urandom(32))
    chain = [device_link(person, ident.public_key, "desk", CREATED, 0)]
    inv = create_invitation(ident, protocol_name="knowledge-query", protocol_version="1", protocol_id="a" * 64,
                            ticket="endpointticket")
    return ident, make_card(ident.secret, chain, inv.to_dict(), documents=1, chunks=2, created=CREATED, seq=1,
                            mailboxes=mailboxes, **kw)


def code_of(doc: dict) -> str:
    with pytest.raises(KithError) as err:
        check_card(doc)
    return err.value.code


def test_a_format_1_card_is_unchanged() -> None:
    _, doc = card()
    assert set(doc) == _FIELDS and "mailboxes" not in doc
    checked = check_card(doc)
    assert checked.format == 1 and checked.mailboxes == ()


def test_a_format_2_card_names_its_mailboxes() -> None:
    ident, doc = card([BOX, "http://127.0.0.1:8787"])
    checked = check_card(doc, device=ident.public_key)
    assert checked.format == 2 and checked.mailboxes == (BOX, "http://127.0.0.1:8787")


def test_neither_format_s_signature_stands_for_the_other() -> None:
    _, v2 = card([BOX])
    stripped = {k: v for k, v in v2.items() if k != "mailboxes"}  # a holder hiding the flag
    assert code_of(stripped) == "card-forged"
    _, v1 = card()
    assert code_of({**v1, "mailboxes": [BOX]}) == "card-forged"  # a flag added by someone else
    assert code_of({**v2, "mailboxes": ["https://evil.example"]}) == "card-forged"  # redirected


@pytest.mark.parametrize("bad", [[], [BOX, BOX], ["ftp://x"], ["https://x/?q=1"], ["https://u:p@x"],
                                 ["https://x y"], [BOX] * 5, "https://x", [1], ["https://" + "x" * 200]])
def test_malformed_mailboxes(bad) -> None:
    with pytest.raises(KithError) as err:
        card(bad)
    assert err.value.code == "card-malformed"
    _, v2 = card([BOX])
    assert code_of({**v2, "mailboxes": bad}) == "card-malformed"


def test_an_older_guest_refuses_a_format_2_card() -> None:
    """What an older guest does, by its own rule (the exact format-1 field set): the card is
    not one, so it is not kept and never dialled (card-malformed)."""
    _, v2 = card([BOX])
    assert set(v2) != _FIELDS and set(v2) - _FIELDS == {"mailboxes"}


def test_the_community_server_keeps_and_hands_out_a_format_2_card(tmp_path) -> None:
    ident, doc = card([BOX])
    body = json.dumps(doc).encode()
    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        r = http.post("/api/v1/cards", content=body, headers=signed_headers(ident, "POST", "/api/v1/cards", body))
        assert r.status_code == 201, r.text
        got = http.get(f"/api/v1/cards/{doc['person_key']}").json()["cards"]
    assert got == [doc] and check_card(got[0]).mailboxes == (BOX,)
    assert public_key_of(ident.secret) == got[0]["device_key"]


# ------------------------------------------------------------------------ the handshake's choice
def _handshake_card(spec, host: Identity, *, card_v2: dict, card_v1: dict | None, capabilities: list[str],
                    want_card: bool) -> dict | None:
    """The card a guest advertising ``capabilities`` (``want_card``: this version's guest)
    is sent in ``_session_proof`` by a host holding ``card_v2`` (and ``card_v1``)."""
    from node.engine.events import SessionReady
    from node.engine.session import GuestConfig, HostConfig, SessionEngine

    from support.engines import POST_ID

    guest = Identity(os.urandom(32))
    h = SessionEngine("host", spec, public_key=host.public_key, sign=host.sign,
                      host=HostConfig(remote_id=guest.public_key, post_protocol={POST_ID: spec.protocol_id}.get,
                                      nonce_unseen=lambda n: True, card=lambda: card_v2,
                                      card_v1=(lambda: card_v1) if card_v1 is not None else None))
    g = SessionEngine("guest", spec, public_key=guest.public_key, sign=guest.sign,
                      guest=GuestConfig(remote_id=host.public_key, post_id=POST_ID, host_public_key=host.public_key,
                                        want_card=want_card, capabilities=capabilities))
    g.initiate()
    events: list = []
    for _ in range(20):  # bounded: the handshake is three frames
        out_g, out_h = g.data_to_send(), h.data_to_send()
        if not out_g and not out_h:
            break
        h.receive_data(out_g) if out_g else None
        events += g.receive_data(out_h) if out_h else []
    events += g.confirm_ready()
    ready = [e for e in events if isinstance(e, SessionReady)]
    assert ready, events
    return ready[0].peer_card


def test_an_older_guest_is_sent_the_format_1_card_of_the_same_seq_and_this_version_format_2() -> None:
    """A guest of this version advertises device_card_v1 and device_card_v2 and is sent the
    format-2 card; an older guest (device_card_v1 only) is sent the format-1 card of the same
    seq, which its exact field check keeps — it is not left without the host's card."""
    from node.engine.handshake import CARD_CAPABILITY, CARD_V2_CAPABILITY
    from node.protocol.spec import load_spec

    from support.homes import PROTOCOLS

    spec = load_spec(PROTOCOLS / "echo")
    person = os.urandom(32)
    ident = Identity(os.urandom(32))
    chain = [device_link(person, ident.public_key, "desk", CREATED, 0)]
    inv = create_invitation(ident, protocol_name="echo", protocol_version="1", protocol_id="a" * 64, ticket="t")
    v1 = make_card(ident.secret, chain, inv.to_dict(), documents=1, chunks=2, created=CREATED, seq=7)
    v2 = make_card(ident.secret, chain, inv.to_dict(), documents=1, chunks=2, created=CREATED, seq=7,
                   mailboxes=[BOX])
    got = _handshake_card(spec, ident, card_v2=v2, card_v1=v1, capabilities=[], want_card=True)
    assert got == v2 and check_card(got).format == 2
    older = _handshake_card(spec, ident, card_v2=v2, card_v1=v1, capabilities=[CARD_CAPABILITY], want_card=False)
    assert older == v1 and set(older) == _FIELDS and older["seq"] == v2["seq"]
    # a host that keeps one card (no mailboxes) sends it to both
    assert _handshake_card(spec, ident, card_v2=v1, card_v1=None, capabilities=[CARD_CAPABILITY],
                           want_card=False) == v1
    assert _handshake_card(spec, ident, card_v2=v1, card_v1=None, capabilities=[CARD_CAPABILITY, CARD_V2_CAPABILITY],
                           want_card=False) == v1


def test_a_mailbox_host_sends_an_older_guest_a_card_it_keeps(tmp_path) -> None:
    """Real `kith host --server URL --mailbox` on loopback: the card on the server and in a
    this-version handshake is format 2; an older guest's handshake (device_card_v1 only) gets
    the format-1 card of the same seq, signed by the same device."""
    import anyio

    from node.community.store import MailboxLimits
    from node.engine.handshake import CARD_CAPABILITY
    from node.engine.events import SessionReady
    from node.engine.session import GuestConfig, SessionEngine, State
    from node.protocol.spec import load_spec
    from node.transport.iroh import bind_node
    from node.trust.invitation import parse_invitation

    from support.cli import kith
    from support.waits import wait_for
    from support.homes import PROTOCOLS
    from support.hosts import HostProcess, notes_host

    host_home = notes_host(tmp_path)
    person = json.loads(kith(host_home, "device", "list", "--json").stdout)["person_key"]
    spec = load_spec(PROTOCOLS / "knowledge-query")

    async def card_in_handshake(inv, capabilities: list[str], want_card: bool) -> dict | None:
        ident = Identity(os.urandom(32))
        async with bind_node(ident.secret, spec.alpn, local=True) as node:
            stream = await node.open_stream(await node.connect(inv.transport_info.ticket))
            engine = SessionEngine("guest", spec, public_key=ident.public_key, sign=ident.sign,
                                   guest=GuestConfig(remote_id=stream.remote_id, post_id=inv.post_id,
                                                     host_public_key=inv.host_public_key, want_card=want_card,
                                                     capabilities=capabilities))
            engine.initiate()
            await stream.send(engine.data_to_send())
            with anyio.fail_after(20):
                while engine.state is State.HANDSHAKE:
                    data = await stream.receive()
                    assert data, "the host hung up in the handshake"
                    engine.receive_data(data)
            ready = [e for e in engine.confirm_ready() if isinstance(e, SessionReady)]
            await stream.aclose()
            return ready[0].peer_card if ready else None

    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
        host = HostProcess(host_home, "--server", url, "--mailbox")
        try:
            posted = wait_for("the host's card on the server", lambda: (r := httpx.get(
                f"{url}/api/v1/cards/{person}", timeout=10)).status_code == 200 and r.json()["cards"][0])
            inv = parse_invitation(host.invitation)
            newer = anyio.run(card_in_handshake, inv, [], True, backend="asyncio")
            older = anyio.run(card_in_handshake, inv, [CARD_CAPABILITY], False, backend="asyncio")
        finally:
            host.stop()
    assert check_card(posted).mailboxes == (url,) and newer == posted
    assert set(older) == _FIELDS and older["seq"] == posted["seq"] and older["device_key"] == posted["device_key"]
    assert check_card(older).format == 1
