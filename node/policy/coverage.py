"""What the policy's rules cover among the indexed sources (issue 20, specs/policy.md §7.1).

A rule that matches nothing indexed is almost always a typo (``/oddd/**``), and a rule
whose sources are all decided by a more specific rule changes nothing: both must be said
when the owner sets the rule (``kith policy set``), on request (``kith policy check``) and
on the dashboard's policy page. Everything here is computed from the policy and the list
of indexed source ids (:meth:`node.corpus.store.Corpus.source_ids`) with the policy's own
matcher and precedence (:meth:`node.policy.store.Policy.match`), so what it reports is what
the gate decides.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.policy.store import Policy, Rule

#: Source ids listed per "decided elsewhere" group and in ``undecided`` at most.
MAX_LISTED = 20
#: Closest prefixes suggested for a rule that matches nothing.
MAX_SUGGESTIONS = 3


def rule_label(rule: Rule) -> str:
    """``"GLOB → TIER"`` (``" (override for NAME)"`` appended for an override)."""
    return f"{rule.glob} → {rule.tier}" + (f" (override for {rule.peer})" if rule.peer else "")


@dataclass
class RuleCoverage:
    """What one rule covers.

    Attributes:
        rule: the rule.
        matched: indexed source ids its glob matches.
        decided: those of ``matched`` it decides (it wins :meth:`Policy.match` for them:
            for an override, for its peer; for a rule, for an anonymous peer).
        elsewhere: the rest of ``matched`` by the rule that decides them instead, in
            policy order: ``[(rule, [source ids])]``.
        suggestions: when nothing matched, the closest indexed folder prefixes, as
            ``PREFIX/**`` globs (closest first).
    """

    rule: Rule
    matched: list[str] = field(default_factory=list)
    decided: list[str] = field(default_factory=list)
    elsewhere: list[tuple[Rule, list[str]]] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: ``{"glob", "tier", "for"?, "matches", "decides", "decidedElsewhere":
        [{"glob", "tier", "for"?, "count", "sources": [...]}], "suggestions": [...]}``
        (``sources`` lists at most :data:`MAX_LISTED`)."""
        out: dict[str, Any] = {"glob": self.rule.glob, "tier": self.rule.tier}
        if self.rule.peer is not None:
            out["for"] = self.rule.peer
        out.update(matches=len(self.matched), decides=len(self.decided),
                   decidedElsewhere=[_rule_ref(r, ids) for r, ids in self.elsewhere],
                   suggestions=list(self.suggestions))
        return out

    def lines(self) -> list[str]:
        """What ``kith policy set`` prints about the rule (plain text, one fact a line)."""
        n = len(self.decided)
        out = [f"decides {n} indexed source{'s' if n != 1 else ''}"]
        for other, ids in self.elsewhere:
            shown = ", ".join(ids[:MAX_LISTED]) + (f" (and {len(ids) - MAX_LISTED} more)" if len(ids) > MAX_LISTED else "")
            out.append(f"{len(ids)} of the sources it matches {'is' if len(ids) == 1 else 'are'} still decided by "
                       f"{rule_label(other)}: {shown}")
        return out

    def warning(self, indexed: int) -> str | None:
        """The warning for a rule that matches no indexed source, else None."""
        if self.matched:
            return None
        if not indexed:
            return (f"{self.rule.glob} matches no indexed source: nothing is indexed yet "
                    "(kith index add PATH, then kith index sync); the rule is kept")
        hint = f" (did you mean {' or '.join(self.suggestions)}?)" if self.suggestions else ""
        return f"{self.rule.glob} matches no indexed source; the rule is kept{hint}"


def _rule_ref(rule: Rule, ids: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"glob": rule.glob, "tier": rule.tier}
    if rule.peer is not None:
        out["for"] = rule.peer
    out.update(count=len(ids), sources=ids[:MAX_LISTED])
    return out


def _literal_head(glob: str) -> str:
    """The glob up to its first segment with a wildcard (``/oddd/**`` → ``/oddd``)."""
    head: list[str] = []
    for seg in glob.split("/")[1:]:
        if "*" in seg or "?" in seg:
            break
        head.append(seg)
    return "/" + "/".join(head)


def folder_prefixes(sources: Sequence[str]) -> list[str]:
    """Every folder above an indexed source id (``/a/b/c.md`` → ``/a``, ``/a/b``), sorted."""
    out: set[str] = set()
    for sid in sources:
        parts = sid.split("/")
        for i in range(2, len(parts)):
            out.add("/".join(parts[:i]))
    return sorted(out)


def suggest(glob: str, sources: Sequence[str]) -> list[str]:
    """The indexed folders closest to ``glob``'s literal head, as ``PREFIX/**`` globs; at
    most :data:`MAX_SUGGESTIONS`, closest first. Closeness is difflib's ratio of the whole
    paths or of their last segments, whichever is higher (``/oddd`` is close to
    ``/notes/odd``), keeping those within 0.1 of the best; with nothing at least 0.6 alike, the top-level folders."""
    head = _literal_head(glob)
    last = head.rsplit("/", 1)[-1]
    folders = folder_prefixes(sources)
    scored = []
    for folder in folders:
        whole = difflib.SequenceMatcher(None, head, folder).ratio()
        tail = difflib.SequenceMatcher(None, last, folder.rsplit("/", 1)[-1]).ratio() if last else 0.0
        score = max(whole, tail)
        if score >= 0.6:
            scored.append((-score, folder.count("/"), folder))
    scored.sort()
    # only the ones about as close as the best (a typo has one intended folder)
    close = [f for neg, _, f in scored if -neg >= -scored[0][0] - 0.1][:MAX_SUGGESTIONS]
    if not close:  # nothing alike: the top-level folders, so the owner sees what exists
        close = [f for f in folders if f.count("/") == 1][:MAX_SUGGESTIONS]
    return [f"{c}/**" for c in close]


def rule_coverage(policy: Policy, rule: Rule, sources: Sequence[str]) -> RuleCoverage:
    """What ``rule`` (one of ``policy``'s rules or overrides) covers among ``sources``."""
    cov = RuleCoverage(rule)
    others: dict[int, tuple[Rule, list[str]]] = {}
    order = {id(r): i for i, r in enumerate((*policy.rules, *policy.overrides))}
    for sid in sources:
        if not rule.matcher.match(sid):
            continue
        cov.matched.append(sid)
        winner = policy.match(sid, rule.peer)
        if winner is rule or winner == rule:
            cov.decided.append(sid)
        elif winner is not None:
            others.setdefault(id(winner), (winner, []))[1].append(sid)
    cov.elsewhere = [others[k] for k in sorted(others, key=lambda k: order.get(k, 0))]
    if not cov.matched:
        cov.suggestions = suggest(rule.glob, sources)
    return cov


@dataclass
class PolicyCheck:
    """``kith policy check``: every rule's coverage and the sources no rule decides.

    Attributes:
        sources: how many sources are indexed.
        rules: coverage of every rule, then every override, in file order.
        undecided: indexed source ids no rule or override matches (they are ``private``
            by default).
    """

    sources: int
    rules: list[RuleCoverage]
    undecided: list[str]

    @property
    def unmatched(self) -> list[RuleCoverage]:
        """The rules that match no indexed source."""
        return [c for c in self.rules if not c.matched]

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: ``{"sources", "rules": [RuleCoverage.to_dict()], "unmatchedRules":
        [{"glob", "tier", "for"?, "suggestions"}], "undecided": {"count", "sources"}}``."""
        return {"sources": self.sources, "rules": [c.to_dict() for c in self.rules],
                "unmatchedRules": [{k: v for k, v in c.to_dict().items()
                                    if k in ("glob", "tier", "for", "suggestions")} for c in self.unmatched],
                "undecided": {"count": len(self.undecided), "sources": self.undecided[:MAX_LISTED]}}


def check_policy(policy: Policy, sources: Sequence[str]) -> PolicyCheck:
    """Measure every rule and override of ``policy`` against the indexed ``sources``."""
    rules = [rule_coverage(policy, r, sources) for r in (*policy.rules, *policy.overrides)]
    every = [*policy.rules, *policy.overrides]
    undecided = [sid for sid in sources if not any(r.matcher.match(sid) for r in every)]
    return PolicyCheck(len(sources), rules, undecided)


def unmatched_scrubs(policy: Policy, sources: Sequence[str]) -> list[dict[str, Any]]:
    """The ``[[scrub]]`` entries with a glob that matches no indexed source (a typo, or a
    real path instead of a source id: they scrub nothing), each as ``{"glob", "for",
    "kinds", "suggestions"}`` (:func:`suggest`), in file order (specs/policy.md §9.5)."""
    out = []
    for entry in policy.scrub_rules:
        if entry.glob is not None and not any(entry.covers(sid) for sid in sources):
            out.append({"glob": entry.glob, "for": entry.recipient, "kinds": list(entry.kinds),
                        "suggestions": suggest(entry.glob, sources) if sources else []})
    return out


def unmatched_scrub_warning(entry: dict[str, Any], indexed: int) -> str:
    """The warning for one :func:`unmatched_scrubs` entry (``kith policy scrub --glob``)."""
    if not indexed:
        return (f"{entry['glob']} matches no indexed source: nothing is indexed yet "
                "(kith index add PATH, then kith index sync); the scrub entry is kept")
    hint = f" (did you mean {' or '.join(entry['suggestions'])}?)" if entry["suggestions"] else ""
    return f"{entry['glob']} matches no indexed source, so it scrubs nothing yet; the scrub entry is kept{hint}"


def indexed_sources(home: Path) -> list[str]:
    """The canonical ids of the sources indexed in ``home`` (``[]`` without a corpus)."""
    from node.common.errors import KithError
    from node.corpus.store import Corpus

    try:
        corpus = Corpus(home, readonly=True)
    except KithError:
        return []
    try:
        return corpus.source_ids()
    finally:
        corpus.close()
