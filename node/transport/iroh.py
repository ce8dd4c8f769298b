"""The iroh QUIC transport (DESIGN §3): endpoint bound with the identity secret, one
bi-stream per session, errors translated to :mod:`node.common.errors` in this one module.

How the endpoint is bound is a :class:`node.transport.modes.TransportMode`
(specs/transport.md §1): ``n0`` (the public preset: n0's relays and address lookup),
``none`` / the owner's relay URLs / LAN (the minimal preset: nothing published to n0),
relay-only (loopback UDP, tickets without direct addresses) and offline (``--offline`` /
``KITH_OFFLINE=1``: relay disabled, loopback bind; tests and loopback demos). Importing
this module applies the version-gated send-path patch (:mod:`node.transport.iroh_patch`).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import anyio
import anyio.abc
import iroh
from iroh import iroh_ffi

from node.common.errors import TransportError
from node.transport import iroh_patch
from node.transport.base import ByteStream
from node.transport.modes import DEFAULT, OFFLINE, RELAY_CHECK_S, TransportMode
from node.transport.paths import UNKNOWN, PathInfo, PathTracker, path_of

iroh_patch.apply()

CLOSE_TIMEOUT_S = 5.0
#: A guest's bound on closing its endpoint (s). Its sessions have ended first (each
#: stream's last frame acknowledged, :meth:`IrohStream.aclose`); what is left is QUIC
#: draining connections that never came up — for a killed host 3×PTO, measured 3.0 s
#: after ``kith ask`` had printed its answer — which no peer will ever receive.
GUEST_CLOSE_TIMEOUT_S = 0.1
#: seconds an incoming QUIC handshake may take before the connection is dropped
QUIC_HANDSHAKE_TIMEOUT_S = 5.0
#: incoming QUIC handshakes completed at once by :meth:`IrohNode.connections`
MAX_CONCURRENT_QUIC_HANDSHAKES = 128
#: Adaptive read size (bytes): each ``read`` crosses the FFI, so during a bulk transfer (a
#: UI bundle) reads grow up to MAX while they come back full, and shrink back when small
#: frames are flowing (a large request allocates that much on the Rust side).
MIN_READ_BYTES = 64 * 1024
MAX_READ_BYTES = 1024 * 1024
#: Large sends go out in pieces of this size: one ``write_all`` of many MiB is several times
#: slower through the FFI than 256 KiB writes (measured 27 vs 83 MB/s for 16 MiB, both ends
#: in one process).
MAX_WRITE_BYTES = 256 * 1024
CONNECT_TIMEOUT_S = 15.0
#: How long :func:`all_refused` listens for the host's machine to refuse every direct
#: address of a dial (s), and how often it sends its empty probe datagram again (s). A
#: refusal on loopback or a LAN comes back within milliseconds; a machine that is asleep
#: or gone sends none, and the dial then waits out its own timeout as before.
REFUSAL_PROBE_S = 1.0
REFUSAL_RESEND_S = 0.25

#: On close, how long a stream waits for the peer to acknowledge every byte sent (s)
#: before the connection is closed anyway. The last frame before a close (a refusal, the
#: terminal ``end``) must reach the peer: closing the connection first discards what is
#: still in flight, so this bound is generous; an acknowledged stream closes at once.
DRAIN_TIMEOUT_S = 5.0


async def all_refused(addresses: list[str], *, wait_s: float = REFUSAL_PROBE_S) -> bool:
    """True when every one of ``addresses`` (``"ip:port"``, ``"[v6]:port"``) is refused by
    its machine within ``wait_s`` seconds: an empty UDP datagram sent to it from a
    connected socket comes back as ``ECONNREFUSED`` (ICMP port unreachable: nothing
    listens on that port) or the network says it cannot be reached
    (``ENETUNREACH``/``EHOSTUNREACH``). False as soon as one answers anything, when one is
    not an address, or when the time runs out without every refusal (a machine asleep or
    behind a firewall sends none). A live host's QUIC socket drops the empty datagram.
    Used by :meth:`IrohNode.connect` (specs/transport.md §3) so that a dial to a host known
    gone fails at once instead of at its timeout."""
    import errno
    import socket
    import time

    dead = {errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH}
    socks: list[socket.socket] = []
    try:
        for a in addresses:
            host, _, port = a.rpartition(":")
            host = host.strip("[]")
            try:
                s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
            except OSError:
                return False
            socks.append(s)
            s.setblocking(False)
            try:
                s.connect((host, int(port)))
            except (OSError, ValueError) as exc:
                if getattr(exc, "errno", None) not in dead:
                    return False
        gone: set[int] = set()
        end = time.monotonic() + wait_s
        next_send = 0.0
        while time.monotonic() < end:
            send = time.monotonic() >= next_send
            if send:
                next_send = time.monotonic() + REFUSAL_RESEND_S
            for i, s in enumerate(socks):
                if i in gone:
                    continue
                try:
                    if send:
                        s.send(b"")
                    s.recv(1)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    if exc.errno in dead:
                        gone.add(i)
                    continue
                return False  # something answered at that address
            if len(gone) == len(socks):
                return True
            await anyio.sleep(0.02)
        return False
    finally:
        for s in socks:
            s.close()


def _io_error(what: str) -> TransportError:
    return TransportError("transport-io", f"the connection failed while {what}")


def ticket_endpoint_id(ticket: str) -> str:
    """Parse an iroh ``EndpointTicket`` string and return its endpoint id (64 hex).

    Raises:
        ValueError: if the ticket cannot be parsed.
    """
    if not isinstance(ticket, str) or len(ticket) > 8192:
        raise ValueError("bad ticket")
    try:
        return str(iroh.EndpointTicket.from_string(ticket).endpoint_addr().id())
    except Exception:  # noqa: BLE001 - iroh raises its own error type; translated here
        raise ValueError("bad ticket") from None


async def _complete(incoming: iroh.Incoming, timeout_s: float) -> iroh.Connection | None:
    """Finish one incoming QUIC handshake; None if it fails or takes over ``timeout_s`` s."""
    try:
        with anyio.fail_after(timeout_s):
            accepting = await incoming.accept()
            return await accepting.connect()
    except (iroh.IrohError, TimeoutError):
        return None


class IrohStream(ByteStream):
    """One QUIC bi-stream as a :class:`node.transport.base.ByteStream`.

    Attributes:
        drain_timeout_s: :meth:`aclose`'s bound on waiting for the peer's acknowledgement
            (s; :data:`DRAIN_TIMEOUT_S` unless set on the class or the instance).
    """

    drain_timeout_s: float = DRAIN_TIMEOUT_S

    def __init__(self, conn: iroh.Connection, bi: iroh.BiStream) -> None:
        self._conn = conn
        self._send = bi.send()
        self._recv = bi.recv()
        self.remote_id: str | None = str(conn.remote_id())
        self._eof_sent = False
        self._read_size = MIN_READ_BYTES
        self._watch: Any = None

    def path(self) -> PathInfo:
        """The path this connection's data takes now, from iroh's own path data
        (``Connection.paths()``: the selected path, :func:`node.transport.paths.path_of`);
        ``unknown`` once the connection closed."""
        try:
            return path_of(self._conn.paths())
        except Exception:  # noqa: BLE001 - iroh error on a closed connection
            return UNKNOWN

    def watch_path(self, on_change: Callable[[PathInfo, PathInfo], None]) -> PathInfo:
        """Call ``on_change(previous, now)`` on the event loop each time the selected path
        changes (iroh's ``watch_paths``; stats-only updates are not changes). Stopped by
        :meth:`aclose`. Returns the path now."""
        tracker = PathTracker(self.path())

        class _Changed(iroh.PathChangeCallback):
            async def on_change(self, paths: list[Any]) -> None:  # noqa: D401 - iroh's callback
                changed = tracker.update(paths)
                if changed is not None:
                    on_change(*changed)

        try:
            self._watch = self._conn.watch_paths(_Changed())
        except Exception:  # noqa: BLE001 - a closed connection: nothing to watch
            self._watch = None
        return tracker.current

    async def receive(self, max_bytes: int | None = None) -> bytes:
        """Return 1..max_bytes bytes, ``b""`` at EOF. Raises TransportError.

        Without ``max_bytes`` the read size adapts between :data:`MIN_READ_BYTES` and
        :data:`MAX_READ_BYTES` (bulk transfers need large reads: measured 36 → 68 MB/s
        for 64 KiB → 1 MiB reads with both ends in one process).
        """
        size = max_bytes if max_bytes is not None else self._read_size
        try:
            data = await self._recv.read(size)
        except iroh.IrohError:
            raise _io_error("receiving") from None
        if max_bytes is None:
            if len(data) * 2 > size:
                self._read_size = min(size * 2, MAX_READ_BYTES)
            elif len(data) * 8 < size:
                self._read_size = max(size // 2, MIN_READ_BYTES)
        return data

    async def send(self, data: bytes) -> None:
        """Send all bytes. Raises TransportError."""
        if not data:
            return
        try:
            if len(data) <= MAX_WRITE_BYTES:
                await self._send.write_all(data)
                return
            view = memoryview(data)
            for i in range(0, len(data), MAX_WRITE_BYTES):
                await self._send.write_all(bytes(view[i:i + MAX_WRITE_BYTES]))
        except iroh.IrohError:
            raise _io_error("sending") from None

    async def send_eof(self) -> None:
        """Finish the send side (idempotent; errors ignored: the peer may be gone)."""
        if self._eof_sent:
            return
        self._eof_sent = True
        try:
            await self._send.finish()
        except iroh.IrohError:
            pass

    async def aclose(self, *, reason: bytes | None = None) -> None:
        """Finish sending and close the connection (the peer sees EOF, then close).

        The connection is closed only once the peer acknowledged every byte sent (QUIC's
        ``stopped()``: all data acknowledged, or the peer stopped the stream), or after
        :attr:`drain_timeout_s` — so the last frame is not lost to a close under load.
        ``reason``: close with QUIC application code 1 and this stable code (a refusal, such
        as ``b"mail-frame-invalid"``) instead of code 0 ``done``."""
        await self.send_eof()
        watch, self._watch = self._watch, None
        if watch is not None:
            try:
                await watch.stop()
            except Exception:  # noqa: BLE001 - already stopped with its connection
                pass
        try:
            with anyio.move_on_after(self.drain_timeout_s):
                await self._send.stopped()
        except iroh.IrohError:
            pass
        try:
            self._conn.close(0, b"done") if reason is None else self._conn.close(1, reason)
        except iroh.IrohError:
            pass


class IrohNode:
    """An iroh endpoint bound with the node identity.

    Use :func:`bind_node` (an async context manager) to create one; it is closed under a
    timeout on exit.
    """

    def __init__(self, endpoint: iroh.Endpoint, alpn: bytes, local: bool,
                 close_timeout_s: float = CLOSE_TIMEOUT_S, mode: TransportMode | None = None,
                 relay_mode: Any = None) -> None:
        self.endpoint = endpoint
        self.alpn = alpn
        self.mode = mode if mode is not None else (OFFLINE if local else DEFAULT)
        self.local = not self.mode.relays  # no relay to wait for (offline, none, LAN)
        self.close_timeout_s = close_timeout_s
        self._relay_mode = relay_mode
        #: True while this endpoint is advertised over mDNS (LAN mode, ``--discovery on``)
        self.advertising = False
        #: the port :func:`bind_node` was asked for and found taken, or None
        self.port_taken: int | None = None

    @property
    def bound_port(self) -> int | None:
        """The UDP port of the endpoint's IPv4 socket (the one tickets name), or None."""
        try:
            sockets = [str(a) for a in self.endpoint.bound_sockets()]
        except Exception:  # noqa: BLE001 - a closed endpoint
            return None
        for sock in sockets:
            if not sock.startswith("["):
                return int(sock.rsplit(":", 1)[1])
        return None

    def relay_map(self) -> list[str]:
        """The relay URLs this endpoint may use (its ``RelayMode``'s relay map; ``[]`` with
        relays disabled; the n0 preset's own map is not exposed by the binding: ``["n0"]``)."""
        if self.mode.uses_n0:
            return ["n0"]
        if self._relay_mode is None:
            return []
        return [str(u) for u in self._relay_mode.relay_map().urls()]

    def home_relay(self) -> str | None:
        """The relay this endpoint is connected to now (its address's relay URL), or None."""
        try:
            url = self.endpoint.addr().relay_url()
        except Exception:  # noqa: BLE001 - a closed endpoint
            return None
        return str(url) if url else None

    def direct_addresses(self) -> list[str]:
        """The socket addresses this endpoint has observed for itself (iroh's own list;
        never an address a peer told it: specs/transport.md §5)."""
        try:
            return [str(a) for a in self.endpoint.addr().direct_addresses()]
        except Exception:  # noqa: BLE001 - a closed endpoint
            return []

    def status(self) -> dict[str, Any]:
        """``{"mode", "relays", "relayOnly", "discovery", "relayMap", "homeRelay",
        "addresses" (what iroh observed for itself; in relay-only mode loopback only, and
        never put in a ticket), "sockets" (the bound UDP sockets), "advertising" (mDNS)}``
        for ``kith status``
        (specs/control.md)."""
        try:
            sockets = [str(a) for a in self.endpoint.bound_sockets()]
        except Exception:  # noqa: BLE001 - a closed endpoint
            sockets = []
        return {**self.mode.describe(), "relayMap": self.relay_map(), "homeRelay": self.home_relay(),
                "addresses": self.direct_addresses(), "sockets": sockets, "advertising": self.advertising}

    @property
    def endpoint_id(self) -> str:
        """Our endpoint id (= identity public key, 64 hex)."""
        return str(self.endpoint.id())

    def ticket(self) -> str:
        """An ``EndpointTicket`` string for our current address: the endpoint's own
        observed addresses and home relay; in relay-only mode the relay URL alone (no IP
        address at all, specs/transport.md §1)."""
        addr = self.endpoint.addr()
        if self.mode.relay_only:
            addr = iroh.EndpointAddr(addr.id(), addr.relay_url(), [])
        return str(iroh.EndpointTicket.from_addr(addr))

    async def wait_online(self, timeout_s: float = RELAY_CHECK_S) -> bool:
        """Wait for a home relay (modes with relays only; the others have none to wait
        for and return True at once). Never waits unbounded (offline, ``online()`` never
        returns — DESIGN §3). Returns True if a relay was reached within ``timeout_s``."""
        if self.local:
            return True
        with anyio.move_on_after(timeout_s):
            await self.endpoint.online()
            return True
        return False

    async def connect(self, ticket: str, *, timeout_s: float = CONNECT_TIMEOUT_S,
                      alpn: bytes | None = None) -> iroh.Connection:
        """Connect to the endpoint in ``ticket`` with ``alpn`` (default: the endpoint's own,
        knowledge-query's; a holder's mailbox is dialled with
        :data:`node.community.iroh_mail.MAILBOX_ALPN`).

        Raises:
            TransportError: ``transport-connect-failed`` (unreachable, refused, timeout).
        """
        try:
            addr = self.dial_addr(iroh.EndpointTicket.from_string(ticket).endpoint_addr())
        except iroh.IrohError:
            raise TransportError("transport-connect-failed", "the iroh ticket cannot be parsed") from None
        if self.mode.lan and self.mode.discovery in ("on", "resolve"):
            from node.transport import lan
            from node.transport.hygiene import dialable

            found = await lan.resolve(str(addr.id()))  # fresh LAN addresses first, then the ticket's
            addr = iroh.EndpointAddr(addr.id(), None, dialable([*found, *(str(a) for a in addr.direct_addresses())]))
        direct = [str(a) for a in addr.direct_addresses()]
        # Only direct addresses, and no address lookup that could find the host elsewhere:
        # when the host's machine refuses every one of them (nothing listens on the port:
        # the host is not running), iroh would retry them until the timeout — fail now.
        probe = bool(direct) and addr.relay_url() is None and not self.mode.uses_n0
        refused = False
        failure: BaseException | None = None
        conn = None
        dial = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                nonlocal refused
                if await all_refused(direct):
                    refused = True
                    dial.cancel()
            if probe:
                tg.start_soon(watch)
            try:
                with dial, anyio.fail_after(timeout_s):
                    conn = await self.endpoint.connect(addr, alpn or self.alpn)
            except (TimeoutError, iroh.IrohError) as exc:
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if conn is not None:
            return conn
        if refused:
            raise TransportError("transport-connect-failed", "the host's address refused the connection "
                                 "(nothing listens there: the host is not running)")
        if isinstance(failure, TimeoutError):
            raise TransportError("transport-connect-failed", f"no answer from the host within {timeout_s:.0f} s")
        raise TransportError("transport-connect-failed", "the host refused or could not be reached")

    def dial_addr(self, addr: iroh.EndpointAddr) -> iroh.EndpointAddr:
        """What of a ticket's address this endpoint may dial (specs/transport.md §1, §5):
        the relay URL only when this mode has relays (the owner's own mode keeps it only
        if it is one of them: no other relay is contacted; the n0 mode only if
        :func:`node.transport.hygiene.relay_dialable`: an ``https`` URL that names no
        loopback or private address); direct addresses only when this
        mode has direct paths (not relay-only), and only those
        :func:`node.transport.hygiene.dialable` keeps (never unspecified, multicast or
        broadcast addresses, at most :data:`node.transport.hygiene.MAX_DIAL_ADDRS`)."""
        from node.transport.hygiene import dialable, relay_dialable

        relay = addr.relay_url()
        own = {u.rstrip("/") for u in self.mode.relay_urls}
        if (not self.mode.relays or (own and str(relay or "").rstrip("/") not in own)
                or (not own and not relay_dialable(str(relay) if relay else None))):
            relay = None
        direct = [] if self.mode.relay_only else dialable([str(a) for a in addr.direct_addresses()])
        return iroh.EndpointAddr(addr.id(), relay, direct)

    async def open_stream(self, conn: iroh.Connection) -> IrohStream:
        """Open the session's bi-stream on ``conn``."""
        try:
            return IrohStream(conn, await conn.open_bi())
        except iroh.IrohError:
            raise TransportError("transport-connect-failed", "could not open a stream to the host") from None

    async def accept(self, *, handshake_timeout_s: float = QUIC_HANDSHAKE_TIMEOUT_S) -> iroh.Connection | None:
        """Wait for the next incoming connection (None when the endpoint closed).

        One at a time (tests, simple servers); a host uses :meth:`connections`, which
        completes QUIC handshakes concurrently. A handshake that fails or does not finish
        within ``handshake_timeout_s`` seconds is skipped, not raised.
        """
        while True:
            try:
                incoming = await self.endpoint.accept_next()
            except iroh.IrohError:
                return None
            if incoming is None:
                return None
            conn = await _complete(incoming, handshake_timeout_s)
            if conn is not None:
                return conn

    @asynccontextmanager
    async def connections(self, *, handshake_timeout_s: float = QUIC_HANDSHAKE_TIMEOUT_S,
                          max_handshakes: int = MAX_CONCURRENT_QUIC_HANDSHAKES
                          ) -> AsyncIterator[anyio.abc.ObjectReceiveStream[iroh.Connection]]:
        """Accept incoming connections in the background for a ``with`` block; yields a
        receive stream of established connections (it ends when the endpoint closes).

        Each QUIC handshake completes in its own task under ``handshake_timeout_s``
        seconds, at most ``max_handshakes`` at once: a peer that starts a handshake and
        stalls delays nobody else (the sequential :meth:`accept` would wait for it).
        """
        send, recv = anyio.create_memory_object_stream[iroh.Connection](max_handshakes)
        limiter = anyio.CapacityLimiter(max_handshakes)

        async def complete(incoming: iroh.Incoming) -> None:
            try:
                conn = await _complete(incoming, handshake_timeout_s)
                if conn is not None:
                    try:
                        await send.send(conn)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        pass
            finally:
                limiter.release_on_behalf_of(incoming)

        async def acceptor(tg: anyio.abc.TaskGroup) -> None:
            while True:
                token = object()
                await limiter.acquire_on_behalf_of(token)
                try:
                    incoming = await self.endpoint.accept_next()
                except iroh.IrohError:
                    incoming = None
                limiter.release_on_behalf_of(token)
                if incoming is None:
                    send.close()
                    return
                await limiter.acquire_on_behalf_of(incoming)
                tg.start_soon(complete, incoming)

        async with anyio.create_task_group() as tg:
            tg.start_soon(acceptor, tg)
            try:
                yield recv
            finally:
                tg.cancel_scope.cancel()
                send.close()

    @staticmethod
    async def accept_stream(conn: iroh.Connection, *, timeout_s: float = 10.0) -> IrohStream:
        """Accept the session's bi-stream on an incoming connection.

        Raises:
            TransportError: ``transport-io`` if none arrives within ``timeout_s``.
        """
        try:
            with anyio.fail_after(timeout_s):
                return IrohStream(conn, await conn.accept_bi())
        except TimeoutError:
            raise TransportError("transport-io", "the peer opened no stream in time") from None
        except iroh.IrohError:
            raise _io_error("accepting a stream") from None

    @staticmethod
    def close_connection(conn: iroh.Connection, reason: bytes) -> None:
        """Close ``conn`` at once with QUIC application code 1 and ``reason`` (a stable
        code such as ``b"handshake-host-busy"``); errors of an already-closed connection
        are ignored."""
        try:
            conn.close(1, reason)
        except Exception:  # noqa: BLE001 - iroh error on an already-closed connection
            pass

    def accept_alpns(self, *extra: bytes) -> None:
        """Accept connections for ``extra`` ALPNs too, beside the endpoint's own (a device that
        holds mail: :data:`node.community.iroh_mail.MAILBOX_ALPN`). Raises TransportError
        ``transport-bind-failed`` when the endpoint refuses the set."""
        try:
            self.endpoint.set_alpns([self.alpn, *(a for a in extra if a != self.alpn)])
        except Exception:  # noqa: BLE001 - iroh error on a closed endpoint
            raise TransportError("transport-bind-failed", "the endpoint did not take the mailbox ALPN") from None

    @staticmethod
    def alpn_of(conn: iroh.Connection) -> bytes:
        """The ALPN ``conn`` was opened with (b"" once it closed)."""
        try:
            return bytes(conn.alpn() or b"")
        except Exception:  # noqa: BLE001 - iroh error on a closed connection
            return b""

    @staticmethod
    def remote_of(conn: iroh.Connection) -> str:
        """The QUIC-authenticated peer key of ``conn`` (64 hex), or "" once it closed."""
        try:
            return str(conn.remote_id())
        except Exception:  # noqa: BLE001 - iroh error on a closed connection
            return ""

    async def aclose(self) -> None:
        """Close the endpoint under ``close_timeout_s`` seconds (:func:`bind_node`'s;
        DESIGN §3)."""
        with anyio.move_on_after(self.close_timeout_s):
            try:
                await self.endpoint.close()
            except iroh.IrohError:
                pass


def endpoint_options(mode: TransportMode, secret: bytes, alpn: bytes,
                     port: int | None = None) -> tuple[iroh.EndpointOptions, Any]:
    """The iroh options of ``mode`` (the one place a mode becomes iroh settings;
    specs/transport.md §1) and the ``RelayMode`` given (None for the n0 preset's own).

    Only ``n0`` uses the n0 preset (its relays and its address lookup); every other mode
    uses the minimal preset, so nothing is published to n0. Owner relay URLs are the whole
    relay map (``RelayMode.custom_from_urls``): no public relay is added as a fallback.
    ``port``: the UDP port to bind the IPv4 socket to in a mode that keeps one
    (node/transport/port.py); None or 0: any free port.
    """
    if mode.uses_n0 and not mode.relay_only:
        return iroh.EndpointOptions(preset=iroh.preset_n0(), secret_key=secret, alpns=[alpn]), None
    if mode.uses_n0:  # relay-only on n0's relays: its preset, UDP on loopback
        return iroh.EndpointOptions(preset=iroh.preset_n0(), bind_addr=mode.bind_addr, secret_key=secret,
                                    alpns=[alpn]), None
    relay_mode = iroh.RelayMode.custom_from_urls(list(mode.relays)) if mode.relays else iroh.RelayMode.disabled()
    kwargs: dict[str, Any] = {"preset": iroh.preset_minimal(), "relay_mode": relay_mode, "secret_key": secret,
                              "alpns": [alpn]}
    if mode.bind_addr is not None:
        from node.transport.port import keeps_port, with_port

        kwargs["bind_addr"] = with_port(mode.bind_addr, port) if port and keeps_port(mode) else mode.bind_addr
    return iroh.EndpointOptions(**kwargs), relay_mode


#: Seconds :func:`bind_node` tries a taken kept port again before binding another one for
#: this run, and the pause between two tries (specs/transport.md §7).
KEPT_PORT_RETRY_S = 3.0
KEPT_PORT_RETRY_EVERY_S = 0.1


async def _retry_kept_port(options: Callable[[], Any], port: int,
                           on_port_taken: Callable[[int], None] | None) -> Any:
    """Bind ``options()`` (naming the kept ``port``, found taken once) again every
    :data:`KEPT_PORT_RETRY_EVERY_S` for up to :data:`KEPT_PORT_RETRY_S`; the endpoint, or
    None when the port stayed taken."""
    deadline = time.monotonic() + KEPT_PORT_RETRY_S
    while True:
        if on_port_taken is not None:
            on_port_taken(port)
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        await anyio.sleep(min(KEPT_PORT_RETRY_EVERY_S, left))
        try:
            return await iroh.Endpoint.bind(options())
        except iroh.IrohError:
            continue


@asynccontextmanager
async def bind_node(secret: bytes, alpn: bytes, *, local: bool = False, mode: TransportMode | None = None,
                    close_timeout_s: float = CLOSE_TIMEOUT_S, port: int | None = None,
                    on_port_taken: Callable[[int], None] | None = None) -> AsyncIterator[IrohNode]:
    """Bind an iroh endpoint with the 32-byte identity ``secret`` for ``alpn``.

    Args:
        local: offline mode (relay disabled + ``127.0.0.1:0`` + minimal preset) when True
            and no ``mode`` is given; the n0 mode otherwise.
        mode: the :class:`node.transport.modes.TransportMode` (wins over ``local``).
        close_timeout_s: bound on closing the endpoint on exit, seconds
            (:data:`CLOSE_TIMEOUT_S` for a host; guests pass :data:`GUEST_CLOSE_TIMEOUT_S`).
        port: the UDP port to bind first in a mode that keeps one (a host's kept port,
            node/transport/port.py); when it is taken, any free port is bound instead and
            the node's :attr:`IrohNode.port_taken` says which one was wanted. A taken port is
            tried again for :data:`KEPT_PORT_RETRY_S` first (a one-off clash — the last run's
            socket not yet closed, another process's short-lived socket — passes).
        on_port_taken: called with ``port`` after each attempt that found it taken (a
            test frees the port there).

    Raises:
        TransportError: ``transport-bind-failed``.
    """
    iroh_ffi.uniffi_set_event_loop(asyncio.get_running_loop())
    mode = mode if mode is not None else (OFFLINE if local else DEFAULT)
    opts, relay_mode = endpoint_options(mode, secret, alpn, port)
    taken = None
    try:
        endpoint = await iroh.Endpoint.bind(opts)
    except iroh.IrohError:
        if not port:
            raise TransportError("transport-bind-failed") from None
        endpoint = await _retry_kept_port(lambda: endpoint_options(mode, secret, alpn, port)[0], port, on_port_taken)
    if endpoint is None:
        taken = port  # the kept port is still in use: any free one, for this run only (said by the host)
        opts, relay_mode = endpoint_options(mode, secret, alpn)
        try:
            endpoint = await iroh.Endpoint.bind(opts)
        except iroh.IrohError:
            raise TransportError("transport-bind-failed") from None
    node = IrohNode(endpoint, alpn, mode.offline, close_timeout_s, mode=mode, relay_mode=relay_mode)
    node.port_taken = taken
    try:
        if mode.lan and mode.discovery == "on":  # advertise while bound (specs/transport.md §6)
            from node.transport.lan import advertised

            async with advertised(node.endpoint_id, node.direct_addresses()) as node.advertising:
                yield node
        else:
            yield node
    finally:
        # shielded: on Ctrl-C the surrounding scope is cancelled, and an unshielded close
        # would be cancelled too, leaving peers to wait for QUIC's idle timeout
        with anyio.CancelScope(shield=True):
            await node.aclose()
