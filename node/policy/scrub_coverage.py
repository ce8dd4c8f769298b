"""What the ``[[scrub]]`` entries cover, once and now (issue 29 item 2; specs/policy.md §9.5).

Scrubbing follows sources and recipients (:meth:`node.policy.store.Policy.scrub_kinds`),
so no rule or tier change narrows it; what can still stop it is a change of the scrub
entries themselves, of a group's members, or of who is pinned. This module says which
indexed sources such a change would serve unscrubbed, before it is made:

* :class:`ScrubRecord` — ``<home>/scrub-record.json``: every (glob, recipient, kinds) a
  scrub entry has covered (a group entry expanded to its members' names), so "a scrub rule
  once covered this" survives the entry's removal and hand edits seen by a ``kith``
  command or a running host.
* :func:`unscrubbed` — the (recipient, source, kind) triples a policy serves unscrubbed
  although the record says they were once scrubbed (``kith policy check``).
* :func:`newly_unscrubbed` — those a change would add (what ``kith policy`` and ``kith
  peers`` ask about before writing).

Everything is computed with the policy's own matcher, precedence and scrub entry point,
so it reports what the gate and the answer path do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.common.home import atomic_write, read_regular
from node.corpus.globs import GlobMatcher
from node.policy.store import EVERY_PEER, GROUP_PREFIX, Policy

log = logging.getLogger("kith.policy")

RECORD_FILE = "scrub-record.json"
#: Rows kept at most; beyond, the ones last seen longest ago are dropped.
MAX_ROWS = 10_000
MAX_RECORD_BYTES = 4 << 20
#: Source ids listed per recipient and kinds at most (the count is always whole).
MAX_LISTED = 20


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def coverage_rows(policy: Policy) -> set[tuple[str | None, str, str]]:
    """``(glob or None, recipient, kind)`` for every kind the policy's scrub entries
    scrub: ``for`` ``*`` and registry names as they are, ``@group`` as each member's name
    (ended memberships included, :meth:`Policy.scrub_recipients`); a group nobody
    defines covers nobody."""
    rows: set[tuple[str | None, str, str]] = set()
    for s in policy.scrub_rules:
        if s.recipient.startswith(GROUP_PREFIX):
            group = policy.groups.get(s.recipient[len(GROUP_PREFIX):])
            names: Iterable[str] = group.members if group is not None else ()
        else:
            names = (s.recipient,)
        for name in names:
            rows.update((s.glob, name, k) for k in s.kinds)
    return rows


class ScrubRecord:
    """``<home>/scrub-record.json``: what scrub entries have covered (specs/policy.md §9.5).

    ``{"version": 1, "rows": [{"glob": str|null, "for": "*"|NAME, "kinds": [...],
    "first": RFC 3339, "last": RFC 3339}]}``, one row per (glob, for). A missing,
    unreadable or malformed file reads as empty (logged); it is rewritten whole
    (0600, tmp+rename) when :meth:`add` changed it and :meth:`save` is called.
    """

    def __init__(self, rows: Mapping[tuple[str | None, str], dict[str, Any]] | None = None) -> None:
        self.rows: dict[tuple[str | None, str], dict[str, Any]] = {k: dict(v) for k, v in (rows or {}).items()}
        self.changed = False
        #: recipient -> its row keys (built when first asked; a record at the cap has
        #: 10,000 rows, and scanning them per recipient was quadratic)
        self._by_who: dict[str, list[tuple[str | None, str]]] | None = None
        #: compiled globs, shared by every recipient (and with :meth:`load`'s check)
        self._matchers: dict[str, GlobMatcher] = {}

    def matcher(self, glob: str) -> GlobMatcher:
        """The compiled §3 glob of a row (compiled once per record).

        Raises:
            PolicyError: ``policy-bad-glob`` (:meth:`load` leaves such rows out).
        """
        m = self._matchers.get(glob)
        if m is None:
            m = self._matchers[glob] = GlobMatcher(glob)
        return m

    @classmethod
    def load(cls, home: Path) -> ScrubRecord:
        """Read the record of ``home`` (empty when there is none or it is unusable)."""
        path = Path(home) / RECORD_FILE
        try:
            raw = read_regular(path, MAX_RECORD_BYTES + 1)
            doc = json.loads(raw) if len(raw) <= MAX_RECORD_BYTES else None
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError):
            doc = None
        from node.common.scrub import KINDS
        from node.trust.peers import NAME_RE

        rows: dict[tuple[str | None, str], dict[str, Any]] = {}
        matchers: dict[str, GlobMatcher] = {}
        items = doc.get("rows") if isinstance(doc, dict) and doc.get("version") == 1 else None
        if not isinstance(items, list):
            log.warning("%s is unusable; starting a new scrub record", path)
            return cls()
        for item in items[:MAX_ROWS]:
            if not isinstance(item, dict):
                continue
            glob, who, kinds = item.get("glob"), item.get("for"), item.get("kinds")
            if (glob is not None and not isinstance(glob, str)) or not isinstance(who, str) \
                    or not isinstance(kinds, list):
                continue
            # a hand edit: only scrub kinds, and "*" or a registry name (groups are stored
            # as their members' names); a row left with neither is unusable, not the record
            kinds = [k for k in kinds if isinstance(k, str) and k in KINDS]
            if not kinds or (who != EVERY_PEER and NAME_RE.fullmatch(who) is None):
                continue
            try:
                if glob is not None:
                    matchers[glob] = matchers.get(glob) or GlobMatcher(glob)
            except Exception:  # a hand-edited glob: the row is unusable, not the record
                continue
            rows[(glob, who)] = {"kinds": sorted(set(kinds)), "first": str(item.get("first", "")),
                                 "last": str(item.get("last", ""))}
        record = cls(rows)
        record._matchers = matchers
        return record

    def add(self, policy: Policy) -> bool:
        """Add what ``policy``'s scrub entries cover now (:func:`coverage_rows`); True
        when a row or kind is new. ``first`` is when a row was made, ``last`` when it last
        gained a kind (the rows dropped beyond :data:`MAX_ROWS` are those with the oldest
        ``last``)."""
        now = _stamp()
        grew = False
        for glob, who, kind in coverage_rows(policy):
            row = self.rows.get((glob, who))
            if row is None:
                row = self.rows[(glob, who)] = {"kinds": [], "first": now, "last": now}
                self._by_who = None
            if kind not in row["kinds"]:
                row["kinds"] = sorted({*row["kinds"], kind})
                row["last"] = now
                grew = True
        if len(self.rows) > MAX_ROWS:
            for key in sorted(self.rows, key=lambda k: self.rows[k]["last"])[: len(self.rows) - MAX_ROWS]:
                del self.rows[key]
            self._by_who = None
        self.changed = self.changed or grew
        return grew

    def copy(self) -> ScrubRecord:
        """An independent copy (the guard adds the "before" policy to it)."""
        out = ScrubRecord(self.rows)
        out._matchers = self._matchers  # compiled globs are immutable: shared
        return out

    def save(self, home: Path) -> None:
        """Write the record when :meth:`add` changed it, united with what the file holds
        now: another writer (a running host recording a reloaded policy, another command)
        may have added rows since this one was read, and they are kept. Read, union and
        write happen under an ``flock`` on ``<home>/scrub-record.json.lock`` (held for
        milliseconds; none on a platform without ``fcntl``).

        Raises:
            OSError: the file could not be written (the old one is intact).
        """
        if not self.changed:
            return
        home = Path(home)
        with _lock(home / (RECORD_FILE + ".lock")):
            for key, row in ScrubRecord.load(home).rows.items():
                mine = self.rows.get(key)
                if mine is None:
                    self.rows[key] = dict(row)
                    self._by_who = None
                elif not set(row["kinds"]) <= set(mine["kinds"]):
                    mine["kinds"] = sorted({*mine["kinds"], *row["kinds"]})
                    mine["last"] = max(mine["last"], row["last"])
            if len(self.rows) > MAX_ROWS:
                for key in sorted(self.rows, key=lambda k: self.rows[k]["last"])[: len(self.rows) - MAX_ROWS]:
                    del self.rows[key]
                self._by_who = None
            doc = {"version": 1, "rows": [{"glob": g, "for": w, **row}
                                          for (g, w), row in sorted(self.rows.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))]}
            atomic_write(home / RECORD_FILE, (json.dumps(doc, indent=1) + "\n").encode("utf-8"), mode=0o600)
        self.changed = False

    def names(self) -> set[str]:
        """The registry names the record mentions (recipients ``kith policy check`` asks about)."""
        return {w for _, w in self.rows if w != EVERY_PEER}

    def rows_for(self, recipient: str | None) -> list[tuple[str | None, frozenset[str]]]:
        """``(glob or None for every source, kinds)`` of the rows that covered
        ``recipient`` (its own rows and the ``*`` rows)."""
        if self._by_who is None:
            self._by_who = {}
            for key in self.rows:
                self._by_who.setdefault(key[1], []).append(key)
        keys = [*self._by_who.get(EVERY_PEER, ()), *(self._by_who.get(recipient, ()) if recipient is not None else ())]
        return [(key[0], frozenset(self.rows[key]["kinds"])) for key in keys]


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600; blocking: every holder only
    reads and writes one small file)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def record_scrub(home: Path, policy: Policy) -> None:
    """Add ``policy``'s coverage to ``home``'s record and write it when it grew; never
    raises (a host reloading a policy, a command reading one: best effort, logged)."""
    try:
        record = ScrubRecord.load(home)
        record.add(policy)
        record.save(home)
    except OSError as exc:
        log.warning("could not write %s: %s", RECORD_FILE, exc.strerror)


def recipients(policy: Policy, record: ScrubRecord, pinned: Iterable[str] = ()) -> list[str | None]:
    """Who to ask about: the anonymous peer (None), every ``pinned`` name, every registry
    name ``policy`` mentions (rules' ``peers``, overrides, group members, scrub ``for``)
    and every name ``record`` mentions; sorted, None first."""
    names = set(pinned) | record.names()
    for rule in (*policy.rules, *policy.overrides):
        names.update(p for p in (*rule.peers, rule.peer or "") if p and not p.startswith(GROUP_PREFIX))
    for group in policy.groups.values():
        names.update(group.members)
    names.update(s.recipient for s in policy.scrub_rules
                 if s.recipient != EVERY_PEER and not s.recipient.startswith(GROUP_PREFIX))
    return [None, *sorted(names)]


@dataclass(frozen=True)
class Unscrubbed:
    """Sources served unscrubbed of ``kinds`` to ``recipient`` though a scrub entry
    covered them (one line of the report).

    Attributes:
        recipient: a registry name, or None for an anonymous peer.
        kinds: the kinds no longer scrubbed, in :data:`node.common.scrub.KINDS` order.
        sources: the canonical ids, sorted.
    """

    recipient: str | None
    kinds: tuple[str, ...]
    sources: tuple[str, ...]
    #: the recipient's pin has ended: its key is served as an anonymous peer now
    pin_ended: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``{"for": NAME|null, "kinds", "count", "sources"}`` (at most :data:`MAX_LISTED` ids)."""
        return {"for": self.recipient, "kinds": list(self.kinds), "count": len(self.sources),
                "sources": list(self.sources[:MAX_LISTED])}

    def line(self) -> str:
        """One plain-text line: who, what, how many and the first sources."""
        who = "an anonymous peer" if self.recipient is None else self.recipient
        if self.pin_ended:
            who += " (pin ended, now an anonymous peer)"
        shown = ", ".join(self.sources[:MAX_LISTED])
        more = f" (and {len(self.sources) - MAX_LISTED} more)" if len(self.sources) > MAX_LISTED else ""
        n = len(self.sources)
        return f"{who}: {', '.join(self.kinds)} no longer scrubbed in {n} source{'s' if n != 1 else ''}: {shown}{more}"


def _lost(policy: Policy, record: ScrubRecord, sources: Callable[[], Sequence[str]],
          who: Sequence[str | None], served_as: Mapping[str, str | None]) -> dict[tuple[str | None, str], set[str]]:
    """``(recipient, source) -> kinds``: ``recipient`` (served as ``served_as.get(r, r)``)
    may see or be asked about ``source`` under ``policy`` (specs/policy.md §6.1's view),
    a row of ``record`` for it held ``kind`` for that source, and ``policy`` does not
    scrub ``kind`` from it for that recipient now. A recipient each of whose rows an
    entry in force repeats (same glob, the kinds included) is skipped without looking at
    a source — the common case, so a rule change costs no scan of the corpus."""
    out: dict[tuple[str | None, str], set[str]] = {}
    for r in who:
        rows = record.rows_for(r)
        if not rows:
            continue
        now_as = served_as.get(r, r) if r is not None else None
        names = policy.scrub_recipients(now_as)
        in_force: dict[str | None, set[str]] = {}
        for s in policy.scrub_rules:
            if s.recipient in names:
                in_force.setdefault(s.glob, set()).update(s.kinds)
        rows = [(g, kinds) for g, kinds in rows if not kinds <= in_force.get(g, set())]
        if not rows:
            continue
        matchers = [(None if g is None else record.matcher(g), kinds) for g, kinds in rows]
        per_folder: dict[str, Any] = {}  # folder -> decision of its files, None: decide each

        def receives(source: str) -> bool:
            folder = source.rsplit("/", 1)[0]
            if folder not in per_folder:
                per_folder[folder] = policy.decide_folder(folder, now_as) if folder else None
            decide = per_folder[folder]
            d = decide(source) if decide is not None else policy.decide_canonical(source, now_as)
            return d.allowed or d.tier == "ask"

        for source in sources():
            once: set[str] = set()
            for matcher, kinds in matchers:
                if matcher is None or matcher.match(source):
                    once.update(kinds)
            if not once:
                continue
            lost = once - policy.scrub_kinds(source, now_as)
            if not lost:
                continue
            if receives(source):
                out[(r, source)] = set(lost)
    return out


def _once(sources: Sequence[str] | Callable[[], Sequence[str]]) -> Callable[[], Sequence[str]]:
    """``sources`` as a callable that reads them at most once (a list is returned as is)."""
    if not callable(sources):
        return lambda: sources  # type: ignore[return-value]
    kept: list[Sequence[str]] = []

    def read() -> Sequence[str]:
        if not kept:
            kept.append(sources())
        return kept[0]
    return read


def _grouped(lost: Mapping[tuple[str | None, str], set[str]],
             ended: Iterable[str] = ()) -> list[Unscrubbed]:
    """``(recipient, source) -> kinds`` as :class:`Unscrubbed` lines: per recipient
    (anonymous first), per set of kinds lost on the same sources; ``ended`` names the
    recipients whose pin has ended (said on their lines)."""
    ended = set(ended)
    from node.common.scrub import KINDS

    lines: dict[tuple[str | None, tuple[str, ...]], list[str]] = {}
    for (r, s), kinds in lost.items():
        if kinds:
            lines.setdefault((r, tuple(k for k in KINDS if k in kinds)), []).append(s)
    return [Unscrubbed(r, kinds, tuple(sorted(ids)), pin_ended=r in ended)
            for (r, kinds), ids in sorted(lines.items(), key=lambda kv: (kv[0][0] is not None, kv[0][0] or "", kv[0][1]))]


def unscrubbed(policy: Policy, record: ScrubRecord, sources: Sequence[str] | Callable[[], Sequence[str]],
               who: Sequence[str | None], *, ended: Iterable[str] = ()) -> list[Unscrubbed]:
    """What ``policy`` serves unscrubbed to ``who`` among the indexed ``sources`` (or a
    callable reading them, called only when needed) that ``record`` says a scrub entry
    once covered (``kith policy check``; specs/policy.md §9.5).

    Args:
        ended: pinned names whose pin has ended (``--until`` passed): their keys are
            anonymous peers now, so they are decided and scrubbed as one (§9.0).
    """
    ended = set(ended)
    return _grouped(_lost(policy, record, _once(sources), who, {n: None for n in ended}), ended)


def newly_unscrubbed(before: Policy, after: Policy, record: ScrubRecord,
                     sources: Sequence[str] | Callable[[], Sequence[str]],
                     who: Sequence[str | None], *,
                     served_as: Mapping[str, str | None] | None = None) -> list[Unscrubbed]:
    """What changing ``before`` into ``after`` would newly serve unscrubbed: the triples
    of :func:`unscrubbed` under ``after`` that are not so under ``before``, with
    ``before``'s own coverage counted as "once covered" (so removing a scrub entry, or a
    group member, counts at once).

    Args:
        served_as: recipients served under another identity after the change
            (``kith peers remove NAME``: ``{NAME: None}``, its key is then anonymous).
    """
    rec = record.copy()
    rec.add(before)
    read = _once(sources)
    was = _lost(before, rec, read, who, {})
    now = _lost(after, rec, read, who, served_as or {})
    return _grouped({key: kinds - was.get(key, set()) for key, kinds in now.items()})


def change_unscrubs(home: Path, before: Policy, after: Policy, *,
                    served_as: Mapping[str, str | None] | None = None,
                    on_scan: Callable[[int], None] | None = None) -> tuple[list[Unscrubbed], ScrubRecord]:
    """:func:`newly_unscrubbed` for a change of ``home``'s policy from ``before`` to
    ``after``: over its indexed sources (read only when some recipient may lose a kind),
    for :func:`recipients` of both policies with its pinned names, with its record.

    Args:
        on_scan: called with the number of indexed sources when they have to be read
            (the command says it is checking them: a long corpus takes seconds).

    Returns:
        ``(lines, record)``: what the change would newly serve unscrubbed (empty: nothing)
        and the record read, for :func:`commit_change`.
    """
    from node.policy.coverage import indexed_sources
    from node.trust.peers import PeerRegistry

    record = ScrubRecord.load(home)
    if not (before.scrub_rules or record.rows):  # nothing was ever scrubbed: nothing can lapse
        return [], record
    pinned = list(PeerRegistry.load(home).peers)
    who = sorted(set(recipients(before, record, pinned)) | set(recipients(after, record, pinned)),
                 key=lambda r: (r is not None, r or ""))
    def sources() -> list[str]:
        ids = indexed_sources(home)
        if on_scan is not None:
            on_scan(len(ids))
        return ids

    return newly_unscrubbed(before, after, record, sources, who, served_as=served_as), record


def commit_change(home: Path, record: ScrubRecord, before: Policy, after: Policy,
                  write: Callable[[], Any]) -> None:
    """Make a change :func:`change_unscrubs` measured: add ``before``'s coverage to the
    record and write it, call ``write()``, then add ``after``'s (so what either covered
    counts as "once covered"). A record that cannot be written is logged, never fatal.

    ``write()`` runs under an ``flock`` on ``<home>/policy.toml.lock``, and only when
    ``policy.toml`` is still the file ``before`` was read from (:attr:`Policy.source_stamp`):
    another command that wrote it meanwhile was not measured, and writing ``after`` over
    it would drop its change — a scrub entry, say — without asking.

    Raises:
        PolicyError: ``policy-changed`` — the file changed since ``before`` was read;
            nothing is written (run the command again).
    """
    from node.common.errors import PolicyError
    from node.policy.store import POLICY_FILE, file_stamp

    def save() -> None:
        try:
            record.save(home)
        except OSError as exc:
            log.warning("could not write %s: %s", RECORD_FILE, exc.strerror)

    with _lock(Path(home) / (POLICY_FILE + ".lock")):
        if before.path is not None and before.source_stamp is not None \
                and file_stamp(before.path) != before.source_stamp:
            raise PolicyError("policy-changed", f"not changed: {before.path} changed while this command ran "
                              "(another kith command or an edit); run it again")
        record.add(before)
        save()
        write()
    record.add(after)
    save()


def refuse_unscrubbing(home: Path, before: Policy, after: Policy, write: Callable[[], Any], *,
                       how: str) -> None:
    """Make the change only when it stops scrubbing nothing (a surface with no way to
    confirm, e.g. the dashboard's policy form); ``how`` names the command that can.

    Raises:
        PolicyError: ``scrub-would-lapse`` naming the first lines of what would lapse;
            nothing is written then.
    """
    from node.common.errors import PolicyError

    lapsed, record = change_unscrubs(home, before, after)
    if lapsed:
        raise PolicyError("scrub-would-lapse", "not changed: it would stop scrubbing "
                          + "; ".join(u.line() for u in lapsed[:3]) + f" (confirm with {how} --yes)")
    commit_change(home, record, before, after, write)
