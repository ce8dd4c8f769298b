"""Pinning a host from ``kith join`` (issue 30 item 5): the name prompt that follows the
``[y/N]`` trust question never takes a yes/no answer as a name, and ``--pin NAME`` with a
name already pinned to another host is its own refusal (``pin-name-taken``), not
``host-key-changed``. Real ``kith host`` and ``kith join`` processes over iroh on
loopback; the prompts on a pseudo-terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.trust.peers import PeerRegistry

from support.cli import KITH, kith
from support.hosts import HostProcess as Host, notes_host as _host_home
from support.terminal import in_pty as _in_pty


@pytest.mark.iroh
@pytest.mark.slow
def test_the_name_prompt_refuses_yes_no_answers_and_pin_name_taken_has_its_own_code(tmp_path: Path) -> None:
    home = _host_home(tmp_path)
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    other_key = json.loads(kith(tmp_path / "other", "init", "--json").stdout)["public_key"]
    assert kith(guest, "peers", "add", "bea", other_key).returncode == 0  # "bea" names another host
    invite = tmp_path / "invite.json"
    host = Host(home, "--invite-file", str(invite))
    try:
        # --pin with a name another host holds: refused before connecting, as a name taken
        r = kith(guest, "join", str(invite), "--offline", "--trust", "--pin", "bea", "--query", "staging", "--json")
        assert r.returncode == 2, r.stderr
        err = json.loads(r.stdout)["error"]
        assert err["code"] == "pin-name-taken" and "host-key-changed" not in r.stdout + r.stderr
        assert other_key[:16] in err["message"] and "kith peers remove bea" in (err.get("hint") or "")
        # on a terminal: "y" to the trust question, then "n", "yes", a taken name, then a real one
        argv = [*KITH, "--home", str(guest), "join", str(invite), "--offline", "--query", "staging"]
        text, code = _in_pty(argv, columns=120, replies=[
            ("[y/N]", "y\n"), ("Type a name", "n\n"), ("Type a name", "yes\n"), ("Type a name", "bea\n"),
            ("Type a name", "carol\n")])
    finally:
        host.stop()
    assert code == 0, text
    assert "'n' reads as an answer, not a name" in text and "'yes' reads as an answer, not a name" in text
    assert "'bea' is already pinned to another host" in text
    assert "pinned the host as 'carol'" in text
    reg = PeerRegistry.load(guest)
    assert set(reg.peers) == {"bea", "carol"}  # never 'n' or 'yes'
    assert reg.by_name("carol").public_key == host.invitation["host_public_key"]
