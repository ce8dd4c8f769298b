"""Core commands: ``init``, ``host``, ``join``, ``protocol test`` / ``protocol id``
(registered in :data:`node.cli.app.COMMANDS`)."""

from __future__ import annotations

import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any, Optional

import anyio
import typer

from node.cli.common import (TransportArgs, console, default_agent, emit_json, err_console, home_if_any,
                             identity_home_of, new_home_of, safe_text, server_option, stdin_is_terminal, stdin_line,
                             transport_options, warn)
from node.cli.render import CONNECTING_NOTICE_S, Waiting, print_answer
from node.answer.contract import TOP_K_DEFAULT
from node.common.errors import CODES, InvitationError, KithError, SessionAborted, SpecError, UsageError, error_for

protocol_app = typer.Typer(help="Work with protocol folders (spec.json + hooks.py).", no_args_is_help=True)


# ----------------------------------------------------------------------------- init
def init_cmd(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    device_name: Optional[str] = typer.Option(None, "--device-name", metavar="NAME", help="This device's name in its binding (default: the host name, plus -HOMEDIR for a --home that is not the default one; 1-64 printable characters)."),
) -> None:
    """Create this device's Ed25519 key (the iroh endpoint id) and a person key that binds it.

    The person key signs a device binding for this device; a recovery secret is printed
    ONCE as 24 words (write them on paper: they are not stored and cannot be shown again).
    On a home that already has both, prints them and changes nothing; a home made before
    person keys keeps its identity key as this device's key and gets a person key. A home
    without agents gets the agent `default` (`kith agent`), whose token is printed once.
    """
    from node.common.errors import SigningError
    from node.trust.identity import fingerprint, init_identity
    from node.trust.person import init_person

    home = new_home_of(ctx)  # one of the two commands that create a home
    ident, created = init_identity(home)
    try:
        person, words = init_person(home, ident, device_name)
    except SigningError as exc:
        raise UsageError("usage", f"--device-name: {exc.message}") from None
    binding = person.binding_for(ident.public_key)
    from node.local.agents import ensure_default_agent

    agent_token = ensure_default_agent(home)  # the agent `default` (specs/agents.md); its token shown once
    if json_out:
        emit_json({"public_key": ident.public_key, "fingerprint": ident.fingerprint, "created": created,
                   "agent_token": agent_token,
                   "home": str(home), "person_key": person.person_key,
                   "person_fingerprint": fingerprint(person.person_key), "person_created": words is not None,
                   "device_name": binding["device_name"] if binding else None,
                   "recovery_words": words})
        return
    verb = "Created" if created else "Existing"
    console.print(f"{verb} identity in {home}")
    console.print(f"  device key:  {ident.public_key}")
    console.print(f"  fingerprint: {ident.fingerprint}")
    console.print(f"{'Created' if words else 'Existing'} person key")
    console.print(f"  person key:  {person.person_key}")
    console.print(f"  fingerprint: {fingerprint(person.person_key)}")
    if binding:
        console.print(f"  this device: {safe_text(binding['device_name'])!r} (binding {binding['seq']})",
                      highlight=False, markup=False)
    if agent_token:
        console.print("Created the agent 'default' for `kith mcp` and the local API (every source, every "
                      "pinned peer, the outbox; outbound: ask). Its token (shown once; `kith agent rotate "
                      "default` prints a new one):", highlight=False, markup=False)
        console.print(f"  {agent_token}", highlight=False, markup=False)
    if words:
        console.print("Recovery secret (shown once, not stored; write it on paper — it can sign a rotation of "
                      "the person key if the device holding it is lost):", highlight=False, markup=False)
        console.print(f"  {words}", highlight=False, markup=False)


# ----------------------------------------------------------------------------- host
def _redacted_log_handler(home: Path, server: str | None = None) -> None:
    """Show the node's warnings on stderr with real paths, keys, hosts and URL query
    strings redacted (issue 5 rule 7: host logs are often pasted to others) — but the
    community server URL the owner gave (``server``) as typed (issue 20: no placeholders)."""
    import logging

    from node.policy.redact import RedactingFilter

    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    from node.common.names import holder_text  # the URL as the client prints it

    handler.addFilter(RedactingFilter([str(home)], keep=[holder_text(server.rstrip("/"))] if server else []))
    logging.getLogger("kith").addHandler(handler)


def _ticket_text(mode: Any, inv: dict[str, Any]) -> str:
    """The mode and what the invitation's ticket tells its readers (specs/transport.md §2):
    ``relay-only via URL; the ticket carries no IP address`` or ``none; ticket addresses: …``."""
    from node.transport.hygiene import ticket_addresses

    try:
        relay, direct = ticket_addresses(inv["transport_info"]["ticket"])
    except (KeyError, TypeError, ValueError):
        return mode.name
    name = mode.name + (", relay-only" if mode.relay_only else "")
    if mode.lan:
        name += f", discovery {mode.discovery}"
    parts = [f"relay {relay}" if relay else "no relay"]
    parts.append("the ticket carries no IP address" if not direct else "ticket addresses " + " ".join(direct))
    return f"{name}; " + "; ".join(parts)


