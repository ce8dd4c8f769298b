"""Docs that are tested (the datasette habit): what the code has, the docs name.

- every error code in ``node.common.errors.CODES`` is documented in ``specs/error-codes.md``, under
  its category, and every code documented there exists;
- every ``kith`` command and sub-command appears in ``README.md`` as ``kith <command>``;
- every command's ``--help`` works and has a help text;
- ``specs/protocol-spec.schema.json`` is byte-for-byte ``node.protocol.spec.META_SCHEMA``;
- ``specs/README.md`` indexes every file in ``specs/``;
- the README's captured ``kith join`` output is what ``node/cli/render.py`` prints now.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import typer
from typer.testing import CliRunner

from node.common.errors import CODES

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "specs"
ERROR_DOC = SPECS / "error-codes.md"

_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")
_SECTION = re.compile(r"^##\s+(\S+)\s*$")


def documented_codes() -> dict[str, str]:
    """code → the ``## <category>`` section its table row is in (first row wins)."""
    found: dict[str, str] = {}
    section = ""
    for line in ERROR_DOC.read_text("utf-8").splitlines():
        m = _SECTION.match(line)
        if m:
            section = m.group(1)
            continue
        m = _ROW.match(line)
        if m:
            assert m.group(1) not in found, f"{m.group(1)!r} has two rows in specs/error-codes.md"
            found[m.group(1)] = section
    return found


def test_every_error_code_is_documented():
    text = ERROR_DOC.read_text("utf-8")
    missing = [code for code in CODES if f"`{code}`" not in text]
    assert not missing, f"codes missing from specs/error-codes.md: {missing}"
    rows = documented_codes()
    no_row = [code for code in CODES if code not in rows]
    assert not no_row, f"codes without a table row in specs/error-codes.md: {no_row}"


def test_every_documented_error_code_exists():
    unknown = sorted(set(documented_codes()) - set(CODES))
    assert not unknown, f"specs/error-codes.md documents codes not in node.common.errors.CODES: {unknown}"


def test_error_codes_are_documented_under_their_category():
    wrong = {code: (section, CODES[code][0]) for code, section in documented_codes().items()
             if code in CODES and section != CODES[code][0]}
    assert not wrong, f"code → (doc section, CODES category) mismatches: {wrong}"


# ---------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def cli() -> Any:
    import node.cli.main as main

    if "index" not in {g.name for g in main.app.registered_groups}:
        main._register()
    return main.app


def _walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
        yield from _walk(sub, path + (name,))


def _commands(app: Any) -> list[tuple[tuple[str, ...], Any]]:
    return list(_walk(typer.main.get_command(app)))


def test_cli_tree_is_complete(cli):
    names = {" ".join(p) for p, _ in _commands(cli)}
    assert {"init", "host", "join", "search", "protocol test", "index add", "index sync",
            "policy set", "community serve"} <= names


def test_every_cli_command_is_in_the_readme(cli):
    readme = REPO / "README.md"
    paths = [p for p, _ in _commands(cli) if p]
    wanted = [f"kith {' '.join(p)}" for p in paths]
    if not readme.is_file():
        pytest.fail(f"README.md does not exist; it must mention: {wanted}")
    text = readme.read_text("utf-8")
    missing = [w for w in wanted if w not in text]
    assert not missing, f"commands not mentioned in README.md: {missing}"


def test_every_command_help_works_and_has_text(cli):
    runner = CliRunner()
    failures = []
    for path, command in _commands(cli):
        result = runner.invoke(cli, [*path, "--help"])
        help_text = (command.help or command.short_help or "").strip()
        if result.exit_code != 0 or "Usage" not in result.output or not help_text:
            failures.append((" ".join(("kith",) + path), result.exit_code, bool(help_text)))
        elif help_text.split()[0] not in result.output:
            failures.append((" ".join(("kith",) + path), "help text not shown", True))
    assert not failures, f"(command, exit code, has help text): {failures}"


# ---------------------------------------------------------------------------------- specs
def test_meta_schema_file_is_byte_for_byte_META_SCHEMA():
    from node.protocol.spec import META_SCHEMA

    expected = json.dumps(META_SCHEMA, indent=2) + "\n"
    assert (SPECS / "protocol-spec.schema.json").read_text("utf-8") == expected, (
        "regenerate: python -c 'import json; from node.protocol.spec import META_SCHEMA; "
        "print(json.dumps(META_SCHEMA, indent=2))' > specs/protocol-spec.schema.json")


def test_specs_index_lists_every_spec_file():
    index = (SPECS / "README.md").read_text("utf-8")
    files = sorted(p.name for p in SPECS.iterdir() if p.is_file() and p.name != "README.md")
    missing = [f for f in files if f"({f})" not in index]
    assert not missing, f"specs/README.md has no line for: {missing}"
    linked = re.findall(r"\]\(([^)/]+)\)", index)
    dangling = [f for f in linked if not (SPECS / f).is_file()]
    assert not dangling, f"specs/README.md links to missing files: {dangling}"


def test_readme_join_example_is_what_kith_join_prints_now():
    """The README's captured ``kith join`` output uses today's rendering
    (``node/cli/render.py``): the status line, ``#N SOURCE  lines A-B`` heads, no score, the
    answer header; a stale capture (``ok — N result(s)``, ``score 0.040``) fails."""
    from node.cli.render import answer_lines, format_lines, status_line

    text = (REPO / "README.md").read_text("utf-8")
    start = text.index("[q1] ok")
    block = text[start:text.index("to pin this host:", start)].splitlines()
    heads = [ln for ln in block if re.match(r"^  #\d+ ", ln)]
    assert heads, "no result heads in the README's join example"
    assert block[0] == status_line({"query_id": "q1", "status": "ok"}, len(heads))
    for rank, ln in enumerate(heads, 1):
        assert re.fullmatch(rf"  #{rank} /\S+  lines? \d+(-\d+)?", ln), ln
    assert not any("score" in ln for ln in block)
    sample = {"query_id": "q1", "status": "ok", "envelope": {
        "results": [], "answerSynthesis": {"sentences": [{"text": "x", "citationId": "c"}]}}}
    header = format_lines(answer_lines(sample), None)[1]
    assert header in block
