"""`kith`'s consoles are built on first use (node/cli/common.py, issue 44): off a terminal a
print of plain strings is written without importing rich, and what it writes is exactly
what the rich console would have written for the same call; whatever rich would change
(markup, an emoji code, a tab, a renderable, a terminal) is handed to rich."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from node.cli.common import LazyConsole, _terminal_by_rich_rule

#: (objects, keywords) of print calls: plain ones and ones only rich may render
CALLS = [
    (("session 7f1408eb42851a1c54b3c892be5b85d0",), {"highlight": False}),
    (("path: direct (127.0.0.1:59907)",), {"highlight": False, "markup": False}),
    (("path: relay (https://relay.example:443/) -> direct [::1]:4433",), {"markup": False}),
    (("connecting to 92e614e7eb7008bd… (gives up after 15 s)",), {}),
    (("[bold]Hosting[/bold] knowledge-query",), {}),
    (("a [link] in brackets",), {"markup": False}),
    (("thumbs :thumbs_up: and :smile:",), {}),
    (("thumbs :thumbs_up:",), {"emoji": False}),
    (("time 10:00:00",), {}),
    (("tab\there", "and\r\nreturn"), {"sep": " | "}),
    (("bell \x07 escape \x1b[2J",), {"markup": False}),
    (("bidi \u202e override, C1 \x85, DEL \x7f",), {"markup": False}),
    (("two", "strings"), {"sep": "--", "end": "!\n"}),
    (("no newline",), {"end": ""}),
    (("",), {}),
    ((), {}),
    (("multi\nline\n",), {}),
    (("wide 日本語 and emoji 🎉 " + "x" * 300,), {}),
    (("soft wrap off " + "y" * 5000,), {"soft_wrap": False}),
    (("highlighted 1234",), {"highlight": True}),
    (("styled",), {"style": "bold"}),
]


def _consoles(kind: str, stream: io.StringIO) -> tuple[LazyConsole, object]:
    """(a lazy console of ``kind`` writing to ``stream``, the rich console it would build)."""
    from node.cli.consoles import _KithConsole, _UntrustedConsole

    if kind == "untrusted":
        real = _UntrustedConsole(file=stream)
        return LazyConsole(lambda: _UntrustedConsole(), markup=False, emoji=False, untrusted=True), real
    if kind == "stderr":
        return LazyConsole(lambda: _KithConsole(stderr=True, soft_wrap=True), stderr=True), \
            _KithConsole(file=stream, soft_wrap=True)
    return LazyConsole(lambda: _KithConsole()), _KithConsole(file=stream)


@pytest.mark.parametrize("kind", ["stdout", "stderr", "untrusted"])
@pytest.mark.parametrize("objects,kwargs", CALLS)
def test_a_plain_print_writes_what_rich_writes(kind, objects, kwargs, monkeypatch):
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"):
        monkeypatch.delenv(var, raising=False)
    lazy_out, rich_out = io.StringIO(), io.StringIO()
    lazy, real = _consoles(kind, rich_out)
    monkeypatch.setattr(sys, "stderr" if kind == "stderr" else "stdout", lazy_out)
    lazy.print(*objects, **kwargs)
    real.print(*objects, **kwargs)
    assert lazy_out.getvalue() == rich_out.getvalue()
    if (objects, kwargs) in PLAIN:
        assert lazy._real is None  # written without rich


#: calls every console writes without building rich
PLAIN = CALLS[0:2] + CALLS[3:4] + CALLS[12:15] + CALLS[16:18]


@pytest.mark.parametrize("env,expected", [({}, False), ({"FORCE_COLOR": "1"}, True), ({"FORCE_COLOR": ""}, False),
                                          ({"TTY_COMPATIBLE": "1"}, True), ({"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, False)])
def test_the_terminal_rule_is_the_one_rich_uses(env, expected, monkeypatch):
    from rich.console import Console

    for var in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    stream = io.StringIO()
    assert Console(file=stream).is_terminal is expected
    assert _terminal_by_rich_rule(stream) is expected


def test_a_terminal_forced_by_the_environment_is_rendered_by_rich(monkeypatch):
    """FORCE_COLOR makes rich call a pipe a terminal (colour, wrapping): the plain path
    steps aside and the call is rich's."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    lazy = LazyConsole(lambda: __import__("node.cli.consoles", fromlist=["_KithConsole"])._KithConsole())
    lazy.print("[bold]strong[/bold]")
    assert "\x1b[1m" in out.getvalue()


def test_plain_lines_off_a_terminal_never_import_rich():
    """In a fresh interpreter: plain prints on the three consoles, their ``file`` and
    ``is_terminal`` load no rich module; a renderable does."""
    code = ("import sys\n"
            "from node.cli.common import console, err_console, untrusted_console\n"
            "console.print('session abc', highlight=False)\n"
            "err_console.print('path: direct (127.0.0.1:1234)', highlight=False, markup=False)\n"
            "untrusted_console.print('peer text [not markup] \\x1b')\n"
            "assert not console.is_terminal and console.file is sys.stdout\n"
            "print(sorted(m for m in sys.modules if m == 'rich' or m.startswith('rich.')))\n"
            "err_console.print('[red]error[/red]')\n"
            "print('rich' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL, env={k: v for k, v in __import__("os").environ.items()
                                                      if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines == ["session abc", "peer text [not markup] \ufffd", "[]", "True"], r.stdout
    assert r.stderr == "path: direct (127.0.0.1:1234)\nerror\n"
