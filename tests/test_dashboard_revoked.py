"""The owner's view of a stolen device (issue 22 items 3 and 6): the dashboard's peers page,
like `kith peers list`, marks a person pin's device that a kept revocation list of that
person revokes — the owner must not see a stolen laptop listed like any other device. A real
dashboard in a thread, the list taken by the real `kith peers import-revocation`."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from node.local.dashboard.app import run_dashboard_in_thread
from node.trust.peers import PeerRegistry, note_device
from node.trust.revocation_list import make_list
from node.trust.signing import public_key_of

from support.cli import kith
from support.dashboard import logged_in as _logged_in


def test_the_peers_page_marks_a_revoked_device_of_a_person(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert kith(home, "init").returncode == 0
    secret = os.urandom(32)
    person = public_key_of(secret)
    assert kith(home, "peers", "add", "alice", person, "--devices").returncode == 0
    desk, laptop = os.urandom(32).hex(), os.urandom(32).hex()
    registry = PeerRegistry.load(home)
    for key, name in ((desk, "desk"), (laptop, "laptop")):  # what a host notes as they join
        note_device(registry, registry.peers["alice"], key, name)
    listed = tmp_path / "revocation.json"
    listed.write_text(json.dumps(make_list(secret, [laptop], 0, "2026-12-02T04:00:00Z")))
    assert kith(home, "peers", "import-revocation", str(listed)).returncode == 0

    with run_dashboard_in_thread(home) as (base, login):
        client = _logged_in(base, login)
        try:
            page = client.get("/peers").text
        finally:
            client.close()
    rows = {m.group(1): m.group(0) for m in re.finditer(r'device (desk|laptop) <code.*?</div>', page)}
    assert set(rows) == {"desk", "laptop"}, page
    assert "REVOKED" in rows["laptop"] and "REVOKED" not in rows["desk"], rows
