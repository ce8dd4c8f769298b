"""Pairing two devices of one person (issue 22 item 1): the one-time code's rules (80 bits,
single use, 10 minutes, 3 tries; time as an input) and, over real iroh on loopback through
real `kith` processes, `kith device add` / `kith device join CODE` — the words both show,
the owner's confirmation, wrong codes, a refusal — then a host seeing both homes as one
person."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.common.errors import UsageError
from node.trust.device_pairing import MAX_TRIES, SECRET_BYTES, TTL_S, PairingOffer, make_code, new_secret, parse_code

from support.cli import kith, readline
from support.devices import Offer, join_offer as _join
from support.homes import FIXTURE
from support.hosts import HostProcess as Host, prepare_host


def test_a_code_has_80_bits_and_parses_back():
    secret = new_secret()
    assert SECRET_BYTES * 8 >= 64 and len(secret) == 16 and secret != new_secret()
    assert parse_code(make_code(secret, "endpointabc")) == (secret, "endpointabc")
    for bad in ("", "nosep", "SHOUTING2345ABCD@t", f"{secret}@", f"{secret[:-1]}@t", f"{secret}@a b"):
        with pytest.raises(UsageError) as exc:
            parse_code(bad)
        assert exc.value.code == "pairing-code-invalid"


def test_an_offer_is_single_use_expires_and_dies_after_three_wrong_tries():
    offer = PairingOffer("a" * 16, created=100.0)
    assert offer.try_secret("b" * 16, 101.0) == "pairing-code-wrong"
    assert offer.try_secret("a" * 16, 102.0) is None
    assert offer.try_secret("a" * 16, 103.0) == "pairing-used"
    late = PairingOffer("a" * 16, created=0.0)
    assert late.try_secret("a" * 16, TTL_S) == "pairing-expired"
    tried = PairingOffer("a" * 16, created=0.0)
    assert [tried.try_secret("c" * 16, 1.0) for _ in range(MAX_TRIES)] == ["pairing-code-wrong"] * MAX_TRIES
    assert tried.try_secret("a" * 16, 2.0) == "pairing-too-many-tries"  # even the right secret now
    assert tried.try_secret(None, 2.0) == "pairing-too-many-tries"


# ----------------------------------------------------------------------------- real processes
@pytest.mark.iroh
def test_two_devices_pair_and_a_host_sees_one_person(tmp_path: Path):
    desk, laptop = tmp_path / "desk", tmp_path / "laptop"
    made = json.loads(kith(desk, "init", "--json", "--device-name", "desk").stdout)
    offer = Offer(desk)
    joiner = _join(laptop, offer.code)
    words = json.loads(readline(joiner, 60))  # shown once the secret was accepted
    assert words["event"] == "pairing-words" and len(words["words"].split()) == 5
    offer.answer("yes")  # the owner saw the same words on both
    out, err = joiner.communicate(timeout=30)
    assert joiner.returncode == 0, err
    # it said whom it waited for, at each wait (it waited silently, issue 32)
    desk_key = json.loads(kith(desk, "status", "--json").stdout)["identity"]["key"]
    other = f"the device that printed the code ({desk_key[:16]}…)"
    for line in (f"connecting to {other}…", f"waiting for {other} to check the code",
                 f"waiting for you to confirm the words on {other}"):
        assert line in err, err
    joined = json.loads(out.splitlines()[-1])
    rc, out, err = offer.finish()
    assert rc == 0, err
    assert words["words"] in err  # the offering device printed the same words
    assert joined["person_key"] == made["person_key"] and joined["device_name"] == "laptop"
    assert not (laptop / "person.key").exists()  # the person key never left the desk
    for home in (desk, laptop):
        listed = json.loads(kith(home, "device", "list", "--json").stdout)
        assert listed["person_key"] == made["person_key"]
        assert [d["name"] for d in listed["devices"]] == ["desk", "laptop"]
    assert json.loads(kith(laptop, "device", "list", "--json").stdout)["holds_person_key"] is False

    # the same code never works twice, and a host sees both homes as one person
    host_home = prepare_host(tmp_path, FIXTURE)
    invite = tmp_path / "invite.json"
    host = Host(host_home, "--invite-file", str(invite))
    try:
        persons = []
        for home in (desk, laptop):  # read the host's events after each join (its stdout is line-read)
            r = kith(home, "join", str(invite), "--local", "--trust", "--query", "installing")
            assert r.returncode in (0, 3), r.stderr
            for _ in range(50):
                ev = json.loads(host.readline(60))
                if ev.get("event") == "session-started":
                    persons.append((ev["person"], ev["device_name"]))
                    break
    finally:
        host.stop()
    assert persons == [(made["person_key"], "desk"), (made["person_key"], "laptop")]


@pytest.mark.iroh
def test_wrong_codes_are_refused_three_times_then_the_code_is_dead(tmp_path: Path):
    desk = tmp_path / "desk"
    kith(desk, "init")
    offer = Offer(desk)
    secret, ticket = parse_code(offer.code)
    wrong = make_code("a" * 16 if secret != "a" * 16 else "b" * 16, ticket)
    codes = []
    for i in range(3):
        p = _join(tmp_path / f"thief{i}", wrong)
        _out, err = p.communicate(timeout=30)
        codes.append((p.returncode, err.strip().splitlines()[-1]))
    rc, _out, err = offer.finish()
    assert [c for c, _ in codes] == [1, 1, 1]
    assert all("pairing-code-wrong" in e for _, e in codes)
    assert rc == 1 and "pairing-too-many-tries" in err
    listed = json.loads(kith(desk, "device", "list", "--json").stdout)
    assert len(listed["devices"]) == 1  # nothing was bound


@pytest.mark.iroh
def test_words_not_confirmed_bind_nothing(tmp_path: Path):
    desk, laptop = tmp_path / "desk", tmp_path / "laptop"
    kith(desk, "init")
    offer = Offer(desk)
    joiner = _join(laptop, offer.code)
    assert json.loads(readline(joiner, 60))["event"] == "pairing-words"
    offer.answer("no")
    _out, err = joiner.communicate(timeout=30)
    rc, _o, err_offer = offer.finish()
    assert joiner.returncode == 1 and "pairing-not-confirmed" in err
    assert rc == 1 and "pairing-not-confirmed" in err_offer
    assert not (laptop / "person.json").exists()
    assert len(json.loads(kith(desk, "device", "list", "--json").stdout)["devices"]) == 1


def test_device_add_needs_the_person_key_and_join_refuses_a_home_with_a_person(tmp_path: Path):
    desk = tmp_path / "desk"
    kith(desk, "init")
    r = kith(desk, "device", "join", "a" * 16 + "@endpointxyz", "--local")
    assert r.returncode == 1 and "device-has-person" in r.stderr
    bare = tmp_path / "bare"
    bare.mkdir(mode=0o700)
    (bare / "identity.key").write_text("11" * 32 + "\n")
    (bare / "identity.key").chmod(0o600)
    r = kith(bare, "device", "add", "--local")
    assert r.returncode == 1 and "device-no-person-key" in r.stderr
    r = kith(bare, "device", "join", "not-a-code", "--local")
    assert r.returncode == 2 and "pairing-code-invalid" in r.stderr


@pytest.mark.iroh
def test_device_add_and_join_follow_the_homes_transport_table(tmp_path: Path):
    """Pairing binds its endpoint in the home's [transport] mode like `kith ask` (it used the
    n0 preset whatever the owner set): a bad table stops `kith device add` and `kith device
    join` with exit 2 before anything is bound — even with --offline, which wins over a good
    table."""
    desk, laptop = tmp_path / "desk", tmp_path / "laptop"
    kith(desk, "init")
    (desk / "config.toml").write_text('[transport]\nrelay = "nowhere"\n')
    r = kith(desk, "device", "add", "--offline", "--json", "--yes-words", timeout=30)
    assert r.returncode == 2 and "transport-mode-invalid" in r.stderr, r.stderr
    (desk / "config.toml").write_text('[transport]\nrelay = "none"\n')
    offer = Offer(desk)  # --local (= --offline) over a good table: offered on loopback
    try:
        laptop.mkdir()
        (laptop / "config.toml").write_text('[transport]\nlan = "yes"\n')
        joiner = _join(laptop, offer.code)
        _out, err = joiner.communicate(timeout=30)
        assert joiner.returncode == 2 and "transport-mode-invalid" in err, err
    finally:
        offer.proc.kill()
        offer.proc.wait(timeout=30)


@pytest.mark.iroh
def test_a_new_device_killed_before_its_binding_arrived_pairs_again_with_a_new_code(tmp_path: Path):
    """The new device is SIGKILLed after presenting the code; the owner confirms and binds
    it, but the binding never reaches it (its home has no person). Re-running `kith device
    join` with a new code gives it that same binding (nothing new is signed), where it was
    refused pairing-device-known and the home could never join its person."""
    desk, laptop = tmp_path / "desk", tmp_path / "laptop"
    made = json.loads(kith(desk, "init", "--json", "--device-name", "desk").stdout)
    offer = Offer(desk)
    joiner = _join(laptop, offer.code)
    assert json.loads(readline(joiner, 60))["event"] == "pairing-words"
    joiner.kill()
    joiner.wait(timeout=30)
    offer.answer("yes")
    rc, _out, err = offer.finish()
    assert rc == 0, err
    assert not (laptop / "person.json").exists()  # the binding never arrived
    first = json.loads(kith(desk, "device", "list", "--json").stdout)["devices"]

    offer = Offer(desk)
    joiner = _join(laptop, offer.code)
    assert json.loads(readline(joiner, 60))["event"] == "pairing-words"
    offer.answer("yes")
    out, err = joiner.communicate(timeout=30)
    assert joiner.returncode == 0, err
    rc, _out, err_offer = offer.finish()
    assert rc == 0, err_offer
    assert json.loads(out.splitlines()[-1])["person_key"] == made["person_key"]
    for home in (desk, laptop):
        listed = json.loads(kith(home, "device", "list", "--json").stdout)
        assert [d["name"] for d in listed["devices"]] == ["desk", "laptop"]
    assert json.loads(kith(desk, "device", "list", "--json").stdout)["devices"] == first  # nothing new signed