@transport_options(deprecated_local=True)
def host_cmd(
    ctx: typer.Context,
    protocol: str = typer.Option("knowledge-query", "--protocol", help="Protocol to serve."),
    server: Optional[str] = server_option("Community server to publish the invitation to.", from_env=False),
    invite_file: Optional[Path] = typer.Option(None, "--invite-file", metavar="FILE", help="Write the invitation to FILE (paired peers, no server)."),
    transport: TransportArgs = TransportArgs(),
    presence: Optional[str] = typer.Option(None, "--presence", metavar="open|granted", help="Who learns this host is online: open (default; every guest with the invitation) or granted (only peers holding a grant; the rest get the unknown-post refusal). Config: [host] presence."),
    unlisted: bool = typer.Option(False, "--unlisted", help="With --server: the post is reachable by post_id, by its invitation file and by pinned peers (browse --host KEY), but absent from browsing."),
    ttl: int = typer.Option(24 * 3600, "--ttl", min=60, max=30 * 24 * 3600, help="Invitation lifetime in seconds."),
    message: Optional[str] = typer.Option(None, "--message", help="A line shown with the invitation."),
    tag: list[str] = typer.Option([], "--tag", help="Tag the invitation (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Invitation as JSON on the first stdout line, then one event object per line."),
    peers_only: bool = typer.Option(False, "--peers-only", help="Admit only guests pinned in the peer registry (kith peers add), or devices of a person pinned with --devices."),
    mailbox: bool = typer.Option(False, "--mailbox", help="With --server: take the sealed questions left for this device in the server's mailbox (at start, then every 5 s), answer each under this host's rules now, and leave the sealed answer there; this device's card names the mailbox (card format 2: older guests ignore it)."),
    holder: list[str] = typer.Option([], "--holder", metavar="URL", help="Take sealed questions also from this holder, a device of your person running --hold-mail: http://HOST:PORT, or iroh:TICKET for one reached over iroh (the ticket of its invitation, which its `kith host` prints) (repeatable, at most 3); this device's card names it, so askers leave questions there while this device sleeps."),
    hold_mail: Optional[str] = typer.Option(None, "--hold-mail", metavar="HOST:PORT|iroh", help="Hold mail for your person's devices while this device is up, kept in <home>/mailbox.sqlite3, taking only sealed records to or from your person's devices (it opens only those sealed to this device too). HOST:PORT: served there over plain HTTP (loopback or LAN, or behind TLS) and over this host's iroh endpoint; iroh: over the iroh endpoint only (no HTTP listener). This device's card names it: http://HOST:PORT, or iroh:TICKET (specs/sealed.md §7b)."),
    share_ui: bool = typer.Option(False, "--share-ui", help="Offer the protocol's ui/ bundle to guests that join with --accept-host-ui."),
    max_sessions: Optional[int] = typer.Option(None, "--max-sessions", min=1, max=1_000_000, help="Sessions one post_id allows (1 = single-use); with --server a used-up or expired post is republished under a new post_id."),
    watch: bool = typer.Option(False, "--watch", help="Re-index added, changed and deleted files live (holds the index writer lock while hosting)."),
    audit_queries: bool = typer.Option(False, "--audit-queries", help="Record each query's text in the audit log (default: only a keyed hash of it; `kith audit`)."),
    anonymous_slots: Optional[int] = typer.Option(None, "--anonymous-slots", min=0, max=1_000_000, help="Session slots anonymous guests (keys not in the peer registry) may hold together; the rest stay free for pinned peers. Default: 3/4 of the 64 slots (48)."),
    evict_idle_after: float = typer.Option(30.0, "--evict-idle-after", min=0.0, max=86_400.0, metavar="SECONDS", help="An anonymous session that answered no query (rate-limited answers do not count) for this long may be ended with session-evicted for a guest that already holds a session; a guest with none evicts a session quiet for 2 s at once."),
    max_failed_handshakes: int = typer.Option(10, "--max-failed-handshakes", min=1, max=1_000_000, help="Failed handshakes (a live post named, then verification failed) before a key is refused for --failure-cooldown, and before a single-use or file-mode post is retired."),
    failure_cooldown: float = typer.Option(600.0, "--failure-cooldown", min=1.0, max=30 * 86_400.0, metavar="SECONDS", help="How long a key over --max-failed-handshakes is refused (handshake-too-many-failures)."),
    new_invitation: bool = typer.Option(False, "--new-invitation", help="File mode: stop honouring the invitations of earlier runs (kept in <home>/posts.json until their own expiry or use count) and sign a new one; their guests are told to ask for a new invitation."),
    sign_citations: bool = typer.Option(False, "--sign-citations", help="Sign a citation for each result a guest asks citations for (`kith verify` checks them). A signed answer cannot be denied later. Default: off (such guests get unsigned results marked signing-off)."),
) -> None:
    """Share this node's corpus: publish an invitation and serve guests until Ctrl-C/SIGTERM.

    \b
    Transport modes (specs/transport.md):
      --relay n0 (default)  public n0 relays + n0 address lookup; direct paths when possible
      --relay none          direct only, nothing published to n0
      --relay URL[,URL]     only your own relays (never a public one), nothing published to n0;
                            a relay that cannot be reached is reported within 5 s, never replaced
      --relay-only          tickets without IP addresses, UDP on loopback: peers see the relay only
      --lan [--discovery off|on|resolve]
                            LAN interfaces, relays off; optional mDNS discovery
      --offline             loopback only (tests, demos); --local is its old spelling
    The session path (direct / relayed via URL) shows in events, `kith sessions` and `kith status`.
    """
    from node.host.host import HostOptions, serve_host

    if not server and invite_file is None:
        raise UsageError("usage", "give --server URL (publish) or --invite-file FILE (paired peers, no server)")
    if invite_file is not None and not invite_file.resolve().parent.is_dir():
        raise UsageError("usage", f"--invite-file: the folder {invite_file.parent} does not exist")
    # a refused start leaves the home as it was: an older home's agent `default` is made, and
    # the runner (its lock, its pool) started, only once the host is up (on_invitation below)
    home = identity_home_of(ctx, agent=False)
    mode = transport.mode(home, "host")
    from node.host.grants import presence_from

    presence = presence_from(presence, home)
    if unlisted and not server:
        raise UsageError("usage", "--unlisted is for a post on a community server (--server URL)")
    _redacted_log_handler(home, server)
    opts = HostOptions(protocol=protocol, server_url=server, invite_file=invite_file, local=mode.offline, ttl_s=ttl,
                       message=message, tags=list(tag), peers_only=peers_only, post_max_sessions=max_sessions,
                       transport=mode, presence=presence, unlisted=unlisted)
    opts.share_ui = share_ui
    opts.watch = watch
    opts.audit_queries = audit_queries
    opts.sign_citations = sign_citations
    if mailbox and not server:
        raise UsageError("usage", "--mailbox takes sealed questions from a community server: give --server URL")
    opts.mailbox = mailbox
    if len(holder) > 3:
        raise UsageError("usage", "--holder: at most 3 (repeatable up to three times)")
    for i, url in enumerate(holder):
        if url in holder[:i]:
            raise UsageError("usage", f"--holder {url[:60]} is given twice")
    if holder:
        from node.trust.card import check_mailboxes

        try:
            check_mailboxes(list(holder))
        except KithError:
            raise UsageError("usage", "--holder takes a holder's base URL, http(s)://HOST[:PORT][/path], or "
                                      "iroh:TICKET") from None
        from node.community.iroh_mail import SCHEME, holder_key

        for url in holder:
            if url.startswith(SCHEME) and holder_key(url) is None:
                raise UsageError("usage", f"--holder {url[:40]}…: not an iroh ticket (the one `kith host --hold-mail "
                                 "iroh` prints)")
    opts.holders = list(holder)
    named = {*holder, *([server] if mailbox else []), *([f"http://{hold_mail}" if hold_mail != "iroh" else "iroh"]
                                                           if hold_mail is not None else [])}
    if len(named) > 4:  # a card names at most 4 (node.trust.card.MAX_MAILBOXES, specs/sealed.md §6): none dropped
        raise UsageError("usage", f"a card names at most 4 holders: --hold-mail, --holder and --mailbox make "
                                  f"{len(named)}; leave one out")
    if hold_mail is not None:
        from node.host.sealed_host import parse_hold_mail

        parse_hold_mail(hold_mail)
    opts.hold_mail = hold_mail
    if new_invitation and server:
        raise UsageError("usage", "--new-invitation is for file mode: a server post is withdrawn at every exit")
    opts.new_invitation = new_invitation
    opts.anonymous_sessions = anonymous_slots
    opts.evict_idle_after_s = evict_idle_after
    opts.max_failed_handshakes = max_failed_handshakes
    opts.failure_cooldown_s = failure_cooldown

    up = None  # the anyio.Event set by the first invitation: the host started (made in main)

    def on_invitation(inv: dict[str, Any]) -> None:
        if up is not None and not up.is_set():
            up.set()
        if json_out:
            emit_json(inv)
        else:
            console.print(f"[bold]Hosting[/bold] {inv['protocol']['name']} as {inv['host_public_key'][:16]}…")
            console.print(f"  post_id: [bold]{inv['post_id']}[/bold]  (expires {inv['expires_at']})")
            console.print(f"  transport: {_ticket_text(mode, inv)}", highlight=False, markup=False)
            if server:
                console.print(f"  join with: kith join {inv['post_id']} --server {server}" + mode.join_flags())
            if invite_file is not None:
                console.print(f"  invitation file: {invite_file}  (kith join {invite_file}{mode.join_flags()})")
            if hold_mail == "iroh":  # what the person's other devices give --holder (specs/sealed.md §7b)
                console.print(f"  holds mail over iroh: iroh:{inv['transport_info']['ticket']}  (your other devices: "
                              "--holder with it)", highlight=False, markup=False)
            console.print("  Ctrl-C to stop.")

    async def main() -> None:
        nonlocal up
        stop = anyio.Event()
        up = anyio.Event()

        async def until_signal() -> None:  # 1st signal: end sessions cleanly; 2nd: stop now
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    if stop.is_set():
                        tg.cancel_scope.cancel()
                        return
                    err_console.print("stopping: ending sessions and closing the endpoint…")
                    stop.set()

        from node.cli.host_render import HostEventPrinter
        from node.cli.outbox_cmd import say_delivery
        from node.guest.owner import Guest
        from node.runtime.clock import SYSTEM_CLOCK

        clock = SYSTEM_CLOCK  # one clock for the host and the home's background work beside it
        guest = Guest(home, mode=mode, local=mode.offline, clock=clock)  # the asking side of this process

        async def background_once_up() -> None:
            await up.wait()
            try:
                default_agent(home)  # a home made before agents (node/cli/common.py)
            except KithError as exc:  # a full disk, say: the host serves on; the next command makes it
                warn(f"the agent 'default' could not be created now [{exc.code}]: {exc.message}")
            # the home's background work while it hosts: the outbox's delivery (specs/outbox.md §5)
            await guest.run_background(command="kith host", on_event=say_delivery)

        async with anyio.create_task_group() as tg:
            tg.start_soon(until_signal)
            tg.start_soon(background_once_up)
            await serve_host(home, opts, on_invitation=on_invitation, warn=warn, stop=stop,
                             on_event=HostEventPrinter(json_out=json_out, server=server),
                             clock=clock, on_devices_revoked=partial(_end_revoked_copies, home))
            tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")


