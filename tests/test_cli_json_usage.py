"""Under ``--json`` a command line the CLI library refuses (a missing argument, an unknown
option, a bad choice or value) is the ``usage`` refusal every usage error is: one
``{"error": {"code": "usage", ...}}`` object on stdout, exit 2 (specs/error-codes.md).
Without ``--json`` the library's own usage text stays. Real ``kith`` processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cli import json_lines, kith

REFUSED = [
    (("search", "--json"), "Missing argument"),
    (("search", "staging", "--json", "--no-such-option"), "No such option: --no-such-option"),
    (("search", "staging", "--json", "--top-k", "many"), "'many' is not a valid int"),
    (("policy", "set", "/docs/**", "secret", "--json"), "'secret' is not one of"),
    (("outbox", "list", "--json", "extra"), "unexpected extra argument"),
    (("--no-such-option", "status", "--json"), "No such option: --no-such-option"),
]


@pytest.mark.parametrize("args, said", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_command_line_the_library_refuses_is_the_usage_object_under_json(
        tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    r = kith(tmp_path / "home", *args, init=True)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    [line] = json_lines(r.stdout)
    error = line["error"]
    assert error["code"] == "usage" and said in error["message"], error
    assert "--help" in error["hint"], error
    assert f"error [usage]: {error['message']}" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "home" / "policy.toml").exists()  # nothing was done


@pytest.mark.parametrize("args, path", [(("search", "--json=1", "staging"), "kith search"),
                                        (("search", "staging", "--json=true"), "kith search"),
                                        (("policy", "set", "/docs/**", "open", "--json=yes"), "kith policy set"),
                                        (("sent", "--json=1"), "kith sent")])
def test_json_given_a_value_is_refused_as_the_usage_object_naming_the_command(
        tmp_path: Path, args: tuple[str, ...], path: str) -> None:
    """``--json`` is a flag: ``--json=1`` is refused (usage, exit 2), and since it asks for
    JSON the refusal is the one JSON object, its hint naming the command's ``--help`` —
    it printed the library's plain text (``Error: Option '--json' does not take a
    value.``), which a ``--json`` caller cannot read."""
    r = kith(tmp_path / "home", *args, init=True)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    [line] = json_lines(r.stdout)
    assert line["error"]["code"] == "usage" and "'--json' does not take a value" in line["error"]["message"]
    assert f"`{path} --help`" in line["error"]["hint"], line
    assert "Traceback" not in r.stderr and not (tmp_path / "home" / "policy.toml").exists()


def test_json_given_a_value_that_says_no_is_refused_in_text(tmp_path: Path) -> None:
    """``--json=false`` asks for no JSON: the library's usage text, naming the command."""
    r = kith(tmp_path / "home", "search", "staging", "--json=false", init=True)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert "Usage: kith search" in r.stderr and "'--json' does not take a value" in r.stderr


OPTION_AS_VALUE = [
    (("search", "--top-k", "--json", "staging"), "kith search", "--top-k", "--json"),
    (("search", "staging", "--source", "--json"), "kith search", "--source", "--json"),
    (("ask", "-p", "--json", "staging"), "kith ask", "-p", "--json"),
    (("sent", "--agent", "--json", "approve", "ab12"), "kith sent", "--agent", "--json"),
    (("policy", "set", "/docs/**", "peers", "--peer", "--json"), "kith policy set", "--peer", "--json"),
]


@pytest.mark.parametrize("args, path, option, word", OPTION_AS_VALUE, ids=[" ".join(a) for a, *_ in OPTION_AS_VALUE])
def test_an_option_after_an_option_that_takes_a_value_is_refused_naming_it(
        tmp_path: Path, args: tuple[str, ...], path: str, option: str, word: str) -> None:
    """``kith search --top-k --json q``: ``--top-k`` has no value — the library took
    ``--json`` for it (``'--json' is not a valid int``; a text option such as ``--source``
    even ran the command with the value ``--json`` and printed no JSON). It is the usage
    refusal naming the option, as the JSON object since ``--json`` is on the line."""
    r = kith(tmp_path / "home", *args, init=True)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    [line] = json_lines(r.stdout)
    error = line["error"]
    assert error["code"] == "usage" and f"Option '{option}' requires an argument: '{word}'" in error["message"], error
    assert f"`{path} --help`" in error["hint"], error
    assert "Traceback" not in r.stderr and not (tmp_path / "home" / "policy.toml").exists()


