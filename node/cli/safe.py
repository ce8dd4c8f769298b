"""Text that came from a peer, a server or a file, made safe to print (imports nothing:
:mod:`node.cli.common` re-exports :func:`safe_text`, and the rich consoles of
:mod:`node.cli.consoles` use it without importing the CLI's plumbing)."""

from __future__ import annotations

_CONTROL = dict.fromkeys([*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0),
                          0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)], "\ufffd")


def safe_text(text: object) -> str:
    """``text`` with control characters (C0 except tab/newline, DEL, C1) and bidirectional
    overrides replaced by U+FFFD, for printing text that came from a peer, a server or a
    file: terminal escape sequences never reach the terminal."""
    return str(text).translate(_CONTROL)
