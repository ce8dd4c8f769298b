"""``kith host --server URL --mailbox`` / ``--holder URL`` / ``--hold-mail HOST:PORT``: the host
takes the sealed questions left for it when it wakes, and every few seconds while it runs
(issue 43 items 2a, 2b, 3; specs/sealed.md §7, §7b).

One loop per host (started in the host's task group): a step of
:func:`node.community.inbox.take_step` against each holder it takes from
(:meth:`node.host.host.Host.mail_urls`: the server's mailbox, a device of its person that
holds mail, its own held mail), with the host's own
admission by the host's doorkeeper — the one check a live handshake passes
(:func:`sealed_on_question`, :meth:`node.host.doorkeeper.Doorkeeper.sealed_name`) — and the
answer (:func:`node.answer.sealed_questions.host_answerer`: the one answer path, the egress
gate seam, the audit) run in a worker thread like every other answer; repeated at once while the server says more wait, then after
:data:`TAKE_EVERY_S`. A failing take is said once on stderr and tried again; the host
serves on.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import anyio
import anyio.to_thread

from node.common.errors import KithError, UsageError


#: The file a device that holds mail keeps its sealed records in (``<home>/mailbox.sqlite3``).
HELD_MAIL_FILE = "mailbox.sqlite3"

#: Seconds between two takes while the host runs (the first is at start).
TAKE_EVERY_S = 5.0


async def take_sealed_questions(host: Any, *, every_s: float = TAKE_EVERY_S) -> None:
    """Take and answer this host's sealed questions until cancelled, from every holder of
    ``host.mail_urls()`` in turn (one that cannot be read is said once and tried again; the
    others are still taken from). Each holder's take cursor is kept from step to step for the
    run (:attr:`node.community.inbox.InboxReport.next`): the answers waiting there for the
    asking part of this device are read once, not again every round.

    Args:
        host: the running :class:`node.host.host.Host` (its ``home``, ``identity``,
            ``mail_urls()``, ``held_mail`` / ``held_url`` (its own, taken in-process),
            ``listener`` (the endpoint a holder over iroh is dialled from), ``opts.peers_only``,
            ``knowledge``, ``audit``, ``warn``, ``clock``).
        every_s: seconds between takes, waited on the host's
            :class:`node.runtime.clock.Clock` (a test's ManualClock starts the next take).
    """
    from node.common.names import holder_text
    from node.community.inbox import take_step
    from node.community.iroh_mail import mail_client
    from node.trust.person import own_chain
    on_question = sealed_on_question(host.door, host.knowledge, audit=getattr(host.audit, "log", None))
    async def endpoint() -> Any:  # a holder over iroh is dialled from this host's own endpoint
        return host.listener

    def client_of(url: str) -> Any:
        held = host.held_mail
        own = held.app if held is not None and url == host.held_url else None  # its own held mail: in-process
        return mail_client(url, host.identity, endpoint=endpoint, local_app=own)

    seen = host.sealed_seen()  # durable: a question is answered once across restarts (specs/sealed.md §5)
    said: set[str] = set()
    cursors: dict[str, str | None] = {}  # holder → take cursor: records passed over are not read again this run
    while True:
        for url in host.mail_urls():
            try:
                chain = own_chain(host.home, host.identity.public_key)
                async with client_of(url) as client:
                    while True:
                        report = await take_step(client, host.identity, chain, on_question=on_question, seen=seen,
                                                 after=cursors.get(url))
                        cursors[url] = report.next
                        if report.answered or report.refused:
                            from node.common.host_events import SealedTaken

                            host.emit(SealedTaken(holder=url, answered=len(report.answered),
                                                  dropped=dict(report.refused)).to_dict())
                        if not report.more or not (report.answered or report.refused):
                            break
                said.discard(url)
            except KithError as exc:
                if url not in said:
                    said.add(url)
                    if exc.category == "config":  # a file of this home (sealed-seen.sqlite, ...): not the mailbox
                        host.warn(f"sealed questions at {holder_text(url)} wait until a file of this home is fixed: "
                                  f"[{exc.code}] {exc.message}" + (f" — hint: {exc.hint}" if exc.hint else ""))
                    elif exc.code == "mailbox-off":  # no question can wait there: say how to turn it on
                        host.warn(f"the community server at {holder_text(url)} keeps no mailbox: no asker can leave a sealed "
                                  "question there (mailbox-off) — run it with `kith community serve --mailbox`, "
                                  "or host without --mailbox")
                    else:
                        host.warn(f"the mailbox at {holder_text(url)} could not be read ({exc.code}); "
                                  f"sealed questions wait there until it can")
        await host.clock.sleep(every_s)


def sealed_on_question(door: Any, knowledge: Any, *, audit: Any = None) -> Any:
    """The ``on_question`` of :func:`node.community.inbox.take_step` for a host: its asker
    admitted by ``door`` (:meth:`node.host.doorkeeper.Doorkeeper.sealed_name`, on the event
    loop, as a handshake is; a refusal raises its handshake code and the question is dropped
    with it), then answered under that name in a worker thread
    (:func:`node.answer.sealed_questions.host_answerer`).

    Args:
        door: the host's :class:`node.host.doorkeeper.Doorkeeper`.
        knowledge: the host's :class:`node.host.host.Knowledge`.
        audit: the host's :class:`node.trust.audit_log.AuditLog`, or None.

    Returns:
        an async ``Opened → results message``.
    """
    from node.answer.sealed_questions import host_answerer

    answer = host_answerer(knowledge, audit=audit)

    async def on_question(opened: Any) -> Any:
        name = door.sealed_name(opened.sender, opened.identity)
        return await anyio.to_thread.run_sync(answer, opened, name)

    return on_question


def person_devices(home: Path) -> frozenset[str]:
    """The device keys this home's person record names (``person.json``'s device links):
    every device of the person on the device that holds the person key; on a paired device,
    those bound before it and itself. Empty without a person record."""
    from node.trust.person import load_person

    try:
        rec = load_person(home)
    except KithError:
        return frozenset()
    return frozenset(d["device_key"] for d in rec.devices if isinstance(d.get("device_key"), str)) if rec else frozenset()


def holds_for(home: Path) -> Any:
    """The ``mailbox_admits`` of a device that holds mail for its person
    (:func:`node.community.server.create_app`): a record is kept when its sender or one of
    its recipients is a device of this home's person (:func:`person_devices`, re-read on
    each put: a device bound meanwhile counts) — so it is not an open relay for strangers.
    """

    def admits(sender: str, recipients: tuple[str, ...]) -> bool:
        mine = person_devices(home)
        return sender in mine or any(r in mine for r in recipients)

    return admits


#: ``--hold-mail iroh``: hold mail over iroh only (no HTTP listener; specs/sealed.md §7b).
IROH_ONLY = "iroh"


def parse_hold_mail(address: str) -> tuple[str, int] | None:
    """``--hold-mail``'s value → ``(host, port)`` (port 0: a free one), or None for
    :data:`IROH_ONLY` (``iroh``: the mail is served over iroh only).

    The host is the address the device's card names (specs/sealed.md §7b), so it must be
    one others can dial: an unspecified address (``0.0.0.0``, ``::``) would be named as is
    and send every asker to its own machine.

    Raises:
        UsageError: ``usage`` when it is not ``iroh`` nor a host and a port 0-65535, or the
            host is an unspecified address.
    """
    import ipaddress

    if address == IROH_ONLY:
        return None
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError("usage", f"--hold-mail takes HOST:PORT (e.g. 127.0.0.1:8740) or iroh, not {address!r}")
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        unspecified = False  # a host name
    if unspecified:
        raise UsageError("usage", f"--hold-mail names the address this device's card gives askers, not "
                         f"{host!r} (every address): give this device's LAN address, e.g. 192.168.1.20:8740")
    return host, int(port)


@dataclass
class HeldMail:
    """The mail a device holds for its person, while :func:`hold_mail`'s block runs.

    Attributes:
        app: the mailbox's ASGI app (:func:`node.community.server.create_app` of
            ``<home>/mailbox.sqlite3``): the one verifier, store, bounds, rate limits and
            ``mailbox-not-held`` rule, called in-process for the mailbox over iroh
            (:func:`node.community.iroh_mail.serve_mail_connection`) and for this device's
            own takes.
        url: ``http://HOST:PORT`` (the real port) when served over HTTP too, else None.
    """

    app: Any
    url: str | None


def forget_unserved_mail(home: Path) -> None:
    """Remove ``<home>/mailbox.sqlite3`` and its SQLite side files after a ``kith host``
    start that made the file and was then refused (a port in use, a damaged file met later):
    nothing was ever held in it, and a refused start leaves the home as it was. The caller
    checks that the file did not exist before the start; a file already gone is no fault."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            (Path(home) / (HELD_MAIL_FILE + suffix)).unlink()


