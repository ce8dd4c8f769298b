"""Running `kith` where a person would see it: on a pseudo-terminal (:func:`in_pty`, with
replies typed at prompts) and reading a child's pipe line by line with arrival times
(:class:`Lines`)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
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
