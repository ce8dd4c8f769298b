"""The egress policy: ``<home>/policy.toml`` rules mapping source globs to tiers (DESIGN §10).

A rule is ``glob`` + ``tier`` (+ ``peers`` for the ``peers`` tier). :meth:`Policy.decide`
answers, for one (source, peer), which tier applies and whether the source may leave.
The exact glob, specificity and tie rules are in ``specs/policy.md``; in short:

* ``*`` and ``?`` never cross ``/``; ``**`` (a whole segment) matches zero or more whole
  segments; every other character is literal (no ``[...]`` classes, no escapes).
* The most specific matching glob wins: specificity = the number of literal characters
  (every character that is not ``*`` or ``?``, ``/`` included). Ties → the more
  restrictive tier (never > private > ask > peers > public), then the earlier rule.
* No match, or a source that does not normalize → ``private``.
* ``[[override]]`` tables (``peer`` + ``glob`` + ``tier``) apply only to that registry
  name; they compete with the rules on specificity and win ties (DESIGN §10 "optionally
  per peer").
* ``never`` differs from ``private`` in that no approval or promotion can open it.
* ``[group.NAME]`` tables (``members`` + optional ``until`` per member) name sets of
  registry names; an override's ``peer``, a ``peers`` list and a ``[quota.peer]`` key may
  be ``@NAME``. A peer's groups compete as its own overrides do: among overrides of equal
  specificity naming it directly and through groups, the more restrictive tier decides
  (deny beats allow); a group quota is the most restrictive of its groups', the peer's own
  ``[quota.peer.NAME]`` over it.
* An override and a group membership may carry ``until`` (RFC 3339 UTC): from then on it
  is ignored (:mod:`node.common.grants`).
* ``[[scrub]]`` (``glob`` optional, ``for``, ``kinds``; ``kith policy scrub``): kinds of
  values (:data:`node.common.scrub.KINDS`) replaced by placeholders in what the recipients
  ``for`` names (``"*"``, a registry name, ``@group``) receive from the sources ``glob``
  matches — attached to sources and recipients, never to a tier, so no rule or tier change
  narrows it (:meth:`Policy.scrub_kinds`; specs/policy.md §9.0). The older
  ``[scrub.tier]`` / ``[scrub.peer]`` tables are migrated on read (:func:`_scrub_rules`).

The file is read with stdlib :mod:`tomllib` and written with ``tomli-w`` through
:func:`node.common.home.atomic_write` (0600, tmp+rename). Comments are not preserved on save.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from node.corpus.globs import (  # noqa: F401 - re-exported: the policy speaks this glob language
    MAX_DOUBLE_STARS, MAX_GLOB_CHARS, GlobMatcher, canonical_glob, folder_form, specificity)
from node.corpus.sources import normalize_source
from node.corpus.types import Root
from node.common.errors import KithError, PolicyError
from node.common.home import atomic_write, read_regular

POLICY_FILE = "policy.toml"

#: All tiers, least restrictive first (the index is the restrictiveness rank).
TIERS: tuple[str, ...] = ("public", "peers", "ask", "private", "never")
_RANK = {tier: i for i, tier in enumerate(TIERS)}


def _winner(candidates: Iterable[tuple[int, int, "Rule"]]) -> "Rule | None":
    """The rule that decides among ``(kind, index, rule)`` candidates that all match
    (:meth:`Policy.match`'s order: highest specificity, then an override (kind 0) before a
    rule, then the most restrictive tier, then the earliest), or None when there are none."""
    best = min(candidates, key=lambda c: (-c[2].specificity, c[0], -_RANK[c[2].tier], c[1]), default=None)
    return None if best is None else best[2]
DEFAULT_TIER = "private"

#: Bounds on what a policy may contain (DESIGN §14).
MAX_POLICY_BYTES = 1 << 20

_RULE_KEYS = {"glob", "tier", "peers"}
_OVERRIDE_KEYS = {"peer", "glob", "tier", "until"}
_GROUP_KEYS = {"members", "until"}
#: How a rule, an override or a quota names a group instead of a peer: ``@team``.
GROUP_PREFIX = "@"
#: The most members one group may have.
MAX_GROUP_MEMBERS = 1000
_QUOTA_KEYS = {"queries_per_hour", "burst", "max_message_bytes"}
#: Tiers a legacy ``[scrub.tier]`` entry may name: the ones whose sources reach a peer
#: (``kith policy scrub --for TIER`` accepts them as the old spelling of ``--for '*'``).
SCRUB_TIERS: tuple[str, ...] = ("public", "peers", "ask")
_SCRUB_KEYS = {"glob", "for", "kinds"}
#: A ``[[scrub]]`` ``for`` that covers every peer, pinned or anonymous.
EVERY_PEER = "*"
_COPY_KEYS = {"glob", "for", "until", "max_bytes"}
#: Tiers whose sources a ``[[copy]]`` may let a peer keep (specs/copies.md §1): only what
#: the peer may already be served without asking.
COPY_TIERS: tuple[str, ...] = ("public", "peers")
#: The largest ``max_bytes`` of one grant (bytes of scrubbed UTF-8 text, 16 GiB).
MAX_COPY_BYTES = 1 << 34

#: Quota defaults: per peer (pinned or anonymous key), queries per hour, burst, bytes per
#: answer. A person exploring does not hit them (issue 20): 60 questions back to back, then
#: one every 6 s — a first-time guest asking a few dozen questions in a few minutes is
#: answered every time.
DEFAULT_QUOTA = {"queries_per_hour": 600, "burst": 60, "max_message_bytes": 65536}
#: Anonymous peers (not in the registry) also share one bucket, this many times the
#: default (a peer that rotates keys cannot multiply its quota).
ANONYMOUS_SHARED_FACTOR = 4
#: Smallest accepted ``max_message_bytes`` (an empty answer must still fit).
MIN_MESSAGE_BYTES = 8192


def file_stamp(path: Path) -> tuple[Any, ...]:
    """A cheap identity of the file at ``path`` (one ``os.stat``): device, inode, size,
    mtime and ctime in ns; ``("missing",)`` when absent, ``("error", errno)`` when it
    cannot be stat'ed. Two equal stamps mean "unchanged" (DESIGN §10: a running host
    applies the current policy, specs/policy.md §2.1)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ("missing",)
    except OSError as exc:
        return ("error", exc.errno)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class Rule:
    """One ``[[rule]]``: canonical ``glob``, ``tier``, and ``peers`` (registry names).

    ``peers`` is non-empty exactly when ``tier == "peers"``. ``peer`` is set only for an
    ``[[override]]`` (the one registry name it applies to; its tier is never ``peers``).
    """

    glob: str
    tier: str
    peers: tuple[str, ...] = ()
    peer: str | None = None
    #: an override's end (RFC 3339 UTC), None: it never ends
    until: str | None = None
    matcher: GlobMatcher = field(init=False, repr=False, compare=False)
    specificity: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "matcher", GlobMatcher(self.glob))
        object.__setattr__(self, "specificity", specificity(self.glob))

    def to_toml(self) -> dict[str, Any]:
        """The rule as a TOML table (``peers`` only when non-empty)."""
        out: dict[str, Any] = {"peer": self.peer} if self.peer is not None else {}
        out.update({"glob": self.glob, "tier": self.tier})
        if self.peers:
            out["peers"] = list(self.peers)
        if self.until is not None:
            out["until"] = self.until
        return out