@contextlib.contextmanager
def hold_mail(home: Path, address: str) -> Iterator[HeldMail]:
    """Hold mail for this home's person while the ``with`` block runs: the mailbox routes of
    specs/community-api.md ("Mailbox") from ``<home>/mailbox.sqlite3``, with the community
    server's default bounds and rate limits, keeping only records to or from the person's
    devices (:func:`holds_for`; others are refused ``mailbox-not-held``) — served on
    ``address`` (``HOST:PORT``) over HTTP, or by nothing but the returned app (``iroh``: the
    host serves it on its iroh endpoint, specs/sealed.md §7b). The records survive a
    restart (they are in the file).

    Yields:
        the :class:`HeldMail`.

    Raises:
        UsageError: a malformed ``address``. CommunityError: ``server-start-failed`` (the
            address cannot be bound); ``database-unavailable`` naming ``mailbox.sqlite3``
            with the ``mv`` that moves it aside (damaged, not SQLite, a folder).
    """
    from node.common.errors import CommunityError
    from node.common.http import bind_socket, serve_app_in_thread
    from node.community.server import create_app
    from node.community.store import MailboxLimits

    where = parse_hold_mail(address)
    path = Path(home) / HELD_MAIL_FILE
    try:
        app = create_app(path, mailbox=MailboxLimits(), mailbox_admits=holds_for(home))
    except CommunityError as exc:  # the held mail cannot be opened: its file and the way out
        if exc.code != "database-unavailable":
            raise
        raise CommunityError(exc.code, f"the mail this device holds cannot be opened ({path}): {exc.message}",
                             hint=f"move it aside (`mv {path} {path}.bad`) and start again; the sealed "
                                  "records it held are then not served") from None
    try:
        if where is None:
            yield HeldMail(app, None)
        else:
            sock = bind_socket(*where)
            with serve_app_in_thread(app, sock, what="the mail this device holds") as url:
                yield HeldMail(app, url)
    finally:
        app.state.store.close()


__all__ = ["HELD_MAIL_FILE", "HeldMail", "IROH_ONLY", "TAKE_EVERY_S", "forget_unserved_mail", "hold_mail", "holds_for", "parse_hold_mail",
           "person_devices", "sealed_on_question", "take_sealed_questions"]