def _end_revoked_copies(home: Path, keys: list[str]) -> None:
    """The copies this home keeps of devices revoked while it hosts go (specs/copies.md §5):
    the guest's side, wired into the host by the command that runs both."""
    from node.guest.copies.lifecycle import end_copies

    for key in keys:
        end_copies(home, host_key=key, via="device-revoked")


# ----------------------------------------------------------------------------- join
def _prompt(text: str) -> str:
    """Ask on stderr and read a line from stdin (stdout carries only data; DESIGN §13).

    Raises:
        EOFError: stdin closed.
    """
    sys.stderr.write(text)
    sys.stderr.flush()
    line = stdin_line()
    if not line:
        raise EOFError
    return line.rstrip("\n")


def _offer_pin(home: Path, key: str, profile: dict[str, Any], pin: str | None,
               invitation: dict[str, Any] | None = None, server: str | None = None,
               card: object = None) -> None:
    """After a successful session with an unpinned host: pin it as ``pin``, or (on a TTY)
    ask for a name; otherwise say how to pin it later. Messages go to stderr.

    ``card``: the device card the host sent in that session's handshake (or None). It is
    kept for the new pin as a card of a pinned device's own handshake is
    (:func:`node.guest.cards.take_card`), so the holders it names are known to ``--later``
    at once (specs/sealed.md §10: a device pin uses the mailbox its card names once this
    home met it live — and the pinning session was that meeting)."""
    import re

    from node.trust.peers import NAME_RE, PeerRegistry

    if pin is None and not stdin_is_terminal():
        err_console.print(f"to pin this host: kith peers add NAME {key}", highlight=False)
        return
    registry = PeerRegistry.load(home)  # read here: a pin is written to the file as it is now
    if pin is None:
        suggested = re.sub(r"[^A-Za-z0-9_.-]+", "-", profile.get("displayName", "")).strip("-._")[:64]
        suggested = suggested if NAME_RE.fullmatch(suggested or "-") and suggested not in registry.peers else ""
        shown = f" (it calls itself {suggested!r})" if suggested else ""
        pin = _ask_pin_name(f"Pin this host in your peer registry{shown}? Type a name, or Enter to skip: ",
                            registry)
        if pin is None:
            return
    rec = registry.add(pin, key, profile=profile, invitation=invitation, server=server)
    err_console.print(f"pinned the host as {rec.name!r}", highlight=False, markup=False)
    if card is not None:  # the session's card, refused before the pin existed (card-wrong-person)
        from node.guest.cards import take_card

        take_card(home, card, via="handshake", device=key)


#: Answers of the ``[y/N]`` trust question that are never taken as a peer name (issue 30).
YES_NO_ANSWERS = frozenset({"y", "n", "yes", "no"})
#: How often the name prompt asks again after an answer it cannot take.
PIN_NAME_TRIES = 5


