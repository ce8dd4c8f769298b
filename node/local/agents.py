"""Agent credentials and the one scope check of both local doors (issue 41, specs/agents.md).

An *agent* is a program the owner lets act for them through a local door — the local API
(``kith api serve``) or ``kith mcp``. Each agent has a name, a token (kept here only as its
SHA-256) and a scope:

- ``sources``: globs of this node's own source ids it may search (empty: none);
- ``peers``: pinned peer names, ``@group`` names, or ``all`` (empty: it asks no one);
- ``queue``: whether it may keep questions in the outbox (and read it);
- ``outbound``: what the outbound gate does with a held question (``allow|ask|block``);
- ``until``: when the credential ends (RFC 3339 UTC), or never.

What a scope does not name is not granted. A scope only narrows what an agent may do; it
never widens what the owner's policy lets a peer see.

The agents live in ``<home>/agents.json`` (0600, written atomically under a lock). Both
doors call :func:`authorize` — one function — with the credential and the
:class:`Operation`; it answers the :class:`Scope` or raises :class:`AgentError`
(``agent-token-required``, ``agent-token-invalid``, ``agent-expired``, ``agent-scope``).
The file is re-read whenever its stat changes, so a removed, rotated or expired agent is
refused by a running server from its next request on.

This module imports only the standard library and :mod:`node.common` at import time (the
CLI's start-up budget); the glob matcher, the policy (for ``@group``) and the peer registry
are imported when first needed.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from node.common.errors import AgentError, ConfigError, KithError, UsageError
from node.common.home import AGENTS_FILE, NotRegularFile, open_regular, read_json_state

#: The environment variable ``kith mcp`` reads its token from (MCP stdio servers take
#: credentials from their environment).
TOKEN_ENV = "KITH_AGENT_TOKEN"
#: Every token starts with this (easy to spot in a leaked config, never a secret itself).
TOKEN_PREFIX = "kith_agent_"
#: The agent ``kith init`` (and the first command in an older home) creates.
DEFAULT_AGENT = "default"
#: What the outbound gate does with a held question, per agent.
OUTBOUND_RULES = ("allow", "ask", "block")
#: ``peers`` words that are not names.
ALL, NONE = "all", "none"
GROUP_PREFIX = "@"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_FORMAT = 1

#: The operations a door may ask for, and what each needs of a scope.
#: ``connect``: a valid credential only (static documents: the contract, the OpenAPI
#: document, the full health answer); ``stats``: the whole corpus (``sources`` holds
#: ``**``: counts are over every source); ``search``: some of this node's sources;
#: ``ask``: the named peers (or ``all``, narrowed to the agent's peers); ``verify``: some
#: peer (it reads the peer registry and copies of peers); ``outbox-read``: ``queue``;
#: ``queue``: ``queue`` and the named peers.
OPERATIONS = ("connect", "stats", "search", "ask", "verify", "outbox-read", "queue")

#: The local API's routes → operation (``POST /search`` is ``search`` or ``ask`` by its
#: body: :func:`api_operation`). ``GET /health`` without a credential answers only "up".
API_OPERATIONS: dict[tuple[str, str], str] = {
    ("GET", "/health"): "connect", ("GET", "/contract"): "connect", ("GET", "/openapi.json"): "connect",
    ("GET", "/stats"): "stats", ("POST", "/search"): "search", ("POST", "/verify"): "verify",
    ("GET", "/outbox"): "outbox-read", ("POST", "/outbox"): "queue",
}
#: ``kith mcp``'s tools → operation (``search`` is ``search`` or ``ask`` by its arguments:
#: :func:`tool_operation`).
TOOL_OPERATIONS: dict[str, str] = {"search": "search", "verify": "verify", "outbox": "outbox-read",
                                   "ask_later": "queue"}


@dataclass(frozen=True)
class Agent:
    """One agent of ``agents.json`` (see the module docstring for the scope's fields)."""

    name: str
    token_hash: str
    sources: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()
    queue: bool = False
    outbound: str = "ask"
    until: str | None = None
    created_at: str = ""
    rotated_at: str | None = None

    def public(self, now: float | None = None) -> dict[str, Any]:
        """The agent as ``kith agent list|show --json`` prints it: never the token or its
        hash; ``expired`` computed at ``now``."""
        return {"name": self.name, "sources": list(self.sources), "peers": list(self.peers) or [NONE],
                "queue": self.queue, "outbound": self.outbound, "until": self.until,
                "expired": _expired(self.until, now), "createdAt": self.created_at,
                "rotatedAt": self.rotated_at}

    def _doc(self) -> dict[str, Any]:
        return {"name": self.name, "tokenSha256": self.token_hash, "sources": list(self.sources),
                "peers": list(self.peers), "queue": self.queue, "outbound": self.outbound,
                "until": self.until, "createdAt": self.created_at, "rotatedAt": self.rotated_at}


@dataclass(frozen=True)
class Operation:
    """What a door is asked to do: ``kind`` (one of :data:`OPERATIONS`) and, for ``ask``
    and ``queue``, the peers named (a tuple of names, or ``"all"``)."""

    kind: str
    peers: tuple[str, ...] | str = ()

    def __post_init__(self) -> None:
        if self.kind not in OPERATIONS:
            raise ValueError(f"unknown operation {self.kind!r}")


@dataclass(frozen=True)
class Scope:
    """What an authorised agent may do (:func:`authorize` returns it)."""

    agent: Agent
    home: Path = field(compare=False)

    @property
    def name(self) -> str:
        """The agent's name (recorded by the outbound log)."""
        return self.agent.name

    @property
    def all_sources(self) -> bool:
        """True when ``sources`` covers every source (``**``)."""
        return "/**" in self.agent.sources or "**" in self.agent.sources

    def source_filter(self) -> tuple[str, ...] | None:
        """The globs a local search is narrowed to (ANDed with the request's own
        ``sources``), or None when the scope covers every source."""
        return None if self.all_sources else self.agent.sources

    def sees(self, source_id: str) -> bool:
        """True when ``source_id`` is one of this node's sources the agent may search."""
        return self.all_sources or any(_matcher(g).match(source_id) for g in self.agent.sources)

    def may_ask(self, peer: str, groups: set[str] | None = None) -> bool:
        """True when the agent may ask the pinned peer ``peer``; ``groups``: the peer's
        ``@group`` memberships now (loaded from the policy when None and needed)."""
        granted = self.agent.peers
        if ALL in granted or peer in granted:
            return True
        if not any(p.startswith(GROUP_PREFIX) for p in granted):
            return False
        if groups is None:
            groups = _groups_of(self.home, peer)
        return any(g in granted for g in groups)

    def may_read(self, record: dict[str, Any]) -> bool:
        """True when the agent may see the outbox record ``record`` (its ``peers`` rows):
        it may ask every peer the question was kept for — the questions and answers of
        other peers are outside its scope even with ``--queue``."""
        if ALL in self.agent.peers:
            return True
        return all(self.may_ask(str(p.get("name"))) for p in record.get("peers") or ())

    def peers_for(self, requested: Sequence[str] | str) -> list[str] | str:
        """The peers a request naming ``requested`` (names or ``"all"``) goes to: names
        unchanged (:func:`authorize` checked them); ``"all"`` stays ``"all"`` for an agent
        with ``--peers all``, else becomes the pinned, unblocked peers it may ask.

        Raises:
            AgentError: ``agent-scope`` when ``"all"`` leaves no peer to ask.
        """
        if requested != ALL:
            return list(requested)
        if ALL in self.agent.peers:
            return ALL
        from node.trust.peers import PeerRegistry

        registry = PeerRegistry.load(self.home)
        names = sorted(n for n, r in registry.peers.items()
                       if not registry.is_blocked(r.public_key) and self.may_ask(n))
        if not names:
            raise _scope(self.agent, "it may ask none of the pinned peers")
        return names


# --- the one check ------------------------------------------------------------------------
def authorize(home: Path | str, token: str | None, operation: Operation, *,
              agent: str | None = None, now: float | None = None) -> Scope:
    """The one check of both local doors: is ``token`` a live agent's, and does its scope
    allow ``operation``?

    Args:
        home: the node home (its ``agents.json``).
        token: the credential as presented (``Authorization: Bearer`` on the API,
            :data:`TOKEN_ENV` for ``kith mcp``); None or empty when none was.
        operation: what the door is asked to do.
        agent: the agent name the caller claims (``kith mcp --agent NAME``); the token must
            be that agent's. None: whichever agent the token is.
        now: Unix seconds (tests); default the wall clock.

    Returns:
        The agent's :class:`Scope`.

    Raises:
        AgentError: ``agents-read-only`` (401: a home made before agents that this user
            may not write, :func:`agentless_read_only`: no token can be one of its agents),
            ``agent-token-required`` (401: no token), ``agent-token-invalid`` (401:
            not a token of a current agent — wrong, rotated or removed — or another agent's
            than ``agent``), ``agent-expired`` (401: past its ``until``), ``agent-scope``
            (403: the operation is outside the scope; the message names the dimension).
        ConfigError: ``agents-file-invalid`` when ``agents.json`` cannot be read.
    """
    home = Path(home)
    if not token:
        raise agentless_read_only(home) or AgentError("agent-token-required", status=401)
    presented = _hash(token)
    found: Agent | None = None
    agents = _cached_agents(home)
    for candidate in agents.values():  # every hash compared: constant time each
        if hmac.compare_digest(presented, candidate.token_hash):
            found = candidate
    if found is None:
        raise (not agents and agentless_read_only(home)) or AgentError("agent-token-invalid", status=401)
    if agent is not None and found.name != agent:  # a live token, of another agent
        raise AgentError("agent-token-invalid", f"This token is the agent {found.name!r}'s, not {agent!r}'s.",
                         hint=f"`kith mcp --agent {found.name}` runs as it", status=401)
    if _expired(found.until, now):
        raise AgentError("agent-expired", f"The agent {found.name!r} expired at {found.until}.", status=401)
    scope = Scope(found, home)
    _check(scope, operation)
    return scope


def _scope(agent: Agent, why: str) -> AgentError:
    return AgentError("agent-scope", f"The agent {agent.name!r} may not do this: {why}.", status=403)


def _check(scope: Scope, op: Operation) -> None:
    a = scope.agent
    kind = op.kind
    if kind == "connect":
        return
    if kind == "stats" and not scope.all_sources:
        raise _scope(a, "corpus counts cover every source, and its --sources are not '**'")
    if kind == "search" and not a.sources:
        raise _scope(a, "it searches none of this node's sources (no --sources)")
    if kind in ("outbox-read", "queue") and not a.queue:
        raise _scope(a, "it may not keep or read questions in the outbox (no --queue)")
    if kind == "verify" and not a.peers:
        raise _scope(a, "verifying peers' citations reads the peers and their copies, and it may ask none (no --peers)")
    if kind in ("ask", "queue"):
        if not a.peers:
            raise _scope(a, "it asks no peer (no --peers)")
        if op.peers != ALL:
            refused = [p for p in op.peers if not scope.may_ask(p)]
            if refused:
                raise _scope(a, f"it may not ask {', '.join(repr(p) for p in refused[:4])}")


def api_operation(method: str, path: str, body: Any = None) -> Operation:
    """The :class:`Operation` of a local API request (``body``: the decoded JSON body of a
    ``POST``; a ``POST /search`` with ``peers`` is ``ask``). Unknown routes are
    ``connect`` (they are refused by the router after the credential check)."""
    kind = API_OPERATIONS.get((method.upper() if method.upper() != "HEAD" else "GET", path), "connect")
    return _with_peers(kind, body)


#: The calls that show a ``kith mcp`` tool is within a scope's reach: a tool is listed when
#: one of them passes the agent check (``search`` of this node's sources, or of its peers).
TOOL_REACH: dict[str, tuple[dict[str, Any], ...]] = {"search": ({}, {"peers": ALL}), "verify": ({},),
                                                     "outbox": ({},), "ask_later": ({"peers": ALL},)}


def tool_allowed(scope: Scope, tool: str) -> bool:
    """True when the agent of ``scope`` may call ``tool`` with some arguments: what
    ``tools/list`` offers it (specs/agents.md §4). The rule is :func:`_check`'s, on the calls
    of :data:`TOOL_REACH`; a tool not named there is not offered."""
    for arguments in TOOL_REACH.get(tool, ()):
        try:
            _check(scope, tool_operation(tool, arguments))
        except AgentError:
            continue
        return True
    return False


def tool_operation(tool: str, arguments: Any) -> Operation:
    """The :class:`Operation` of a ``kith mcp`` tool call (``search`` with ``peer`` or
    ``peers`` is ``ask``). An unknown tool is ``connect`` (the SDK refuses it after)."""
    return _with_peers(TOOL_OPERATIONS.get(tool, "connect"), arguments)


def _with_peers(kind: str, body: Any) -> Operation:
    if kind not in ("search", "queue") or not isinstance(body, dict):
        return Operation(kind)
    peers = body.get("peers")
    peer = body.get("peer")
    if kind == "search" and peers is None and peer is None:
        return Operation(kind)
    named: tuple[str, ...] | str
    if peers == ALL:
        named = ALL
    elif isinstance(peers, list):
        named = tuple(str(p) for p in peers)
    else:
        named = ()
    if peer is not None:  # a pinned name, or an invitation (which no narrowed scope names)
        named = (*(() if named == ALL else named), peer if isinstance(peer, str) else "<invitation>")
    return Operation("ask" if kind == "search" else kind, named)


# --- the file -----------------------------------------------------------------------------
def agents_path(home: Path | str) -> Path:
    """``<home>/agents.json``."""
    return Path(home) / AGENTS_FILE


_cache_lock = threading.Lock()
_cache: dict[Path, tuple[tuple[int, ...], dict[str, Agent]]] = {}


def _stat(path: Path) -> tuple[int, ...]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return (0,)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _cached_agents(home: Path) -> dict[str, Agent]:
    """The agents of ``home``, re-read whenever ``agents.json``'s stat changes (an atomic
    rewrite always changes the inode), so a running server sees every change at once."""
    path = agents_path(home)
    stamp = _stat(path)
    with _cache_lock:
        hit = _cache.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
    agents = load_agents(home)
    with _cache_lock:
        _cache[path] = (stamp, agents)
    return agents


def load_agents(home: Path | str) -> dict[str, Agent]:
    """Every agent of ``home`` by name (empty when there is no ``agents.json``).

    Raises:
        ConfigError: ``agents-file-invalid`` when the file is not a readable agents file.
    """
    path = agents_path(home)
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return {}
    except NotRegularFile:
        raise ConfigError("agents-file-invalid", "agents.json is not a regular file") from None
    except OSError:
        raise ConfigError("agents-file-invalid", "agents.json cannot be read") from None
    try:
        _check_owner_only(fd)
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
    except OSError:
        raise ConfigError("agents-file-invalid", "agents.json cannot be read") from None
    finally:
        os.close(fd)
    try:
        doc = read_json_state(path, data=raw)
    except ConfigError:
        raise ConfigError("agents-file-invalid", "agents.json is not a valid agents file") from None
    try:
        rows = doc["agents"]
        if not isinstance(rows, list):
            raise TypeError("agents")
        agents = {}
        for row in rows:
            agent = Agent(name=_typed(row["name"], str), token_hash=_typed(row["tokenSha256"], str),
                          sources=_strings(row.get("sources", [])), peers=_strings(row.get("peers", [])),
                          queue=_typed(row.get("queue", False), bool),
                          outbound=_typed(row.get("outbound", "ask"), str),
                          until=_typed(row.get("until"), str, None),
                          created_at=_typed(row.get("createdAt", ""), str),
                          rotated_at=_typed(row.get("rotatedAt"), str, None))
            if (agent.outbound not in OUTBOUND_RULES or not _NAME_RE.fullmatch(agent.name)
                    or not _HASH_RE.fullmatch(agent.token_hash) or agent.name in agents):
                raise ValueError(agent.name)
            if agent.until is not None:
                from node.common.grants import until_time

                try:
                    until_time(agent.until)  # a time every later check can read
                except KithError:
                    raise ValueError(agent.until) from None
            agents[agent.name] = agent
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError("agents-file-invalid", "agents.json is not a valid agents file") from None
    return agents


_HASH_RE = re.compile(r"^[0-9a-f]{64}$")


def _typed(value: Any, kind: type, *none: None) -> Any:
    """``value`` when it is a ``kind`` (or None when ``none`` is given); else TypeError —
    a hand-edited ``"queue": "no"`` must not read as true, nor a string as a list."""
    if (none and value is None) or (type(value) is kind):
        return value
    raise TypeError(kind.__name__)


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(type(v) is str for v in value):
        raise TypeError("a list of strings")
    return tuple(value)


def _check_owner_only(fd: int) -> None:
    """Refuse an ``agents.json`` that another account owns or may write (it could add its
    own token's hash); make one that others may only read 0600 again, as the identity key."""
    import stat

    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError("agents-file-invalid", "agents.json is not a regular file")
    if (hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), 0)) or mode & 0o022:  # root may write anything anyway
        raise ConfigError("agents-file-invalid", f"agents.json (mode {mode:04o}) may be written by other "
                          "accounts; it must be 0600 and this account's",
                          hint="check who could change it (it holds only hashes and scopes), then "
                               "`chmod 600 agents.json` in the home")
    if mode & 0o077:
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o600)


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[dict[str, Agent]]:
    """Hold ``<home>/agents.json.lock`` (flock) and yield the agents; what the block leaves
    in the dict is written back atomically (0600) when it changed."""
    import fcntl

    from node.common.home import atomic_write

    home = Path(home)
    fd = os.open(home / (AGENTS_FILE + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        agents = load_agents(home)
        before = dict(agents)
        yield agents
        if agents != before:
            doc = {"format": _FORMAT, "agents": [a._doc() for a in sorted(agents.values(), key=lambda a: a.name)]}
            atomic_write(agents_path(home), (json.dumps(doc, indent=2) + "\n").encode(), 0o600)
    finally:
        os.close(fd)


# --- lifecycle ----------------------------------------------------------------------------
def new_token() -> str:
    """A fresh token: :data:`TOKEN_PREFIX` and 256 random bits (url-safe base64)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _now_stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def check_scope_values(*, sources: Sequence[str] | None = None, peers: Sequence[str] | None = None,
                       outbound: str | None = None) -> dict[str, Any]:
    """Validate and normalise scope values as ``kith agent add|set`` takes them.

    Returns:
        ``{"sources": tuple, "peers": tuple, "outbound": str}`` for the values given.

    Raises:
        UsageError: ``agent-invalid`` for a glob outside the policy's glob language, a
            peer that is not a registry name, ``@group``, ``all`` or ``none`` (``all`` and
            ``none`` stand alone), or an ``outbound`` rule other than allow/ask/block.
    """
    out: dict[str, Any] = {}
    if sources is not None:
        from node.corpus.globs import canonical_glob

        canon = []
        for glob in sources:
            g = glob.strip()
            if g == "**":
                g = "/**"
            try:
                canon.append(canonical_glob(g))
            except KithError as exc:
                raise UsageError("agent-invalid", f"--sources: {exc.message}") from None
            if not canon[-1].startswith("/"):
                raise UsageError("agent-invalid", f"--sources {glob!r}: a glob starts with '/' or is '**'")
        out["sources"] = tuple(dict.fromkeys(canon))
    if peers is not None:
        words = tuple(dict.fromkeys(p.strip() for p in peers))
        if (ALL in words or NONE in words) and len(words) > 1:
            raise UsageError("agent-invalid", "--peers all and --peers none stand alone")
        for p in words:
            bare = p[1:] if p.startswith(GROUP_PREFIX) else p
            if p not in (ALL, NONE) and not _NAME_RE.fullmatch(bare):
                raise UsageError("agent-invalid", f"--peers {p[:40]!r} is not a peer name, @group, all or none")
        out["peers"] = () if words == (NONE,) else words
    if outbound is not None:
        if outbound not in OUTBOUND_RULES:
            raise UsageError("agent-invalid", f"--outbound must be allow, ask or block (not {outbound[:20]!r})")
        out["outbound"] = outbound
    return out


#: Names the outbound log gives to others than agents: the owner at a terminal, and the
#: outbox's later deliveries (node/guest/outbox_task.py).
RESERVED_NAMES = ("owner", "outbox")


def _check_name(name: str) -> None:
    if not _NAME_RE.fullmatch(name or ""):
        raise UsageError("agent-invalid", f"agent name {name[:40]!r} is not 1-64 of [A-Za-z0-9_.-]")
    if name.lower() in RESERVED_NAMES:
        raise UsageError("agent-invalid", f"agent name {name!r} is reserved: the outbound log (`kith sent`) "
                         "names the owner at a terminal 'owner' and the outbox's deliveries 'outbox'")


def add_agent(home: Path | str, name: str, *, sources: Sequence[str] = (), peers: Sequence[str] = (),
              queue: bool = False, outbound: str = "ask", until: str | None = None) -> tuple[Agent, str]:
    """Add the agent ``name`` (``kith agent add``).

    Args:
        home: the node home. name: 1-64 of ``[A-Za-z0-9_.-]``. sources: globs (``**``:
            every source). peers: names, ``@group``, ``all`` or ``none``. queue: may keep
            questions in the outbox. outbound: allow/ask/block. until: an RFC 3339 UTC end
            (:func:`node.common.grants.parse_until` makes one), or None.

    Returns:
        ``(agent, token)``: the token exists only here — the file keeps its hash.

    Raises:
        UsageError: ``agent-invalid``. ConfigError: ``agent-exists``, ``agents-file-invalid``.
    """
    _check_name(name)
    values = check_scope_values(sources=sources, peers=peers, outbound=outbound)
    token = new_token()
    with _locked(Path(home)) as agents:
        if name in agents:
            raise ConfigError("agent-exists", f"an agent named {name!r} exists already")
        agent = Agent(name=name, token_hash=_hash(token), queue=queue, until=until,
                      created_at=_now_stamp(), **values)
        agents[name] = agent
    return agent, token


def set_agent(home: Path | str, name: str, **changes: Any) -> Agent:
    """Change the scope of ``name`` (``kith agent set``): any of ``sources``, ``peers``,
    ``outbound`` (validated as for :func:`add_agent`), ``queue``, ``until`` (None: never
    ends). The token is unchanged.

    Raises:
        ConfigError: ``agent-not-found``. UsageError: ``agent-invalid``.
    """
    values = check_scope_values(**{k: changes[k] for k in ("sources", "peers", "outbound") if k in changes})
    for k in ("queue", "until"):
        if k in changes:
            values[k] = changes[k]
    with _locked(Path(home)) as agents:
        agent = _get(agents, name)
        agents[name] = agent = replace(agent, **values)
    return agent


def rotate_agent(home: Path | str, name: str) -> tuple[Agent, str]:
    """Give ``name`` a new token (``kith agent rotate``); the old one stops working at
    once, also for a server already running.

    Returns:
        ``(agent, token)``.

    Raises:
        ConfigError: ``agent-not-found``.
    """
    token = new_token()
    with _locked(Path(home)) as agents:
        agent = replace(_get(agents, name), token_hash=_hash(token), rotated_at=_now_stamp())
        agents[name] = agent
    return agent, token


def remove_agent(home: Path | str, name: str) -> Agent:
    """Remove ``name`` (``kith agent remove``); its token stops working at once.

    Raises:
        ConfigError: ``agent-not-found``.
    """
    with _locked(Path(home)) as agents:
        return agents.pop(_get(agents, name).name)


def get_agent(home: Path | str, name: str) -> Agent:
    """The agent ``name``.

    Raises:
        ConfigError: ``agent-not-found``, ``agents-file-invalid``.
    """
    return _get(load_agents(home), name)


def _get(agents: dict[str, Agent], name: str) -> Agent:
    if name not in agents:
        raise ConfigError("agent-not-found", f"no agent named {name[:64]!r}")
    return agents[name]


def agentless_read_only(home: Path | str) -> AgentError | None:
    """``agents-read-only`` (HTTP 401) when ``home`` has no ``agents.json`` (made before
    agents) and this user may not write it (:func:`node.common.home.may_write`: a read-only
    copy, a chmod, a read-only mount): no agent can be made there, so no token is
    accepted, and the way out is a home the user may write, not ``kith agent rotate``.
    None otherwise."""
    from node.common.home import may_write

    home = Path(home)
    if agents_path(home).exists() or may_write(agents_path(home)):
        return None
    return AgentError("agents-read-only", status=401)


def ensure_default_agent(home: Path | str) -> str | None:
    """Create the agent ``default`` (``--sources '**' --peers all --queue --outbound
    ask``) in a home that has no ``agents.json`` yet: ``kith init`` and the first command
    run in an older home. A home this process may read but not write
    (:func:`node.common.home.may_write`: a read-only copy, a chmod, a read-only mount)
    gets none and is left as it is: the commands that only read run without it, and one
    that writes the agents (``kith agent add|set|rotate|remove``) refuses ``io-error`` when
    it tries (specs/agents.md §2).

    Returns:
        The new token when the agent was created now (shown once), else None.
    """
    from node.common.home import may_write

    home = Path(home)
    if agents_path(home).exists() or not may_write(agents_path(home)):
        return None
    with _locked(home) as agents:
        if agents or agents_path(home).exists():
            return None
        token = new_token()
        agents[DEFAULT_AGENT] = Agent(name=DEFAULT_AGENT, token_hash=_hash(token), sources=("/**",),
                                      peers=(ALL,), queue=True, outbound="ask", created_at=_now_stamp())
    return token


# --- helpers ------------------------------------------------------------------------------
def _expired(until: str | None, now: float | None = None) -> bool:
    if until is None:
        return False
    from node.common.grants import ended

    return ended(until, now)


def _matcher(glob: str) -> Any:
    from node.corpus.globs import source_glob

    return source_glob(glob)


def _groups_of(home: Path, peer: str) -> set[str]:
    from node.policy.store import Policy

    try:
        return Policy.load(home).groups_of(peer)
    except KithError:  # an unreadable policy grants no group membership
        return set()


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header value, or None (another
    scheme, or no header)."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


__all__ = ["AGENTS_FILE", "API_OPERATIONS", "Agent", "AgentError", "DEFAULT_AGENT", "OPERATIONS",
           "OUTBOUND_RULES", "Operation", "Scope", "TOKEN_ENV", "TOOL_OPERATIONS", "TOOL_REACH", "add_agent",
           "agents_path", "api_operation", "authorize", "bearer_token", "check_scope_values",
           "ensure_default_agent", "get_agent", "load_agents", "remove_agent", "rotate_agent",
           "set_agent", "tool_allowed", "tool_operation"]