@dataclass(frozen=True)
class Decision:
    """The policy outcome for one (source, peer) (DESIGN §10).

    Attributes:
        canonical: the normalized source id, ``None`` when the source is invalid.
        tier: the tier that applies (``private`` when nothing matched or invalid).
        allowed: whether the source may be sent to this peer now (``public``, or ``peers``
            with the peer listed). ``ask`` is always ``False`` here: an ``ask`` source is
            opened only by an owner's approval (:meth:`node.policy.gate.EgressGate.screen`).
        matched: the canonical glob of the winning rule, ``None`` when nothing matched.
        override: the registry name of the ``[[override]]`` that decided, else ``None``.
    """

    canonical: str | None
    tier: str
    allowed: bool
    matched: str | None
    override: str | None = None


_NAME_RULE = "1-64 of [A-Za-z0-9_.-], starting with a letter or digit"


def _is_peer_name(name: object) -> bool:
    from node.trust.peers import NAME_RE  # late: keep the policy store importable on its own

    return isinstance(name, str) and NAME_RE.fullmatch(name) is not None


def _is_principal(name: object) -> bool:
    """A registry name, or ``@`` and a group name."""
    return _is_peer_name(name) or (isinstance(name, str) and name.startswith(GROUP_PREFIX)
                                   and _is_peer_name(name[len(GROUP_PREFIX):]))


def check_peer_names(names: Iterable[str], what: str = "peer name", *, groups: bool = False) -> None:
    """Refuse any of ``names`` that could never be a registry name (specs/peers.md §1:
    :data:`node.trust.peers.NAME_RE`) — a rule naming it would silently match nobody.

    Args:
        groups: also accept ``@GROUP`` (a group name, the same rule).

    Raises:
        PolicyError: ``peer-bad-name`` naming the first bad name (shown with ``repr``,
            control characters escaped).
    """
    for name in names:
        if not (_is_principal(name) if groups else _is_peer_name(name)):
            raise PolicyError("peer-bad-name", f"{what} {str(name)[:80]!a} is not a registry name ({_NAME_RULE})")


def _check_peer_name(peer: object, where: str, key: str = "peer") -> str:
    """``peer`` when it is a registry name or ``@group``; ``key`` is the TOML key named in
    the ``policy-invalid`` raised otherwise."""
    if not _is_principal(peer):
        raise PolicyError("policy-invalid", f"{where}{key!r} must be a registry name or @group ({_NAME_RULE})")
    return peer  # type: ignore[return-value]


def _check_until(until: object, where: str) -> str | None:
    from node.common.grants import until_time

    if until is None:
        return None
    try:
        until_time(until)  # type: ignore[arg-type]
    except KithError:  # grant-bad-until: in a file it is a policy error
        raise PolicyError("policy-invalid", f"{where}'until' must be RFC 3339 UTC (YYYY-MM-DDTHH:MM:SSZ)") from None
    return until  # type: ignore[return-value]


@dataclass(frozen=True)
class Group:
    """One ``[group.NAME]`` (``kith peers group``): registry names, each with an optional
    end of its membership.

    Attributes:
        name: the group name (a registry-name-shaped word; rules name it ``@name``).
        members: registry name → its membership's end (RFC 3339 UTC) or None.
    """

    name: str
    members: dict[str, str | None]

    def to_toml(self) -> dict[str, Any]:
        """``{"members": [...], "until": {name: end}}`` (``until`` only when set)."""
        out: dict[str, Any] = {"members": sorted(self.members)}
        ends = {n: u for n, u in sorted(self.members.items()) if u is not None}
        if ends:
            out["until"] = ends
        return out


def _make_group(name: object, table: object, where: str) -> Group:
    if not _is_peer_name(name):
        raise PolicyError("policy-invalid", f"{where}a group name must be {_NAME_RULE}")
    if not isinstance(table, dict) or set(table) - _GROUP_KEYS or "members" not in table:
        raise PolicyError("policy-invalid", f"{where}a group is a table with 'members' (and 'until')")
    members, ends = table["members"], table.get("until") or {}
    if (not isinstance(members, list) or not all(_is_peer_name(m) for m in members)
            or len(members) > MAX_GROUP_MEMBERS):
        raise PolicyError("policy-invalid", f"{where}'members' must be a list of registry names ({_NAME_RULE})")
    if not isinstance(ends, dict) or any(k not in members for k in ends):
        raise PolicyError("policy-invalid", f"{where}'until' must be a table of members' ends")
    return Group(name, {m: _check_until(ends.get(m), f"{where}until.{m}: ") for m in dict.fromkeys(members)})


def _make_rule(glob: object, tier: object, peers: object, where: str, *,
               peer: str | None = None, until: str | None = None) -> Rule:
    canon = canonical_glob(glob, where=where)  # type: ignore[arg-type]
    if not isinstance(tier, str) or tier not in _RANK:
        raise PolicyError("policy-bad-tier",
                          f"{where}tier {tier!r} is not one of {', '.join(TIERS)}")
    if peer is not None:
        if tier == "peers" or peers:
            raise PolicyError("policy-invalid",
                              f"{where}an override already names its peer: tier 'peers' and 'peers' are not allowed")
        return Rule(canon, tier, (), peer, until)
    if peers is None:
        names: tuple[str, ...] = ()
    elif isinstance(peers, (list, tuple)) and all(_is_principal(p) for p in peers):
        names = tuple(dict.fromkeys(peers))
    else:
        raise PolicyError("policy-invalid", f"{where}'peers' must be a list of registry names ({_NAME_RULE})")
    if tier == "peers" and not names:
        raise PolicyError("policy-invalid", f"{where}tier 'peers' needs a non-empty 'peers' list")
    if tier != "peers" and names:
        raise PolicyError("policy-invalid", f"{where}'peers' is only allowed with tier 'peers'")
    return Rule(canon, tier, names)