def _ask_pin_name(question: str, registry: Any) -> str | None:
    """Ask for a peer name on the terminal until one can be pinned: a yes/no answer
    (:data:`YES_NO_ANSWERS`, typed for the trust question before it), a name that is not
    a peer name, or one already pinned is refused with the reason and asked again, at
    most :data:`PIN_NAME_TRIES` times. Returns the name, or None (Enter, Ctrl-D, or no
    usable name after the last try: nothing is pinned)."""
    from node.trust.peers import NAME_RE

    for _ in range(PIN_NAME_TRIES):
        try:
            name = _prompt(question).strip()
        except EOFError:
            return None
        if not name:
            return None
        if name.lower() in YES_NO_ANSWERS:
            why = f"{name!r} reads as an answer, not a name: type a name for this host (its owner's, say)"
        elif not NAME_RE.fullmatch(name):
            why = f"{safe_text(name)[:64]!r} is not a peer name (1-64 of A-Z a-z 0-9 _ . -, starting with a letter or digit)"
        elif name in registry.peers:
            why = f"{name!r} is already pinned to another host; type another name"
        else:
            return name
        err_console.print(why, highlight=False, markup=False)
    err_console.print("not pinned; pin it later with `kith peers add NAME KEY`", highlight=False, markup=False)
    return None


def _host_end_reason(end: dict[str, Any]) -> str:
    """What the host's terminal message says about why it ended the session. A host that
    shuts down sends ``end`` with reason ``shutdown`` (specs/session.md): shown as the
    code ``session-shutdown``."""
    reason = end.get("reason")
    if reason == "shutdown":
        return "session-shutdown"
    return safe_text(reason)[:200] if isinstance(reason, str) and reason.strip() else "no reason given"


def _install_interactive_sigint(grace_s: float = 3.0) -> None:
    """Ctrl-C in an interactive ``kith join``: raise KeyboardInterrupt as usual (the
    session is cancelled and cleaned up), and make sure the process ends within
    ``grace_s`` seconds even if a worker thread is still blocked in ``input()``."""
    import os
    import threading

    def on_sigint(signum: int, frame: Any) -> None:
        timer = threading.Timer(grace_s, lambda: (sys.stderr.flush(), os._exit(130)))
        timer.daemon = True
        timer.start()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)


def _exit_now(exc: KithError | None, json_out: bool, status: int | None = None) -> None:
    """Report ``exc`` like ``kith``'s dispatcher does, flush, and end the process at once.

    Only for an interactive ``kith join`` whose ``ask>`` prompt is still waiting in
    ``input()`` on a worker thread: a normal exit would wait for that thread, i.e. for
    the user's next line."""
    import os

    from node.cli.main import print_error

    if exc is not None:
        print_error(exc, json_out=json_out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status if status is not None else (exc.exit_code if exc is not None else 0))


@transport_options(deprecated_local=True)
def join_cmd(
    ctx: typer.Context,
    target: Optional[str] = typer.Argument(None, metavar="POST_ID|INVITE_FILE|JSON", help="A post_id (needs --server), an invitation file, or an invitation JSON string (or --peer NAME instead)."),
    peer: Optional[str] = typer.Option(None, "--peer", metavar="NAME", help="Join a pinned peer by its saved invitation (then the newest post of its key on the community server it came from), instead of POST_ID|INVITE_FILE|JSON."),
    server: Optional[str] = server_option("Community server to fetch the post_id from and record the session proof.", from_env=False),
    transport: TransportArgs = TransportArgs(),
    trust: bool = typer.Option(False, "--trust", help="Trust an unknown host key without asking."),
    query: list[str] = typer.Option([], "--query", "-q", help="Ask this question (repeatable); without it, an interactive prompt."),
    top_k: int = typer.Option(TOP_K_DEFAULT, "--top-k", min=1, max=20, help="Results per question (1-20)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object per line: each results message (with the host's key as peer.key; save it for `kith verify`)."),
    citations: bool = typer.Option(False, "--citations", help="Ask the host to sign a citation for each result (it signs only with --sign-citations); check them later with `kith verify`."),
    pin: Optional[str] = typer.Option(None, "--pin", metavar="NAME", help="After a successful session, pin the host in the peer registry as NAME (a name pinned to another key is refused)."),
    accept_host_ui: bool = typer.Option(False, "--accept-host-ui", help="Advertise p2p_ui_v1: accept the host's UI bundle when this protocol has no local ui/ (verified, installed per session under the home)."),
    yes: bool = typer.Option(False, "--yes", help="Send a question even when the outbound gate holds it (12+ words of a source hidden from this host, a personal value or a secret); without it you are asked at a terminal, and refused (outbound-needs-confirmation) without one."),
) -> None:
    """Join a Host's invitation, verify it, connect directly over iroh and ask questions."""
    from node.answer import contract
    from node.guest.owner import Guest

    home = identity_home_of(ctx)
    mode = transport.mode(home, "join")
    guest = Guest(home, mode=mode, local=mode.offline)  # the asking side of this process
    guest.load()  # a home without an identity, or a damaged one, is refused before anything else
    guest.person.now()  # a damaged record fails here, with its hint, not as the host's refusal; read once
    for text in query:  # refused here, with the code every entry point uses, before connecting
        try:
            contract.validate({"query": text, "topK": top_k})
        except KithError as exc:  # a bad --query is a bad command line: exit 2, as `kith ask` (specs/cli.md)
            raise error_for(exc.code, exc.message, hint=exc.hint, exit_code=2) from None

    if (target is None) == (peer is None):
        raise UsageError("usage", "give POST_ID|INVITE_FILE|JSON, or --peer NAME (a pinned peer), not both")
    if peer is not None and pin is not None:
        raise UsageError("usage", "--peer NAME joins a peer pinned already; --pin is for a new one")
    Join(guest, target=target, peer=peer, server=server, trust=trust, query=query, top_k=top_k,
         json_out=json_out, citations=citations, pin=pin, accept_host_ui=accept_host_ui, yes=yes).run()


