"""The dashboard's door (issue 12; specs/dashboard.md §2): who may reach the pages at all.

One :class:`Door` per dashboard process holds

- the **login token** printed once at start (``/login?token=…``): 32 random bytes,
  compared in constant time, consumed by its first use — a second use, or any wrong
  token, answers 403 ``dashboard-login-invalid``;
- the **sessions** login tokens opened (each token opens one; at most
  :data:`MAX_SESSIONS`, the oldest dropped): a random id sent as an ``HttpOnly``,
  ``SameSite=Strict`` cookie, and per session the **CSRF token** every POST form carries
  (a hidden ``csrf`` field, checked in constant time: 403 ``dashboard-csrf``).

:class:`Guard` is the outer ASGI layer, before Starlette (so nothing is read, parsed or
changed for a refused request): a client whose address is not loopback answers 403
``dashboard-loopback-only``; a ``Host`` that is not a loopback name with the server's
port, or an ``Origin`` that is not such a loopback origin, 403 ``dashboard-bad-host``
(the local API's rule, :func:`node.local.api.host_refusal`: DNS rebinding and cross-site
forms); any page but ``/login`` and ``/static/…`` without the session cookie, 401
``dashboard-login-required``; a POST whose body is not ``application/x-www-form-urlencoded``,
415 ``dashboard-form-invalid``. Refusals are a small HTML page naming the code, with the
code also in the ``X-Kith-Error`` header.
"""

from __future__ import annotations

import hmac
import html
import secrets
import threading
from http.cookies import SimpleCookie

from starlette.responses import HTMLResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from node.common.errors import CODES
from node.local.api import LoopbackGuard

#: the session cookie's name
COOKIE = "kith_dashboard"
#: browsers signed in at once (each login link opens one session; the oldest goes first)
MAX_SESSIONS = 8
#: headers on every dashboard response: no caching, no framing, no referrer to another site,
#: and only the dashboard's own CSS and script. (Not ``no-referrer``: with it Chromium sends
#: ``Origin: null`` on the dashboard's own forms, which the Origin check must refuse.)
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": ("default-src 'none'; style-src 'self'; script-src 'self'; "
                                "img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
                                "base-uri 'none'"),
}


class Door:
    """The login token, the sessions login tokens opened and each session's CSRF token
    (module docstring). Thread-safe."""

    def __init__(self) -> None:
        self.login_token = secrets.token_urlsafe(32)
        self._used = False
        self._sessions: dict[str, str] = {}  # session id -> its CSRF token, oldest first
        self._lock = threading.Lock()

    def rotate(self) -> None:
        """A new one-time login token (``kith dashboard --login-link``, issue 20: a lost
        link or cookie no longer means a restart). The old token stops working; browsers
        signed in already stay signed in (issue 32: a new link for one browser logged out
        the others). Restarting the dashboard ends every session."""
        with self._lock:
            self.login_token = secrets.token_urlsafe(32)
            self._used = False

    def redeem(self, token: str | None) -> str | None:
        """Consume the login token. Returns the new session id, or None when ``token`` is
        wrong or the token was used already (nothing changes then). The oldest session
        ends when :data:`MAX_SESSIONS` are open."""
        with self._lock:
            if self._used or not token or not hmac.compare_digest(token.encode(), self.login_token.encode()):
                return None
            self._used = True
            session = secrets.token_urlsafe(32)
            self._sessions[session] = secrets.token_urlsafe(32)
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.pop(next(iter(self._sessions)))
            return session

    def _find(self, session_id: str | None) -> str | None:
        if not session_id:
            return None
        with self._lock:
            known = list(self._sessions)
        for s in known:  # every one compared in constant time
            if hmac.compare_digest(session_id.encode(), s.encode()):
                return s
        return None

    def session_ok(self, session_id: str | None) -> bool:
        """True when ``session_id`` is a session a login token opened."""
        return self._find(session_id) is not None

    def csrf_for(self, session_id: str | None) -> str:
        """The CSRF token of ``session_id``'s session ("" for none)."""
        found = self._find(session_id)
        return self._sessions.get(found, "") if found else ""

    def csrf_ok(self, token: str | None, session_id: str | None) -> bool:
        """True when ``token`` is the CSRF token of ``session_id``'s session."""
        want = self.csrf_for(session_id)
        return bool(token) and bool(want) and hmac.compare_digest(str(token).encode(), want.encode())


def session_cookie(scope: Scope) -> str | None:
    """The value of the session cookie in the request's ``Cookie`` headers, or None."""
    for key, value in scope.get("headers") or ():
        if key == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # a malformed Cookie header is no session
                continue
            if COOKIE in jar:
                return jar[COOKIE].value
    return None


def refusal_page(code: str, message: str, status: int) -> HTMLResponse:
    """The HTML refusal: the code (``<code id="error-code">``) and a one-line message; the
    code is also in ``X-Kith-Error``. The code must be in the error table."""
    assert code in CODES, code
    body = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Kith dashboard: {code}"
            f"</title><link rel=stylesheet href=/static/dashboard.css></head><body class=refused>"
            f"<main><h1>Refused</h1><p><code id=error-code>{code}</code></p>"
            f"<p>{html.escape(message)}</p></main></body></html>")
    return HTMLResponse(body, status_code=status, headers={"X-Kith-Error": code, **SECURITY_HEADERS})


def _form_content_type(scope: Scope) -> bool:
    for key, value in scope.get("headers") or ():
        if key == b"content-type":
            return value.decode("latin-1").split(";", 1)[0].strip().lower() == \
                "application/x-www-form-urlencoded"
    return False


class Guard(LoopbackGuard):
    """Outer ASGI layer of the dashboard (module docstring)."""

    def __init__(self, app: ASGIApp, door: Door) -> None:
        super().__init__(app, "dashboard", refusal_page)
        self.door = door

    async def admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"].upper()
        if path.startswith("/static/") or path == "/login":
            await self.app(scope, receive, send)
            return
        if not self.door.session_ok(session_cookie(scope)):
            await refusal_page("dashboard-login-required", "open the login URL `kith dashboard` "
                               "printed (it works once); `kith dashboard --login-link` prints a new "
                               "one", 401)(scope, receive, send)
            return
        if method == "POST" and not _form_content_type(scope):
            await refusal_page("dashboard-form-invalid", "a dashboard POST is a form "
                               "(application/x-www-form-urlencoded)", 415)(scope, receive, send)
            return
        await self.app(scope, receive, send)


__all__ = ["COOKIE", "MAX_SESSIONS", "Door", "Guard", "SECURITY_HEADERS", "refusal_page", "session_cookie"]
