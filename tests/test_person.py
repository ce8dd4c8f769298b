"""Person keys, device bindings and the binding chain in the handshake (issue 22 item 1;
specs/peers.md §9, specs/session.md §4.2–4.3): the home's files, the chain's rules, and
both engines over the in-memory pipe — a guest with a chain is seen as person + device,
a guest without one (or a host that never offers v2) is served exactly as before, and every
bad chain is refused with its own code before anything is served."""

from __future__ import annotations

import json
import os
import stat

import pytest

from node.common.errors import HandshakeError
from node.engine import frames as F
from node.engine.framing import decode_frame, encode_frame
from node.engine.handshake import FRAMES_V2, PERSON_CAPABILITY
from node.engine.session import SessionClosed, SessionReady
from node.protocol.spec import load_spec
from node.trust.binding import MAX_CHAIN_LINKS, device_link, successor_link, verify_chain
from node.trust.identity import init_identity
from node.trust.person import (
    PERSON_FILE,
    PERSON_KEY_FILE,
    init_person,
    load_person,
    own_chain,
    recovery_secret_of,
    recovery_seed,
)
from node.trust.signing import public_key_of

from support.engines import EnginePair
from support.homes import PROTOCOLS, new_identity

WHEN = "2026-12-01T10:00:00Z"


@pytest.fixture(scope="module")
def echo():
    return load_spec(PROTOCOLS / "echo")


def chain_of(device_key: str, persons: int = 1, name: str = "laptop") -> tuple[list[dict], list[bytes]]:
    """A valid chain: ``persons - 1`` successor links, then the device link."""
    seeds = [os.urandom(32) for _ in range(persons)]
    links = [successor_link(seeds[i], public_key_of(seeds[i + 1]), WHEN, i) for i in range(persons - 1)]
    return links + [device_link(seeds[-1], device_key, name, WHEN, 0)], seeds


# ----------------------------------------------------------------------------- the home
def test_init_creates_a_person_that_binds_this_device_and_stores_nothing_of_the_recovery_secret(tmp_path):
    device, _ = init_identity(tmp_path)
    rec, words = init_person(tmp_path, device, "work laptop")
    assert words is not None and len(words.split()) == 24
    assert stat.S_IMODE(os.stat(tmp_path / PERSON_KEY_FILE).st_mode) == 0o600
    link = rec.binding_for(device.public_key)
    assert link["device_name"] == "work laptop" and link["seq"] == 0 and link["person_key"] == rec.person_key
    # the printed words derive the recovery key the person signed; no file holds the words or the secret
    secret = recovery_secret_of(words)
    assert public_key_of(recovery_seed(secret)) == rec.recovery_key
    for f in tmp_path.iterdir():
        data = f.read_bytes()
        assert secret.hex().encode() not in data and words.split()[0].encode() + b" " not in data
        assert recovery_seed(secret).hex().encode() not in data
    # a second init changes nothing and shows no words again
    again, words2 = init_person(tmp_path, device)
    assert words2 is None and again.person_key == rec.person_key
    assert own_chain(tmp_path, device.public_key) == [link]


def test_an_existing_home_migrates_in_place_keeping_its_identity_as_the_device_key(tmp_path):
    device, _ = init_identity(tmp_path)
    before = (tmp_path / "identity.key").read_bytes()
    assert load_person(tmp_path) is None and own_chain(tmp_path, device.public_key) is None
    rec, words = init_person(tmp_path, device)
    assert (tmp_path / "identity.key").read_bytes() == before
    assert words and rec.person_key != device.public_key
    assert verify_chain(own_chain(tmp_path, device.public_key), device.public_key).person == rec.person_key


def test_a_hand_edited_person_file_is_refused_not_sent(tmp_path):
    device, _ = init_identity(tmp_path)
    init_person(tmp_path, device)
    raw = json.loads((tmp_path / PERSON_FILE).read_text())
    raw["devices"][0]["device_name"] = "renamed"
    (tmp_path / PERSON_FILE).write_text(json.dumps(raw))
    with pytest.raises(Exception) as exc:
        load_person(tmp_path)
    assert getattr(exc.value, "code", None) == "config-invalid"


# ----------------------------------------------------------------------------- the chain's rules
def test_a_chain_of_rotations_names_the_current_person_and_the_earlier_keys():
    dev = new_identity().public_key
    chain, seeds = chain_of(dev, persons=3)
    who = verify_chain(chain, dev)
    assert who.person == public_key_of(seeds[-1]) and who.device == dev and who.device_name == "laptop"
    assert who.earlier == (public_key_of(seeds[0]), public_key_of(seeds[1]))


def _code(chain, dev) -> str:
    with pytest.raises(HandshakeError) as exc:
        verify_chain(chain, dev)
    return exc.value.code