def _check_quota_values(table: object, where: str, *, allow_peer: bool) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise PolicyError("policy-invalid", f"{where}must be a table")
    allowed = _QUOTA_KEYS | ({"peer", "anonymous"} if allow_peer else set())
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in allowed:
            raise PolicyError("policy-invalid", f"{where}unknown key {key!r}")
        if key == "peer":
            if not isinstance(value, dict):
                raise PolicyError("policy-invalid", f"{where}'peer' must be a table of tables")
            out["peer"] = {_check_peer_name(name, f"{where}peer.{name!a}: "):
                           _check_quota_values(sub, f"{where}peer.{name}: ", allow_peer=False)
                           for name, sub in value.items()}
        elif key == "anonymous":
            out["anonymous"] = _check_quota_values(value, f"{where}anonymous: ", allow_peer=False)
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 10**9:
            raise PolicyError("policy-invalid", f"{where}{key!r} must be an integer from 0 to 10^9")
        elif key == "max_message_bytes" and value < MIN_MESSAGE_BYTES:
            raise PolicyError("policy-invalid", f"{where}'max_message_bytes' must be at least {MIN_MESSAGE_BYTES}")
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class ScrubRule:
    """One ``[[scrub]]`` entry (specs/policy.md §9.0): ``kinds`` are scrubbed from every
    source ``glob`` matches (None: every source) in what ``recipient`` receives.

    Attributes:
        recipient: the TOML ``for``: :data:`EVERY_PEER`, a registry name or ``@group``.
        kinds: kinds of :data:`node.common.scrub.KINDS`, non-empty, in that order.
        glob: the canonical §3 glob, or None for every source (UNC ids included).
    """

    recipient: str
    kinds: tuple[str, ...]
    glob: str | None = None
    matcher: GlobMatcher | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "matcher", None if self.glob is None else GlobMatcher(self.glob))

    def covers(self, canonical: str) -> bool:
        """Whether the entry's glob matches the canonical source id (always, without one)."""
        return self.matcher is None or self.matcher.match(canonical)

    def to_toml(self) -> dict[str, Any]:
        """``{"glob"?, "for", "kinds"}`` (``glob`` only when set)."""
        out: dict[str, Any] = {} if self.glob is None else {"glob": self.glob}
        out.update({"for": self.recipient, "kinds": list(self.kinds)})
        return out


def _merged_scrubs(rules: Iterable[ScrubRule]) -> list[ScrubRule]:
    """``rules`` with entries of the same (glob, for) merged into the first (kinds united),
    in first-seen order."""
    from node.common.scrub import check_kinds

    merged: dict[tuple[str | None, str], set[str]] = {}
    for r in rules:
        merged.setdefault((r.glob, r.recipient), set()).update(r.kinds)
    return [ScrubRule(who, check_kinds(kinds), glob) for (glob, who), kinds in merged.items() if kinds]


def _scrub_rules(raw: object, name: str) -> tuple[list[ScrubRule], bool]:
    """The ``scrub`` key of a policy document as :class:`ScrubRule` s, and whether it was
    the legacy table form (specs/policy.md §2: migrated on read).

    ``[[scrub]]`` (a list): each table checked (``for`` required, ``glob`` optional,
    ``kinds`` a non-empty list). Legacy ``[scrub]`` (a table of ``tier`` / ``peer``
    sub-tables): every ``[scrub.tier]`` list becomes one entry for :data:`EVERY_PEER` and
    every source (kinds united; nothing it scrubbed before is unscrubbed), every
    ``[scrub.peer]`` NAME list an entry for NAME and every source.

    Raises:
        PolicyError: ``policy-invalid`` (unknown key, a tier that never reaches a peer, a
            name that is no registry name or group, not a list, an empty ``kinds``),
            ``policy-bad-glob``, ``scrub-bad-kind``.
    """
    from node.common.scrub import check_kinds

    if isinstance(raw, list):
        out = []
        for where, table in _array_of_tables({"scrub": raw}, "scrub", name, _SCRUB_KEYS, ("for", "kinds")):
            who = table["for"]
            if who in TIERS:
                raise PolicyError("policy-invalid", f"{where}'for' names who receives, not a tier: "
                                  f"\"*\" (every peer), a registry name or @group (specs/policy.md §9.0)")
            if who != EVERY_PEER:
                _check_peer_name(who, where, "for")
            kinds = table["kinds"]
            if not isinstance(kinds, list) or not kinds:
                raise PolicyError("policy-invalid", f"{where}'kinds' must be a non-empty list of kinds")
            glob = canonical_glob(table["glob"], where=where) if "glob" in table else None
            out.append(ScrubRule(who, check_kinds(kinds, where), glob))
        return _merged_scrubs(out), False
    where = f"{name}: [scrub]: "
    if not isinstance(raw, dict):
        raise PolicyError("policy-invalid", f"{where}must be [[scrub]] tables (or the older [scrub.tier] table)")
    every: list[str] = []
    named: list[ScrubRule] = []
    for key, sub in raw.items():
        if key not in ("tier", "peer"):
            raise PolicyError("policy-invalid", f"{where}unknown key {key!r} (use [[scrub]] with glob, for, kinds)")
        if not isinstance(sub, dict):
            raise PolicyError("policy-invalid", f"{where}{key!r} must be a table")
        for target, kinds in sub.items():
            at = f"{where}{key}.{target!a}: "
            if key == "tier" and target not in SCRUB_TIERS:
                raise PolicyError("policy-invalid", f"{at}scrubbing applies to tiers {', '.join(SCRUB_TIERS)} "
                                  "(the others never reach a peer)")
            if key == "peer":
                _check_peer_name(target, at)
            if not isinstance(kinds, list):
                raise PolicyError("policy-invalid", f"{at}must be a list of kinds")
            got = check_kinds(kinds, at)
            if key == "tier":
                every.extend(got)
            elif got:
                named.append(ScrubRule(target, got))
    first = [ScrubRule(EVERY_PEER, check_kinds(every))] if every else []
    return _merged_scrubs(first + named), True


@dataclass(frozen=True)
class CopyGrant:
    """One ``[[copy]]`` entry (specs/copies.md §1): ``recipient`` may keep a copy of the
    sources ``glob`` matches that it may already see (tier ``public``/``peers`` for it).

    Attributes:
        glob: the canonical §3 glob of the sources.
        recipient: the TOML ``for``: a registry name (a person pin's name too) or ``@group``.
        until: RFC 3339 UTC end of the grant, or None (until removed).
        max_bytes: the most bytes of (scrubbed, UTF-8) text the copy may hold, or None.
    """

    glob: str
    recipient: str
    until: str | None = None
    max_bytes: int | None = None
    matcher: GlobMatcher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "matcher", GlobMatcher(self.glob))

    def to_toml(self) -> dict[str, Any]:
        """``{"glob", "for", "until"?, "max_bytes"?}``."""
        out: dict[str, Any] = {"glob": self.glob, "for": self.recipient}
        if self.until is not None:
            out["until"] = self.until
        if self.max_bytes is not None:
            out["max_bytes"] = self.max_bytes
        return out