class Join:
    """One ``kith join``: the host it joins, the session with it and what it prints.

    Built by :func:`join_cmd` once the command line is checked, with the process's
    :class:`node.guest.owner.Guest` (its identity, transport and views of ``peers.json``
    and ``person.json``: each is read once, and again only when a write changed it);
    :meth:`run` joins, asks (the ``--query`` questions, or at the ``ask>`` prompt) and
    raises the refusal the session ends with (:func:`_join_result`). Its state is what the
    session's callbacks share: the answers so far, the question out, the outbound gate's
    tickets, whether the prompt waits on a worker thread.
    """

    def __init__(self, guest: Any, *, target: str | None, peer: str | None,
                 server: str | None, trust: bool, query: list[str], top_k: int, json_out: bool, citations: bool,
                 pin: str | None, accept_host_ui: bool, yes: bool) -> None:
        self.guest = guest
        self.home, self.identity, self.mode = guest.home, guest.identity, guest.mode
        self.target, self.peer, self.server, self.trust = target, peer, server, trust
        self.query, self.top_k, self.json_out, self.citations = query, top_k, json_out, citations
        self.pin, self.accept_host_ui, self.yes = pin, accept_host_ui, yes
        self.interactive = not query
        #: what the handshake told of the host (its profile)
        self.host_seen: dict[str, Any] = {}
        #: the results messages shown, in order
        self.answered: list[dict[str, Any]] = []
        self.refused: str | None = None  # the code this guest refused the host's reply with (it ended the session)
        #: the Target joined (for the refusal's wording)
        self.joined: Any = None
        self.inv: Any = None
        self.name: str | None = None
        #: the outbound log's ticket of each question sent
        self.tickets: list[Any] = []
        #: (monotonic time asked, question number) of the question out, or None
        self.outstanding: tuple[float, int] | None = None
        #: the ask> prompt's input() is waiting on a worker thread
        self.at_prompt = False
        self.at_terminal = False
        self.who = ""
        self.unresponsive_s = 0.0
        self.waiting = Waiting(err_console)
        self.ready: Any = None  # the anyio.Event set when the session is ready (made in the event loop)

    # ------------------------------------------------------------ the command
    def run(self) -> None:
        """Join, ask, and end as ``kith join`` does: raise the session's refusal, or in an
        interactive session whose prompt still waits, report and end the process at once."""
        if self.interactive:
            _install_interactive_sigint()
            try:  # bytes that are not UTF-8 at the prompt become lone surrogates, which the
                # contract refuses as query-invalid, instead of a UnicodeDecodeError
                sys.stdin.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]
            except (AttributeError, ValueError):
                pass  # not a text stream of its own (a test runner's)
        try:
            outcome = anyio.run(self.main, backend="asyncio")
        except (KeyboardInterrupt, KithError) as exc:
            if isinstance(exc, KeyboardInterrupt):  # Ctrl-C: the session is cleaned up; stop now,
                _exit_now(None, self.json_out, 130)  # not after the interpreter's ~0.3 s teardown
            if self.interactive and self.at_prompt:  # the session ended (error) under the prompt
                _exit_now(exc, self.json_out)
            raise
        try:
            _join_result(outcome, self.query, self.answered, self.interactive, self.joined, self.refused)
        except KithError as exc:
            if self.interactive and self.at_prompt:  # say why now, not after the user's next line
                _exit_now(exc, self.json_out)
            raise
        if self.interactive and self.at_prompt:
            _exit_now(None, self.json_out)

    async def main(self) -> Any:
        """The session's outcome, after the host is opened, trusted and asked."""
        from node.guest.guest import GuestOptions, ask
        from node.runtime.driver import inflight_heartbeat

        host = await self._open()
        self.tickets = [await anyio.to_thread.run_sync(self.gated, text) for text in self.query]  # before connecting
        self.unresponsive_s = inflight_heartbeat()[1]  # the bound while a question is out
        self.ready = anyio.Event()
        self.who = safe_text(self.name) if self.name is not None else f"{self.inv.host_public_key[:16]}…"
        options = GuestOptions(queries=tuple(self.query), on_results=self.on_results, top_k=self.top_k,
                               next_question=self.next_question if self.interactive else None,
                               filters={"citations": True} if self.citations else {})
        if self.interactive:
            err_console.print("Type a question at each ask> prompt; an empty line or Ctrl-D ends the session.")
        for attempt in (1, 2):
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.say_connecting)
                    tg.start_soon(self.say_waiting)
                    asked = await ask(self.home, self.identity, host, options, local=self.mode.offline, mode=self.mode,
                                      server_url=self.server, host_seen=self.host_seen, on_ready=self.on_ready,
                                      accept_host_ui=self.accept_host_ui, on_path=self.on_path, peers=self.guest.peers,
                                      person=self.guest.person.now)
                    tg.cancel_scope.cancel()
            finally:
                self.waiting.stop()
            outcome = asked.outcome
            self.refused = asked.refused
            newer = (await _newer_post(self.peer, self.guest, outcome) if attempt == 1 and self.peer is not None
                     else None)
            if newer is None:
                break
            host = newer  # --peer: the saved post is gone there; its community server's newest one
            self.joined, self.inv = host, host.invitation
        assert outcome is not None  # no timeout_s: the session always ends with an outcome
        if outcome.code == "peer-unresponsive" and self.outstanding is not None:
            raise host_gone(self.who, outcome, f"q{self.outstanding[1]}")
        self._after(outcome)
        return outcome

    async def _open(self) -> Any:
        """The host to join (its :class:`node.guest.targets.Target`), checked against the
        pins and, when it is unknown, trusted (``--trust`` or ``[y/N]``) — or refused."""
        from node.guest.guest import check_pinned_name, open_target, resolve_peer
        from node.trust.identity import fingerprint
        from node.trust.pairing import pairing_code

        home, identity, peers = self.home, self.identity, self.guest.peers
        host = await (open_target(self.target, home, server_url=self.server, registry=peers.now())
                      if self.target is not None else resolve_peer(self.peer, home, registry=peers.now()))
        self.joined = host
        inv, name = self.inv, self.name = host.invitation, host.pinned_name
        if self.pin is not None:
            from node.trust.peers import NAME_RE

            if not NAME_RE.fullmatch(self.pin):
                raise UsageError("usage", "--pin NAME: 1-64 of [A-Za-z0-9_.-], starting with a letter or digit")
            check_pinned_name(self.pin, inv, home, registry=peers.now())
        revoked = None
        if name is not None:
            check_pinned_name(name, inv, home, registry=peers.now())
        else:
            from node.trust.peers import pin_of_revoked_device

            revoked = pin_of_revoked_device(peers.now(), home, inv.host_public_key)
            if revoked is not None:  # a stolen laptop's invitation is what a thief would send (specs/peers.md §10)
                err_console.print(f"warning: this host {inv.host_public_key[:16]}… is a device of "
                                  f"{safe_text(revoked[0].name)!r} that its person revoked (the revocation list "
                                  f"kept here, of {revoked[1]}): it is not one of {safe_text(revoked[0].name)!r}'s "
                                  "devices, only an unknown host; join it only if you trust it anyway (--trust)",
                                  highlight=False, markup=False)
            fp = fingerprint(inv.host_public_key)
            code = pairing_code(identity.public_key, inv.host_public_key)
            err_console.print(f"Unknown host {inv.host_public_key[:16]}… fingerprint [bold]{fp}[/bold]", highlight=False)
            # the host prints these words only once a session starts, i.e. after this
            # guest trusted it: for comparing first, its owner computes them from this key
            err_console.print(f"  pairing code: [bold]{code}[/bold] (the host's owner sees the same words with "
                              f"`kith peers code {identity.public_key}`, and in its log once you connect)",
                              highlight=False)
            if self.json_out and not self.trust:  # before the prompt / the refusal (with --trust: stderr only)
                from node.common.host_events import HostPairingCode, checked

                emit_json(checked(HostPairingCode(host_public_key=inv.host_public_key, pairing_code=code).to_dict(),
                                  command=True))
        if name is None and not self.trust:
            if revoked is not None:  # never on a keypress: only --trust, after the warning above
                raise InvitationError("host-not-trusted", f"this host is a device {safe_text(revoked[0].name)!r}'s "
                                      "person revoked; pass --trust to connect anyway",
                                      hint=f"ask {safe_text(revoked[0].name)} whether this device is theirs again "
                                           "(a revoked device stays revoked: a new one pairs with `kith device "
                                           "join`); --trust joins it as an unknown host")
            if not stdin_is_terminal():
                raise InvitationError("host-not-trusted", "unknown host key; pass --trust to connect anyway",
                                      hint=f"check the pairing code '{code}' (fingerprint {fp}) with the host's owner, "
                                           f"who runs `kith peers code {identity.public_key}`")
            try:
                answer = await anyio.to_thread.run_sync(_prompt, "Trust this host and connect? [y/N] ")
            except EOFError:
                answer = ""
            if answer.strip().lower() not in ("y", "yes"):
                raise InvitationError("host-not-trusted", "you did not trust the host")
        self.at_terminal = stdin_is_terminal() and sys.stderr.isatty()
        return host

    def gated(self, text: str) -> Any:
        """The outbound gate for one question to this host, before it leaves (specs/agents.md §5)."""
        from node.cli.common import confirm_outbound
        from node.policy.outbound import OWNER, gate

        return gate(self.home, {"query": text, "topK": self.top_k}, [self.name], actor=OWNER, rule="ask",
                    yes=self.yes, confirm=confirm_outbound if self.at_terminal else None)

    # ------------------------------------------------------------ the session's callbacks
    def wait_for_answer(self) -> None:
        """A question went out: note when, and show the waiting line."""
        import time

        self.outstanding = (time.monotonic(), len(self.answered) + 1)
        self.waiting.start(f"waiting for the answer to q{len(self.answered) + 1} "
                           f"(up to {self.unresponsive_s:.0f} s of silence)…")

    async def say_waiting(self) -> None:
        """One stderr line from WAIT_NOTICE_S on, then every WAIT_REPEAT_S, while a
        question is out: until its answer, or the heartbeat ends the session."""
        import time

        from node.cli.render import WAIT_NOTICE_S, WAIT_REPEAT_S

        told: tuple[Any, float] | None = None
        while True:
            await anyio.sleep(0.1)
            cur = self.outstanding
            if cur is None:
                continue
            waited = time.monotonic() - cur[0]
            due = WAIT_NOTICE_S if told is None or told[0] is not cur else told[1] + WAIT_REPEAT_S
            if waited >= due:
                told = (cur, due)
                err_console.print(f"still waiting for {self.who} to answer q{cur[1]} ({waited:.0f} s; "
                                  f"gives up after {self.unresponsive_s:.0f} s without a word from it)",
                                  highlight=False, markup=False)

    def on_ready(self, sid: str) -> None:
        self.ready.set()
        self.waiting.stop()
        err_console.print(f"session {sid}", highlight=False)
        if self.query:  # the first question goes out now
            self.wait_for_answer()

    def on_path(self, now: Any, previous: Any) -> None:
        """The path iroh selected, and each change (specs/transport.md §3); stderr only."""
        if previous is None:
            err_console.print(f"path: {safe_text(now.describe())}", highlight=False, markup=False)
        else:
            err_console.print(f"path changed: {safe_text(previous.describe())} -> {safe_text(now.describe())}",
                              highlight=False, markup=False)

    def on_results(self, message: dict[str, Any]) -> None:
        self.outstanding = None
        self.waiting.stop()
        self.answered.append(message)
        if len(self.answered) <= len(self.tickets):  # what came back, in the outbound log
            self.tickets[len(self.answered) - 1].done({**(message.get("envelope") or {}),
                                                       "status": message.get("status")})
        if self.json_out:  # which host answered, for `kith verify` (the message does not say)
            emit_json({**message, "peer": {"key": self.inv.host_public_key, "name": self.name}})
        else:
            print_answer(message, console)
        if len(self.answered) < len(self.query):
            self.wait_for_answer()

    async def say_connecting(self) -> None:
        """A line each second while it keeps trying (a host that is gone is not silence)."""
        import time

        from node.transport.iroh import CONNECT_TIMEOUT_S

        started = time.monotonic()
        await anyio.sleep(CONNECTING_NOTICE_S)
        if not self.ready.is_set():
            err_console.print(f"connecting to {self.inv.host_public_key[:16]}… (gives up after "
                              f"{CONNECT_TIMEOUT_S:.0f} s)", highlight=False, markup=False)
            self.waiting.start("connecting…")
        while not self.ready.is_set():
            await anyio.sleep(1.0)
            if not self.ready.is_set():
                err_console.print(f"still connecting to {self.inv.host_public_key[:16]}… "
                                  f"({time.monotonic() - started:.0f} s of {CONNECT_TIMEOUT_S:.0f} s)",
                                  highlight=False, markup=False)

    def next_question(self) -> str | None:
        """The next question typed at ``ask>`` (on a worker thread), or None to end. A
        question the contract refuses (too long, NUL, not UTF-8) gets the refusal --query
        gives, and the prompt asks again: the session goes on."""
        from node.answer import contract
        from node.cli.main import print_error

        while True:
            try:
                sys.stderr.write("ask> ")  # stdout carries only JSON in --json mode (DESIGN §13)
                sys.stderr.flush()
                self.at_prompt = True
                text = input()
            except EOFError:
                return None
            finally:
                self.at_prompt = False
            if not text.strip():
                return None
            try:
                contract.validate({"query": text, "topK": self.top_k})
                self.tickets.append(self.gated(text.strip()))  # the outbound gate (held, not confirmed: refused)
            except KithError as exc:
                print_error(exc)  # text only: in --json mode stdout carries results only
                continue
            self.wait_for_answer()
            return text.strip()

    # ------------------------------------------------------------ afterwards
    def _after(self, outcome: Any) -> None:
        """What a session leaves: the host's UI, and for a host answered, its pin offered
        (unknown) or its invitation kept (pinned)."""
        from node.guest.guest import trust_status

        inv, name, home = self.inv, self.name, self.home
        if outcome.ui_path is not None:
            from node.runtime.ui_artifacts import write_results_js

            write_results_js(outcome.ui_path.parent, self.answered)
            err_console.print(f"host UI installed for this session: {outcome.ui_path.as_uri()}",
                              highlight=False, markup=False)
        for code, side in outcome.ui_refused:
            err_console.print(f"host UI not installed: {safe_text(code)[:64]} (refused by the {safe_text(side)[:16]})",
                              highlight=False, markup=False)
        person = trust_status(inv, home, registry=self.guest.peers.now()) if outcome.ok and name is None else None
        if person is not None:  # its card in this handshake made it a known device of a person pin
            err_console.print(f"this host is a device of {person!r} (its card is kept): `kith ask --peer {person}` "
                              "asks it, or another awake device of that person", highlight=False, markup=False)
        elif outcome.ok and name is None and not (self.interactive and outcome.peer_end is not None):
            _offer_pin(home, inv.host_public_key, self.host_seen.get("profile") or {}, self.pin, inv.to_dict(),
                       self.server, card=self.host_seen.get("card"))
        elif outcome.ok and name is not None:  # a pinned host: keep its last invitation (`kith ask`)
            from node.trust.peers import PeerRegistry

            before = self.guest.peers.now().by_key(inv.host_public_key)
            was = before.invitation if before is not None else None
            if before is None or (was == inv.to_dict() and (self.server is None or before.server == self.server)):
                return  # nothing to keep: the file is not read again
            rec = PeerRegistry.load(home).remember_invitation(inv.host_public_key, inv.to_dict(), self.server)
            if rec is not None and rec.invitation != was:  # re-joining refreshed the pin: say so
                old = f" (it replaces post {safe_text(was.get('post_id'))[:64]})" if isinstance(was, dict) else ""
                err_console.print(f"saved this invitation (post {inv.post_id}, expires {inv.expires_at}) for "
                                  f"{rec.name!r}{old}: `kith ask --peer {rec.name}` and `kith join --peer "
                                  f"{rec.name}` use it", highlight=False, markup=False)


