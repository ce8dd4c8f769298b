"""The owner's control channel of a running ``kith host`` (issue 12; specs/control.md).

A host serves HTTP/1.1 with JSON bodies on a Unix domain socket,
``<home>/run/control.sock`` (:func:`control_socket_path`), that only its owner can reach:

- the folder ``<home>/run`` is created 0700; a folder that is not a real directory, is
  owned by another user or grants anything to group/others is refused
  (``control-dir-unsafe``) by the host *and* the client (a client must not talk to a socket
  someone else could have planted);
- the socket file is 0600 (bound under a ``0o177`` umask, never widened);
- every connection's peer uid is read with ``SO_PEERCRED`` (Linux) and a peer that is not
  the host's own uid gets ``403 control-forbidden`` (root included: root can read the home
  anyway, but the channel answers its owner only);
- the ``Host`` header must name a loopback host and an ``Origin`` header is refused
  (``403 control-forbidden``): a browser page never talks to this channel.

Endpoints (specs/control.md): ``GET /v1/state`` (the live state, :meth:`HostControl.state`)
and ``POST /v1/sessions/end`` ``{"id": ID-or-unique-prefix}`` (ends that session with
``session-ended-by-owner``, through the same path revocation uses,
:meth:`node.host.sessions.SessionTable.end_session`).

:class:`ControlClient` is the owner's side (``kith status``, ``kith sessions``, the
dashboard). It raises ``host-not-running`` when nothing listens (no socket file, or a stale
one a crashed host left; a new host removes a stale socket at start: it holds
``host.lock``, so no other host can be using it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import anyio

from node.common.errors import ConfigError, KithError, error_for, CODES
from node.runtime.clock import rfc3339

log = logging.getLogger("kith.control")

#: The folder of ``<home>`` that holds the control socket (0700).
RUN_DIR = "run"
#: The socket's file name inside :data:`RUN_DIR`.
SOCKET_NAME = "control.sock"
#: The state document's version (``"v"`` key; bumped only for incompatible changes).
STATE_VERSION = 2  # 2: a session row's pairing code is `pairingCode` (was `safetyCode`)
#: Largest request body the control channel reads (bytes).
MAX_BODY = 4096
#: How long the client waits for the host (s): the state is built from memory and small files.
CLIENT_TIMEOUT_S = 5.0
#: Shortest session-id prefix ``kith sessions end`` accepts (hex digits).
MIN_PREFIX = 4
#: Hex digits of a session id shown in tables (made longer when needed to stay unique).
SHORT_ID = 8
#: ``Host`` header values the server accepts (with or without a port).
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1", "kith"})


def control_socket_path(home: Path) -> Path:
    """``<home>/run/control.sock``: where a running ``kith host`` of ``home`` listens."""
    return Path(home) / RUN_DIR / SOCKET_NAME


def check_run_dir(folder: Path, *, create: bool) -> None:
    """Check (and with ``create``, make) the control folder: a real directory (not a
    symlink), owned by this process's effective uid, mode without any group/other bit.

    Raises:
        ConfigError: ``control-dir-unsafe`` naming the folder and what is wrong;
            ``host-not-running`` when it does not exist and ``create`` is False.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        raise ConfigError("host-not-running", f"no `kith host` is running for this home ({folder} does not exist)") \
            from None
    except PermissionError:
        raise ConfigError("control-forbidden", f"the control folder {folder} is not reachable by this user") from None
    problem = None
    if not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    elif stat.S_IMODE(st.st_mode) & 0o077:
        problem = f"has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0700"
    if problem is not None:
        raise ConfigError("control-dir-unsafe", f"the control folder {folder} {problem}",
                          hint=f"remove it or run `chmod 700 {folder}` as its owner")


#: Longest socket path bound or connected to as is (``sun_path`` holds 108 bytes on Linux).
MAX_SUN_PATH = 100


@contextlib.contextmanager
def _reachable(path: Path) -> Iterator[str]:
    """A name for ``path`` short enough for ``bind``/``connect``: the path itself, or, for
    a deep home on Linux, ``/proc/self/fd/N/control.sock`` through a handle on its folder."""
    if len(os.fsencode(str(path))) <= MAX_SUN_PATH or not os.path.isdir("/proc/self/fd"):
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``), or None
    where the platform has no such option (then only the folder's 0700 keeps others out)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    fmt = "3i"
    try:
        _pid, uid, _gid = struct.unpack(fmt, sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize(fmt)))
    except OSError:
        return None
    return uid


def short_ids(ids: list[str]) -> dict[str, str]:
    """``id → the shortest prefix of at least`` :data:`SHORT_ID` ``digits unique among ids``."""
    out = {}
    for sid in ids:
        n = SHORT_ID
        while n < len(sid) and any(o != sid and o.startswith(sid[:n]) for o in ids):
            n += 1
        out[sid] = sid[:n]
    return out