def test_each_bad_chain_has_its_own_code():
    dev = new_identity().public_key
    good, seeds = chain_of(dev, persons=2)
    forged = [good[0], {**good[1], "device_name": "renamed"}]
    assert _code(forged, dev) == "handshake-binding-forged"
    other = device_link(os.urandom(32), dev, "laptop", WHEN, 0)  # signed by someone the chain does not lead to
    assert _code([good[0], other], dev) == "handshake-binding-wrong-person"
    assert _code(good, new_identity().public_key) == "handshake-binding-wrong-device"
    assert _code([{**good[0], "signature": good[0]["signature"].upper()}, good[1]], dev) == "handshake-binding-malformed"
    assert _code([{**good[0], "person_key": "0x" + good[0]["person_key"][2:]}, good[1]], dev) \
        == "handshake-binding-malformed"
    assert _code([{**good[1], "extra": 1}], dev) == "handshake-binding-malformed"
    assert _code([], dev) == "handshake-binding-malformed"
    assert _code(good[1], dev) == "handshake-binding-malformed"  # not a list
    a, b = os.urandom(32), os.urandom(32)
    loop = [successor_link(a, public_key_of(b), WHEN, 0), successor_link(b, public_key_of(a), WHEN, 1),
            device_link(a, dev, "laptop", WHEN, 0)]
    assert _code(loop, dev) == "handshake-chain-loop"


def test_a_chain_longer_than_four_is_refused_before_any_signature_is_checked():
    dev = new_identity().public_key
    chain, _ = chain_of(dev, persons=MAX_CHAIN_LINKS)
    assert verify_chain(chain, dev).person  # four links is the limit
    junk = {"type": "successor", "signature": "zz"}  # not even well-formed: the length decides first
    assert _code([junk] * (MAX_CHAIN_LINKS + 1), dev) == "handshake-chain-too-long"
    long, _ = chain_of(dev, persons=MAX_CHAIN_LINKS + 1)
    assert _code(long, dev) == "handshake-chain-too-long"


# ----------------------------------------------------------------------------- engines over the pipe
def _ready(events) -> list[SessionReady]:
    return [e for e in events if isinstance(e, SessionReady)]


def test_the_host_sees_person_and_device_over_the_pipe(echo):
    host, guest = new_identity(), new_identity()
    chain, seeds = chain_of(guest.public_key, persons=3, name="desk")
    pair = EnginePair(echo, host, guest, guest_chain=chain)
    pair.handshake()
    ready = _ready(pair.host_events)
    assert ready and ready[0].peer_person.person == public_key_of(seeds[-1])
    assert ready[0].peer_person.device == guest.public_key and ready[0].peer_person.device_name == "desk"
    assert PERSON_CAPABILITY in ready[0].peer_capabilities


def test_a_guest_without_a_chain_gets_todays_handshake_byte_for_byte(echo):
    host, guest = new_identity(), new_identity()
    pair = EnginePair(echo, host, guest)
    pair.guest.initiate()
    init = decode_frame(pair.guest.data_to_send())
    assert PERSON_CAPABILITY not in init.get("capabilities", [])
    pair.host_events += pair.host.receive_data(encode_frame(init))
    proof = decode_frame(pair.host.data_to_send())
    assert set(proof) == {"action", "session_id", "host_public_key", "host_nonce", "host_signature"}
    pair.guest_events += pair.guest.receive_data(encode_frame(proof))
    pair.guest_events += pair.guest.confirm_ready()
    ready = decode_frame(pair.guest.data_to_send())
    assert set(ready) == {"action", "session_id", "guest_signature"}
    pair.host_events += pair.host.receive_data(encode_frame(ready))
    assert _ready(pair.host_events)[0].peer_person is None


def test_an_old_host_that_never_offers_v2_gets_no_chain_and_the_guest_goes_on(echo):
    """An old host ignores the capability and answers a v1 proof: the new guest sends a v1
    ``_session_ready`` (an old host refuses unknown fields), device-key-only identity."""
    host, guest = new_identity(), new_identity()
    chain, _ = chain_of(guest.public_key)
    pair = EnginePair(echo, host, guest, guest_chain=chain)
    pair.guest.initiate()
    init = decode_frame(pair.guest.data_to_send())
    assert PERSON_CAPABILITY in init["capabilities"]
    pair.host.receive_data(encode_frame(init))
    proof = decode_frame(pair.host.data_to_send())
    assert proof["frames_version"] == FRAMES_V2
    del proof["frames_version"]  # what an old host sends
    pair.guest_events += pair.guest.receive_data(encode_frame(proof))
    pair.guest_events += pair.guest.confirm_ready()
    ready = decode_frame(pair.guest.data_to_send())
    assert "binding_chain" not in ready
    F.decode_system(ready)  # strict struct: still valid


