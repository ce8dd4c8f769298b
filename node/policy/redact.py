"""Redaction of text that may be shown to others: logs, events, diagnostics (DESIGN §8, §10).

What a peer sees of an error is only its stable code and the code's fixed message (the
engine sends ``CODES[code]``'s text, never exception text). Logs and event lines a user
may paste elsewhere go through :func:`redact`, which replaces:

* the real paths given (roots, the node home) in any spelling the egress gate's leak scan
  knows (``node.policy.gate.leak_needles``) → ``<path>``;
* any other absolute POSIX/Windows path of two or more segments → ``<path>``;
* hex runs of 32+ characters (keys, signatures, nonces, session and post ids) → their
  first 8 characters and ``…`` (``aeba1fc0…``: enough to tell two apart in one log, not
  enough to use);
* URL query strings (``?…`` after ``scheme://host/path``) → ``?<redacted>``, and the URL's
  host → ``<host>`` — except the strings given as ``keep`` (the community server URL the
  owner gave ``kith host --server``, shown as typed: a log line must not read like a
  template, issue 20);
* IPv4 / bracketed IPv6 addresses with or without a port, and ``name.tld:port`` → ``<host>``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]{1,15})://([^/\s?#]+)([^\s?#]*)(\?[^\s#]*)?")
_HEX = re.compile(r"\b[0-9a-fA-F]{32,}\b")
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b")
_IPV6 = re.compile(r"\[[0-9a-fA-F:.]+\](?::\d{1,5})?")
_HOSTPORT = re.compile(r"\b[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+:\d{1,5}\b")
_POSIX_PATH = re.compile(r"(?<![\w<>:/])/(?:[^\s/'\"<>]+/)+[^\s/'\"<>]*")
_WIN_PATH = re.compile(r"\b[A-Za-z]:[\\/](?:[^\s\\/'\"<>]+[\\/])*[^\s\\/'\"<>]*")


def redact(text: str, paths: Iterable[str] = (), keep: Iterable[str] = ()) -> str:
    """Return ``text`` with real paths, keys, hosts and URL query strings replaced.

    Args:
        text: any text (a log line, an event field).
        paths: real paths that must never appear (roots, home); matched in every spelling
            the egress gate knows, case-insensitively.
        keep: strings shown as they are (the owner's own server URL); a path in ``paths``
            wins over them.

    Returns:
        The redacted text (unchanged when nothing matched).
    """
    from node.policy.gate import leak_needles  # late: gate imports the store

    out = text
    kept = {f"\x00{i}\x00": k for i, k in enumerate(sorted({k for k in keep if k}, key=len, reverse=True))}
    for mark, k in kept.items():
        out = out.replace(k, mark)
    needles = sorted({n.decode("utf-8", "surrogatepass") for n in leak_needles(paths)}, key=len, reverse=True)
    for needle in needles:
        out = re.sub(re.escape(needle), "<path>", out, flags=re.IGNORECASE)

    def url(m: re.Match[str]) -> str:
        return f"{m.group(1)}://<host>{m.group(3)}" + ("?<redacted>" if m.group(4) else "")

    out = _URL.sub(url, out)
    out = _HEX.sub(lambda m: m.group(0)[:8] + "…", out)
    out = _IPV6.sub("<host>", out)
    out = _IPV4.sub("<host>", out)
    out = _HOSTPORT.sub("<host>", out)
    out = _WIN_PATH.sub("<path>", out)
    out = _POSIX_PATH.sub("<path>", out)
    for mark, k in kept.items():
        out = out.replace(mark, k)
    if kept:  # a kept string never carries one of the real paths
        for needle in needles:
            out = re.sub(re.escape(needle), "<path>", out, flags=re.IGNORECASE)
    return out


class RedactingFilter(logging.Filter):
    """A handler filter that rewrites each record's message with :func:`redact`.

    Install it on the handler that prints logs others may see (``kith host`` does, on its
    stderr handler). Exception tracebacks are dropped from such records.

    Args:
        paths: real paths to hide (roots, home).
        keep: strings shown as they are (see :func:`redact`).
    """

    def __init__(self, paths: Iterable[str] = (), keep: Iterable[str] = ()) -> None:
        super().__init__()
        self.paths = list(paths)
        self.keep = list(keep)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage(), self.paths, self.keep)
        record.args = None
        record.exc_info = None
        record.exc_text = None
        return True