def check_id_text(given: str) -> str:
    """``given`` stripped and lower-cased, if it can be a session id or a prefix of one:
    :data:`MIN_PREFIX` to 64 hex digits (a session id is 64).

    Raises:
        UsageError: ``usage`` otherwise (the message shows at most 70 characters of it).
    """
    from node.common.errors import UsageError

    given = given.strip().lower()
    if not MIN_PREFIX <= len(given) <= 64 or any(c not in "0123456789abcdef" for c in given):
        raise UsageError("usage", f"a session id (or a prefix of at least {MIN_PREFIX} hex digits) was expected, "
                                  f"not {given[:70]!r}")
    return given


def resolve_id(candidates: list[str], given: str) -> str:
    """The one id in ``candidates`` equal to ``given`` or starting with it.

    Raises:
        UsageError: ``usage`` for a prefix shorter than :data:`MIN_PREFIX` or not hex.
        ConfigError: ``live-session-not-found`` (no match), ``live-session-ambiguous``
            (several; the message lists their short ids).
    """
    given = check_id_text(given)
    if given in candidates:
        return given
    matches = [c for c in candidates if c.startswith(given)]
    if not matches:
        raise ConfigError("live-session-not-found", f"no live session has an id starting with {given}",
                          hint="`kith sessions` lists the live sessions")
    if len(matches) > 1:
        shown = ", ".join(sorted(short_ids(matches).values()))
        raise ConfigError("live-session-ambiguous", f"{len(matches)} live sessions start with {given}: {shown}",
                          hint="give more digits of the id")
    return matches[0]


# ---------------------------------------------------------------------------------- host side
@dataclass
class HostControl:
    """What the control channel reads and does, bound to one running host.

    The host fills it with references to its live objects; :meth:`state` reads them at
    each request (nothing is copied or cached, so a change shows at the next request).

    Attributes:
        home: the node home.
        identity: the host's :class:`node.trust.identity.Identity`.
        sessions: the host's :class:`node.host.sessions.SessionTable`.
        posts: ``() -> [{"postId", "server", "expiresAt"}]``, the posts guests may join now.
        index: ``() -> {"ready", "roots", "documents", "chunks", ...}``; may block (run
            in a worker thread).
        quota_left: ``(peer_name | None, peer_key) -> dict`` (see specs/control.md), or None.
        started_at: Unix time (s) the host started.
        transport: ``() -> {"mode", "relays", "relayOnly", "discovery", "relayMap",
            "homeRelay", "relayReachable", "addresses", "presence"}`` (specs/control.md), or None.
        policy: ``() -> {"rules", "groups"}`` of the policy in force (the last good one
            when policy.toml is broken), or None.
    """

    home: Path
    identity: Any
    sessions: Any
    posts: Callable[[], list[dict[str, Any]]]
    index: Callable[[], dict[str, Any]]
    quota_left: Callable[[str | None, str], dict[str, Any]] | None = None
    started_at: float = field(default_factory=time.time)
    transport: Callable[[], dict[str, Any]] | None = None
    policy: Callable[[], dict[str, Any]] | None = None

    async def state(self) -> dict[str, Any]:
        """The state document (specs/control.md): node, posts, index, sessions, approvals."""
        try:
            index = await anyio.to_thread.run_sync(self.index)
        except Exception as exc:  # noqa: BLE001 - e.g. the corpus closed by a stop: the rest still shows
            log.debug("control state: index unreadable: %s", type(exc).__name__)
            index = {"ready": False, "warmed": False, "roots": [], "documents": 0, "chunks": 0,
                     "error": exc.code if isinstance(exc, KithError) else "index-unavailable"}
        approvals = await anyio.to_thread.run_sync(pending_approvals, self.home)
        sessions = []
        for s in self.sessions.listing():
            row = dict(s)
            if self.quota_left is not None:
                try:
                    peer = s["peer"]  # a person pin's device draws on its person's one bucket
                    key = peer["person"]["key"] if peer.get("viaPerson") and peer.get("person") else peer["key"]
                    row["quotaLeft"] = self.quota_left(peer["name"], key)
                except KithError as exc:  # e.g. policy.toml broken meanwhile
                    row["quotaLeft"] = {"error": exc.code}
            sessions.append(row)
        return {"v": STATE_VERSION,
                "node": {"fingerprint": self.identity.fingerprint, "key": self.identity.public_key,
                         "home": str(self.home), "pid": os.getpid(), "startedAt": rfc3339(self.started_at)},
                "posts": self.posts(), "index": index, "sessions": sessions, "approvals": approvals,
                "transport": self.transport() if self.transport is not None else None,
                "policy": await anyio.to_thread.run_sync(self.policy) if self.policy is not None else None}

    def end_session(self, given: str) -> dict[str, Any]:
        """End the live session whose id is ``given`` or starts with it (the guest gets
        ``_error session-ended-by-owner``). Returns ``{"ended": id, "peer": {...}}``.

        Raises:
            UsageError / ConfigError: as :func:`resolve_id`.
        """
        rows = {s["id"]: s for s in self.sessions.listing()}
        sid = resolve_id(list(rows), given)
        if not self.sessions.end_session(sid, "session-ended-by-owner", "the host's owner ended this session"):
            raise ConfigError("live-session-not-found", f"the session {sid[:SHORT_ID]} already ended")
        return {"ended": sid, "peer": rows[sid]["peer"]}