def test_frames_version_to_a_guest_that_never_asked_is_refused(echo):
    host, guest = new_identity(), new_identity()
    pair = EnginePair(echo, host, guest)
    pair.guest.initiate()
    pair.host.receive_data(pair.guest.data_to_send())
    proof = decode_frame(pair.host.data_to_send())
    proof["frames_version"] = FRAMES_V2
    events = pair.guest.receive_data(encode_frame(proof))
    closed = [e for e in events if isinstance(e, SessionClosed)]
    assert closed and closed[0].code == "handshake-malformed"


def _host_refuses(echo, chain, *, offer: bool = True) -> str:
    """Feed the host a ``_session_ready`` carrying ``chain``; return its refusal code."""
    host, guest = new_identity(), new_identity()
    pair = EnginePair(echo, host, guest, guest_chain=[] if offer else None)
    pair.guest.initiate()
    pair.host.receive_data(pair.guest.data_to_send())
    pair.guest.receive_data(pair.host.data_to_send())
    pair.guest.confirm_ready()
    ready = decode_frame(pair.guest.data_to_send())
    ready["binding_chain"] = chain(guest) if callable(chain) else chain
    events = pair.host.receive_data(encode_frame(ready))
    assert not _ready(events), "a bad chain reached READY"
    sent = decode_frame(pair.host.data_to_send())
    closed = [e for e in events if isinstance(e, SessionClosed)]
    assert sent["action"] == "_session_reject" and closed[0].reason == "rejected"
    return sent["code"]


def test_the_host_refuses_every_bad_chain_with_its_code_before_ready(echo):
    other_person = lambda g: [device_link(os.urandom(32), g.public_key, "x", WHEN, 0)]  # noqa: E731
    assert _host_refuses(echo, lambda g: [{**other_person(g)[0], "device_name": "y"}]) == "handshake-binding-forged"
    assert _host_refuses(echo, lambda g: [successor_link(os.urandom(32), "ab" * 32, WHEN, 0),
                                         other_person(g)[0]]) == "handshake-binding-wrong-person"
    assert _host_refuses(echo, lambda g: chain_of(new_identity().public_key)[0]) == "handshake-binding-wrong-device"
    assert _host_refuses(echo, lambda g: chain_of(g.public_key, persons=5)[0]) == "handshake-chain-too-long"
    assert _host_refuses(echo, lambda g: [{**other_person(g)[0], "seq": -1}]) == "handshake-binding-malformed"
    assert _host_refuses(echo, [{"type": "device"}]) == "handshake-binding-malformed"
    assert _host_refuses(echo, {"type": "device"}) == "handshake-binding-malformed"  # not a list
    assert _host_refuses(echo, "ab" * 32) == "handshake-binding-malformed"


def test_a_chain_the_host_did_not_offer_v2_for_is_malformed(echo):
    assert _host_refuses(echo, lambda g: chain_of(g.public_key)[0], offer=False) == "handshake-malformed"


def test_a_good_chain_with_a_bad_session_signature_is_still_a_bad_signature(echo):
    host, guest = new_identity(), new_identity()
    pair = EnginePair(echo, host, guest, guest_chain=chain_of(guest.public_key)[0])
    pair.guest.initiate()
    pair.host.receive_data(pair.guest.data_to_send())
    pair.guest.receive_data(pair.host.data_to_send())
    pair.guest.confirm_ready()
    ready = decode_frame(pair.guest.data_to_send())
    ready["guest_signature"] = "00" * 64
    pair.host.receive_data(encode_frame(ready))
    assert decode_frame(pair.host.data_to_send())["code"] == "handshake-bad-signature"


def test_identity_of_a_guest_is_untouched_by_its_chain(echo):
    """The chain never changes the session payload or proof: the session id and both
    signatures are the same fields as today."""
    host, guest = new_identity(), new_identity()
    pair = EnginePair(echo, host, guest, guest_chain=chain_of(guest.public_key)[0])
    pair.handshake()
    proof = _ready(pair.host_events)[0].proof
    assert proof["guest_public_key"] == guest.public_key and "binding_chain" not in proof


def test_two_homes_on_one_machine_get_two_device_names(tmp_path):
    """Both homes of the README's one-machine set-up were named after the host name
    (issue 32): a home that is not the platform default adds its folder's name."""
    import socket
    import subprocess
    import sys

    import platformdirs

    from node.trust.person import default_device_name, load_person

    names = []
    for home in (tmp_path / "kith-host", tmp_path / "kith-guest"):
        r = subprocess.run([sys.executable, "-m", "node.cli.main", "--home", str(home), "init"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        rec = load_person(home)
        names.append(rec.devices[0]["device_name"])
        assert f"this device: {names[-1]!r}" in r.stdout, r.stdout
    host = socket.gethostname().strip() or "device"
    assert names == [f"{host}-kith-host"[:64], f"{host}-kith-guest"[:64]]
    assert default_device_name(platformdirs.user_data_dir("kith")) == host[:64]  # the default home: the host name
