"""Running `kith` where a person would see it: on a pseudo-terminal (:func:`in_pty`, with
replies typed at prompts; :func:`join_on_pty`, an interactive `kith join` the test steers
with :func:`read_until`, :func:`drain` and :func:`end_pty_join`) and reading a child's pipe
line by line with arrival times (:class:`Lines`)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable


def in_pty(argv: list[str], *, columns: int, env: dict[str, str] | None = None, timeout: float = 90,
           replies: list[tuple[str, str | Callable[[], str]]] = ()) -> tuple[str, int]:
    """Run ``argv`` with stdin/stdout/stderr on a pseudo-terminal of ``columns`` columns;
    each ``(pattern, text)`` of ``replies`` types ``text`` (or what the callable returns,
    called then) once ``pattern`` appeared in the output after the previous reply. Returns (everything written, exit code)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                            env={**os.environ, "COLUMNS": str(columns), "TERM": "xterm", **(env or {})},
                            start_new_session=True)
    os.close(slave)
    out, pending, seen_from = b"", list(replies), 0
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
            if pending and pending[0][0].encode() in out[seen_from:]:
                seen_from = len(out)
                reply = pending.pop(0)[1]
                os.write(master, (reply if isinstance(reply, str) else reply()).encode())
        else:
            raise AssertionError(f"{argv[3:]} still running after {timeout} s: {out.decode(errors='replace')!r}")
        return out.decode("utf-8", errors="replace"), proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def join_on_pty(home, invite, *flags: str, env: dict[str, str]) -> tuple[int, int, int]:
    """``kith --home HOME join INVITE --trust FLAGS`` with stdin and stdout on a
    pseudo-terminal (the ``ask>`` prompt) and stderr on a pipe, in environment ``env``.

    Returns:
        ``(pid, pty master fd, stderr read fd)``; :func:`end_pty_join` closes them.
    """
    from support.cli import KITH

    err_r, err_w = os.pipe()
    pid, master = pty.fork()
    if pid == 0:  # the child
        os.dup2(err_w, 2)
        os.execvpe(sys.executable, [*KITH, "--home", str(home), "join", str(invite), *flags, "--trust"], env)
    os.close(err_w)
    return pid, master, err_r


def read_until(fd: int, needle: bytes, timeout: float, buf: bytearray) -> None:
    """Read the raw pipe ``fd`` (unbuffered: select on it is sound) into ``buf`` until
    ``needle`` is in it; fails after ``timeout`` s or at EOF."""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} not seen; got {bytes(buf)!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"EOF before {needle!r}; got {bytes(buf)!r}"
            buf += chunk


def drain(fd: int, buf: bytearray) -> None:
    """Read what is left on the pipe ``fd`` into ``buf``: until EOF (the child exited) or
    until nothing came for 0.2 s (a child still running)."""
    while select.select([fd], [], [], 0.2)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk


def end_pty_join(pid: int, code: int | None, master: int, err: int) -> None:
    """The end of a :func:`join_on_pty` child: killed and reaped unless it exited (``code``
    is its exit code, None while it runs), and both fds closed."""
    if code is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    os.close(master)
    os.close(err)


class Lines:
    """Read a child's pipe in a thread: every line with the time it arrived."""

    def __init__(self, pipe) -> None:
        import threading

        self.lines: list[tuple[float, str]] = []
        self._t = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._t.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, text: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if text in line:
                    return t
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not seen in {timeout} s: {self.lines}")

    def text(self) -> str:
        self._t.join(timeout=10)
        return "\n".join(line for _, line in self.lines)