async def _newer_post(name: str, guest: Any, outcome: Any) -> Any:
    """``kith join --peer NAME`` whose saved invitation the host refused as gone
    (:data:`node.guest.targets.GONE_CODES`): the newest live post of the peer's key on the
    community server the pin came from (``resolve_peer(skip_saved=True)``), said on
    stderr, or None (another outcome, no server, or nothing newer there). ``guest``: the
    process's :class:`node.guest.owner.Guest` (its view of ``peers.json``)."""
    from node.guest.guest import resolve_peer
    from node.guest.targets import GONE_CODES

    if outcome is None or outcome.reason != "rejected" or outcome.code not in GONE_CODES:
        return None
    rec = guest.peers.now().by_name(name)
    if rec is None or not rec.server:
        return None
    try:
        target = await resolve_peer(name, guest.home, skip_saved=True, registry=guest.peers.now())
    except KithError:
        return None
    if rec.invitation is not None and target.invitation.post_id == rec.invitation.get("post_id"):
        return None
    err_console.print(f"the host no longer honours {name!r}'s saved invitation ({outcome.code}); joining its "
                      f"newest post on {safe_text(rec.server)}, {target.invitation.post_id} (saved for {name!r} "
                      "from now on)", highlight=False, markup=False)
    return target


def host_gone(who: str, outcome: Any, what: str) -> KithError:
    """The ``peer-unresponsive`` refusal for a host that went silent while ``what`` (a
    question) was out: which host, since when (local time, from
    ``outcome.last_heard_at``) and what to do (issue 30 item 2; specs/session.md §7.2)."""
    import time

    heard = getattr(outcome, "last_heard_at", None)
    since = (f" since {time.strftime('%H:%M:%S', time.localtime(heard))}"
             f" ({max(0.0, (outcome.ended_at or time.time()) - heard):.0f} s)") if heard else ""
    return SessionAborted("peer-unresponsive", f"{who} stopped answering: nothing from it{since} while {what} "
                          "was out", hint="the host was stopped, went to sleep or lost its network; ask again once "
                                          "it is back")


