"""Person-key rotation (issue 22 item 4; specs/peers.md §11): ``kith person rotate`` on a
real home, the recovery words signing a rotation, the chain rules a rotation adds (a gap,
a loop, a recovery key nobody vouched for), and a real Host over memory pipes following a
rotation — and refusing a fork from a retired key and a binding a retired key signed."""

from __future__ import annotations

import json
import os

import anyio
import pytest

from node.common.errors import ConfigError, HandshakeError
from node.trust.binding import MAX_CHAIN_LINKS, PersonIdentity, device_link, recovery_link, successor_link, verify_chain
from node.trust.identity import Identity, init_identity, load_identity
from node.trust.person import PERSON_KEY_FILE, init_person, load_person, own_chain, recovery_seed, recovery_secret_of
from node.trust.rotation import ROTATIONS_FILE, RotationLedger, adopt_person, rotate_person
from node.trust.signing import person_recovery_payload, public_key_of, sign

from support.memory import MemoryHost, connect_guest as _connect, memory_host_home as _host_home

WHEN = "2026-12-01T10:00:00Z"


def _person_home(path, name="laptop"):
    path.mkdir()
    device, _ = init_identity(path)
    rec, words = init_person(path, device, name)
    return device, rec, words


def _code(chain, dev) -> str:
    with pytest.raises(HandshakeError) as exc:
        verify_chain(chain, dev)
    return exc.value.code


# ----------------------------------------------------------------------------- rotating a home
def test_a_rotation_keeps_every_device_bound_and_the_chain_leads_from_the_old_key(tmp_path):
    device, rec, _words = _person_home(tmp_path / "h")
    old = rec.person_key
    got = rotate_person(tmp_path / "h")
    assert got.old_key == old and got.new_key != old and got.via == "person" and got.devices == ("laptop",)
    who = verify_chain(own_chain(tmp_path / "h", device.public_key), device.public_key)
    assert (who.person, who.earlier, who.rotations) == (got.new_key, (old,), ((old, got.new_key, "person"),))
    held = bytes.fromhex((tmp_path / "h" / PERSON_KEY_FILE).read_text().strip())
    assert public_key_of(held) == got.new_key  # the old person key is gone from the home


def test_five_rotations_still_load_and_the_chain_carries_only_the_newest_three(tmp_path):
    device, rec, _ = _person_home(tmp_path / "h")
    keys = [rec.person_key] + [rotate_person(tmp_path / "h").new_key for _ in range(5)]
    rec = load_person(tmp_path / "h")
    assert [link["person_key"] for link in rec.successors] == keys[:-1]
    chain = own_chain(tmp_path / "h", device.public_key)
    assert len(chain) == MAX_CHAIN_LINKS
    assert verify_chain(chain, device.public_key).earlier == tuple(keys[2:5])


def test_the_recovery_words_sign_a_rotation_on_a_device_without_the_person_key(tmp_path):
    device, rec, words = _person_home(tmp_path / "h")
    (tmp_path / "h" / PERSON_KEY_FILE).unlink()  # the device holding it was lost
    with pytest.raises(ConfigError) as exc:
        rotate_person(tmp_path / "h")
    assert exc.value.code == "device-no-person-key"
    other_words = _person_home(tmp_path / "x")[2]
    with pytest.raises(ConfigError) as exc:
        rotate_person(tmp_path / "h", words=other_words)
    assert exc.value.code == "person-recovery-wrong"
    got = rotate_person(tmp_path / "h", words=words)
    assert got.via == "recovery" and len(got.recovery_words.split()) == 24 and got.recovery_words != words
    who = verify_chain(own_chain(tmp_path / "h", device.public_key), device.public_key)
    assert who.rotations == ((rec.person_key, got.new_key, "recovery"),)
    # the new words are the ones the record now names; the old words no longer rotate
    assert public_key_of(recovery_seed(recovery_secret_of(got.recovery_words))) == load_person(tmp_path / "h").recovery_key
    with pytest.raises(ConfigError) as exc:
        rotate_person(tmp_path / "h", words=words)
    assert exc.value.code == "person-recovery-wrong"


