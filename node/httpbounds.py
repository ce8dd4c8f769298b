"""Bounds on the HTTP connections of Kith's uvicorn servers (the community server and the
local read-only API, DESIGN §11/§12): a slow or idle client cannot pin the process.

uvicorn bounds *requests* (``limit_concurrency`` answers 503 beyond it) and idle
keep-alive connections (``timeout_keep_alive``), but a connection that never finishes its
request head (slowloris) stays open forever and counts against ``limit_concurrency``. The
protocol here adds two rules to uvicorn's h11 protocol:

- **head deadline**: a connection must deliver a complete request head within
  :data:`HEADER_TIMEOUT_S` seconds of opening (and of the previous response on a
  keep-alive connection), else it is closed — dribbling bytes does not extend it;
- **connection cap**: beyond :data:`MAX_CONNECTIONS` open connections a new one is closed
  at once (before it can use memory), so the file descriptors the process holds stay
  bounded.

Used through :data:`UVICORN_LIMITS` (``uvicorn.Config(..., **UVICORN_LIMITS)``) by
:func:`node.community.server._config`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

#: Seconds a connection may take to send a complete request head.
HEADER_TIMEOUT_S = 10.0
#: Open connections beyond which a new connection is closed immediately.
MAX_CONNECTIONS = 512
#: Requests (and connections) in flight beyond which uvicorn answers 503.
LIMIT_CONCURRENCY = 256
#: Seconds an idle keep-alive connection is kept after a response.
KEEP_ALIVE_S = 5


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline and a connection cap (reads
    :data:`HEADER_TIMEOUT_S` and :data:`MAX_CONNECTIONS` at each connection)."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()  # connection_lost() removes it from the set
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # a complete request head arrived
            self._disarm()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._arm()  # the next request's head must come in time too
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


#: Keyword arguments for ``uvicorn.Config``: the bounded protocol, 503 beyond
#: :data:`LIMIT_CONCURRENCY`, idle keep-alive connections closed after :data:`KEEP_ALIVE_S`.
UVICORN_LIMITS: dict[str, Any] = {"http": BoundedH11Protocol,
                                  "limit_concurrency": LIMIT_CONCURRENCY,
                                  "timeout_keep_alive": KEEP_ALIVE_S}

__all__ = ["BoundedH11Protocol", "HEADER_TIMEOUT_S", "KEEP_ALIVE_S", "LIMIT_CONCURRENCY",
           "MAX_CONNECTIONS", "UVICORN_LIMITS"]