def _join_result(outcome: Any, query: list[str], answered: list[dict[str, Any]], interactive: bool,
                 target: Any = None, refused: str | None = None) -> None:
    """Raise the refusal ``kith join`` ends with for ``outcome`` (None: success): the
    session's own failure first (a host that no longer honours the invitation of
    ``target``, a :class:`node.guest.targets.Target`: ``invitation-gone``), else
    ``questions-unanswered`` when an answer's status is not in
    :data:`node.cli.render.ANSWERED_STATUSES` (specs/exit-codes.md) — also when this guest
    ended the session because it refused the host's reply to a question (``refused``: the
    engine's code, :attr:`node.guest.guest.AskResult.refused`)."""
    from node.guest.guest import invitation_gone
    from node.guest.targets import GONE_CODES

    if refused is not None:
        _check_statuses(answered, asked=max(len(query), len(answered)))

    if outcome.ok and interactive and outcome.peer_end is not None:
        reason = _host_end_reason(outcome.peer_end)
        raise SessionAborted("session-shutdown" if reason == "session-shutdown" else "remote-error",
                             f"the host ended the session: {reason}")
    if outcome.ok and query and len(answered) < len(query):
        raise SessionAborted("remote-error", f"the host ended the session after answering "
                                             f"{len(answered)} of {len(query)} question(s)")
    if outcome.ok:
        _check_statuses(answered)
        return
    code = outcome.code if outcome.code in CODES else "handshake-rejected"
    if outcome.reason == "rejected" and code in GONE_CODES and target is not None:
        raise invitation_gone(code, target.invitation, target.pinned_name)  # issue 30: said at once, with a way on
    if outcome.reason == "rejected":
        raise error_for(code, f"the session was refused: {outcome.message or CODES[code][1]}")
    if outcome.remote_errors and outcome.reason == "peer-disconnected":
        # the host said why before it hung up: show its code, not just the hang-up
        rcode, rmessage = outcome.remote_errors[-1]
        if rcode == "session-revoked":  # the host's owner removed or blocked this node
            raise SessionAborted("session-revoked", "the host revoked this node's access and ended the session",
                                 hint="ask the host's owner; `kith peers remove` leaves public sources only, "
                                      "`kith peers block` refuses every new session")
        if rcode == "session-evicted":  # an idle anonymous session made room for another guest
            raise SessionAborted("session-evicted", "the host ended this idle session to make room for another "
                                 "guest, or for a newer session of this same node (it holds the most sessions a "
                                 "peer may)",
                                 hint="join again; a pinned peer (`kith peers add` on the host) is never evicted "
                                      "for another guest")
        if rcode == "session-device-revoked":  # this device's person revoked it (specs/peers.md §10)
            raise SessionAborted("session-device-revoked", "the host learnt that this device was revoked by its "
                                 "person and ended the session",
                                 hint="a revoked device stays revoked; pair a new home with `kith device join`")
        if rcode == "session-grant-expired":  # a pin, membership or override `until` passed (specs/peers.md §12)
            raise SessionAborted("session-grant-expired", "a grant the host gave this node ended and the host "
                                 "ended the session",
                                 hint="ask the host's owner to extend it (`kith peers until`, `--until`)")
        if rcode == "session-ended-by-owner":  # the host's owner ran `kith sessions end`
            raise SessionAborted("session-ended-by-owner", "the host's owner ended this session",
                                 hint="ask the host's owner before joining again")
        shown = rcode if rcode in CODES else "remote-error"
        raise SessionAborted("remote-error", f"the host ended the session: [{shown}] {rmessage}"[:300])
    raise error_for(code, outcome.message or CODES[code][1])


