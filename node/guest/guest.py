"""The Guest role: resolve and verify an invitation, connect over iroh, run the session.

``kith join ARG`` (DESIGN §5): ARG naming an existing file → an invitation file; ARG
starting with ``{`` → an invitation JSON string; anything else → a ``post_id`` fetched
from the community server.

Asking a Host questions is one API for every caller (``kith join`` and the MCP server's
peer search): :func:`open_target` resolves and verifies the invitation, :func:`ask` runs
one knowledge-query session with typed :class:`GuestOptions` and returns every answer.
:func:`join_session` is the protocol-generic session underneath.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from node.answer.contract import TOP_K_DEFAULT
from node.runtime.driver import SessionOutcome, run_session
from node.engine.session import GuestConfig, SessionEngine, SessionReady
from node.common.errors import ConfigError, HandshakeError, InvitationError, KithError
from node.runtime.hooks import HookContext, PeerInfo, load_hooks
from node.trust.identity import Identity
from node.trust.invitation import MAX_INVITATION_BYTES, POST_ID_RE, Invitation, parse_invitation
from node.trust.peers import PeerRegistry, clean_profile, load_own_profile
from node.trust.person import load_person, revocation_of
from node.protocol.spec import ProtocolSpec
from node.guest.targets import Target, check_invitation, pinned_target

log = logging.getLogger("kith.guest")


@dataclass(frozen=True)
class GuestOptions:
    """What a knowledge-query guest asks, and where the answers go.

    Attributes:
        queries: questions asked in this order.
        next_question: when given, called (in a worker thread) for the next question once
            ``queries`` are used up; None or ``""`` ends the session. A guest with it is
            interactive: no hook or idle timeout (it waits on its user).
        on_results: called with each ``results`` message as it arrives.
        top_k: results per question, 1–20 (the ``query`` schema's ``topK``).
        filters: the flat fields sent beside every question (``citations``, ``date``,
            ``dateRange``, ``project``, ``tags``, ``sourceSets``, ``lifecycle``,
            ``workType``, ``sources``, ``remainingBudgetMs``; protocols/knowledge-query).

    The engine validates each ``query`` message against the protocol's schema before it
    is sent (``hook-output-invalid`` otherwise).
    """

    queries: tuple[str, ...] = ()
    next_question: Callable[[], str | None] | None = None
    on_results: Callable[[dict[str, Any]], None] | None = None
    top_k: int = TOP_K_DEFAULT
    filters: Mapping[str, Any] = field(default_factory=dict)

    @property
    def interactive(self) -> bool:
        """True when questions come from :attr:`next_question` (a person typing)."""
        return self.next_question is not None

    def hook_options(self) -> dict[str, Any]:
        """The ``ctx.options`` mapping the knowledge-query guest hooks read
        (``queries``, ``ask``, ``on_results``, ``topK``, ``filters``; its README)."""
        out: dict[str, Any] = {"queries": list(self.queries), "topK": self.top_k, "filters": dict(self.filters)}
        if self.next_question is not None:
            out["ask"] = self.next_question
        if self.on_results is not None:
            out["on_results"] = self.on_results
        return out


@dataclass
class AskResult:
    """What :func:`ask` got back.

    Attributes:
        outcome: how the session ended, or None when ``timeout_s`` expired first.
        answers: every ``results`` message, in arrival order.
        refused: the code this guest's engine refused the host's reply to a question with
            (``message-schema-invalid``, ``frame-invalid-json``, …), which ended the
            session; None when it refused none.
    """

    outcome: SessionOutcome | None
    answers: list[dict[str, Any]] = field(default_factory=list)
    refused: str | None = None


def refused_answer(message: dict[str, Any], reason: str) -> dict[str, Any]:
    """What this guest keeps of a host's ``results`` message it refused unread (too large
    for its fence to screen): the same ``action`` and ``query_id``, status
    ``peer-answer-invalid``, ``error`` saying why (``reason``) and an empty envelope —
    none of the host's text.

    Returns:
        A new message; ``message`` is left as it was.
    """
    return {"action": message.get("action"), "query_id": message.get("query_id"), "status": "peer-answer-invalid",
            "error": f"this guest refused the host's answer unread: {reason}", "envelope": {}}


async def resolve_invitation(arg: str, *, server_url: str | None) -> Invitation:
    """Turn ``kith join``'s argument into a parsed (not yet verified) invitation.

    Raises:
        InvitationError: ``invitation-malformed`` / ``invitation-not-found``.
        ConfigError: ``no-server`` when ARG is a post_id and no server is given;
            ``file-not-found`` when ARG looks like a path (holds ``/`` or ``\\``, or ends in
            ``.json``) and names no file, or a file that cannot be read. A pipe (``kith join
            <(cat inv.json)``) is read as a file is, at most one byte over the 64 KiB bound.
        CommunityError: the server is unreachable or refuses.
    """
    path = Path(arg)
    if arg.lstrip().startswith("{"):
        return parse_invitation(arg)
    if path.is_file() or (path.exists() and not path.is_dir()):  # a pipe too: `kith join <(cat inv.json)`
        try:
            with path.open("rb") as fh:
                data = fh.read(MAX_INVITATION_BYTES + 1)  # parse_invitation refuses more
        except OSError:
            raise ConfigError("file-not-found", f"cannot read invitation file {arg}") from None
        return parse_invitation(data)
    if "/" in arg or "\\" in arg or arg.lower().endswith(".json"):  # a post_id never holds these
        what = "is a folder, not an invitation file" if path.exists() else "no such file"
        raise ConfigError("file-not-found", f"{arg}: {what}",
                          hint="give the invitation file's path, the invitation JSON or a post_id")
    if not POST_ID_RE.fullmatch(arg):
        raise InvitationError("invitation-malformed",
                              f"{arg!r} is neither an invitation file, an invitation JSON string nor a post_id")
    if not server_url:
        raise ConfigError("no-server", "a post_id needs a community server: pass --server URL "
                                       "(or join with an invitation file)")
    from node.community.client import CommunityClient

    async with CommunityClient(server_url) as client:
        return await client.get_invitation(arg)


def trust_status(inv: Invitation, home: Path, *, registry: PeerRegistry | None = None) -> str | None:
    """The registry name pinned to the host key (or the person pin of a host device this
    home knows that person bound, specs/peers.md §10), or None for an unknown host.

    Args:
        registry: the registry as ``peers.json`` says now (the process's view,
            :attr:`node.guest.owner.Guest.peers`), or None: read here.

    Raises:
        HandshakeError: ``host-key-changed`` is raised by the pinned-name check in
            :func:`check_pinned_name`, not here.
    """
    from node.trust.peers import pin_of_known_device

    registry = PeerRegistry.load(home) if registry is None else registry
    rec = registry.by_key(inv.host_public_key) or pin_of_known_device(registry, home, inv.host_public_key)
    return rec.name if rec else None


def check_pinned_name(name: str, inv: Invitation, home: Path, *, registry: PeerRegistry | None = None) -> None:
    """Refuse when ``name`` is pinned in the registry to a different key (DESIGN §5). A
    person pin (``--devices``) is pinned to every device this home knows it bound
    (:func:`node.trust.peers.known_device_of`: a card or chain seen here), so joining one
    of them again is no key change (specs/peers.md §13).

    ``kith join --pin NAME`` calls it before connecting: a name already pinned to another
    key is never silently re-pinned. That is a name the user chose that is taken, not a
    host whose key changed (``host-key-changed`` is for an invitation that names another
    key than a pin's, :func:`_pinned_target`). ``registry``: as :func:`trust_status`.

    Raises:
        UsageError: ``pin-name-taken``.
    """
    from node.common.errors import UsageError
    from node.trust.peers import known_device_of

    rec = (PeerRegistry.load(home) if registry is None else registry).by_name(name)
    if rec is not None and rec.public_key != inv.host_public_key and not (
            rec.devices and known_device_of(home, rec.public_key, inv.host_public_key, rec)):
        raise UsageError("pin-name-taken",
                         f"--pin {name}: that name is already pinned to another host ({rec.public_key[:16]}…); "
                         f"this host is {inv.host_public_key[:16]}…",
                         hint=f"choose another name (--pin NAME), or `kith peers remove {name}` first if "
                              "that pin is no longer wanted")


def invitation_gone(code: str, inv: Invitation, pinned_name: str | None) -> InvitationError:
    """The guest's ``invitation-gone`` refusal for the host's ``code`` (one of
    :data:`node.guest.targets.GONE_CODES`): which host and post, and what to do — a pinned peer is refreshed
    by joining a new invitation once; an unpinned host can be pinned with it."""
    who = repr(pinned_name) if pinned_name else f"{inv.host_public_key[:16]}…"
    why = "it expired there" if code == "handshake-post-expired" else \
        "it restarted without it, withdrew it or used it up"
    if pinned_name:
        hint = (f"ask {pinned_name}'s owner for a new invitation and join it once (`kith join NEW_INVITATION`): "
                f"that refreshes the pin {pinned_name!r}")
    else:
        hint = ("ask the host's owner for a new invitation; to pin the host with it: "
                f"`kith peers add NAME {inv.host_public_key} --invite FILE`")
    return InvitationError("invitation-gone", f"the host {who} no longer honours invitation {inv.post_id} "
                                              f"({why}; the host said {code})", hint=hint)


async def open_target(arg: str, home: Path, *, server_url: str | None,
                      registry: PeerRegistry | None = None) -> Target:
    """Resolve ``arg`` (:func:`resolve_invitation`), verify it against the local protocol
    (:func:`check_invitation`) and look up the host's pinned name (:func:`trust_status`,
    in ``registry`` when given).

    Raises:
        InvitationError: any ``invitation-*`` code, or ``host-key-changed``.
        ConfigError: ``no-server`` / ``file-not-found``.
        CommunityError: fetching a ``post_id`` failed.
    """
    inv = await resolve_invitation(arg, server_url=server_url)
    pdir, spec = check_invitation(inv, home)
    return Target(inv, pdir, spec, trust_status(inv, home, registry=registry))


def _pinned_record(name: str, registry: PeerRegistry) -> Any:
    """The registry record called ``name``, refusing an unknown or blocked name."""
    from node.common.errors import PolicyError

    rec = registry.by_name(name) if isinstance(name, str) else None
    if rec is None:
        raise PolicyError("peer-not-found", f"no peer named {str(name)[:70]!r}",
                          hint="pin it first: `kith join --pin NAME` or `kith peers add NAME KEY --invite FILE`")
    if registry.is_blocked(rec.public_key):
        raise HandshakeError("ask-peer-blocked", f"{name!r} is blocked (`kith peers unblock {name}`)")
    return rec


async def resolve_peer(name: str, home: Path, *, skip_saved: bool = False,
                       registry: PeerRegistry | None = None) -> Target:
    """A pinned peer's current invitation, verified: the saved one first, then the newest
    live post of its key on the community server it came from (``browse --host KEY``),
    in that order (issue 13; specs/peers.md §1, specs/ask.md §2). For a person pin
    (``--devices``) whose saved invitation does not verify, the device card of the device
    that answered here last comes before the server (specs/peers.md §13). Every check of
    ``kith join`` applies to either (binding signature, expiry, protocol id) plus key =
    pinned key. A server invitation that passes is saved as the peer's last one.

    Args:
        name: a registry name. home: this node's home.
        skip_saved: go to the server at once (the saved invitation verified but its host
            could not be reached: it restarted with a new address).
        registry: the registry as ``peers.json`` says now (the process's view), or None:
            read here. A server invitation is saved to the file as read again then.

    Returns:
        A :class:`Target` whose ``pinned_name`` is ``name``.

    Raises:
        PolicyError: ``peer-not-found`` (unknown name).
        HandshakeError: ``ask-peer-blocked``; ``host-key-changed`` (the invitation names
            another key).
        InvitationError: the saved invitation's refusal when there is no server to ask
            (``invitation-*``), ``invitation-not-found`` (neither works).
        CommunityError: the server could not be asked and nothing was saved.
    """
    registry = PeerRegistry.load(home) if registry is None else registry
    rec = _pinned_record(name, registry)
    first: Exception | None = None
    if rec.invitation is not None and not skip_saved:
        try:
            return pinned_target(parse_invitation(rec.invitation), rec, home)
        except HandshakeError:
            raise  # a saved invitation for another key: never fall back silently
        except InvitationError as exc:
            first = exc
    if rec.devices and not skip_saved:  # a person pin: the device that answered here last (specs/peers.md §13)
        from node.guest.cards import device_targets

        for _device, target in device_targets(home, rec, registry=registry):
            return target
    if not rec.server:
        if first is not None:
            raise first
        raise InvitationError("invitation-not-found",
                              f"no invitation is saved for {name!r} and it has no community server",
                              hint=f"`kith peers add {name} KEY --invite FILE|POST_ID --server URL` after removing it")
    from node.community.client import CommunityClient

    async with CommunityClient(rec.server) as client:
        page = await client.browse(host=rec.public_key, limit=20)
    for post in page["invitations"]:
        try:
            target = pinned_target(parse_invitation(post["invitation"]), rec, home)
        except (InvitationError, HandshakeError) as exc:
            first = first or exc
            continue
        PeerRegistry.load(home).remember_invitation(rec.public_key, target.invitation.to_dict(), rec.server)
        return target
    if isinstance(first, (InvitationError, HandshakeError)):
        raise first
    raise InvitationError("invitation-not-found", f"the community server has no live invitation of {name!r}")


async def ask(home: Path, identity: Identity, target: Target, options: GuestOptions, *,
              local: bool, mode: Any = None, server_url: str | None = None, timeout_s: float | None = None,
              on_ready: Callable[[str], None] | None = None,
              host_seen: dict[str, Any] | None = None,
              accept_host_ui: bool = False,
              heartbeat: Any = "default", on_path: Callable[[Any, Any], None] | None = None,
              peers: Any = None, person: Callable[[], Any] | None = None) -> AskResult:
    """Ask ``target`` the questions of ``options`` in one session; the one guest API of
    ``kith join`` and of the MCP server's peer search.

    Args:
        home, identity: this node's home and identity.
        target: from :func:`open_target` (the caller decides whether an unpinned host is
            acceptable: ``kith join`` asks its user, MCP refuses it).
        options: the questions and callbacks (:class:`GuestOptions`).
        local: offline mode (relay disabled, loopback), when ``mode`` is None.
        mode: the guest's :class:`node.transport.modes.TransportMode` (``--relay``, ...).
        server_url: community server that records the session proof, or None.
        timeout_s: end-to-end bound in seconds (connect, handshake, every answer); on
            expiry the session is cancelled and ``outcome`` is None. None: no bound.
        on_ready, host_seen, accept_host_ui, heartbeat, on_path, peers, person: as :func:`join_session`.

    Returns:
        :class:`AskResult` with the session outcome and every ``results`` message, each
        marked as peer evidence on arrival (:func:`node.answer.fence.mark_answer`:
        ``untrusted`` and ``suspicious`` on every result and citation) — or, for an answer
        too large for the fence to screen (:func:`node.answer.fence.check_markable`), never
        scanned: :func:`refused_answer` in its place, status ``peer-answer-invalid``. A reply
        to a question that this guest's engine refuses (it breaks the protocol: schema,
        JSON) is kept the same way, and the session ends there (``end`` is sent; the turn
        stays the host's, so no other answer can come): ``refused`` names its code.

    Raises:
        TransportError: bind/connect failures (``transport-*``).
    """
    import anyio

    result = AskResult(outcome=None)

    manifest_asked = [False]
    manifest_out = [False]  # the copy_list was sent: the next reply is its, never an answer
    queued = list(options.queries)
    asked = [0, False]  # questions sent, and whether the host's reply to the last is due
    stop = anyio.Event()  # set: the session ends (the guest refused the reply it waited for)

    def on_results(message: dict[str, Any]) -> None:
        from node.answer.fence import screen_answer

        asked[1] = False
        if manifest_out[0]:  # asked below, after the questions: what the host withdrew from the copy
            # (a rate-limited `results` when the peer's quota cannot pay it: the next sync asks)
            from node.guest.copies.lifecycle import record_withdrawn
            from node.guest.copies.store import CopyStore

            if target.pinned_name is not None:
                record_withdrawn(CopyStore(home, target.pinned_name), message)
            return
        try:  # the guest's own marks (never the host's); too large to screen: refused unread
            screen_answer(message)
        except ValueError as exc:
            message = refused_answer(message, str(exc))
        result.answers.append(message)
        if options.on_results is not None:
            options.on_results(message)

    def stale_copy() -> bool:
        """The pinned host's handshake told another grant stamp than its copy here was
        synced under (specs/copies.md §5.1): ask its manifest once, after the questions."""
        from node.guest.copies.lifecycle import stale
        from node.guest.copies.store import CopyStore

        if manifest_asked[0] or target.pinned_name is None:
            return False
        manifest_asked[0] = True
        try:
            store = CopyStore(home, target.pinned_name)
            return (store.exists() and store.load().get("hostKey") == target.invitation.host_public_key
                    and stale(store))
        except KithError:
            return False

    first_ask = options.next_question
    asked_out = [first_ask is None]  # the person ended their questions: never prompted again

    def question() -> Any:
        if queued:
            return queued.pop(0)
        text = first_ask() if not asked_out[0] and first_ask is not None else None
        if text:
            return text
        asked_out[0] = True
        if stale_copy():
            manifest_out[0] = True
            return {"action": "copy_list"}
        return None

    def next_question() -> Any:
        text = question()
        if text:
            asked[0] += 0 if manifest_out[0] else 1
            asked[1] = True
        return text

    def on_refused(code: str, _message: str) -> None:
        """The engine refused a message of the host (and told it so with ``_error``):
        when it was the reply a question waited for, keep the question's refusal and end
        the session — the turn stays the host's, nothing else can come of it."""
        if not asked[1] or stop.is_set():
            return  # not a reply to a question (out of turn): the session goes on
        asked[1] = False
        stop.set()
        if manifest_out[0]:
            return
        result.refused = code
        refused = refused_answer({"action": "results", "query_id": f"q{asked[0]}"}, code)
        result.answers.append(refused)
        if options.on_results is not None:
            options.on_results(refused)

    hook_options = {**options.hook_options(), "queries": [], "on_results": on_results, "ask": next_question}
    with anyio.move_on_after(timeout_s):
        result.outcome = await join_session(
            home, identity, target.invitation, target.protocol_dir, target.spec, local=local, mode=mode,
            server_url=server_url, options=hook_options, interactive=options.interactive,
            on_ready=on_ready, host_seen=host_seen, accept_host_ui=accept_host_ui, heartbeat=heartbeat,
            on_path=on_path, peers=peers, person=person, on_refused=on_refused, stop=stop)
    return result


async def join_session(home: Path, identity: Identity, inv: Invitation, pdir: Path, spec: ProtocolSpec, *,
                       local: bool, server_url: str | None, options: dict[str, Any], mode: Any = None,
                       interactive: bool = False,
                       on_ready: Callable[[str], None] | None = None,
                       host_seen: dict[str, Any] | None = None,
                       accept_host_ui: bool = False,
                       heartbeat: Any = "default", node: Any = None,
                       connect_timeout_s: float | None = None,
                       on_path: Callable[[Any, Any], None] | None = None,
                       on_refused: Callable[[str, str], None] | None = None,
                       on_copy_notice: Callable[[dict[str, Any]], None] | None = None,
                       copy_states: dict[str, dict[str, Any]] | None = None,
                       peers: Any = None, person: Callable[[], Any] | None = None,
                       stop: Any = None) -> SessionOutcome:
    """Connect to the host of ``inv`` and run one session with the protocol's guest hooks.

    Args:
        mode: the :class:`node.transport.modes.TransportMode` to bind with (None: ``local``'s);
            what it allows decides which of the ticket's addresses are dialled
            (:meth:`node.transport.iroh.IrohNode.connect`).
        options: the guest hooks' ``ctx.options`` as the protocol defines them (for
            knowledge-query, :meth:`GuestOptions.hook_options`; echo: ``texts``).
        interactive: no hook timeout (the hook waits on its user).
        on_ready: called with the session id once the handshake completed.
        host_seen: when given, filled with ``{"public_key", "profile", "card"}`` of the host
            once the handshake completed (``card``: the device card it sent, or None; ``kith
            join`` offers to pin the host with them and keeps the card for the new pin).
        accept_host_ui: advertise ``p2p_ui_v1`` (``--accept-host-ui``); the host's UI is
            requested only when the protocol has no local ``ui/`` (DESIGN §6), verified by
            the engine, and installed under ``<home>/ui/sessions/<session_id>/``
            (``outcome.ui_path`` is its ``index.html``).
        heartbeat: ``(ping_interval_s, unresponsive_s)`` or ``"default"`` (10, 30).
        node: an already bound :class:`node.transport.iroh.IrohNode` for ``spec.alpn``
            (the warm pool's one endpoint, node/guest/pool.py): the session opens its own
            connection on it and leaves the endpoint open. None: bind one for this session.
        connect_timeout_s: bound on connecting, seconds (None: the transport's 15 s).
        on_path: called ``(now, previous)`` with :class:`node.transport.paths.PathInfo`s:
            once when the stream opened (``previous`` None), then at each change of the
            path iroh selected (direct ↔ relayed; specs/transport.md §3).
        on_refused: called with ``(code, message)`` of each host message this guest's
            engine refused (:func:`node.runtime.driver.run_session`).
        stop: an ``anyio.Event``; once set, the session ends cleanly (``end`` is sent:
            :func:`node.runtime.driver.run_session`'s ``stop``), or None.
        on_copy_notice: told of each copy the host's word ends or changes
            (:data:`node.guest.copies.lifecycle.Notify`), or None: stderr.
        copy_states: where the host's word on the copy grant is remembered for a sync
            (:data:`node.guest.copies.lifecycle.CopyStates`, the session pool's), or None.
        peers: the process's view of ``peers.json`` (:class:`node.guest.peerview.PeerView`;
            :attr:`node.guest.owner.Guest.peers`) the session reads the registry through,
            or None: a view of its own. Writes (the host's shared profile merged, a device
            seen) load and save the file themselves, only when they change it.
        person: returns this home's person record (:class:`node.trust.person.PersonRecord`
            or None): the ``now`` of the process's view of ``person.json``
            (:attr:`node.guest.owner.Guest.person`, read again only when it changed), so a
            run reads the file once; None: read it here. The binding chain and revocation list
            the handshake carries come from it.

    The guest asks for the host's copy grant state (``copy_state_v1``) and acts on it
    (:func:`node.guest.copies.lifecycle.take_copy_state`: a copy no longer granted is deleted now,
    saying so). The guest asks for the host's device card (``device_card_v1``) and keeps it when the
    host is a device of a person pinned here with ``--devices``
    (:func:`node.guest.cards.take_card`; a bad card is refused with its code and never kept).
    The guest shares its own profile (``<home>/profile.json``) in ``_session_init``; the
    host's shared profile is merged into the registry only when the host key is already
    pinned. A host whose key is not pinned but whose ``displayName`` claims a pinned name
    is refused (``host-key-changed``) before ``_session_ready``.

    Raises:
        TransportError: bind/connect failures (``transport-*``).
    """
    from node.engine.ui import CAPABILITY as UI_CAPABILITY
    from node.transport.iroh import GUEST_CLOSE_TIMEOUT_S, bind_node
    from node.runtime.ui_artifacts import install_bundle, local_ui_dir

    hooks = load_hooks(pdir)
    if peers is None:
        from node.guest.peerview import PeerView

        peers = PeerView(home)
    name = trust_status(inv, home, registry=peers.now())

    recorded: list[str] = []  # session ids whose proof the server recorded

    async def on_proof(proof: dict[str, Any]) -> None:
        if server_url:
            from node.community.client import CommunityClient

            async with CommunityClient(server_url, identity) as client:
                await client.submit_session(proof)
            recorded.append(proof["session_id"])

    def admit_host(key: str, profile: dict[str, Any]) -> bool:
        from node.trust.peers import known_device_of

        claimed = peers.now().claimed_by_other(key, profile)
        if claimed is not None and not (claimed.devices and known_device_of(home, claimed.public_key, key, claimed)):
            raise HandshakeError("host-key-changed",
                                 f"the host calls itself {claimed.name!r}, which is pinned to a different key")
        return True

    def make_context(ev: SessionReady) -> HookContext:
        if clean_profile(ev.peer_profile) and peers.now().by_key(ev.peer_public_key) is not None:
            PeerRegistry.load(home).merge_profile(ev.peer_public_key, ev.peer_profile)  # a write: the file as it is
        if ev.peer_card is not None:  # kept for a person pinned with --devices, or this device's own pin (specs/peers.md §13)
            from node.guest.cards import take_card

            take_card(home, ev.peer_card, via="handshake", device=ev.peer_public_key, registry=peers.now())
        if ev.peer_copy_state is not None:  # the host's word on our copy of it (specs/copies.md §5)
            from node.guest.copies.lifecycle import take_copy_state

            try:
                take_copy_state(home, ev.peer_public_key, ev.peer_copy_state, notify=on_copy_notice,
                                states=copy_states)
            except KithError as exc:  # an ill-formed state is ignored; the session goes on
                logging.getLogger("kith.copies").warning("the host's copy state was refused: %s", exc.code)
            except OSError as exc:  # the copy could not be deleted now: its next sync does; the session goes on
                logging.getLogger("kith.copies").warning("a copy could not be deleted: %s", type(exc).__name__)
        if host_seen is not None:
            host_seen.update({"public_key": ev.peer_public_key, "profile": clean_profile(ev.peer_profile),
                              "card": ev.peer_card})
        if on_ready is not None:
            on_ready(ev.session_id)
        return HookContext(role="guest", session_id=ev.session_id,
                           peer=PeerInfo(ev.peer_public_key, name, ev.peer_profile), options=options,
                           logger=logging.getLogger("kith.hooks." + spec.name))

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def _endpoint():
        if node is not None:
            yield node
        else:
            async with bind_node(identity.secret, spec.alpn, local=local, mode=mode,
                                 close_timeout_s=GUEST_CLOSE_TIMEOUT_S) as bound:
                yield bound

    me = person() if person is not None else load_person(home)  # this home's person: read once
    shared = node is not None
    async with _endpoint() as node:
        conn = await (node.connect(inv.transport_info.ticket) if connect_timeout_s is None
                      else node.connect(inv.transport_info.ticket, timeout_s=connect_timeout_s))
        stream = await node.open_stream(conn)
        if on_path is not None:
            from node.transport.paths import watch

            on_path(watch(stream, lambda previous, now: on_path(now, previous)), None)
        engine = SessionEngine("guest", spec, public_key=identity.public_key, sign=identity.sign,
                               guest=GuestConfig(remote_id=stream.remote_id or "", post_id=inv.post_id,
                                                 host_public_key=inv.host_public_key,
                                                 profile=load_own_profile(home), admit_host=admit_host,
                                                 capabilities=[UI_CAPABILITY] if accept_host_ui else [],
                                                 want_ui=accept_host_ui and local_ui_dir(pdir) is None,
                                                 binding_chain=None if me is None else me.chain_for(identity.public_key),
                                                 revocation_list=revocation_of(home, me), want_card=True,
                                                 want_copy_state=True))

        def on_ui(ev: Any, session_id: str) -> Path:
            return install_bundle(home, session_id, ev.files)

        try:
            outcome = await run_session(stream, engine, hooks, make_context=make_context, on_proof=on_proof,
                                        on_ui=on_ui, hook_timeout_s=None if interactive else "spec",
                                        idle_timeout_s=None if interactive else "spec", heartbeat=heartbeat,
                                        on_refused=on_refused, stop=stop)
        finally:
            if shared:  # the endpoint stays open: this session's connection must not
                try:
                    conn.close(0, b"done")
                except Exception:  # noqa: BLE001 - already closed / endpoint gone
                    pass
    if server_url and outcome.session_id in recorded:  # session status → closed (DESIGN §12)
        from node.community.client import close_session_quietly

        await close_session_quietly(server_url, identity, outcome.session_id,
                                    outcome.code or outcome.reason)
    return outcome