def _check_max_bytes(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COPY_BYTES:
        raise PolicyError("policy-invalid", f"{where}'max_bytes' must be an integer 1-{MAX_COPY_BYTES}")
    return value


def _copy_grants(raw: object, name: str) -> list[CopyGrant]:
    """The ``copy`` key of a policy document as :class:`CopyGrant` s (one per (glob, for);
    a later duplicate replaces the earlier).

    Raises:
        PolicyError: ``policy-invalid`` (unknown key, a ``for`` that is no registry name
            or group, a bad ``until`` or ``max_bytes``), ``policy-bad-glob``.
    """
    out: dict[tuple[str, str], CopyGrant] = {}
    for where, table in _array_of_tables({"copy": raw}, "copy", name, _COPY_KEYS, ("glob", "for")):
        who = table["for"]
        if not _is_principal(who):
            raise PolicyError("policy-invalid", f"{where}'for' must be a registry name or @group ({_NAME_RULE})")
        glob = canonical_glob(table["glob"], where=where)
        grant = CopyGrant(glob, who, _check_until(table.get("until"), where),
                          _check_max_bytes(table.get("max_bytes"), where))
        out[(glob, who)] = grant
    return list(out.values())


@dataclass(frozen=True)
class Quota:
    """One peer's quota (DESIGN §10).

    Attributes:
        queries_per_hour: sustained rate (a token bucket refilled at this rate); 0 = the
            peer may not query at all.
        burst: bucket size (queries allowed back to back); at least 1 when the rate > 0.
        max_message_bytes: largest ``results`` message sent to this peer (bytes of the
            encoded JSON line); results are dropped from the end until it fits.
    """

    queries_per_hour: int
    burst: int
    max_message_bytes: int


def _array_of_tables(doc: dict[str, Any], key: str, name: str, allowed: Any,
                     required: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """The ``[[key]]`` tables of a policy document, each checked for unknown and missing
    keys, paired with the ``where`` prefix its errors use (``"<file>: [[rule]] #2: "``).

    Raises:
        PolicyError: ``policy-invalid`` naming the file, the table and the key.
    """
    tables = doc.get(key, [])
    if not isinstance(tables, list):
        raise PolicyError("policy-invalid", f"{name}: '{key}' must be an array of tables ([[{key}]])")
    out = []
    for i, table in enumerate(tables, start=1):
        where = f"{name}: [[{key}]] #{i}: "
        if not isinstance(table, dict):
            raise PolicyError("policy-invalid", f"{where}must be a table")
        for k in table:
            if k not in allowed:
                raise PolicyError("policy-invalid", f"{where}unknown key {k!r}")
        for k in required:
            if k not in table:
                raise PolicyError("policy-invalid", f"{where}missing key {k!r}")
        out.append((where, table))
    return out


class Policy:
    """The rules of ``<home>/policy.toml`` plus its ``[quota]`` table.

    Args:
        rules: the rules in file order.
        quota: the parsed ``[quota]`` table (kept and written back; the per-peer rate
            limit of :mod:`node.policy.quota`).
        path: where :meth:`save` writes; ``None`` for an in-memory policy.
    """

    def __init__(self, rules: Iterable[Rule] = (), quota: dict[str, Any] | None = None,
                 path: Path | None = None, overrides: Iterable[Rule] = (),
                 groups: dict[str, Group] | None = None, scrubs: Iterable[ScrubRule] = ()) -> None:
        self._rules: list[Rule] = list(rules)
        self._overrides: list[Rule] = list(overrides)
        #: ``[group.NAME]`` tables by name (``kith peers group``).
        self.groups: dict[str, Group] = dict(groups or {})
        #: Unix time (s) the ends of grants are compared with; the host sets its clock's
        #: :meth:`node.runtime.clock.Clock.time`, and a re-read policy keeps it.
        self.now: Any = time.time
        self.quota: dict[str, Any] = dict(quota or {})
        self._scrubs: list[ScrubRule] = _merged_scrubs(scrubs)
        #: ``[[copy]]`` grants in file order (specs/copies.md §1)
        self._copies: list[CopyGrant] = []
        #: True when the file held the legacy ``[scrub.tier]``/``[scrub.peer]`` form (read
        #: as ``[[scrub]]``; :meth:`save` writes the new form)
        self.scrub_migrated = False
        self.path = path
        #: :func:`file_stamp` of :attr:`path` taken just before :meth:`load` read it;
        #: ``None`` for a policy not loaded from a file (never re-read, see
        #: :meth:`node.policy.gate.EgressGate.current_policy`).
        self.source_stamp: tuple[Any, ...] | None = None

    # --- loading / saving -------------------------------------------------------------
    @classmethod
    def load(cls, home: Path) -> Policy:
        """Read ``<home>/policy.toml``; a missing file is an empty policy.

        Raises:
            PolicyError: ``policy-invalid`` (unreadable, too large, not UTF-8, bad TOML,
                unknown key, wrong type), ``policy-bad-tier``, ``policy-bad-glob``,
                ``scrub-bad-kind``; the message names the file and the key or the
                1-based ``[[rule]]`` number.
        """
        path = Path(home) / POLICY_FILE
        stamp = file_stamp(path)  # before reading: a change after this is seen as a change
        try:
            raw = read_regular(path, MAX_POLICY_BYTES + 1)
        except FileNotFoundError:
            empty = cls(path=path)
            empty.source_stamp = stamp
            return empty
        except OSError as exc:
            raise PolicyError("policy-invalid", f"{path}: cannot be read ({exc.strerror})") from None
        if len(raw) > MAX_POLICY_BYTES:
            raise PolicyError("policy-invalid", f"{path}: larger than {MAX_POLICY_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PolicyError("policy-invalid", f"{path}: not UTF-8") from None
        policy = cls.from_toml(text, path=path)
        policy.source_stamp = stamp
        return policy

    @classmethod
    def from_toml(cls, text: str, *, path: Path | None = None) -> Policy:
        """Parse policy TOML ``text`` (see :meth:`load` for errors); ``path`` names it."""
        name = str(path) if path is not None else POLICY_FILE
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError("policy-invalid", f"{name}: not valid TOML: {exc}") from None
        for key in doc:
            if key not in ("rule", "override", "quota", "group", "scrub", "copy"):
                raise PolicyError("policy-invalid", f"{name}: unknown key {key!r}")
        rules = [_make_rule(t["glob"], t["tier"], t.get("peers"), where)
                 for where, t in _array_of_tables(doc, "rule", name, _RULE_KEYS, ("glob", "tier"))]
        overrides = [_make_rule(t["glob"], t["tier"], None, where, peer=_check_peer_name(t["peer"], where),
                                until=_check_until(t.get("until"), where))
                     for where, t in _array_of_tables(doc, "override", name, _OVERRIDE_KEYS,
                                                      ("peer", "glob", "tier"))]
        quota = (_check_quota_values(doc["quota"], f"{name}: [quota]: ", allow_peer=True)
                 if "quota" in doc else {})
        raw_groups = doc.get("group", {})
        if not isinstance(raw_groups, dict):
            raise PolicyError("policy-invalid", f"{name}: 'group' must be a table of tables ([group.NAME])")
        groups = {g: _make_group(g, t, f"{name}: [group.{str(g)[:64]}]: ") for g, t in raw_groups.items()}
        scrubs, migrated = _scrub_rules(doc["scrub"], name) if "scrub" in doc else ([], False)
        policy = cls(rules, quota, path, overrides, groups, scrubs)
        policy.scrub_migrated = migrated
        policy._copies = _copy_grants(doc["copy"], name) if "copy" in doc else []
        return policy

    def to_toml(self) -> str:
        """Serialize to TOML (a header comment, ``[[rule]]`` tables, ``[quota]``, then
        ``[[scrub]]``)."""
        doc: dict[str, Any] = {}
        if self._rules:
            doc["rule"] = [r.to_toml() for r in self._rules]
        if self._overrides:
            doc["override"] = [r.to_toml() for r in self._overrides]
        if self.quota:
            doc["quota"] = self.quota
        if self.groups:
            doc["group"] = {n: g.to_toml() for n, g in sorted(self.groups.items())}
        if self._scrubs:
            doc["scrub"] = [s.to_toml() for s in self._scrubs]
        if self._copies:
            doc["copy"] = [c.to_toml() for c in self._copies]
        header = ("# Kith egress policy (DESIGN §10). Written by `kith policy`; "
                  "comments are not kept.\n")
        return header + tomli_w.dumps(doc)

    def save(self) -> None:
        """Write the policy to :attr:`path` atomically with mode 0600 (DESIGN §13).

        Raises:
            ValueError: if the policy has no path (built in memory).
        """
        if self.path is None:
            raise ValueError("in-memory policy has no path to save to")
        atomic_write(self.path, self.to_toml().encode("utf-8"), mode=0o600)

    # --- editing ------------------------------------------------------------------------
    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules in file order."""
        return tuple(self._rules)

    @property
    def overrides(self) -> tuple[Rule, ...]:
        """The ``[[override]]`` rules in file order."""
        return tuple(self._overrides)

    def rules_naming(self, prefix: str) -> list[str]:
        """Rules and overrides whose glob names the source root ``prefix`` (``/prefix`` or
        below), as ``"GLOB -> TIER"`` lines (``" (override for NAME)"`` appended for an
        override): what a removed root leaves matching nothing (``kith index remove``,
        the dashboard's *Remove*)."""
        prefix = prefix.strip("/")
        return [f"{r.glob} -> {r.tier}" + (f" (override for {r.peer})" if r.peer else "")
                for r in (*self._rules, *self._overrides)
                if r.glob == f"/{prefix}" or r.glob.startswith(f"/{prefix}/")]

    def rule_for(self, glob: str, *, for_peer: str | None = None) -> Rule | None:
        """The rule (with ``for_peer``: that peer's override) whose canonical glob equals
        ``glob``'s, or None: what :meth:`set` would replace.

        Raises:
            PolicyError: ``policy-bad-glob`` when ``glob`` is invalid.
        """
        canon = canonical_glob(glob)
        current = self._rules if for_peer is None else self._overrides
        return next((r for r in current if r.glob == canon and r.peer == for_peer), None)

    def same_sources(self, rule: Rule) -> list[Rule]:
        """The other rules (for an override: that peer's other overrides) whose glob is
        spelled differently but names exactly the same sources (``/x`` and ``/x/**``, equal
        :func:`node.corpus.globs.folder_form`), in file order. They tie with ``rule`` on
        specificity, so the more restrictive tier decides (specs/policy.md §4)."""
        form = folder_form(rule.glob)
        current = self._rules if rule.peer is None else self._overrides
        return [r for r in current
                if r.peer == rule.peer and r.glob != rule.glob and folder_form(r.glob) == form]

    def set(self, glob: str, tier: str, peers: Sequence[str] | None = None, *,
            for_peer: str | None = None, until: str | None = None) -> Rule:
        """Add or replace the rule for ``glob`` (compared in canonical form).

        With ``for_peer`` (a registry name or ``@group``), add or replace the
        ``[[override]]`` for (that peer, ``glob``) instead, ending at ``until`` (RFC 3339
        UTC, :func:`node.common.grants.parse_until`; None: never). A replaced rule keeps
        its position; later duplicates of the same glob are removed. Does not save.

        Returns:
            The new :class:`Rule`.

        Raises:
            PolicyError: ``policy-bad-glob``, ``policy-bad-tier``, ``peer-bad-name`` (a
                ``for_peer`` or ``peers`` name that is not a registry name,
                :data:`node.trust.peers.NAME_RE`), or ``policy-invalid`` (``peers`` tier without
                peers, or peers with another tier).
        """
        if isinstance(peers, str):
            peers = [peers]
        if for_peer is not None:
            check_peer_names([for_peer], "--for name", groups=True)
        elif until is not None:
            raise PolicyError("policy-invalid", "only an override (--for NAME) takes --until")
        check_peer_names(peers or (), "--peer name", groups=True)
        rule = _make_rule(glob, tier, list(peers) if peers else None, "", peer=for_peer,
                          until=_check_until(until, ""))
        kept: list[Rule] = []
        placed = False
        current = self._rules if for_peer is None else self._overrides
        for old in current:
            if old.glob == rule.glob and old.peer == rule.peer:
                if not placed:
                    kept.append(rule)
                    placed = True
                continue
            kept.append(old)
        if not placed:
            kept.append(rule)
        if for_peer is None:
            self._rules = kept
        else:
            self._overrides = kept
        return rule

    def unset(self, glob: str, *, for_peer: str | None = None) -> bool:
        """Remove every rule (or, with ``for_peer``, every override for that peer) whose
        canonical glob equals ``glob``'s; ``True`` if any was.

        Raises:
            PolicyError: ``policy-bad-glob`` when ``glob`` itself is invalid;
                ``peer-bad-name`` when ``for_peer`` is not a registry name.
        """
        canon = canonical_glob(glob)
        if for_peer is not None:
            check_peer_names([for_peer], "--for name", groups=True)
            before = len(self._overrides)
            self._overrides = [r for r in self._overrides if not (r.glob == canon and r.peer == for_peer)]
            return len(self._overrides) != before
        before = len(self._rules)
        self._rules = [r for r in self._rules if r.glob != canon]
        return len(self._rules) != before

    def set_quota(self, values: dict[str, int], *, for_peer: str | None = None,
                  anonymous: bool = False) -> dict[str, Any]:
        """Set keys of the ``[quota]`` table (``kith policy quota``); does not save.

        Args:
            values: some of ``queries_per_hour``, ``burst``, ``max_message_bytes``
                (integers, the rules of :func:`_check_quota_values`: 0…10^9,
                ``max_message_bytes`` ≥ :data:`MIN_MESSAGE_BYTES`); keys not given keep
                their value.
            for_peer: set ``[quota.peer.<name>]`` (that registry name only) instead.
            anonymous: set ``[quota.anonymous]`` (the bucket all anonymous peers share).

        Returns:
            The table as now stored (only the keys it sets itself).

        Raises:
            PolicyError: ``policy-invalid`` for a value out of range or an unknown key,
                ``peer-bad-name`` for a ``for_peer`` that is not a registry name. Nothing
                changes when one is raised.
        """
        if for_peer is not None and anonymous:
            raise ValueError("for_peer and anonymous exclude each other")
        checked = _check_quota_values(dict(values), "quota: ", allow_peer=False)
        if for_peer is not None:
            check_peer_names([for_peer], "--for name", groups=True)
            peers = dict(self.quota.get("peer") or {})
            table = {**(peers.get(for_peer) or {}), **checked}
            peers[for_peer] = table
            self.quota = {**self.quota, "peer": peers}
        elif anonymous:
            table = {**(self.quota.get("anonymous") or {}), **checked}
            self.quota = {**self.quota, "anonymous": table}
        else:
            self.quota = {**self.quota, **checked}
            table = {k: v for k, v in self.quota.items() if k in _QUOTA_KEYS}
        return dict(table)

    def quota_for(self, peer_name: str | None) -> Quota:
        """The quota of ``peer_name`` (``None``: an anonymous peer): ``[quota.peer.<name>]``
        over its groups' ``[quota.peer."@group"]`` over ``[quota]`` over
        :data:`DEFAULT_QUOTA`, key by key; where several of its groups set a key, the
        smallest value (the most restrictive) is taken. ``peer_name`` may be ``@group``
        (that group's own quota)."""
        merged = dict(DEFAULT_QUOTA)
        merged.update({k: v for k, v in self.quota.items() if k in _QUOTA_KEYS})
        if peer_name is not None:
            tables = self.quota.get("peer") or {}
            from_groups: dict[str, int] = {}
            for group in sorted(self.groups_of(peer_name)):
                for k, v in (tables.get(group) or {}).items():
                    from_groups[k] = min(v, from_groups.get(k, v))
            merged.update(from_groups)
            merged.update(tables.get(peer_name) or {})
        return Quota(**merged)

    # --- groups ---------------------------------------------------------------------------
    def groups_of(self, peer_name: str | None) -> set[str]:
        """The groups ``peer_name`` is a member of now, as ``@name`` (memberships whose
        ``until`` has passed at :attr:`now` are left out)."""
        if peer_name is None or peer_name.startswith(GROUP_PREFIX):
            return set()
        from node.common.grants import in_force

        now = self.now()
        return {GROUP_PREFIX + g.name for g in self.groups.values()
                if peer_name in g.members and in_force(g.members[peer_name], now)}

    def groups_by_member(self) -> dict[str, dict[str, str | None]]:
        """Registry name → {group name → that membership's end (RFC 3339) or None}, ended
        memberships included (the owner's view: ``kith peers list``, the dashboard)."""
        out: dict[str, dict[str, str | None]] = {}
        for g in self.groups.values():
            for member, until in g.members.items():
                out.setdefault(member, {})[g.name] = until
        return out

    def add_members(self, group: str, names: Sequence[str], until: str | None = None) -> Group:
        """Add ``names`` to ``group`` (made when new), each membership ending at ``until``
        (RFC 3339 UTC or None: never); a member added again takes the new ``until``. Does
        not save.

        Raises:
            PolicyError: ``peer-bad-name`` (a group or member name that is not a registry
                name), ``policy-invalid`` (more than :data:`MAX_GROUP_MEMBERS`).
        """
        check_peer_names([group], "group name")
        check_peer_names(names, "member name")
        members = dict(self.groups[group].members) if group in self.groups else {}
        members.update({n: _check_until(until, "") for n in names})
        if len(members) > MAX_GROUP_MEMBERS:
            raise PolicyError("policy-invalid", f"a group has at most {MAX_GROUP_MEMBERS} members")
        self.groups[group] = Group(group, members)
        return self.groups[group]

    def remove_members(self, group: str, names: Sequence[str] = ()) -> Group:
        """Remove ``names`` from ``group``, or the whole group when ``names`` is empty (its
        rules stay and match nobody). Does not save.

        Returns:
            The group as it was before.

        Raises:
            PolicyError: ``group-not-found``; ``group-member-not-found`` (a name that is not
                a member).
        """
        old = self.groups.get(group)
        if old is None:
            raise PolicyError("group-not-found", f"no group named {str(group)[:64]!r}")
        missing = [n for n in names if n not in old.members]
        if missing:
            raise PolicyError("group-member-not-found", f"{missing[0][:64]!r} is not a member of {group!r}")
        if names:
            self.groups[group] = Group(group, {n: u for n, u in old.members.items() if n not in names})
        else:
            del self.groups[group]
        return old

    def anonymous_quota(self) -> Quota:
        """The bucket all anonymous peers share: ``[quota.anonymous]``, else the anonymous
        per-peer quota's rate and burst times :data:`ANONYMOUS_SHARED_FACTOR`."""
        base = self.quota_for(None)
        merged = {"queries_per_hour": base.queries_per_hour * ANONYMOUS_SHARED_FACTOR,
                  "burst": base.burst * ANONYMOUS_SHARED_FACTOR,
                  "max_message_bytes": base.max_message_bytes}
        merged.update(self.quota.get("anonymous") or {})
        return Quota(**merged)

    # --- scrubbing (kith policy scrub; specs/policy.md §9.0) -----------------------------
    @property
    def scrub_rules(self) -> tuple[ScrubRule, ...]:
        """The ``[[scrub]]`` entries in file order."""
        return tuple(self._scrubs)

    def set_scrub(self, target: str, kinds: Iterable[str], *, glob: str | None = None) -> ScrubRule | None:
        """Set the kinds scrubbed for (``glob``, ``target``), replacing what that entry had;
        empty ``kinds`` removes it. Does not save.

        Args:
            target: :data:`EVERY_PEER`, a registry name or ``@group``; a tier of
                :data:`SCRUB_TIERS` is the old spelling of :data:`EVERY_PEER`.
            glob: the sources (a §3 glob, stored canonical); None: every source.

        Returns:
            The entry now stored, or None when it was removed (or there was none).

        Raises:
            PolicyError: ``scrub-bad-kind``; ``policy-invalid`` for ``private``/``never``
                (never sent, nothing to scrub); ``peer-bad-name`` for a target that is
                neither ``*``, a tier, a registry name nor a group; ``policy-bad-glob``.
                Nothing changes when one is raised.
        """
        from node.common.scrub import check_kinds

        got = check_kinds(kinds)
        if target in TIERS and target not in SCRUB_TIERS:
            raise PolicyError("policy-invalid", f"tier {target!r} never reaches a peer: nothing to scrub "
                              f"(scrubbing applies to what peers receive)")
        who = EVERY_PEER if target in SCRUB_TIERS else target
        if who != EVERY_PEER:
            check_peer_names([who], "--for name", groups=True)
        canon = canonical_glob(glob) if glob is not None else None
        entry = ScrubRule(who, got, canon) if got else None
        kept: list[ScrubRule] = []
        placed = False
        for old in self._scrubs:
            if (old.glob, old.recipient) == (canon, who):
                if entry is not None and not placed:
                    kept.append(entry)
                placed = True
                continue
            kept.append(old)
        if entry is not None and not placed:
            kept.append(entry)
        self._scrubs = kept
        return entry

    def scrub_recipients(self, peer_name: str | None) -> frozenset[str]:
        """The ``for`` values that cover ``peer_name`` (None: an anonymous peer):
        :data:`EVERY_PEER`, the name itself and ``@group`` for every group listing it —
        ended memberships included: an ``until`` ends what a group grants, never what it
        scrubs (specs/policy.md §9.0)."""
        if peer_name is None:
            return frozenset((EVERY_PEER,))
        return frozenset({EVERY_PEER, peer_name} | {GROUP_PREFIX + g.name for g in self.groups.values()
                                                      if peer_name in g.members})

    def scrubs_for(self, peer_name: str | None) -> bool:
        """True when some ``[[scrub]]`` entry covers ``peer_name`` (else its answers and
        view pay nothing for scrubbing)."""
        names = self.scrub_recipients(peer_name)
        return any(s.recipient in names for s in self._scrubs)

    def scrub_kinds(self, canonical: str | None, peer_name: str | None) -> frozenset[str]:
        """The kinds scrubbed from the source ``canonical`` (a canonical id, §1) in what
        ``peer_name`` (None: an anonymous peer) receives: the union of the ``kinds`` of
        every ``[[scrub]]`` whose glob matches it and whose ``for`` covers the peer
        (:meth:`scrub_recipients`). Independent of the tier and the rules (specs/policy.md
        §9.0): the one entry point the answer path and a peer's view use. Empty: nothing
        is scrubbed. ``canonical`` None (an invalid id) → empty (it is never sent).

        Raises:
            ValueError: ``canonical`` is a tier name — the entry point took a tier before
                scrubbing followed the sources; a caller still passing one would scrub
                by the wrong rule, so it fails loudly instead.
        """
        if canonical in _RANK:
            raise ValueError(f"scrub_kinds takes a canonical source id, not the tier {canonical!r} "
                             "(specs/policy.md §9.0)")
        if canonical is None or not self._scrubs:
            return frozenset()
        names = self.scrub_recipients(peer_name)
        kinds: set[str] = set()
        for s in self._scrubs:
            if s.recipient in names and s.covers(canonical):
                kinds.update(s.kinds)
        return frozenset(kinds)

    @property
    def scrubs(self) -> bool:
        """True when any ``[[scrub]]`` entry exists (else no peer answer pays for scrubbing)."""
        return bool(self._scrubs)

    # --- copies a peer may keep (kith policy copy; specs/copies.md §1) ----------------------
    @property
    def copy_grants(self) -> tuple[CopyGrant, ...]:
        """The ``[[copy]]`` grants in file order (ended ones included)."""
        return tuple(self._copies)

    def set_copy(self, glob: str, recipient: str, *, until: str | None = None,
                 max_bytes: int | None = None) -> CopyGrant:
        """Grant (or replace the grant of) ``recipient`` a copy of ``glob``. Does not save.

        Raises:
            PolicyError: ``peer-bad-name`` (not a registry name or ``@group``),
                ``policy-bad-glob``, ``policy-invalid`` (``max_bytes`` out of range).
                Nothing changes when one is raised.
        """
        check_peer_names([recipient], "--for name", groups=True)
        grant = CopyGrant(canonical_glob(glob), recipient, until, _check_max_bytes(max_bytes, "--max-bytes: "))
        for i, old in enumerate(self._copies):
            if (old.glob, old.recipient) == (grant.glob, recipient):
                self._copies[i] = grant
                return grant
        self._copies.append(grant)
        return grant

    def unset_copy(self, glob: str, recipient: str) -> bool:
        """Remove the grant (``glob``, ``recipient``); False when there was none."""
        canon = canonical_glob(glob)
        kept = [c for c in self._copies if (c.glob, c.recipient) != (canon, recipient)]
        removed = len(kept) != len(self._copies)
        self._copies = kept
        return removed

    def copy_grants_for(self, peer_name: str | None) -> list[CopyGrant]:
        """The grants in force now (:attr:`now`) that name ``peer_name`` or a group it is a
        member of now; empty for an anonymous peer (a copy is for a pinned peer only)."""
        if peer_name is None or not self._copies:
            return []
        from node.common.grants import in_force

        names = {peer_name} | self.groups_of(peer_name)
        now = self.now()
        return [c for c in self._copies if c.recipient in names and in_force(c.until, now)]

    def copy_allowed(self, canonical: str, peer_name: str | None) -> CopyGrant | None:
        """The grant under which ``peer_name`` may keep a copy of the source ``canonical``,
        or None: a grant in force covers it AND the peer may already be served it
        (:meth:`decide_canonical` allowed, tier in :data:`COPY_TIERS`); ``ask``,
        ``private`` and ``never`` sources never are, nor a source whose id holds a value
        scrubbed for the peer: a copy keys and signs documents by their real id, so one is
        answered live only, its id scrubbed (specs/copies.md §1)."""
        grants = [c for c in self.copy_grants_for(peer_name) if c.matcher.match(canonical)]
        if not grants:
            return None
        d = self.decide_canonical(canonical, peer_name)
        if not d.allowed or d.tier not in COPY_TIERS:
            return None
        kinds = self.scrub_kinds(canonical, peer_name)
        if kinds:
            from node.common.scrub import scrub

            if scrub(canonical, kinds) != canonical:
                return None
        return grants[0]

    def copy_budget(self, peer_name: str | None) -> int | None:
        """The byte budget of ``peer_name``'s copy: the largest ``max_bytes`` among its
        grants in force (None: some grant sets no bound, or there is no grant)."""
        grants = self.copy_grants_for(peer_name)
        if not grants or any(c.max_bytes is None for c in grants):
            return None
        return max(c.max_bytes for c in grants if c.max_bytes is not None)

    def copy_until(self, peer_name: str | None) -> str | None:
        """The end of ``peer_name``'s copy (RFC 3339 UTC): the earliest end of what admits
        the peer to it — each grant in force lasts until its own ``until`` or, for a grant
        to a group, the end of the peer's membership, whichever comes first; the copy lasts
        as long as the longest of those, and no longer than any time-limited override in
        force that admits the peer to sources (an allowing tier). None when nothing ends it,
        or there is no grant. The host bounds it by the pin's own end too
        (:meth:`node.host.connection.Connection.copy_state`). The peer's node deletes its
        copy once it passes (specs/copies.md §5)."""
        from node.common.grants import in_force, until_time

        grants = self.copy_grants_for(peer_name)
        if not grants or peer_name is None:
            return None

        def earliest(a: str | None, b: str | None) -> str | None:
            return b if a is None else a if b is None else min(a, b, key=until_time)

        ends: list[str | None] = []
        for c in grants:
            end = c.until
            if c.recipient.startswith(GROUP_PREFIX):
                group = self.groups.get(c.recipient[len(GROUP_PREFIX):])
                end = earliest(end, group.members.get(peer_name) if group is not None else None)
            ends.append(end)
        out = None if any(e is None for e in ends) else max((e for e in ends if e is not None), key=until_time)
        names = {peer_name} | self.groups_of(peer_name)
        now = self.now()
        for r in self._overrides:
            if r.peer in names and r.until is not None and in_force(r.until, now) and r.tier in COPY_TIERS:
                out = earliest(out, r.until)
        return out

    def copy_state(self, peer_name: str | None) -> dict[str, Any]:
        """What a host tells ``peer_name`` of its copy in the handshake (specs/copies.md §5,
        specs/session.md §4.2): ``{"granted": bool (a grant in force names it), "stamp":
        32 hex, "until": :meth:`copy_until`}``. ``stamp`` is opaque: SHA-256 of the policy
        document (rules, overrides, groups, scrubs, grants) and of what is in force for
        this peer now (its groups, its copy grants, its overrides whose ``until`` has not
        passed), so it changes whenever what the peer may keep may have changed — the
        peer then re-syncs. Cheap: no source is decided."""
        import hashlib

        from node.common.grants import in_force

        grants = self.copy_grants_for(peer_name)
        names = ({peer_name} | self.groups_of(peer_name)) if peer_name is not None else set()
        now = self.now()
        basis = [self.to_toml(), sorted(names), [c.to_toml() for c in grants],
                 [i for i, r in enumerate(self._overrides) if r.peer in names and in_force(r.until, now)]]
        stamp = hashlib.sha256(json.dumps(basis, sort_keys=True).encode("utf-8")).hexdigest()[:32]
        return {"granted": bool(grants), "stamp": stamp, "until": self.copy_until(peer_name)}

    # --- deciding -------------------------------------------------------------------------
    def match(self, canonical: str, peer_name: str | None = None) -> Rule | None:
        """The winning rule for an already-canonical source id, or ``None``.

        Candidates: every ``[[rule]]`` plus the ``[[override]]`` tables of ``peer_name``
        and of its groups (:meth:`groups_of`), those whose ``until`` has passed left out.
        Winner: highest :attr:`Rule.specificity`, then an override before a rule, then the
        most restrictive tier (so among equal overrides naming the peer directly and
        through groups, deny beats allow), then the earliest in the file.
        """
        return _winner(c for c in self._candidates(peer_name) if c[2].matcher.match(canonical))

    def _candidates(self, peer_name: str | None) -> list[tuple[int, int, Rule]]:
        """``(kind, index, rule)`` of every rule that may decide for ``peer_name`` (kind 1
        a ``[[rule]]``, 0 an ``[[override]]`` in force of the peer or its groups)."""
        candidates = [(1, i, r) for i, r in enumerate(self._rules)]
        if peer_name is not None:
            from node.common.grants import in_force

            names = {peer_name} | self.groups_of(peer_name)
            now = self.now()
            candidates += [(0, i, r) for i, r in enumerate(self._overrides)
                           if r.peer in names and in_force(r.until, now)]
        return candidates

    def decide_folder(self, folder: str, peer_name: str | None
                      ) -> Callable[[str], Decision] | None:
        """The decision of every file directly inside the canonical ``folder`` at once,
        when no rule can tell its files apart; else None (decide each file).

        Returns:
            ``decision(canonical)``: for any canonical id ``folder + "/" + name``, the
            :class:`Decision` :meth:`decide` gives it (same tier, allowed, matched,
            override); None when some candidate rule's glob matches some names of the
            folder and not others (:meth:`node.corpus.globs.GlobMatcher.covers_files_of`).
        """
        covering = []
        for candidate in self._candidates(peer_name):
            covers = candidate[2].matcher.covers_files_of(folder)
            if covers is None:
                return None
            if covers:
                covering.append(candidate)
        d = self._decision("", _winner(covering), peer_name)  # the same tier, allowed, matched, override

        def decision(canonical: str) -> Decision:
            return Decision(canonical, d.tier, d.allowed, d.matched, d.override)
        return decision

    def _decision(self, canonical: str, rule: Rule | None, peer_name: str | None) -> Decision:
        """The :class:`Decision` for ``canonical`` when ``rule`` won (None: nothing matched)."""
        if rule is None:
            return Decision(canonical, DEFAULT_TIER, False, None)
        if rule.tier == "public":
            allowed = True
        elif rule.tier == "peers":
            allowed = peer_name is not None and (peer_name in rule.peers
                                                 or bool(self.groups_of(peer_name) & set(rule.peers)))
        else:  # ask (opened per peer by approvals, see node.policy.approvals), private, never
            allowed = False
        return Decision(canonical, rule.tier, allowed, rule.glob, rule.peer)

    def decide(self, source_id: str | None, peer_name: str | None, *,
               roots: Sequence[Root] = ()) -> Decision:
        """Decide whether ``source_id`` may be sent to ``peer_name`` (DESIGN §10).

        Args:
            source_id: any source form; normalized with
                :func:`node.corpus.sources.normalize_source` against ``roots`` first.
            peer_name: the peer's registry name, ``None`` for an anonymous peer.
            roots: source roots for normalization (empty: textual rules only).

        Returns:
            A :class:`Decision`. Invalid source → ``Decision(None, "private", False, None)``.
        """
        canonical = normalize_source(source_id, roots) if source_id is not None else None
        if canonical is None:
            return Decision(None, DEFAULT_TIER, False, None)
        return self.decide_canonical(canonical, peer_name)

    def decide_canonical(self, canonical: str, peer_name: str | None) -> Decision:
        """:meth:`decide` for an id already canonical (normalized against the roots, e.g.
        by :meth:`node.corpus.sources.SourceNormalizer.folder_files`): no normalization."""
        return self._decision(canonical, self.match(canonical, peer_name), peer_name)