def _check_statuses(answered: list[dict[str, Any]], asked: int | None = None) -> None:
    """Raise ``questions-unanswered`` (exit 1) when any answer's status says the question
    was not answered (rate-limited, pending-approval, policy-denied, …; the table of
    specs/exit-codes.md). In ``--json`` mode no ``{"error"}`` line is added to stdout:
    each ``results`` line already carries its status. ``asked``: how many questions the
    message counts (default: the answers)."""
    from node.cli.render import ANSWERED_STATUSES

    failed = [m for m in answered if m.get("status") not in ANSWERED_STATUSES]
    if not failed:
        return

    def one(m: dict[str, Any]) -> str:
        text = f"{safe_text(m.get('query_id'))[:64]} {safe_text(m.get('status'))[:64]}"
        if m.get("status") == "rate-limited" and isinstance(m.get("retry_after_s"), int):
            text += f" (retry in {m['retry_after_s']} s)"
        return text

    listed = ", ".join(one(m) for m in failed[:5]) + (", …" if len(failed) > 5 else "")
    ids = list(dict.fromkeys(safe_text(m["approval_id"])[:16] for m in failed
                             if m.get("status") == "pending-approval" and isinstance(m.get("approval_id"), str)))
    hint = ("ask the host's owner to run: " + "; ".join(f"kith approvals approve {i}" for i in ids[:3])
            if ids else None)
    exc = SessionAborted("questions-unanswered", f"{len(failed)} of {asked or len(answered)} question(s) not answered: "
                                                 f"{listed}", hint=hint)
    exc.json_line = False  # each results line on stdout already carries its status
    raise exc


# ----------------------------------------------------------------------------- protocol test
@protocol_app.command("test")
def protocol_test_cmd(
    ctx: typer.Context,
    target: str = typer.Argument(..., metavar="DIR|NAME", help="Protocol folder with spec.json and hooks.py, or a protocol name (as `kith host --protocol` takes)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    adversarial: bool = typer.Option(False, "--adversarial", help="Also send malformed variants of every guest→host message and require each to be refused before hooks (prints a variant → refusal code table)."),
) -> None:
    """Run both roles of a protocol over the in-memory pipe with the real engine and its
    test/ fixtures; exit 1 on any failure."""
    from node.devtools.harness import run_protocol_test
    from node.protocol.spec import resolve_protocol_dir

    directory = resolve_protocol_dir(target, home_if_any(ctx))

    report = anyio.run(run_protocol_test, directory, backend="asyncio")
    adv = None
    if adversarial:
        from node.devtools.adversarial import render_table, run_adversarial

        adv = anyio.run(run_adversarial, directory, backend="asyncio")
    if json_out:
        out = report.to_dict()
        if adv is not None:
            out["adversarial"] = adv.to_dict()
            out["passed"] = out["passed"] and adv.passed
        emit_json(out)
    else:
        console.print(f"protocol [bold]{report.protocol}[/bold] ({report.protocol_id[:16]}…)")
        for c in report.checks:
            mark = "[green]PASS[/green]" if c.passed else "[red]FAIL[/red]"
            console.print(f"  {mark} {c.name}" + (f" — {c.detail}" if c.detail else ""), highlight=False)
        if adv is not None:
            console.print("adversarial variants (each must be refused before hooks):")
            for row in render_table(adv):
                console.print("  " + row, highlight=False, markup=False, soft_wrap=True)
    failed = sum(not c.passed for c in report.checks) + (sum(not r.passed for r in adv.rows) if adv else 0)
    if failed:
        raise SpecError("protocol-test-failed", f"{failed} check(s) failed")


@protocol_app.command("id")
def protocol_id_cmd(
    ctx: typer.Context,
    target: str = typer.Argument(..., metavar="DIR|NAME", help="Protocol folder or protocol name."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print a protocol's name, version and protocol_id (SHA-256 of its canonical spec)."""
    from node.protocol.spec import load_spec, resolve_protocol_dir

    spec = load_spec(resolve_protocol_dir(target, home_if_any(ctx)))
    if json_out:
        emit_json({"name": spec.name, "version": spec.version, "protocol_id": spec.protocol_id})
    else:
        console.print(f"{spec.name} {spec.version} {spec.protocol_id}")


