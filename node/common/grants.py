"""Grants that end: the ``--until DATE|DURATION`` of a peer pin, an override and a group
membership (specs/policy.md §8, specs/peers.md §12).

A grant's end is stored as RFC 3339 UTC (``YYYY-MM-DDTHH:MM:SSZ``); it is in force while
``now < until``. :func:`parse_until` turns what the owner typed into that form;
:func:`until_time` reads it back (Unix seconds). The running host ends the sessions of a
grant that just ended (:mod:`node.host.grants`); every decision made after that
ignores it. Pure time arithmetic below the trust and policy layers, which both read grant
ends (tests/test_layers.py).
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from node.common.errors import UsageError

_DURATION_RE = re.compile(r"([1-9][0-9]{0,8})([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_STAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
#: The longest grant one ``--until`` may give (10 years, s).
MAX_GRANT_S = 10 * 366 * 86400


def _stamp(ts: float) -> str:
    return datetime.fromtimestamp(int(ts), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_until(text: str, now: float | None = None) -> str:
    """The end of a grant from ``--until`` (``now``: Unix s, default the wall clock).

    Accepts a duration from now (``90s``, ``30m``, ``12h``, ``7d``, ``2w``), a date
    (``2027-01-31``: the grant ends at the *start* of that day, 00:00 UTC) or an RFC 3339
    UTC time (``2027-01-31T18:00:00Z``).

    Returns:
        RFC 3339 UTC, whole seconds.

    Raises:
        UsageError: ``grant-bad-until`` for anything else, a time not after ``now``, or more
            than 10 years ahead.
    """
    now = time.time() if now is None else now
    raw = text.strip() if isinstance(text, str) else ""
    m = _DURATION_RE.fullmatch(raw)
    if m:
        end = now + int(m.group(1)) * _UNIT_S[m.group(2)]
    elif _DATE_RE.fullmatch(raw) or _STAMP_RE.fullmatch(raw):
        end = until_time(raw if "T" in raw else raw + "T00:00:00Z")
    else:
        raise UsageError("grant-bad-until", f"--until {raw[:40]!r} is not a date, a time or a duration")
    if end <= now:
        raise UsageError("grant-bad-until", f"--until {raw[:40]!r} is not in the future")
    if end - now > MAX_GRANT_S:
        raise UsageError("grant-bad-until", f"--until {raw[:40]!r} is more than 10 years ahead")
    return _stamp(end)


def until_time(stamp: str) -> float:
    """Unix seconds of a stored grant end (``YYYY-MM-DDTHH:MM:SSZ``).

    Raises:
        UsageError: ``grant-bad-until`` when it is not that form or not a real time.
    """
    if not isinstance(stamp, str) or _STAMP_RE.fullmatch(stamp) is None:
        raise UsageError("grant-bad-until", f"{str(stamp)[:40]!r} is not an RFC 3339 UTC time (YYYY-MM-DDTHH:MM:SSZ)")
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise UsageError("grant-bad-until", f"{stamp!r} is not a real time") from None


def in_force(until: str | None, now: float | None = None) -> bool:
    """True while a grant ending at ``until`` (None: never ends) is in force at ``now``."""
    return until is None or (time.time() if now is None else now) < until_time(until)


def ended(until: str | None, now: float | None = None) -> bool:
    """True once a grant ending at ``until`` has ended (never for None): the one test every
    view (``kith status``, ``peers list``, ``policy list``, the dashboard) reads."""
    return not in_force(until, now)


def until_text(until: str | None, still: str = "until ", now: float | None = None) -> str:
    """A grant's end as every view words it: ``""`` (never ends), ``still + until`` while
    in force (``still`` is ``"until "``, or ``""`` in a column headed "until"), ``ended
    <until>`` once it ended."""
    if until is None:
        return ""
    return f"ended {until}" if ended(until, now) else f"{still}{until}"


__all__ = ["MAX_GRANT_S", "ended", "in_force", "parse_until", "until_text", "until_time"]
