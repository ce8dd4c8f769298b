"""Hostile files given to the person commands by hand (issue 22): `kith peers
import-revocation FILE` and `kith person import FILE` refuse a deeply nested JSON file with
their typed code (exit 1, `error [code]`), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import kith

DEEP = "[" * 5000 + "]" * 5000  # well under the 8 KiB read, far past the recursion limit


@pytest.mark.parametrize(("args", "code"), [
    (("peers", "import-revocation"), "revocation-malformed"),
    (("person", "import"), "config-invalid"),
])
def test_a_deeply_nested_file_is_refused_with_a_code(tmp_path: Path, args: tuple[str, ...], code: str):
    home = tmp_path / "home"
    assert kith(home, "init").returncode == 0
    bad = tmp_path / "deep.json"
    bad.write_text(DEEP)
    r = kith(home, *args, str(bad))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"error [{code}]" in r.stderr, r.stderr
    r = kith(home, *args, str(bad), "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["code"] == code, r.stdout + r.stderr


@pytest.mark.parametrize("content", ["", "not json", DEEP, "{}", "[]"], ids=["empty", "text", "deep", "object", "list"])
def test_a_person_file_that_is_not_json_names_the_file_to_give_not_a_home_repair(tmp_path: Path, content: str):
    """`kith person import FILE` with a file that is not a person record: the hint says which
    file to give (the `kith person show --json` of the device that rotated), not the repair of
    a damaged file of the home ("move it aside … and set again what it held"): FILE is the
    user's, nothing of the home is damaged."""
    home = tmp_path / "home"
    assert kith(home, "init").returncode == 0
    bad = tmp_path / "person.json"
    bad.write_text(content)
    r = kith(home, "person", "import", str(bad))
    assert r.returncode == 1 and "error [config-invalid]" in r.stderr, r.stderr
    assert "kith person show --json" in r.stderr and "set again what it held" not in r.stderr, r.stderr