def test_a_global_option_missing_its_value_is_refused_too(tmp_path: Path) -> None:
    """``kith --home --json status`` took ``--json`` for the home (``home-not-initialized``
    for a folder named ``--json``)."""
    import subprocess

    from support.cli import KITH

    r = subprocess.run([*KITH, "--home", "--json", "status"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    [line] = json_lines(r.stdout)
    assert line["error"]["code"] == "usage" and "Option '--home' requires an argument" in line["error"]["message"]
    assert not (tmp_path / "--json").exists()


def test_an_option_value_that_starts_with_dashes_is_given_with_equals(tmp_path: Path) -> None:
    """Without ``--json`` the refusal is the library's usage text naming the option (``--``
    after it, too); ``--source=--json`` gives that word as the value (searched for, and
    refused by the search: no glob starts with ``--``)."""
    r = kith(tmp_path / "home", "search", "--top-k", "--", "staging", init=True)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert "Usage: kith search" in r.stderr and "Option '--top-k' requires an argument: '--'" in r.stderr
    r = kith(tmp_path / "home", "search", "--source=--json", "--json", "staging", init=True)
    assert r.returncode == 1 and json_lines(r.stdout)[0]["error"]["code"] == "query-invalid", (r.stdout, r.stderr)


@pytest.mark.parametrize("args", [("sent", "--json", "approve", "ab12"), ("sessions", "--json", "end", "abcd"),
                                  ("sent", "--agent", "bob", "approve", "ab12", "--json")])
def test_a_list_groups_options_before_a_sub_command_are_refused(tmp_path: Path, args: tuple[str, ...]) -> None:
    """``kith sent`` and ``kith sessions`` list when run alone; their options shape that
    list. Before a sub-command they were ignored — ``kith sent --json approve ID`` printed
    the sub-command's text on success (the JSON object only on failure), ``--agent``
    filtered nothing. Now the usage refusal naming them."""
    r = kith(tmp_path / "home", *args, init=True)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    [line] = json_lines(r.stdout)
    error = line["error"]
    assert error["code"] == "usage" and f"of `kith {args[0]}` shape its list" in error["message"], error
    assert args[1] in error["message"] and f"`kith {args[0]} " in error["hint"] and "--help" in error["hint"]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args, path", [(("--json", "status"), "kith status"),
                                        (("policy", "--json", "list"), "kith policy list"),
                                        (("peers", "--json", "group", "list"), "kith peers group list")])
def test_a_commands_option_before_the_command_says_where_it_goes(
        tmp_path: Path, args: tuple[str, ...], path: str) -> None:
    """``kith --json status``: the library said ``No such option: --json (Possible
    options: --version)``; the refusal now says ``--json`` is the command's and goes after it."""
    r = kith(tmp_path / "home", *args, init=True)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    [line] = json_lines(r.stdout)
    error = line["error"]
    assert error["code"] == "usage" and f"it is an option of `{path}`: give it after the command" in error["message"]
    assert f"`{path} --help`" in error["hint"], error


def test_without_json_the_library_prints_its_own_usage_text(tmp_path: Path) -> None:
    r = kith(tmp_path / "home", "search", "staging", "--no-such-option", init=True)
    assert r.returncode == 2 and r.stdout == ""
    assert "Usage: kith search" in r.stderr and "No such option: --no-such-option" in r.stderr


def test_a_group_without_its_sub_command_still_prints_its_help(tmp_path: Path) -> None:
    r = kith(tmp_path / "home", "outbox", init=True)
    assert r.returncode == 2 and "Usage: kith outbox" in r.stdout + r.stderr and "list" in r.stdout + r.stderr


def test_json_after_the_end_of_options_is_a_query_not_the_option(tmp_path: Path) -> None:
    """``kith search -- --json`` searches for the word ``--json``: its refusal (a home
    never synced) is the text one on stderr — it printed the ``{"error": ...}`` object on
    stdout as if ``--json`` were given (attack49)."""
    r = kith(tmp_path / "home", "search", "--", "--json", init=True)
    assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert "error [index-unavailable]" in r.stderr
    r = kith(tmp_path / "home", "search", "--json", "--", "--json", init=True)
    assert r.returncode == 1 and json_lines(r.stdout)[0]["error"]["code"] == "index-unavailable"
