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