def pending_approvals(home: Path) -> list[dict[str, Any]]:
    """``[{"id", "peer": {"key", "name"}, "query", "sources", "since"}]``: the requests
    waiting for the owner (:meth:`node.policy.approvals.Approvals.pending`), oldest first.
    A broken approvals folder gives ``[]`` (the state must still load)."""
    from node.policy.approvals import Approvals

    try:
        pending = Approvals(Path(home)).pending()
    except (KithError, OSError):
        return []
    return [{"id": r.id, "peer": {"key": r.peer_key, "name": r.peer_name}, "query": r.query,
             "source": r.sources[0] if r.sources else None, "sources": list(r.sources), "since": r.created_at}
            for r in pending]


def _app(control: HostControl) -> Any:
    """The Starlette app of the control channel (Host/Origin checked on every request)."""
    import json

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from node.common.http import error_response, read_body

    def refused(request: Request) -> JSONResponse | None:
        host = (request.headers.get("host") or "").strip().lower()
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
        if name not in LOCAL_HOSTS:
            return error_response("control-forbidden", "the Host header does not name this machine", 403)
        if "origin" in request.headers:
            return error_response("control-forbidden", "the control channel does not answer browser pages", 403)
        return None

    async def state(request: Request) -> JSONResponse:
        return refused(request) or JSONResponse(await control.state())

    async def end(request: Request) -> JSONResponse:
        bad = refused(request)
        if bad is not None:
            return bad
        try:
            body = json.loads(await read_body(request, MAX_BODY) or b"null")
        except KithError as exc:
            return error_response(exc.code, exc.message, exc.status)
        except ValueError:
            return error_response("request-invalid", "the body is not JSON", 400)
        sid = body.get("id") if isinstance(body, dict) else None
        if not isinstance(sid, str):
            return error_response("request-invalid", 'the body must be {"id": "<session id or prefix>"}', 400)
        try:
            return JSONResponse(control.end_session(sid))
        except KithError as exc:
            return JSONResponse({"error": exc.to_dict()}, status_code=404 if "not-found" in exc.code else 400)

    return Starlette(routes=[Route("/v1/state", state, methods=["GET"]),
                             Route("/v1/sessions/end", end, methods=["POST"])])


async def _forbidden_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI app a connection of another user gets: ``403 control-forbidden`` to any request."""
    from node.common.http import error_response

    if scope["type"] != "http":
        return
    response = error_response("control-forbidden", "the control channel answers only its owner's user", 403)
    await response(scope, receive, send)


def _protocol_class() -> type:
    from node.common.http import BoundedH11Protocol

    class PeerCheckedProtocol(BoundedH11Protocol):
        """The bounded h11 protocol; a connection whose ``SO_PEERCRED`` uid is not ours is
        answered by :func:`_forbidden_app` whatever it asks."""

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            uid = peer_uid(sock) if sock is not None else None
            if uid is not None and uid != os.geteuid():
                log.warning("control channel: refused a connection of uid %d", uid)
                self.app = _forbidden_app

    return PeerCheckedProtocol


def _bind(path: Path) -> socket.socket:
    """Bind and listen on the control socket (0600), replacing a stale socket file.

    The caller holds the home's host lock, so a socket file there is stale.

    Raises:
        ConfigError: ``control-dir-unsafe`` (see :func:`check_run_dir`), ``io-error``
            when a non-socket file is in the way or the path cannot be bound.
    """
    check_run_dir(path.parent, create=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError("io-error", f"{path} exists and is not a socket", hint="remove it")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        with _reachable(path) as name:
            sock.bind(name)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise ConfigError("io-error", f"cannot listen on {path}: {exc.strerror or type(exc).__name__}") from None
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return sock


async def serve_control(control: HostControl, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve the control channel of ``control.home`` until cancelled (in the host's loop).

    Started with ``await tg.start(serve_control, control)``: returns once listening. On
    cancel the uvicorn server is shut down (bounded) and the socket file removed.

    Raises:
        ConfigError: as :func:`_bind`.
    """
    import uvicorn

    from node.common.http import UVICORN_LIMITS

    path = control_socket_path(control.home)
    sock = _bind(path)

    class QuietServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the host owns SIGINT/SIGTERM

    limits = {**UVICORN_LIMITS, "http": _protocol_class(), "limit_concurrency": 32}
    server = QuietServer(uvicorn.Config(_app(control), lifespan="off", log_config=None, access_log=False,
                                        server_header=False, timeout_graceful_shutdown=1, proxy_headers=False,
                                        **limits))
    finished = []

    async def serve() -> None:
        await server.serve([sock])
        finished.append(True)  # uvicorn shut itself down

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            with anyio.fail_after(10):
                while not server.started:
                    await anyio.sleep(0.01)
            task_status.started(path)
    finally:
        with anyio.CancelScope(shield=True):
            if server.started and not finished:  # cancelled (the host stopped): close connections, bounded
                with anyio.move_on_after(2):
                    await server.shutdown([sock])
            sock.close()
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)


