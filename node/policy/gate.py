"""The egress gate: the last check before anything leaves the machine (DESIGN §1, §10).

Two duties, built once per (roots, policy, home) and cheap to call:

* :meth:`EgressGate.screen` — per hit: normalize the source id, check it against the
  hit's own origin (``root_prefix``/``rel_path``), decide the tier for (peer, source)
  (:meth:`EgressGate.decide_hits`), keep only allowed hits, with their canonical (wire)
  id, in the original order, plus ``ask`` hits the owner's approvals opened.
* :meth:`EgressGate.check_outgoing` — refuse an outgoing message (``egress-leak``) that
  contains the real absolute path of a source root or of the node home, in any spelling a
  serializer may produce (raw, symlink-resolved, NFC/NFD, ``\\`` or ``/`` separators, JSON
  escapes incl. ``\\/`` and ``\\uXXXX``, percent-encoding), matched ASCII-case-insensitively.

``ask`` hits are withheld by policy alone; :meth:`EgressGate.screen` applies the owner's
approvals (``node.policy.approvals``) per (peer key, query) and tells the answer service
which ``ask`` hits still wait for a decision. :meth:`EgressGate.check_frame` is the one
seam every outgoing business frame of a Host session passes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import itertools
import threading
import unicodedata
import urllib.parse
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from node.common.errors import EgressRefused, PolicyError
from node.corpus.lens import Lens
from node.corpus.sources import SourceNormalizer, carried_id, folders_resolved_once
from node.corpus.types import Hit, Root
from node.common.grants import in_force
from node.policy.store import DEFAULT_TIER, Decision, Policy, file_stamp
from node.common.kept import keep

log = logging.getLogger("kith.policy")

#: States :meth:`EgressGate.screen` gives a hit.
VISIBLE, PENDING = "visible", "pending"

_INVALID = Decision(None, DEFAULT_TIER, False, None)
#: tokens of gates and of in-memory policies (parts of a lens key; never reused)
_GATE_TOKENS = itertools.count(1)
#: lenses kept by :meth:`EgressGate.lens_for` (lens key -> lens, least recently used dropped)
MAX_LENSES = 64
_lenses: OrderedDict[Any, Lens] = OrderedDict()
_lenses_lock = threading.Lock()
#: At most this many decisions kept per lens key (:meth:`EgressGate.decide_hits`); the
#: kept set is emptied when full.
MAX_DECIDED = 4096


def _path_spellings(path: str) -> set[str]:
    """Textual spellings of one real path (before byte-level encodings)."""
    bases = {path}
    try:
        bases.add(os.path.realpath(path))
    except (OSError, ValueError):
        pass
    out: set[str] = set()
    for base in bases:
        base = base.rstrip("/\\") or base
        for form in ("NFC", "NFD"):
            text = unicodedata.normalize(form, base)
            out.update({text, text.replace("\\", "/"), text.replace("/", "\\")})
    return out


def leak_needles(paths: Iterable[str]) -> set[bytes]:
    """Every byte string whose presence in an outgoing message reveals one of ``paths``.

    Args:
        paths: real absolute paths (roots, the node home).

    Returns:
        UTF-8 needles: each spelling from raw text, JSON string escapes (``ensure_ascii`` on
        and off, with ``/`` and with ``\\/``), and percent-encoding (``/`` kept or ``%2F``).
        Needles shorter than 2 bytes (a root at ``/``) are skipped: they would refuse
        everything.
    """
    needles: set[str] = set()
    for path in paths:
        for text in _path_spellings(str(path)):
            forms = {text, urllib.parse.quote(text), urllib.parse.quote(text, safe="")}
            for ascii_only in (True, False):
                escaped = json.dumps(text, ensure_ascii=ascii_only)[1:-1]
                forms.update({escaped, escaped.replace("/", "\\/")})
            needles.update(forms)
    return {n.encode("utf-8", "surrogatepass") for n in needles if len(n) >= 2}


#: A run of the bytes no spelling of :func:`leak_needles` changes (percent-encoding keeps
#: them, JSON escapes them not): a piece of a needle found in every spelling of it.
_PIECE = re.compile(rb"[A-Za-z0-9_.~-]+")
#: A needle's longest piece shorter than this makes the prefilter useless (too common).
MIN_PIECE_BYTES = 4


def leak_pieces(needles: Iterable[bytes]) -> tuple[bytes, ...] | None:
    """The prefilter of the leak scan: for each needle its longest :data:`_PIECE`,
    lowercased (the scan ignores ASCII case), minus those holding another — a message
    whose lowercased bytes contain none of them contains no needle, so the regex need not
    run (a 5.5 KB answer under a root and a home: ~7 µs instead of ~21 µs). None when
    some needle has no piece of :data:`MIN_PIECE_BYTES` (then the regex always runs)."""
    pieces: set[bytes] = set()
    for needle in needles:
        piece = max(_PIECE.findall(needle), key=len, default=b"")
        if len(piece) < MIN_PIECE_BYTES:
            return None
        pieces.add(piece.lower())
    # a piece holding another is found only where that one is (``2falice``, ``alice``)
    return tuple(sorted(p for p in pieces if not any(q != p and q in p for q in pieces)))


_END = -1


def _trie_pattern(needles: Iterable[bytes]) -> bytes:
    """One regex alternation with common prefixes factored out (a trie in regex form).

    A needle that is a prefix of another makes the longer one redundant (any occurrence of
    the longer contains the shorter), so the trie is cut at the first end marker.
    """
    trie: dict[int, dict] = {}
    for needle in sorted(needles, key=len):
        node = trie
        for byte in needle:
            if _END in node:
                break
            node = node.setdefault(byte, {})
        else:
            node.clear()
            node[_END] = {}

    def build(node: dict[int, dict]) -> bytes:
        if _END in node:
            return b""
        branches = [re.escape(bytes([b])) + build(child) for b, child in sorted(node.items())]
        return branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"

    return build(trie)


class EgressGate:
    """Policy per hit and a leak scan per outgoing message (DESIGN §10).

    Args:
        roots: the registered source roots (real folders are never sent).
        policy: the loaded :class:`node.policy.store.Policy`.
        home: the node home (its real path is never sent either).

    The leak scanner is one compiled bytes regex built here; build a new gate when the
    roots change. A policy loaded from a file (:meth:`Policy.load`) is re-read when that
    file changes (:meth:`current_policy`, one ``os.stat`` per query).
    """

    def __init__(self, roots: Sequence[Root], policy: Policy, home: Path, *,
                 approvals: Any = None) -> None:
        #: this gate's part of every lens key (gates differ in roots, hence decisions)
        self.token = next(_GATE_TOKENS)
        self._policy_tokens: weakref.WeakKeyDictionary[Policy, int] = weakref.WeakKeyDictionary()
        self.roots: tuple[Root, ...] = tuple(roots)
        self.policy = policy
        self.home = Path(home)
        self.approvals = approvals
        self._reload_lock = threading.Lock()
        self._bad_stamp: tuple[Any, ...] | None = None  # a changed file that failed to parse
        self._normalize = SourceNormalizer(self.roots)
        paths = [r.path for r in self.roots] + [str(self.home)]
        needles = leak_needles(paths)
        self._leak: re.Pattern[bytes] | None = (
            re.compile(_trie_pattern(needles), re.IGNORECASE) if needles else None)
        self._leak_pieces = leak_pieces(needles)
        #: decisions of canonical ids per lens key, generation left out (:meth:`_kept_decisions`)
        self._decided: OrderedDict[Any, dict[str, Decision]] = OrderedDict()

    # --- the current policy ---------------------------------------------------------------
    def current_policy(self) -> Policy:
        """The policy to apply to the query being answered (DESIGN §10; specs/policy.md §2.1).

        When :attr:`policy` was loaded from ``policy.toml`` (it has a ``source_stamp``) and
        the file's stamp (inode, size, mtime, ctime; one ``os.stat``) differs, the file is
        read again and replaces :attr:`policy` — rules and quotas alike — so
        ``kith policy set`` reaches a running host at its next query. A changed file that
        fails to load keeps the last good policy; a warning is logged once per change.
        A deleted file is an empty policy (everything private). Thread-safe.

        Returns:
            The :class:`Policy` to use for the whole query (take it once per query).
        """
        policy = self.policy
        if policy.source_stamp is None or policy.path is None:
            return policy
        stamp = file_stamp(policy.path)
        if stamp == policy.source_stamp or stamp == self._bad_stamp:
            return policy
        with self._reload_lock:
            policy = self.policy
            if stamp == policy.source_stamp or stamp == self._bad_stamp:
                return policy
            try:
                fresh = Policy.load(policy.path.parent)
            except PolicyError as exc:
                self._bad_stamp = stamp
                log.warning("policy.toml changed but does not load (%s: %s); the last good policy "
                            "stays in force until it is fixed", exc.code, exc.message)
                return policy
            self._bad_stamp = None
            fresh.now = policy.now  # grants end on the host's clock, re-read or not
            self.policy = fresh
            log.info("policy.toml changed: the new policy applies from this query on")
            return fresh

    # --- policy per hit -----------------------------------------------------------------
    def decide(self, source: str | None, peer_name: str | None, *, policy: Policy | None = None) -> Decision:
        """Normalize ``source`` against the roots and decide it for ``peer_name`` (under
        ``policy``, default :attr:`policy`)."""
        canonical = self._normalize(source) if source is not None else None
        if canonical is None:
            return _INVALID
        return (policy or self.policy).decide(canonical, peer_name)

    def decide_many(self, sources: Sequence[str], peer_name: str | None, *,
                    policy: Policy | None = None) -> list[Decision]:
        """:meth:`decide` for every source of ``sources``, in order — the same decisions,
        made per folder where possible (a view's visible set, issue 21 item 4).

        Sources are grouped by folder (the id up to its last ``/``). Per folder, the
        normalizer lists once which names need no resolving
        (:meth:`node.corpus.sources.SourceNormalizer.folder_files`: one ``scandir``
        instead of one path resolution per file) and the policy says whether one
        decision holds for every file in it (:meth:`node.policy.store.Policy.decide_folder`:
        no rule tells its files apart); otherwise, and for every other source (symlinks,
        unusual names, datasource ids, a case-insensitive file system), each is decided
        exactly as :meth:`decide` does. Never raises for a bad source (invalid decision)."""
        policy = policy or self.policy
        out: list[Decision | None] = [None] * len(sources)
        folders: dict[str, list[int]] = {}
        for i, source in enumerate(sources):
            folders.setdefault(source.rpartition("/")[0], []).append(i)
        with folders_resolved_once():
            for folder, members in folders.items():
                listed = self._normalize.folder_files(folder) if folder else None
                if listed is not None:
                    canonical, names = listed
                    decide = policy.decide_folder(canonical, peer_name)
                    for i in members:
                        name = sources[i].rpartition("/")[2]
                        if name in names:
                            cid = canonical + "/" + name
                            out[i] = (decide(cid) if decide is not None
                                      else policy.decide_canonical(cid, peer_name))
                for i in members:
                    if out[i] is None:
                        out[i] = self.decide(sources[i], peer_name, policy=policy)
        return out  # type: ignore[return-value]

    # --- the lens (issue 29 item 1) -------------------------------------------------------
    def lens_key(self, policy: Policy, peer_name: str | None, generation: int) -> tuple[Any, ...]:
        """What a peer's lens under ``policy`` is a function of: ``(gate token, policy
        stamp, grants in force, peer name, generation)``. The policy stamp is its file's
        :func:`node.policy.store.file_stamp` (a re-read policy is a new stamp), or for
        an in-memory policy a token of that policy object; the grants in force are the
        peer's groups and the overrides in force for it now (an ``until`` that passes
        changes the key, specs/policy.md §8). Cheap: no decision is made."""
        stamp: Any = policy.source_stamp
        if stamp is None:
            stamp = self._token_of(policy)
        grants: tuple[Any, ...] = ()
        if peer_name is not None:
            groups = policy.groups_of(peer_name)
            names = {peer_name} | groups
            now = policy.now()
            grants = (tuple(sorted(groups)),
                      tuple(i for i, r in enumerate(policy.overrides)
                            if r.peer in names and in_force(r.until, now)))
        return (self.token, stamp, grants, peer_name, generation)

    def _token_of(self, policy: Policy) -> int:
        """A number for the ``policy`` object, the same for its lifetime, never another's."""
        token = self._policy_tokens.get(policy)
        if token is None:
            token = self._policy_tokens[policy] = next(_GATE_TOKENS)
        return token

    def lens(self, policy: Policy, peer_name: str | None, generation: int,
             sources: Sequence[str]) -> Lens:
        """The lens of ``peer_name`` (None: anonymous) under ``policy`` over the corpus's
        ``sources`` (stored ids of its ``done`` documents at ``generation``,
        :meth:`node.corpus.store.Corpus.lens_basis`): the sources it may see now or be
        asked about (``ask`` tier), decided per folder (:meth:`decide_many`), and for
        each the kinds scrubbed for this peer (:meth:`node.policy.store.Policy.scrub_kinds`
        of its canonical id; specs/policy.md §9). Both are keyed by the stored and the canonical
        id. The decisions are the gate's own; the corpus only reads the result.

        Returns:
            A :class:`node.corpus.lens.Lens` keyed :meth:`lens_key`.
        """
        visible: set[str] = set()
        kinds: dict[str, frozenset[str]] = {}
        scrubs = policy.scrubs_for(peer_name)
        for source, d in zip(sources, self.decide_many(sources, peer_name, policy=policy)):
            if not (d.allowed or (d.tier == "ask" and d.canonical is not None)):
                continue
            ids = (source,) if d.canonical in (None, source) else (source, d.canonical)
            visible.update(ids)
            if scrubs:
                scrubbed = policy.scrub_kinds(d.canonical, peer_name)
                if scrubbed:
                    kinds.update((i, scrubbed) for i in ids)
        return Lens(self.lens_key(policy, peer_name, generation), generation, visible, kinds)

    def lens_for(self, corpus: Any, peer_name: str | None, policy: Policy | None = None) -> Lens:
        """The lens of ``peer_name`` under ``policy`` (default :meth:`current_policy`) over
        ``corpus`` (a :class:`node.corpus.store.Corpus`) at its current generation
        (:meth:`lens`). Kept per lens key across callers (at most :data:`MAX_LENSES`; this
        gate's lenses of older generations are dropped), so it is decided once per
        (policy stamp, grants, peer, generation) — outside the corpus lock.

        Raises:
            CorpusError: ``index-unavailable`` (no record).
        """
        policy = policy if policy is not None else self.current_policy()
        generation, ids = corpus.lens_basis()
        key = self.lens_key(policy, peer_name, generation)
        with _lenses_lock:
            lens = _lenses.get(key)
            if lens is not None:
                _lenses.move_to_end(key)
                return lens
        lens = self.lens(policy, peer_name, generation, ids)
        with _lenses_lock:
            for old in [k for k in _lenses if k[0] == self.token and k[4] < generation]:
                del _lenses[old]  # a lens of an older generation is not asked for again
            _lenses[key] = lens
            while len(_lenses) > MAX_LENSES:
                _lenses.popitem(last=False)
        return lens

    def scrub_kinds(self, canonical: str, peer_name: str | None, policy: Policy) -> frozenset[str]:
        """The kinds scrubbed from the canonical source ``canonical`` sent to ``peer_name``
        under ``policy`` (:meth:`node.policy.store.Policy.scrub_kinds`): for a source a
        lens does not hold (decided at an older generation)."""
        return policy.scrub_kinds(canonical, peer_name)

    def decide_hits(self, hits: Sequence[Hit], peer_name: str | None, *,
                    policy: Policy | None = None) -> list[tuple[Hit, Decision]]:
        """Decide every hit for ``peer_name`` (``None``: an anonymous peer), in order, under
        ``policy`` (default :attr:`policy`; callers answering a query pass
        :meth:`current_policy`).

        A hit whose source id does not normalize, or whose normalized id differs from the
        id of its own origin (``/<root_prefix>/<rel_path>``, when ``root_prefix`` is set),
        gets the invalid decision (``private``, not allowed). Returned hits carry their
        canonical ``source_id``. A hit the corpus served carries its origin's canonical id,
        resolved once at serve time (``Hit.origin_id``); when that id belongs to the hit's
        source id (:func:`node.corpus.sources.carried_id`) the decision is made on it and
        nothing is resolved again. Any other hit is normalized here: each distinct source
        once per call (a document's chunks share it).
        """
        policy = policy or self.policy
        out: list[tuple[Hit, Decision]] = []
        decided: dict[str, Decision] = {}  # chunks of one source: one decision per call
        by_id = self._kept_decisions(policy, peer_name)  # the same for carried canonical ids
        for hit in hits:
            carried = carried_id(hit)
            if carried is not None:
                decision = by_id.get(carried)
                if decision is None:
                    decision = keep(by_id, carried, policy.decide(carried, peer_name), MAX_DECIDED)
                if decision.canonical is not None and decision.canonical != hit.source_id:
                    hit = dataclasses.replace(hit, source_id=decision.canonical)
                out.append((hit, decision))
                continue
            decision = decided.get(hit.source_id)
            if decision is None:
                decision = decided[hit.source_id] = self.decide(hit.source_id, peer_name, policy=policy)
            if decision.canonical is not None and hit.root_prefix is not None:
                origin = f"/{hit.root_prefix}/{hit.rel_path}" if hit.rel_path else f"/{hit.root_prefix}"
                if origin != hit.source_id and self._normalize(origin) != decision.canonical:
                    decision = _INVALID
            if decision.canonical is not None and decision.canonical != hit.source_id:
                hit = dataclasses.replace(hit, source_id=decision.canonical)
            out.append((hit, decision))
        return out

    def _kept_decisions(self, policy: Policy, peer_name: str | None) -> dict[str, Decision]:
        """The decisions of carried canonical ids kept for ``peer_name`` under ``policy``:
        keyed by what a decision is a function of — :meth:`lens_key` without the
        generation (gate, policy file stamp, the peer's groups and overrides in force now,
        peer) and the policy object — so a re-read policy, a group joined or left, or an
        override's ``until`` passing starts afresh. Only for a policy read from its file
        and as the file says (its :meth:`current_policy` object, never changed in place);
        an in-memory or changed policy, which its owner may change again, gets a fresh
        dict per call (nothing kept). At most :data:`MAX_LENSES` keys,
        :data:`MAX_DECIDED` decisions each."""
        if policy.source_stamp is None or policy is not self.policy:
            return {}
        key = (self.lens_key(policy, peer_name, None), self._token_of(policy))
        with self._reload_lock:
            kept = self._decided.get(key)
            if kept is None:
                kept = self._decided[key] = {}
                while len(self._decided) > MAX_LENSES:
                    self._decided.popitem(last=False)
            else:
                self._decided.move_to_end(key)
        return kept

    def screen(self, hits: Sequence[Hit], peer_name: str | None, peer_key: str | None,
               query: str, *, policy: Policy | None = None) -> list[tuple[Hit, str]]:
        """The hits this peer may see now or could after an approval, in ranked order.

        Args:
            hits: ranked hits from the corpus.
            peer_name: registry name, ``None`` for an anonymous peer.
            peer_key: the peer's public key (approvals are per key); ``None`` → no
                approval applies.
            query: the query text (approvals without ``--remember`` are per query).
            policy: the policy to apply; default :meth:`current_policy` (re-read when
                ``policy.toml`` changed).

        Returns:
            ``(hit, state)`` pairs with canonical ids: :data:`VISIBLE` for hits allowed by
            policy or opened by an approval/promotion of an ``ask`` source, :data:`PENDING`
            for ``ask`` hits nobody decided yet. Everything else (``never``, ``private``,
            ``peers`` without this peer, ``ask`` the owner denied, invalid) is absent.
        """
        verdicts = None
        read = self.approvals is None or peer_key is None  # read at the first ask hit, if any
        out: list[tuple[Hit, str]] = []
        policy = policy or self.current_policy()
        for hit, decision in self.decide_hits(hits, peer_name, policy=policy):
            if decision.allowed:
                out.append((hit, VISIBLE))
            elif decision.tier == "ask" and decision.canonical is not None:
                if not read:  # the approvals' files are read only for an answer with ask hits
                    verdicts, read = self.approvals.verdicts(peer_key, query), True
                if verdicts is not None and decision.canonical in verdicts.deny:
                    continue
                if verdicts is not None and decision.canonical in verdicts.allow:
                    out.append((hit, VISIBLE))
                else:
                    out.append((hit, PENDING))
        return out

    # --- leak scan ----------------------------------------------------------------------
    def check_outgoing(self, data: bytes | str, exempt: Iterable[bytes] = ()) -> None:
        """Refuse ``data`` if it contains a real path of a root or of the home.

        Args:
            data: the serialized outgoing message (UTF-8 bytes or text).
            exempt: byte strings the *peer* sent (its query and filter values as JSON
                string bodies, see :func:`echoes_of`). Those that themselves name a root or
                the home are cut out (exact occurrences) before the scan: the envelope
                echoes the request, and refusing a peer's own words because they happen to
                name a root would tell it that they do (an oracle on the real path). Our
                content around them is still scanned; other peer strings are not cut.

        Raises:
            EgressRefused: ``egress-leak``; the message names no path.
        """
        if self._leak is None:
            return
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        if not self._may_leak(data):  # the common case: one scan, nothing to cut
            return
        # only a peer string that itself names a root/home is cut out: cutting any other
        # (say "home") could break up one of our own paths and hide it from the scan
        for echo in sorted({e for e in exempt if self._leak.search(e)}, key=len, reverse=True):
            data = data.replace(echo, b"\x00")
        if self._leak.search(data) is not None:
            raise EgressRefused("egress-leak")

    def _may_leak(self, data: bytes) -> bool:
        """True when ``data`` contains a needle (:attr:`_leak`, which must be set), its
        pieces looked for first (:func:`leak_pieces`)."""
        pieces = self._leak_pieces
        if pieces is not None:
            low = data.lower()
            if not any(piece in low for piece in pieces):
                return False
        return self._leak.search(data) is not None  # type: ignore[union-attr]

    def check_frame(self, frame: Any) -> None:
        """The gate seam: the last check before an outgoing business frame leaves
        (DESIGN §1, §10). The session engine calls it once with every such frame, after
        validating and encoding it; there is no other leak scan on the answer path.

        Args:
            frame: a :class:`node.engine.session.OutgoingFrame` — ``data``, the encoded
                line that will leave (what is scanned, once), and ``replying_to``, the
                last business message the peer sent in this session (a decoded JSON
                object) or None: its strings are the echo exemption (:func:`echoes_of`,
                :meth:`check_outgoing`). ``message`` is not read here.

        Raises:
            EgressRefused: ``egress-leak``.
        """
        data = frame.data
        if self._leak is None or not self._may_leak(data):
            return  # the common case: one scan, and no echo set to build
        replying_to = frame.replying_to
        self.check_outgoing(data, echoes_of(replying_to) if replying_to is not None else ())


def echoes_of(request: Any) -> set[bytes]:
    """The JSON string bodies (as ``msgspec``/``json`` encode them) of every string in a
    peer's request — what an envelope may echo back (see :meth:`EgressGate.check_outgoing`)."""
    import msgspec

    out: set[bytes] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.add(msgspec.json.encode(value)[1:-1])
            out.add(json.dumps(value, ensure_ascii=True)[1:-1].encode("ascii"))
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(request)
    return out
