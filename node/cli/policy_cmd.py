"""``kith policy``: edit and explain the egress policy (``<home>/policy.toml``, DESIGN §10)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from node.cli.common import (confirm_or_refuse, err_console, safe_text, untrusted_console as console, emit_json,
                             home_of, command_group, json_option)
from node.corpus.types import Root
from node.common.errors import KithError, UsageError
from node.policy.coverage import (MAX_LISTED, check_policy, indexed_sources, rule_coverage, rule_label,
                                  unmatched_scrubs)
from node.policy.store import (ANONYMOUS_SHARED_FACTOR, MAX_COPY_BYTES, MIN_MESSAGE_BYTES, TIERS, Decision, Policy, Quota,
                               Rule, check_peer_names)

#: said after every change: a running host re-reads policy.toml at its next query
LIVE_NOTE = "a running `kith host` applies this from its next query (no restart needed)"


def _note(message: str) -> None:
    """A note on stderr (plain text: a glob may contain '[' and must not be read as markup)."""
    err_console.print(safe_text(f"note: {message}"), markup=False, highlight=False)


def _warn(message: str) -> None:
    """A warning on stderr (plain text, see :func:`_note`)."""
    err_console.print(safe_text(f"warning: {message}"), markup=False, highlight=False)

policy_app = command_group(
    "Decide what may leave this machine: map source globs (/<root>/..., datasource ids, "
    "absolute paths) to tiers public, peers, ask, private (the default) or never."
)


class TierChoice(str, Enum):
    """The tiers a rule may give (DESIGN §10)."""

    public = "public"
    peers = "peers"
    ask = "ask"
    private = "private"
    never = "never"


_JSON = json_option("Print one JSON object on stdout.")
_YES = typer.Option(False, "--yes", help="Make the change even if it stops scrubbing indexed sources for some peer (without it, a terminal asks and anything else is refused).")


def guarded_write(home: Path, before: Policy, after: Policy, write, *, yes: bool,
                  served_as: dict | None = None) -> list:
    """Make a change that might stop scrubbing (specs/policy.md §9.5): say which indexed
    sources ``after`` would newly serve unscrubbed compared with ``before`` (and what the
    scrub record says was once covered), ask on a terminal unless ``yes``, then call
    ``write()`` and add both policies' coverage to the record.

    Args:
        before, after: the policy as it is and as the change leaves it.
        write: makes the change (saves policy.toml, removes a pin, ...); called only
            when nothing would lapse or the owner confirmed.
        served_as: recipients served under another identity afterwards
            (``kith peers remove NAME``: ``{NAME: None}``).

    Returns:
        The :class:`node.policy.scrub_coverage.Unscrubbed` lines the owner confirmed
        (empty: nothing lapsed).

    Raises:
        PolicyError: ``scrub-would-lapse`` (not a terminal and no ``yes``, or not
            answered yes); nothing is written then.
    """
    from node.common.errors import PolicyError
    from node.policy.scrub_coverage import change_unscrubs, commit_change

    def scanning(n: int) -> None:
        if n >= 10_000:
            _note(f"checking what this change stops scrubbing in {n} indexed sources…")

    lapsed, record = change_unscrubs(home, before, after, served_as=served_as, on_scan=scanning)
    if lapsed:
        err_console.print(safe_text("this change stops scrubbing indexed sources (specs/policy.md §9):\n"
                                    + "\n".join(f"  {u.line()}" for u in lapsed)),
                          markup=False, highlight=False, soft_wrap=True)
        confirm_or_refuse("stop scrubbing them?", yes=yes,
                          off_terminal=PolicyError("scrub-would-lapse", "not changed: it would serve these sources "
                                                   "unscrubbed; run it again with --yes to confirm"),
                          declined=PolicyError("scrub-would-lapse", "not changed (not confirmed)"))
    commit_change(home, record, before, after, write)
    return lapsed


def _unscrubbed_json(lapsed: list) -> dict:
    """``{"unscrubbed": [...]}`` for a change that stopped scrubbing (confirmed), else ``{}``."""
    return {"unscrubbed": [u.to_dict() for u in lapsed]} if lapsed else {}


def _rule_dict(rule: Rule) -> dict:
    out = {"glob": rule.glob, "tier": rule.tier, "peers": list(rule.peers)}
    if rule.peer is not None:
        out["for"] = rule.peer
    if rule.until is not None:
        out["until"] = rule.until
    return out


def _corpus_roots(home: Path) -> list[Root]:
    """Roots from the corpus database, or ``[]`` when there is no corpus (yet)."""
    try:
        from node.corpus.store import Corpus
    except ModuleNotFoundError as exc:
        if exc.name != "node.corpus.store":
            raise
        return []
    try:
        corpus = Corpus(home, readonly=True)
    except KithError:
        return []
    try:
        return list(corpus.roots())
    except KithError:
        return []
    finally:
        close = getattr(corpus, "close", None)
        if callable(close):
            close()


def _tier_text(rule: Rule) -> str:
    """``never``, or ``peers (alice, bob)`` for a peers rule."""
    return f"{rule.tier} ({', '.join(rule.peers)})" if rule.peers else rule.tier


def _warn_unpinned(home: Path, names: list[str], option: str) -> list[str]:
    """Warn about each of ``names`` that is no pinned peer's name (a typo, or a peer not yet
    added): the rule or quota is kept, but applies to nobody until a peer is pinned under
    that name. Returns those names (sorted, no duplicates)."""
    if not names:
        return []
    from node.trust.peers import PeerRegistry

    registry = PeerRegistry.load(home)
    groups = Policy.load(home).groups
    unknown = sorted({n for n in names if (groups.get(n[1:]) is None if n.startswith("@") else
                                           registry.by_name(n) is None)})
    for name in unknown:
        if name.startswith("@"):
            _warn(f"{option} {name}: no group has that name, so this applies to nobody until "
                  f"`kith peers group add {name[1:]} PEER...`")
            continue
        _warn(f"{option} {name}: no pinned peer has that name, so this applies to nobody until a peer "
              f"is pinned as {name} (`kith peers list` shows the pinned names)")
    return unknown


def _supersession(old: Rule | None, rule: Rule, same: list[Rule]) -> tuple[list[str], dict]:
    """What ``kith policy set`` says about the rules the new ``rule`` replaced (``old``, the
    same glob) or ties with (``same``: other spellings of the same sources, where the more
    restrictive tier decides, specs/policy.md §4): (lines, JSON fields)."""
    lines: list[str] = []
    out: dict = {"replaced": None, "sameSources": []}
    if old is not None:
        out["replaced"] = _rule_dict(old)
        if (old.tier, old.peers) == (rule.tier, rule.peers):
            lines.append(f"unchanged: {rule.glob} was already {_tier_text(old)}")
        else:
            lines.append(f"replaced {_tier_text(old)} → {_tier_text(rule)}")
    rank = TIERS.index(rule.tier)
    for other in same:
        other_rank = TIERS.index(other.tier)
        out["sameSources"].append({**_rule_dict(other), "stillDecides": other_rank > rank})
        if rank > other_rank:
            lines.append(f"overrides {rule_label(other)}: it names the same sources, and on a tie the "
                         "more restrictive tier decides")
        elif other_rank > rank:
            lines.append(f"{rule_label(other)} names the same sources and is more restrictive, so it still "
                         f"decides them (kith policy unset '{other.glob}' to let this rule decide)")
        else:
            lines.append(f"{rule_label(other)} already names the same sources with the same tier")
    return lines, out


@policy_app.command("set")
def set_cmd(
    ctx: typer.Context,
    glob: str = typer.Argument(..., help="Source glob, e.g. '/docs/**' ('*', '?' stay in a segment)."),
    tier: TierChoice = typer.Argument(..., help="Tier for sources the glob matches."),
    peer: Optional[List[str]] = typer.Option(
        None, "--peer", metavar="NAME", help="Registry name allowed by tier 'peers' (repeatable)."),
    for_peer: Optional[str] = typer.Option(
        None, "--for", metavar="NAME|@GROUP", help="A per-peer override: applies to this registry name (or group) only."),
    until: Optional[str] = typer.Option(
        None, "--until", metavar="DATE|DURATION", help="The override ends then (2027-01-31, 12h, 7d, 2w); only with --for."),
    yes: bool = _YES,
    as_json: bool = _JSON,
) -> None:
    """Add or replace the rule for GLOB (with --for NAME: that peer's override). Scrubbing
    follows sources, not tiers, so moving a source to another tier keeps it scrubbed; a
    rule that would open to a peer a source once scrubbed for it and no longer is asks
    first (--yes)."""
    from node.common.grants import parse_until

    if until is not None and for_peer is None:
        raise UsageError("usage", "--until ends an override: give --for NAME|@GROUP too")
    ends = parse_until(until) if until is not None else None
    peers = list(peer or [])
    if for_peer is not None:
        if tier is TierChoice.peers or peers:
            raise UsageError("usage", "--for NAME already names the peer: use tier public, ask, private or never")
    elif tier is TierChoice.peers and not peers:
        raise UsageError("usage", "tier 'peers' needs at least one --peer NAME")
    if tier is not TierChoice.peers and peers:
        raise UsageError("usage", "--peer is only allowed with tier 'peers'")
    check_peer_names([for_peer] if for_peer is not None else [], "--for name", groups=True)
    check_peer_names(peers, "--peer name", groups=True)
    home = home_of(ctx)
    before = Policy.load(home)
    policy = Policy.load(home)
    old = policy.rule_for(glob, for_peer=for_peer)
    rule = policy.set(glob, tier.value, peers or None, for_peer=for_peer, until=ends)
    # every refusal is raised before the write: a refused set leaves policy.toml as it was
    lapsed = guarded_write(home, before, policy, policy.save, yes=yes)
    unpinned = _warn_unpinned(home, [for_peer] if for_peer is not None else peers,
                              "--for" if for_peer is not None else "--peer")
    said, superseded = _supersession(old, rule, policy.same_sources(rule))
    sources = indexed_sources(home)
    cov = rule_coverage(policy, rule, sources)
    warning = cov.warning(len(sources))
    if as_json:
        emit_json({**_rule_dict(rule), **{k: v for k, v in cov.to_dict().items() if k not in ("glob", "tier", "for")},
                   **superseded, "unpinnedPeers": unpinned, "warning": warning,
                   **_unscrubbed_json(lapsed)})
    else:
        extra = f" (peers: {', '.join(rule.peers)})" if rule.peers else ""
        extra += f" (override for {rule.peer})" if rule.peer else ""
        extra += f" (until {rule.until})" if rule.until else ""
        console.print(f"{rule.glob} → {rule.tier}{extra}", highlight=False, markup=False)
        body = said + (cov.lines() if cov.matched else [])
        if body:
            console.print("\n".join(f"  {line}" for line in body), highlight=False, markup=False,
                          soft_wrap=True)
    if warning:
        _warn(warning)
    if policy.copy_grants:
        _note(COPY_TIER_NOTE)
    _note(LIVE_NOTE)


def _not_pinned(home: Path, policy: Policy) -> list[dict[str, str]]:
    """``[{"where", "name"}]``: each rule (its ``peers``), override (its ``--for``), group
    member and copy grant (its ``--for``, specs/copies.md §1) naming a peer that is not pinned in ``peers.json`` (any more) — it grants
    nothing until that name is pinned again (`kith policy check`, issue 32)."""
    from node.policy.store import GROUP_PREFIX
    from node.trust.peers import PeerRegistry

    pinned = set(PeerRegistry.load(home).peers)
    out: list[dict[str, str]] = []
    for rule in [*policy.rules, *policy.overrides]:
        named = [*rule.peers, *([rule.peer] if rule.peer else [])]
        out += [{"where": rule_label(rule), "name": n} for n in named
                if not n.startswith(GROUP_PREFIX) and n not in pinned]
    for group in policy.groups.values():
        out += [{"where": f"@{group.name}", "name": m} for m in sorted(group.members) if m not in pinned]
    out += [{"where": f"copy grant {c.glob}", "name": c.recipient} for c in policy.copy_grants
            if not c.recipient.startswith(GROUP_PREFIX) and c.recipient not in pinned]
    return out


@policy_app.command("check")
def check_cmd(ctx: typer.Context, as_json: bool = _JSON) -> None:
    """List the rules that match no indexed source (typos) and the indexed sources no rule
    decides (private by default), with how many sources each rule decides, the indexed
    sources served unscrubbed to a peer that a scrub entry once covered, and the rules,
    groups and copy grants naming a peer that is not pinned (any more)."""
    from node.policy.scrub_coverage import ScrubRecord, recipients, unscrubbed
    from node.trust.peers import PeerRegistry

    home = home_of(ctx)
    policy = Policy.load(home)
    sources = indexed_sources(home)
    report = check_policy(policy, sources)
    record = ScrubRecord.load(home)
    record.add(policy)  # what it reads counts as covered from now on (§9.5)
    try:
        record.save(home)
    except OSError as exc:
        _warn(f"could not write the scrub record: {exc.strerror}")
    from node.common.grants import ended as grant_ended

    registry = PeerRegistry.load(home)
    ended = [name for name, rec in registry.peers.items() if grant_ended(rec.until)]
    lapsed = unscrubbed(policy, record, sources, recipients(policy, record, list(registry.peers)), ended=ended)
    idle_scrubs = unmatched_scrubs(policy, sources)
    not_pinned = _not_pinned(home, policy)
    if as_json:
        emit_json({**report.to_dict(), "unscrubbed": [u.to_dict() for u in lapsed], "unmatchedScrub": idle_scrubs,
                   "notPinned": not_pinned, "copy": _copy_check(policy, sources)})
        return
    lines = [f"{report.sources} indexed source(s), {len(report.rules)} rule(s)"]
    for cov in report.rules:
        lines.append(f"  {rule_label(cov.rule)}: matches {len(cov.matched)}, decides {len(cov.decided)}")
        lines += [f"    {line}" for line in cov.lines()[1:]]
    if report.unmatched:
        lines.append("rules that match no indexed source:")
        for cov in report.unmatched:
            hint = f"  (did you mean {' or '.join(cov.suggestions)}?)" if cov.suggestions else ""
            lines.append(f"  {rule_label(cov.rule)}{hint}")
    else:
        lines.append("every rule matches at least one indexed source")
    if report.undecided:
        lines.append(f"sources no rule decides ({len(report.undecided)}; private by default):")
        lines += [f"  {sid}" for sid in report.undecided[:MAX_LISTED]]
        if len(report.undecided) > MAX_LISTED:
            lines.append(f"  (and {len(report.undecided) - MAX_LISTED} more; --json lists the first {MAX_LISTED})")
    else:
        lines.append("every indexed source is decided by a rule")
    if idle_scrubs:
        lines.append("scrub entries that match no indexed source (they scrub nothing):")
        for miss in idle_scrubs:
            hint = f"  (did you mean {' or '.join(miss['suggestions'])}?)" if miss["suggestions"] else ""
            lines.append(f"  {miss['glob']} for {miss['for']}: {', '.join(miss['kinds'])}{hint}")
    if lapsed:
        lines.append("served unscrubbed though a scrub entry once covered them "
                     "(`kith policy scrub --for WHO [--glob GLOB] KINDS` scrubs them again):")
        lines += [f"  {u.line()}" for u in lapsed]
    elif policy.scrub_rules or record.rows:
        lines.append("nothing a scrub entry ever covered is served unscrubbed")
    lines += _copy_check_lines(policy, sources)
    if policy.scrub_migrated:
        lines.append("policy.toml still holds the older [scrub.tier]/[scrub.peer] form (read as [[scrub]]; "
                     "the next `kith policy` change writes the new form)")
    if not_pinned:
        lines.append("rules and groups naming a peer that is not pinned (they grant it nothing; "
                     "`kith peers add NAME KEY`, or remove the name):")
        lines += [f"  {n['where']}: {n['name']}" for n in not_pinned]
    else:
        lines.append("every peer the rules and groups name is pinned")
    console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)


@policy_app.command("unset")
def unset_cmd(
    ctx: typer.Context,
    glob: str = typer.Argument(..., help="The glob of the rule to remove."),
    for_peer: Optional[str] = typer.Option(None, "--for", metavar="NAME|@GROUP", help="Remove that peer's (or group's) override instead."),
    yes: bool = _YES,
    as_json: bool = _JSON,
) -> None:
    """Remove the rule for GLOB (a warning, not an error, when there is none). Asks first
    (--yes) when that would open to a peer a source once scrubbed for it and no longer is."""
    home = home_of(ctx)
    before = Policy.load(home)
    policy = Policy.load(home)
    removed = policy.unset(glob, for_peer=for_peer)
    lapsed: list = []
    if removed:
        lapsed = guarded_write(home, before, policy, policy.save, yes=yes)
    else:
        _warn(f"no rule for {glob!r}; nothing changed")
    if as_json:
        emit_json({"glob": glob, "removed": removed, **_unscrubbed_json(lapsed)})
    elif removed:
        console.print(f"removed {glob}", highlight=False, markup=False)
    if removed:
        _note(LIVE_NOTE)


def _quota_text(q: Quota) -> str:
    rate = "no queries" if q.queries_per_hour <= 0 else f"{q.queries_per_hour} queries/hour"
    return f"{rate}, burst {q.burst}, at most {q.max_message_bytes} bytes per answer"


def _quota_lines(policy: Policy) -> list[str]:
    """The effective quotas, one line each: every peer's default, each named peer's, and
    the bucket anonymous peers share (defaults included: a guest over quota is told
    ``rate-limited``, and the owner should see why)."""
    table = policy.quota
    own = {k: v for k, v in table.items() if k not in ("peer", "anonymous")}
    lines = [f"  {'every peer':<18} {_quota_text(policy.quota_for(None))}"
             + ("" if own else "  (built-in default)")]
    for name in sorted(table.get("peer") or {}):
        lines.append(f"  {'peer ' + name:<18} {_quota_text(policy.quota_for(name))}")
    lines.append(f"  {'anonymous, shared':<18} {_quota_text(policy.anonymous_quota())}"
                 + ("" if table.get("anonymous") else
                    f"  ({ANONYMOUS_SHARED_FACTOR}x rate and burst)"))
    return lines


@policy_app.command("list")
def list_cmd(ctx: typer.Context, as_json: bool = _JSON) -> None:
    """Show the rules in file order, then per-peer overrides, then the quotas in force
    (the [quota] table, built-in defaults where it sets nothing), then what is scrubbed."""
    from node.common.grants import until_text

    policy = Policy.load(home_of(ctx))
    if as_json:
        emit_json({"rules": [_rule_dict(r) for r in policy.rules],
                   "overrides": [_rule_dict(r) for r in policy.overrides], "quota": policy.quota,
                   "scrub": _scrub_json(policy), "copy": _copy_json(policy)})
        return
    if not policy.rules and not policy.overrides:
        console.print("no rules: every source is private", highlight=False)
    else:
        table = Table("glob", "tier", "peers", "for", "until", box=None, header_style="bold")
        for rule in (*policy.rules, *policy.overrides):
            table.add_row(rule.glob, rule.tier, ", ".join(rule.peers), rule.peer or "",
                          until_text(rule.until, still=""))
        console.print(table)
    console.print("quota (`kith policy quota` changes it):\n" + "\n".join(_quota_lines(policy)),
                  highlight=False, markup=False, soft_wrap=True)
    console.print("scrubbed for peers (`kith policy scrub` changes it):\n" + "\n".join(_scrub_lines(policy)),
                  highlight=False, markup=False, soft_wrap=True)
    console.print("copies peers may keep (`kith policy copy` changes it):\n" + "\n".join(_copy_lines(policy)),
                  highlight=False, markup=False, soft_wrap=True)


@policy_app.command("quota")
def quota_cmd(
    ctx: typer.Context,
    for_peer: Optional[str] = typer.Option(
        None, "--for", metavar="NAME|@GROUP", help="Set this registry name's (or group's) quota ([quota.peer.NAME]) instead of every peer's."),
    anonymous: bool = typer.Option(
        False, "--anonymous", help="Set the one bucket all anonymous peers share ([quota.anonymous])."),
    per_hour: Optional[int] = typer.Option(
        None, "--per-hour", metavar="N", help="Queries per hour, sustained (0: no queries at all)."),
    burst: Optional[int] = typer.Option(
        None, "--burst", metavar="N", help="Queries allowed back to back (the bucket size)."),
    max_bytes: Optional[int] = typer.Option(
        None, "--max-bytes", metavar="N", help=f"Largest answer message in bytes (at least {MIN_MESSAGE_BYTES})."),
    as_json: bool = _JSON,
) -> None:
    """Set the per-peer query quota (token bucket): every peer's, one peer's (--for NAME)
    or the anonymous peers' shared bucket (--anonymous). Keys not given keep their value;
    with none given, show the quota in force."""
    if for_peer is not None and anonymous:
        raise UsageError("usage", "give --for NAME or --anonymous, not both")
    values = {k: v for k, v in (("queries_per_hour", per_hour), ("burst", burst),
                                ("max_message_bytes", max_bytes)) if v is not None}
    home = home_of(ctx)
    policy = Policy.load(home)
    if values:
        policy.set_quota(values, for_peer=for_peer, anonymous=anonymous)
        policy.save()
    elif for_peer is not None:
        check_peer_names([for_peer], "--for name", groups=True)
    unpinned = _warn_unpinned(home, [for_peer] if for_peer is not None else [], "--for")
    q = policy.anonymous_quota() if anonymous else policy.quota_for(for_peer)
    if as_json:
        emit_json({"for": for_peer, "anonymous": anonymous, "changed": bool(values), "unpinnedPeers": unpinned,
                   "queries_per_hour": q.queries_per_hour, "burst": q.burst,
                   "max_message_bytes": q.max_message_bytes})
    else:
        who = (f"peer {for_peer}" if for_peer is not None else
               "anonymous peers (shared)" if anonymous else "every peer")
        console.print(f"quota for {who}: {_quota_text(q)}", highlight=False, markup=False, soft_wrap=True)
    if values:
        _note(LIVE_NOTE)


def _scrub_json(policy: Policy) -> list:
    """The ``[[scrub]]`` entries as stored: ``[{"glob": str|null, "for", "kinds"}]``."""
    return [{"glob": s.glob, "for": s.recipient, "kinds": list(s.kinds)} for s in policy.scrub_rules]


def _scrub_lines(policy: Policy) -> list[str]:
    """The ``[[scrub]]`` entries, one line each (``kith policy scrub``/``list``)."""
    lines = []
    for s in policy.scrub_rules:
        who = "every peer" if s.recipient == "*" else s.recipient
        lines.append(f"  {who:<18} {s.glob or 'every source':<24} {', '.join(s.kinds)}")
    if policy.scrub_migrated:
        lines.append("  (read from the older [scrub.tier]/[scrub.peer] form; the next change writes [[scrub]])")
    return lines or ["  nothing is scrubbed"]


@policy_app.command("scrub")
def scrub_cmd(
    ctx: typer.Context,
    kinds: Optional[str] = typer.Argument(
        None, metavar="[KINDS]",
        help="Comma-separated kinds to replace by placeholders: email, phone, card, iban, secret."),
    for_target: Optional[str] = typer.Option(
        None, "--for", metavar="'*'|PEER|@GROUP",
        help="Who it is scrubbed for: '*' (every peer, anonymous included), a pinned peer's name, or @GROUP (every member). "
             "A tier (public, peers, ask) is the old spelling of '*'."),
    glob: Optional[str] = typer.Option(
        None, "--glob", metavar="GLOB", help="Only these sources, whatever their tier (default: every source)."),
    off: bool = typer.Option(False, "--off", help="Stop scrubbing for --for (and --glob): removes that entry."),
    yes: bool = _YES,
    as_json: bool = _JSON,
) -> None:
    """Scrub values out of what peers receive: e-mail addresses, phone numbers, card
    numbers (Luhn), IBANs (mod 97) and API/private keys are replaced by [email], [phone],
    ... in previews, excerpts, synthesis and source ids, and a scrubbed peer's index holds
    the scrubbed text, so searching for a value finds nothing. It follows the sources
    (--glob) and the recipients (--for), never a tier: moving a source to another tier, or
    approving an 'ask' source, keeps it scrubbed. KINDS replaces what the entry had;
    removing kinds asks first (--yes) when indexed sources would be served unscrubbed.
    Without arguments, list what is scrubbed."""
    from node.common.scrub import KINDS, check_kinds
    from node.policy.store import SCRUB_TIERS

    home = home_of(ctx)
    policy = Policy.load(home)
    changed = None
    lapsed: list = []
    if for_target is None:
        if kinds is not None or off or glob is not None:
            raise UsageError("usage", "give --for '*'|PEER|@GROUP with KINDS or --off")
    else:
        if off == (kinds is not None):
            raise UsageError("usage", "give either KINDS (e.g. email,card) or --off")
        wanted = [] if off else [k.strip() for k in kinds.split(",") if k.strip()]  # type: ignore[union-attr]
        if not off and not wanted:
            raise UsageError("usage", f"KINDS is a comma-separated list of {', '.join(KINDS)}")
        check_kinds(wanted)
        before = Policy.load(home)
        entry = policy.set_scrub(for_target, wanted, glob=glob)
        changed = policy.scrub_rules != before.scrub_rules or policy.scrub_migrated
        if changed:
            lapsed = guarded_write(home, before, policy, policy.save, yes=yes)
            policy.scrub_migrated = False
        if for_target in SCRUB_TIERS:
            _note(f"scrubbing follows sources and recipients, not tiers (specs/policy.md §9.0): --for {for_target} "
                  "is stored as --for '*' (every peer); narrow it with --glob")
        elif for_target != "*" and entry is not None:
            _warn_unpinned(home, [for_target], "--for")
        if off and policy.scrub_rules == before.scrub_rules:
            _warn(f"nothing was scrubbed for {for_target}" + (f" in {glob}" if glob else "") + "; nothing changed")
        if entry is not None and entry.glob is not None:
            from node.policy.coverage import unmatched_scrub_warning, unmatched_scrubs

            sources = indexed_sources(home)
            for miss in unmatched_scrubs(Policy(scrubs=[entry]), sources):
                _warn(unmatched_scrub_warning(miss, len(sources)))
    if as_json:
        emit_json({"scrub": _scrub_json(policy), "changed": bool(changed), **_unscrubbed_json(lapsed)})
    else:
        console.print("scrubbed for peers (`kith policy scrub --for '*'|PEER|@GROUP [--glob GLOB] KINDS`):\n"
                      + "\n".join(_scrub_lines(policy)), highlight=False, markup=False, soft_wrap=True)
    if changed:
        _note(LIVE_NOTE + "; a scrubbed peer's index is rebuilt at its next query")


@policy_app.command("explain")
def explain_cmd(
    ctx: typer.Context,
    source: str = typer.Argument(..., help="A source id (/<root>/...), datasource id or absolute path."),
    peer: Optional[str] = typer.Option(
        None, "--peer", metavar="NAME", help="Answer for this registry name (default: an anonymous peer)."),
    as_json: bool = _JSON,
) -> None:
    """Show how SOURCE normalizes and which rule and tier apply for a peer."""
    home = home_of(ctx)
    if peer is not None:
        check_peer_names([peer], "--peer name")
    policy = Policy.load(home)
    decision: Decision = policy.decide(source, peer, roots=_corpus_roots(home))
    grant = policy.copy_allowed(decision.canonical, peer) if decision.canonical is not None else None
    if as_json:
        out = {"canonical": decision.canonical, "tier": decision.tier,
               "allowed": decision.allowed, "matched": decision.matched}
        if grant is not None:  # only when NAME may keep a copy of it (specs/copies.md §1)
            out["copy"] = {"glob": grant.glob, "for": grant.recipient, "until": grant.until,
                           "maxBytes": grant.max_bytes}
        if decision.override is not None:
            out["override"] = decision.override  # only when a per-peer override decided
        emit_json(out)
        return
    who = f"peer {peer!r}" if peer is not None else "an anonymous peer"
    lines = [
        f"canonical: {decision.canonical if decision.canonical is not None else '(invalid source)'}",
        f"tier:      {decision.tier}",
        f"allowed:   {'yes' if decision.allowed else 'no'} (for {who})",
        f"matched:   {decision.matched if decision.matched is not None else '(no rule: default private)'}"
        + (f" (override for {decision.override})" if decision.override else ""),
    ]
    if decision.tier == "ask":
        lines.append("note:      'ask' sources open per request: kith approvals list / approve ID")
    if grant is not None:
        lines.append(f"copy:      {who} may keep a copy (grant {grant.glob} for {grant.recipient}"
                     + (f" until {grant.until}" if grant.until else "") + ")")
    elif peer is not None:
        lines.append(f"copy:      no ({who} may not keep a copy of it)")
    console.print("\n".join(lines), highlight=False, markup=False)


# --- copies a peer may keep (specs/copies.md §1) ---------------------------------------

#: What the owner is told when granting a copy: what no later change can undo (specs/copies.md §5).
COPY_WARNING = ("a copy cannot be taken back from a peer that stops syncing: it keeps what it copied, "
                "and the host's signatures prove what was shared. Ending or narrowing the grant deletes "
                "the copy at that peer's next sync or handshake with this host only (an --until its own "
                "node enforces, without asking this host).")
#: What ending or narrowing a grant does, and what it cannot (specs/copies.md §5).
COPY_ENDING_NOTE = ("the peer deletes what this no longer grants at its next sync or handshake with this host "
                    "(any session it opens: an ask, a queued question's delivery, a sync); what cannot be undone: "
                    "a peer that stops syncing and never connects again keeps what it copied, and this host's "
                    "signatures prove what was shared.")
#: `policy set` when copy grants exist: tiers decide what a copy may hold too.
COPY_TIER_NOTE = ("copy grants follow tiers: a source this no longer serves a granted peer without asking "
                  "(ask, private, never, or peers not naming it) leaves that peer's copy at its next sync or "
                  "handshake with this host; a peer that never connects again keeps what it copied.")


def _copy_json(policy: Policy) -> list:
    """The ``[[copy]]`` grants as stored: ``[{"glob", "for", "until", "maxBytes", "inForce"}]``."""
    from node.common.grants import ended

    return [{"glob": c.glob, "for": c.recipient, "until": c.until, "maxBytes": c.max_bytes,
             "inForce": not ended(c.until, policy.now())} for c in policy.copy_grants]


def _copy_lines(policy: Policy) -> list[str]:
    """The ``[[copy]]`` grants, one line each."""
    lines = []
    for c in _copy_json(policy):
        end = "" if c["until"] is None else (f" until {c['until']}" if c["inForce"] else f" ended {c['until']}")
        budget = "" if c["maxBytes"] is None else f" max {c['maxBytes']:,} bytes"
        lines.append(f"  {c['for']:<18} {c['glob']:<24}{budget}{end}")
    return lines or ["  no peer may keep a copy"]


def _copy_check(policy: Policy, sources: list) -> list:
    """Per grant: how many indexed sources its glob matches, how many the recipient may keep
    (the rest are ``ask``/``private``/``never``, not shared with it or have a scrubbed value
    in their id, and are never copied).
    A group grant is counted for the group's current members together."""
    out = []
    for c in policy.copy_grants:
        who = ([m for m in policy.groups.get(c.recipient[1:], None).members]
               if c.recipient.startswith("@") and policy.groups.get(c.recipient[1:]) is not None
               else [] if c.recipient.startswith("@") else [c.recipient])
        matched = [s for s in sources if c.matcher.match(s)]
        kept = [s for s in matched if any(policy.copy_allowed(s, w) is not None for w in who)]
        out.append({"glob": c.glob, "for": c.recipient, "matches": len(matched), "copyable": len(kept),
                    "notCopied": sorted(set(matched) - set(kept))[:MAX_LISTED]})
    return out


def _copy_check_lines(policy: Policy, sources: list) -> list[str]:
    lines = []
    for c in _copy_check(policy, sources):
        lines.append(f"copy grant {c['glob']} for {c['for']}: matches {c['matches']}, may be kept {c['copyable']}")
        if c["notCopied"]:
            lines.append("  never copied (ask, private, never, not shared with it, or its id holds a value scrubbed for it):")
            lines += [f"    {s}" for s in c["notCopied"]]
    return lines


def _warn_copy_reach(home: Path, policy: Policy, glob: str, recipient: str) -> None:
    """What ``kith policy copy GLOB --for NAME`` says when the new grant copies nothing: its
    glob matches no indexed source (a typo, or a folder not indexed yet), or every source it
    matches is one the recipient may not keep (:func:`_copy_check`'s count)."""
    rows = [c for c in _copy_check(policy, indexed_sources(home)) if c["glob"] == glob and c["for"] == recipient]
    if not rows:
        return
    if rows[0]["matches"] == 0:
        _warn(f"{glob} matches no indexed source: nothing is copied until a source it matches is indexed "
              "(`kith policy check` lists each grant's matches)")
    elif rows[0]["copyable"] == 0:
        _warn(f"{recipient} may keep none of the {rows[0]['matches']} source(s) {glob} matches (ask, private, never, "
              "not shared with it, or a scrubbed value in the id): nothing is copied")


@policy_app.command("copy")
def copy_cmd(
    ctx: typer.Context,
    glob: Optional[str] = typer.Argument(None, metavar="[GLOB]", help="The sources (a policy glob, e.g. '/notes/**')."),
    for_target: Optional[str] = typer.Option(None, "--for", metavar="PEER|@GROUP",
                                             help="Who may keep the copy: a pinned peer's (or person's) name, or @GROUP."),
    until: Optional[str] = typer.Option(None, "--until", metavar="DATE|DURATION",
                                        help="End the grant then (2027-01-31, 2027-01-31T18:00:00Z, 30d); the peer's own node deletes the copy then, even if it never reaches this host again."),
    max_bytes: Optional[int] = typer.Option(None, "--max-bytes", metavar="N", min=1, max=MAX_COPY_BYTES,
                                            help="The most bytes of text the copy may hold (a sync over it is refused: "
                                                 "copy-over-budget). With several grants for one peer, the largest "
                                                 "counts, and none when one has none."),
    off: bool = typer.Option(False, "--off", help="End the grant (GLOB, --for): the peer's next sync or handshake with this host deletes what it copied under it."),
    as_json: bool = _JSON,
) -> None:
    """Let a pinned peer keep a copy of some sources, so it can search them while this
    host sleeps (`kith copies sync` on its side). Only sources it may already see are
    copied (tier public, or peers naming it); ask, private and never sources never are.
    The copy holds the text as scrubbed for that peer, each document signed by this host.
    Ending or narrowing it (--off, --until, a tier change) deletes what the peer may no
    longer hold at its next sync or handshake with this host; at --until its own node
    deletes the copy without asking. What cannot be undone: a peer that stops syncing keeps
    what it copied, and the signatures prove what was shared. Without arguments, list the
    grants."""
    from node.common.grants import parse_until

    home = home_of(ctx)
    policy = Policy.load(home)
    changed = False
    if glob is None:
        if for_target is not None or off or until is not None or max_bytes is not None:
            raise UsageError("usage", "give GLOB with --for PEER|@GROUP")
    else:
        if for_target is None:
            raise UsageError("usage", "give --for PEER|@GROUP: who may keep the copy")
        check_peer_names([for_target], "--for name", groups=True)
        if off:
            if until is not None or max_bytes is not None:
                raise UsageError("usage", "--off takes no --until or --max-bytes")
            changed = policy.unset_copy(glob, for_target)
            if not changed:
                _warn(f"no copy grant {glob} for {for_target}; nothing changed")
            else:
                _warn(COPY_ENDING_NOTE)
        else:
            end = parse_until(until) if until is not None else None
            policy.set_copy(glob, for_target, until=end, max_bytes=max_bytes)
            changed = True
            _warn_unpinned(home, [for_target], "--for")
            if not for_target.startswith("@"):
                budget = policy.copy_budget(for_target)
                if budget != max_bytes:  # another grant decides it (specs/copies.md §1)
                    _warn(f"{for_target}'s copy may hold {'any number of' if budget is None else f'{budget:,}'} "
                          f"bytes, not {'any number' if max_bytes is None else f'{max_bytes:,}'}: the budget is "
                          f"the largest --max-bytes among {for_target}'s grants, none when one sets none")
            _warn_copy_reach(home, policy, glob, for_target)
            _warn(COPY_WARNING)
        if changed:
            policy.save()
    if as_json:
        emit_json({"copy": _copy_json(policy), "changed": changed,
                   **({"warning": COPY_ENDING_NOTE if off else COPY_WARNING} if changed else {})})
    else:
        console.print("copies peers may keep (`kith policy copy GLOB --for PEER|@GROUP [--until ...] [--max-bytes N]`):\n"
                      + "\n".join(_copy_lines(policy)), highlight=False, markup=False, soft_wrap=True)
    if changed:
        _note("the peer's next sync or handshake with this host applies this (`kith copies sync`, its running "
              "node's, or any `kith ask` it sends here)"
              + ("" if off or until is None else "; at --until its own node deletes the copy, even if it "
                 "never reaches this host again"))
