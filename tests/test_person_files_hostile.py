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
