"""The `kith` command as the tests run it: a real process (:func:`kith`, :func:`kith_argv`),
in this process through Typer's CliRunner (:func:`invoke`), and reading what it prints."""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

from support.homes import initialized

#: argv prefix that runs `kith` with this interpreter (the editable install under test)
KITH = [sys.executable, "-m", "node.cli.main"]


def without_root_reads() -> list[str]:
    """An argv prefix that runs a command without the capabilities that let root read and
    search every file (``setpriv``), so a file mode means what it means for a user; ``[]``
    when not root. Skips the test when root has no ``setpriv`` (util-linux)."""
    if os.geteuid() != 0:
        return []
    import shutil

    if shutil.which("setpriv") is None:
        import pytest

        pytest.skip("running as root without setpriv (util-linux): apt-get install util-linux")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def kith_argv(home: Path, *args: str) -> list[str]:
    """``kith --home HOME ARGS`` as an argv list (for :class:`subprocess.Popen`)."""
    return [*KITH, "--home", str(home), *args]


def kith(home: Path, *args: str, timeout: float = 120, input: str | None = None,
         env: dict[str, str] | None = None, init: bool = False, **kw: Any) -> subprocess.CompletedProcess:
    """Run ``kith --home HOME ARGS`` as a real process to the end, output captured as text.

    Args:
        timeout: seconds before :class:`subprocess.TimeoutExpired`.
        input: text for stdin (stdin is /dev/null otherwise: a prompt never waits).
        env: the process environment (this one's when None).
        init: give HOME an identity first unless the command is ``init`` (every command but
            init refuses an uninitialised home).
        kw: passed to :func:`subprocess.run` (``cwd``, ...).
    """
    if init and args[:1] != ("init",):
        initialized(home)
    return subprocess.run(kith_argv(home, *args), capture_output=True, text=True, timeout=timeout,
                          input=input, stdin=None if input is not None else subprocess.DEVNULL, env=env, **kw)


def kith_init(home: Path, env: dict[str, str] | None = None) -> str:
    """``kith --home HOME init --json`` as a real process: the new device's public key."""
    r = kith(home, "init", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["public_key"]


def invoke(home: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    """``kith --home HOME ARGS`` in this process through Typer's CliRunner on the real app
    (every command registered); HOME gets an identity first. Returns the
    :class:`click.testing.Result` (``exit_code``, ``stdout``, ``output``, ``exception``)."""
    from typer.testing import CliRunner

    from node.cli import main as cli_main

    cli_main._register()
    return CliRunner().invoke(cli_main.app, ["--home", str(initialized(home)), *args], env=env)


def json_lines(text: str) -> list[dict]:
    """Every non-blank line of ``text`` parsed as JSON (raises when one is not JSON)."""
    lines = [line for line in text.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


#: bytes read past the last line :func:`next_line` returned, per stream (weakly keyed)
_PENDING: "weakref.WeakKeyDictionary[Any, bytearray]" = weakref.WeakKeyDictionary()


def next_line(stream: Any, timeout: float) -> str | bytes | None:
    """The next line of a child's pipe ``stream`` (text or binary, as the stream is), ``""``
    / ``b""`` at end of file, or None when no whole line comes within ``timeout`` s.

    Reads the pipe's file descriptor itself, keeping what it read past the line for the
    next call, because ``select`` on a buffered file object only sees the descriptor: a line
    the object's own buffer already holds would wait forever (a test that waited 60 s for a
    host event that had arrived with the previous one). Use this, never ``stream.readline``,
    on a stream read more than once; :func:`pending` gives what it read ahead."""
    buf = _PENDING.setdefault(stream, bytearray())
    fd = stream.fileno()
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:  # end of file: the rest, however short ("" when nothing is left)
            rest = bytes(buf)
            buf.clear()
            return _decoded(stream, rest)
        buf += chunk
    end = buf.index(b"\n") + 1
    line = bytes(buf[:end])
    del buf[:end]
    return _decoded(stream, line)


def pending(stream: Any) -> str | bytes:
    """What :func:`next_line` read from ``stream`` past its last line (empty when nothing):
    prepend it to a later ``communicate()`` / ``read()`` of the same stream."""
    return _decoded(stream, bytes(_PENDING.pop(stream, b"")))


def _decoded(stream: Any, data: bytes) -> str | bytes:
    if isinstance(stream, io.TextIOBase):
        return data.decode(stream.encoding or "utf-8", stream.errors or "strict")
    return data


def readline(proc: subprocess.Popen, timeout: float) -> str:
    """The next line of ``proc``'s stdout, failing when none comes within ``timeout`` s."""
    line = next_line(proc.stdout, timeout)
    assert line is not None, f"no output in {timeout}s"
    return line


async def wait_exit(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """From async code: wait (in a worker thread, bounded by ``timeout`` s) for ``proc`` to
    exit and return ``(returncode, stdout, stderr)``; raises subprocess.TimeoutExpired."""
    import anyio

    def wait() -> tuple[int, str, str]:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err

    return await anyio.to_thread.run_sync(wait)


def lines_until(proc: subprocess.Popen, stream, pred: Callable[[str], Any], timeout: float) -> list[str]:
    """Read lines of ``stream`` until one satisfies ``pred`` (bounded by ``timeout`` s);
    returns the lines read, the matching one last."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        line = next_line(stream, max(0.0, deadline - time.monotonic()))
        if not line:  # None: time is up; "": the stream ended
            break
        seen.append(line)
        if pred(line):
            return seen
    raise AssertionError(f"no matching line within {timeout} s; saw {seen!r}")


@contextlib.contextmanager
def serving(argv: list[str], timeout: float = 60) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """A real server process (``kith api serve``, ``kith dashboard`` … with ``--json``) that
    prints one JSON line once it serves: yields ``(that line, parsed; ended)``; when the
    block ends it gets SIGINT, and ``ended`` is filled with its ``stderr`` and
    ``returncode`` once it has exited (within 30 s)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    ended: dict[str, Any] = {}
    try:
        yield json.loads(readline(proc, timeout)), ended
    finally:
        proc.send_signal(signal.SIGINT)
        ended["stderr"] = proc.communicate(timeout=30)[1]
        ended["returncode"] = proc.returncode


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM ``proc`` and reap it (SIGKILL after 20 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ask_later(home: Path, question: str, peer: str) -> str:
    """`kith ask QUESTION --peer PEER --later --offline --json` for ``home`` (the peer asleep:
    the question is kept in the outbox); returns the outbox id. Fails when it exits non-zero."""
    r = kith(home, "ask", question, "--peer", peer, "--later", "--offline", "--json", "--timeout", "5", timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["outbox"]["id"]


def outbox_run_until(home: Path, what: str, check: Callable[[], Any], timeout_s: float = 90) -> str:
    """Run `kith outbox run --offline` for ``home`` until ``check()`` is truthy (polled,
    bounded by ``timeout_s``), then stop it with SIGINT; fails when it never is. Returns
    what it wrote on stderr (its delivery lines)."""
    import signal

    from support.waits import wait_for

    proc = subprocess.Popen(kith_argv(home, "outbox", "run", "--offline"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        wait_for(what, check, timeout_s=timeout_s, every_s=0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return err


def assert_no_real_paths(text: str, *paths: Path) -> None:
    """Fail when ``text`` names any of ``paths`` (as given or resolved)."""
    for p in paths:
        for form in {str(p), str(p.resolve())}:
            assert form not in text, f"real path {form} leaked"