# ---------------------------------------------------------------------------------- client side
class ControlClient:
    """The owner's client of a running host's control channel (``kith status``,
    ``kith sessions``, the dashboard). Synchronous; every call is one short request.

    Args:
        home: the node home whose host to talk to.
        timeout_s: per request (s).

    Every method raises :class:`KithError`: ``host-not-running`` (no socket, or nothing
    listening on it), ``control-dir-unsafe`` (see :func:`check_run_dir`),
    ``control-forbidden`` (the socket is not ours to use), or the code the host answered.
    """

    def __init__(self, home: Path, *, timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        self.home = Path(home)
        self.path = control_socket_path(self.home)
        self.timeout_s = timeout_s

    def state(self) -> dict[str, Any]:
        """The host's state document (specs/control.md)."""
        return self._request("GET", "/v1/state")

    def end_session(self, session_id: str) -> dict[str, Any]:
        """End the live session ``session_id`` (or the one its unique prefix names).

        Returns:
            ``{"ended": full_id, "peer": {"key", "name"}}``.

        Raises:
            KithError: ``live-session-not-found``, ``live-session-ambiguous``, ``usage``,
                plus those of the class docstring.
        """
        return self._request("POST", "/v1/sessions/end", {"id": check_id_text(session_id)})

    def running(self) -> bool:
        """True when a host answers on the channel (``host-not-running`` → False)."""
        try:
            self.state()
        except KithError as exc:
            if exc.code == "host-not-running":
                return False
            raise
        return True

    def _request(self, method: str, url: str, body: Any = None) -> dict[str, Any]:
        import httpx

        check_run_dir(self.path.parent, create=False)
        not_running = ConfigError("host-not-running", "no `kith host` is running for this home",
                                  hint="start one with `kith host`")
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            raise not_running from None
        except PermissionError:
            raise ConfigError("control-forbidden", f"{self.path} may not be used by this user") from None
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise ConfigError("control-dir-unsafe", f"{self.path} is not a socket of yours", hint="remove it")
        try:
            with _reachable(self.path) as name, \
                    httpx.Client(transport=httpx.HTTPTransport(uds=name), base_url="http://localhost",
                                 timeout=self.timeout_s) as client:
                response = client.request(method, url, json=body)
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, PermissionError) or "Permission denied" in str(exc):
                raise ConfigError("control-forbidden", f"{self.path} may not be used by this user") from None
            raise not_running from None  # a stale socket: its host died without removing it
        except httpx.TimeoutException:
            raise ConfigError("host-not-running", f"the host did not answer in {self.timeout_s:g} s",
                              hint="it may be stuck; stop it and start `kith host` again") from None
        try:
            data = response.json()
        except ValueError:
            raise ConfigError("host-not-running", "the control socket did not answer with JSON") from None
        if response.status_code >= 400:
            err = data.get("error") if isinstance(data, dict) else None
            code = err.get("code") if isinstance(err, dict) else None
            if code in CODES:
                raise error_for(code, str(err.get("message") or "")[:300] or None, status=response.status_code)
            raise ConfigError("control-forbidden", f"the host refused the request ({response.status_code})")
        if not isinstance(data, dict):
            raise ConfigError("host-not-running", "the control socket did not answer with a JSON object")
        return data


__all__ = ["ControlClient", "HostControl", "MIN_PREFIX", "SHORT_ID", "check_run_dir", "control_socket_path",
           "check_id_text", "peer_uid", "pending_approvals", "resolve_id", "serve_control", "short_ids"]
