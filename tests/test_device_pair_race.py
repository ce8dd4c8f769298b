"""`kith device add` waits up to 10 minutes for the new device and the owner's yes; the
person record must not be the one it read when it started (issue 22 item 1). A rotation of
the person key meanwhile (`kith person rotate`) must not be undone by the pairing writing the
old record back over it (the home would then hold the new key beside a record of the old
one): the pairing is refused `pairing-person-rotated` on both devices and the rotated record
stays. Real processes, real iroh on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import kith, readline
from support.devices import Offer, join_offer as _join

pytestmark = [pytest.mark.iroh]


def test_a_rotation_while_a_pairing_waits_is_kept_and_the_pairing_refused(tmp_path: Path):
    desk, laptop = tmp_path / "desk", tmp_path / "laptop"
    assert kith(desk, "init", "--device-name", "desk").returncode == 0
    offer = Offer(desk)
    joiner = _join(laptop, offer.code)
    assert json.loads(readline(joiner, 60))["event"] == "pairing-words"
    r = kith(desk, "person", "rotate", "--yes", "--json")  # while `device add` waits for the owner's yes
    assert r.returncode == 0, r.stderr
    rotated = json.loads(r.stdout)["person_key"]
    offer.answer("yes")
    rc, _out, err = offer.finish()
    assert rc == 1 and "pairing-person-rotated" in err, err
    out, err = joiner.communicate(timeout=30)
    assert joiner.returncode == 1 and "pairing-person-rotated" in out + err, out + err
    shown = json.loads(kith(desk, "person", "show", "--json").stdout)
    assert shown["person_key"] == rotated and shown["holds_person_key"]
    assert [d["name"] for d in shown["devices"]] == ["desk"]
    # the home still works: a new pairing binds under the rotated key
    offer = Offer(desk)
    joiner = _join(laptop, offer.code)
    assert json.loads(readline(joiner, 60))["event"] == "pairing-words"
    offer.answer("yes")
    _out, err = joiner.communicate(timeout=30)
    assert joiner.returncode == 0, err
    assert offer.finish()[0] == 0
    assert json.loads(kith(laptop, "person", "show", "--json").stdout)["person_key"] == rotated