def _person_files(home) -> dict[str, bytes]:
    """The bytes of every file a rotation writes (the record, the key, a pending key)."""
    return {p.name: p.read_bytes() for p in sorted(home.iterdir()) if p.name.startswith("person")}


def test_kith_person_rotate_off_a_terminal_needs_yes_and_changes_nothing_without_it(tmp_path):
    """A rotation cannot be undone: off a terminal (stdin not a TTY) without --yes it is
    refused with person-rotate-unconfirmed, its hint naming --yes, and nothing is written —
    also with --recovery, whose words come on stdin; --yes rotates (specs/peers.md §11)."""
    from support.cli import json_lines, kith

    device, rec, words = _person_home(tmp_path / "h")
    before = _person_files(tmp_path / "h")
    for args, stdin in ((("--json",), None), (("--recovery", "--json"), words + "\n")):
        r = kith(tmp_path / "h", "person", "rotate", *args, input=stdin)
        assert r.returncode == 1, (r.stdout, r.stderr)
        [line] = json_lines(r.stdout)
        assert line["error"]["code"] == "person-rotate-unconfirmed" and "--yes" in line["error"]["hint"]
        assert "error [person-rotate-unconfirmed]" in r.stderr and "--yes" in r.stderr
        assert _person_files(tmp_path / "h") == before
    r = kith(tmp_path / "h", "person", "rotate", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["old_person_key"] == rec.person_key
    assert load_person(tmp_path / "h").person_key == json.loads(r.stdout)["person_key"] != rec.person_key


def test_kith_person_rotate_with_stdin_closed_refuses_and_changes_nothing(tmp_path):
    """``kith person rotate <&-`` (stdin closed: Python's ``sys.stdin`` is None) is off a
    terminal too: person-rotate-unconfirmed, nothing written — it printed a traceback
    (AttributeError on ``sys.stdin.isatty``; attack49); with --recovery --yes the words
    that never came are refused, not a traceback."""
    import subprocess

    from support.cli import json_lines, kith_argv

    device, rec, words = _person_home(tmp_path / "h")
    before = _person_files(tmp_path / "h")
    for args, code in ((("--json",), "person-rotate-unconfirmed"),
                       (("--recovery", "--yes", "--json"), "config-invalid")):
        r = subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", *kith_argv(tmp_path / "h", "person", "rotate", *args)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
        [line] = json_lines(r.stdout)
        assert line["error"]["code"] == code, line
        after = _person_files(tmp_path / "h")
        after.pop("person.lock", None)  # the rotation's lock, taken before the words are read
        assert after == before


@pytest.mark.parametrize("answer, rotated", [("n", False), ("y", True)])
def test_kith_person_rotate_at_a_terminal_asks_first(tmp_path, answer, rotated):
    from support.cli import kith_argv
    from support.terminal import in_pty

    device, rec, _ = _person_home(tmp_path / "h")
    before = _person_files(tmp_path / "h")
    out, code = in_pty(kith_argv(tmp_path / "h", "person", "rotate"), columns=200,
                       replies=[("[y/N]", answer + "\n")])
    assert f"rotate the person key {rec.person_key[:16]}" in out and "cannot be undone" in out
    if rotated:
        assert code == 0 and "rotated person" in out, out
        assert load_person(tmp_path / "h").person_key != rec.person_key
    else:
        assert code == 1 and "[person-rotate-unconfirmed]: not rotated (not confirmed)" in out, out  # "error" in red
        assert _person_files(tmp_path / "h") == before


@pytest.mark.parametrize("case", ["unknown device", "this device", "no person key", "wrong words"])
def test_kith_person_rotate_at_a_terminal_refuses_before_it_asks(tmp_path, case):
    """Every check that can refuse a rotation comes before its ``[y/N]``: it asked first,
    so the owner answered ``y`` and was then refused (``device-not-found`` for a
    ``--without`` name, ``person-last-device``, ``device-no-person-key``,
    ``person-recovery-wrong`` for the words typed)."""
    from support.cli import kith_argv
    from support.terminal import in_pty

    other_words = _person_home(tmp_path / "other")[2]  # another person's recovery words
    device, rec, _ = _person_home(tmp_path / "h")
    args, replies, code = {
        "unknown device": (("--without", "nope"), [], "device-not-found"),
        "this device": (("--without", "laptop"), [], "person-last-device"),
        "no person key": ((), [], "device-no-person-key"),
        "wrong words": (("--recovery",), [("recovery words", other_words + "\n")], "person-recovery-wrong"),
    }[case]
    if case == "no person key":  # the person key is on another device
        (tmp_path / "h" / PERSON_KEY_FILE).unlink()
    before = _person_files(tmp_path / "h")
    out, exit_code = in_pty(kith_argv(tmp_path / "h", "person", "rotate", *args), columns=200,
                            replies=[*replies, ("[y/N]", "y\n")])
    assert exit_code == 1 and f"[{code}]" in out, out
    assert "[y/N]" not in out, out
    assert _person_files(tmp_path / "h") == before


def test_kith_person_rotate_recovery_at_a_terminal_reads_the_words_then_asks(tmp_path):
    from support.cli import kith_argv
    from support.terminal import in_pty

    device, rec, words = _person_home(tmp_path / "h")
    out, code = in_pty(kith_argv(tmp_path / "h", "person", "rotate", "--recovery"), columns=200,
                       replies=[("recovery words", words + "\n"), ("[y/N]", "y\n")])
    assert code == 0 and out.index("recovery words") < out.index("[y/N]") < out.index("rotated person"), out
    assert load_person(tmp_path / "h").person_key != rec.person_key


def test_without_leaves_a_lost_device_out_and_never_this_one(tmp_path):
    device, rec, _ = _person_home(tmp_path / "h")
    from node.trust.person import bind_device, load_person_secret, save_person

    lost = Identity(os.urandom(32))
    bind_device(rec, load_person_secret(tmp_path / "h"), lost.public_key, "old-phone")
    save_person(tmp_path / "h", rec)
    for bad, code in ((("laptop",), "person-last-device"), (("nope",), "device-not-found")):
        with pytest.raises(ConfigError) as exc:
            rotate_person(tmp_path / "h", without=bad)
        assert exc.value.code == code
    got = rotate_person(tmp_path / "h", without=("old-phone",))
    assert got.devices == ("laptop",) and got.dropped == ("old-phone",)
    assert load_person(tmp_path / "h").binding_for(lost.public_key) is None


def test_another_device_imports_the_rotated_record(tmp_path):
    device, rec, _ = _person_home(tmp_path / "a")
    from node.trust.person import bind_device, load_person_secret, save_person

    (tmp_path / "b").mkdir()
    desk, _ = init_identity(tmp_path / "b")
    bind_device(rec, load_person_secret(tmp_path / "a"), desk.public_key, "desk")
    save_person(tmp_path / "a", rec)
    save_person(tmp_path / "b", load_person(tmp_path / "a"))  # as `kith device join` leaves it
    before = load_person(tmp_path / "b")
    rotate_person(tmp_path / "a")
    rotated = load_person(tmp_path / "a").as_json()
    with pytest.raises(ConfigError) as exc:
        adopt_person(tmp_path / "a", rotated)  # the same record again is not newer
    assert exc.value.code == "person-not-successor"
    stranger, _, _ = _person_home(tmp_path / "c")
    with pytest.raises(ConfigError) as exc:
        adopt_person(tmp_path / "c", rotated)
    assert exc.value.code == "person-not-successor"
    got = adopt_person(tmp_path / "b", rotated)
    assert got.person_key != before.person_key
    who = verify_chain(own_chain(tmp_path / "b", desk.public_key), desk.public_key)
    assert who.earlier == (before.person_key,)


# ----------------------------------------------------------------------------- the chain rules
def test_a_gap_a_loop_and_an_unvouched_recovery_key_each_have_their_own_code():
    dev = Identity(os.urandom(32)).public_key
    a, b, c, x = (os.urandom(32) for _ in range(4))
    gap = [successor_link(a, public_key_of(b), WHEN, 0), successor_link(x, public_key_of(c), WHEN, 1),
           device_link(c, dev, "laptop", WHEN, 2)]
    assert _code(gap, dev) == "handshake-chain-gap"
    loop = [successor_link(a, public_key_of(b), WHEN, 0), successor_link(b, public_key_of(a), WHEN, 1),
            device_link(a, dev, "laptop", WHEN, 2)]
    assert _code(loop, dev) == "handshake-chain-loop"
    # a recovery rotation whose recovery key the old person key never vouched for
    thief = os.urandom(32)
    unvouched_statement = sign(thief, person_recovery_payload(person_key=public_key_of(a),
                                                              recovery_key=public_key_of(thief), created=WHEN))
    unknown = [recovery_link(thief, public_key_of(a), WHEN, unvouched_statement, public_key_of(b), WHEN, 0),
               device_link(b, dev, "laptop", WHEN, 1)]
    assert _code(unknown, dev) == "handshake-rotation-unknown-key"
    vouched = sign(a, person_recovery_payload(person_key=public_key_of(a), recovery_key=public_key_of(x), created=WHEN))
    good = [recovery_link(x, public_key_of(a), WHEN, vouched, public_key_of(b), WHEN, 0),
            device_link(b, dev, "laptop", WHEN, 1)]
    assert verify_chain(good, dev).rotations == ((public_key_of(a), public_key_of(b), "recovery"),)
    assert _code([{**good[0], "successor_key": public_key_of(c)}, device_link(c, dev, "laptop", WHEN, 1)],
                 dev) == "handshake-binding-forged"


def _pid(person, rotations=(), dev="ee" * 32):
    return PersonIdentity(person=person, device=dev, device_name="d", earlier=tuple(r[0] for r in rotations),
                          rotations=tuple(rotations))


def test_the_ledger_retires_a_rotated_key_and_a_recovery_rotation_overrules_a_thiefs(tmp_path):
    p, q, t, r = "11" * 32, "22" * 32, "33" * 32, "44" * 32
    ledger = RotationLedger.load(tmp_path)
    assert ledger.follow(_pid(q, [(p, q, "person")])) == [(p, q, "person")]
    assert ledger.follow(_pid(q, [(p, q, "person")])) == []  # seen: nothing new
    for pid, code in ((_pid(t, [(p, t, "person")]), "handshake-rotation-revoked-key"),
                      (_pid(p), "handshake-person-key-retired")):
        with pytest.raises(HandshakeError) as exc:
            ledger.follow(pid)
        assert exc.value.code == code
    assert RotationLedger.load(tmp_path).lineage(_pid(r, [(q, r, "person")])) == [r, q, p]
    from node.trust.peers import PeerRegistry
    from node.trust.rotation import pinned_in_lineage

    reg = PeerRegistry.load(tmp_path)
    reg.add("alice", p)  # a pin on alice's first person key
    assert pinned_in_lineage(reg, RotationLedger.load(tmp_path), _pid(r, [(q, r, "person")])).name == "alice"
    assert pinned_in_lineage(reg, RotationLedger.load(tmp_path), _pid(t)) is None
    # the person key was stolen and the thief rotated first: the recovery words win it back
    thief = RotationLedger.load(tmp_path)
    thief.entries.clear()
    thief.follow(_pid(t, [(p, t, "person")]))
    assert thief.follow(_pid(r, [(p, r, "recovery")])) == [(p, r, "recovery")]
    with pytest.raises(HandshakeError) as exc:
        thief.follow(_pid(t))  # the thief's key is retired now
    assert exc.value.code == "handshake-person-key-retired"
    with pytest.raises(HandshakeError) as exc:
        thief.follow(_pid(t, [(p, t, "person")]))  # and cannot take it back with the stolen key
    assert exc.value.code == "handshake-rotation-revoked-key"
    assert json.loads((tmp_path / ROTATIONS_FILE).read_text())["rotations"][p]["via"] == "recovery"


# ----------------------------------------------------------------------------- a real host
def test_a_host_one_rotation_behind_follows_it_and_refuses_a_fork_and_a_retired_binding(tmp_path):
    """A host that saw alice's laptop before she rotated serves it after (one handshake, the
    rotation followed and reported); then a chain forking from her old key — a thief
    holding it — is refused ``handshake-rotation-revoked-key``, and a device still sending a
    binding by the old key ``handshake-person-key-retired``; nothing is served to either."""
    home = _host_home(tmp_path)
    device, rec, _ = _person_home(tmp_path / "alice")
    laptop = load_identity(tmp_path / "alice")
    old_secret = bytes.fromhex((tmp_path / "alice" / PERSON_KEY_FILE).read_text().strip())
    before = own_chain(tmp_path / "alice", device.public_key)
    thief_dev, thief_person = Identity(os.urandom(32)), os.urandom(32)
    fork = [successor_link(old_secret, public_key_of(thief_person), WHEN, 9),
            device_link(thief_person, thief_dev.public_key, "thief", WHEN, 10)]
    stale_dev = Identity(os.urandom(32))
    stale = [device_link(old_secret, stale_dev.public_key, "desk", WHEN, 11)]
    gap_dev, x, y = Identity(os.urandom(32)), os.urandom(32), os.urandom(32)
    gap = [successor_link(old_secret, public_key_of(x), WHEN, 12), successor_link(y, public_key_of(x), WHEN, 13),
           device_link(x, gap_dev.public_key, "gap", WHEN, 14)]

    from node.trust.peers import PeerRegistry

    PeerRegistry.load(home).add("alice", laptop.public_key)  # the host pinned alice's laptop
    stranger_dev, s1, s2 = Identity(os.urandom(32)), os.urandom(32), os.urandom(32)
    stranger = [successor_link(s1, public_key_of(s2), WHEN, 0), device_link(s2, stranger_dev.public_key, "x", WHEN, 1)]

    async def scenario():
        host = MemoryHost(home)
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.host.run)
            await host.ready.wait()
            anon = await _connect(tg, host, stranger_dev, stranger)  # a stranger's own rotation: served,
            anon.ask(None)                                            # never recorded
            first = await _connect(tg, host, laptop, before)
            first.ask("alpha")
            await first.answered(1)
            first.ask(None)
            rotate_person(tmp_path / "alice")
            after = await _connect(tg, host, laptop, own_chain(tmp_path / "alice", device.public_key))
            after.ask("alpha")
            await after.answered(1)
            forked = await _connect(tg, host, thief_dev, fork)
            retired = await _connect(tg, host, stale_dev, stale)
            gapped = await _connect(tg, host, gap_dev, gap)
            await host.until(lambda: all(g.outcome is not None for g in (forked, retired, gapped)))
            after.ask(None)
            host.stop.set()
        return host, after, forked, retired

    host, after, forked, retired = anyio.run(scenario, backend="asyncio")
    new_key = load_person(tmp_path / "alice").person_key
    assert after.results[0]["status"] == "ok"
    assert [(e["old_person"], e["person"], e["via"]) for e in host.of("person-rotated")] == \
        [(rec.person_key, new_key, "person")]
    refused = {e["peer"]: (e["reason"], e["code"]) for e in host.of("session-ended") if not e.get("session_id")}
    assert refused[thief_dev.public_key] == ("rejected", "handshake-rotation-revoked-key")
    assert refused[stale_dev.public_key] == ("rejected", "handshake-person-key-retired")
    assert refused[gap_dev.public_key] == ("rejected", "handshake-chain-gap")
    assert not forked.outcome.ok and not retired.outcome.ok
    assert not forked.results and not retired.results
    started = {e["peer"] for e in host.of("session-started")}
    assert thief_dev.public_key not in started and stale_dev.public_key not in started
    ledger = json.loads((home / ROTATIONS_FILE).read_text())["rotations"]
    assert list(ledger) == [rec.person_key]  # alice's rotation only, not the stranger's
    audit = [json.loads(line) for line in (home / "audit.jsonl").read_text().splitlines()]
    assert any(a.get("event") == "person-rotated" and a.get("person") == new_key for a in audit)
