"""The local read-only API (DESIGN §11, seed ``rag-external-agent-contract``).

``kith api serve`` serves the node's OWN corpus to local agents over HTTP on loopback:

- ``GET /health`` — readiness, the usage policy (``externalAgentContract``);
- ``GET /stats`` — corpus counts (no paths);
- ``GET /contract`` — the read-only contract: routes, the request shape, the budget rule;
- ``GET /openapi.json`` — the OpenAPI 3.1 document (kept as ``specs/openapi.json``);
- ``POST /search`` — the flat request of DESIGN §8 → the ``schemaVersion`` 2 envelope;
  with ``peers`` (pinned names or ``"all"``, a local-only extension) the merged envelope
  of several peers (specs/ask.md §5) over the API's warm session pool: peer evidence
  marked ``untrusted``/``suspicious`` by this node, fenced in its ``fence`` block, and
  header ``X-Kith-Untrusted: peer-evidence`` when any result is a peer's (specs/ask.md §7).
- ``POST /verify`` — ``{"answer": <a saved answer>}`` → the ``kith verify --json``
  document of its signed citations (specs/citations.md; reads only the peer registry and,
  for results from a copy, this home's copy documents; asks no host).

Every request but ``GET /health`` needs an agent's credential (``Authorization: Bearer``,
specs/agents.md; never a query string or a cookie) and is held to the agent's scope by
:func:`node.local.agents.authorize` — the one check ``kith mcp`` runs for every tool too:
401 ``agent-token-required`` / ``agent-token-invalid`` / ``agent-expired``, 403
``agent-scope``. ``GET /health`` without a credential answers only that the server is up.

Everything else is refused before any handler runs and changes nothing: a client whose
address is not loopback answers 403 ``api-loopback-only`` (checked first, on every
request); a ``Host`` header that is not a loopback name with the server's port, or an
``Origin`` header that is not such a loopback origin, answers 403 ``api-bad-host`` (DNS
rebinding: a web page on ``attacker.example`` resolved to 127.0.0.1 must not read the
corpus); any method other than GET/HEAD on any path but ``POST /search`` and ``POST /verify`` answers 403
``api-read-only`` (index, sync, settings, memory, server lifecycle…); an unknown GET
answers 404 ``not-found``; a POST without ``Content-Type: application/json``
answers 415 ``api-content-type`` (a browser cannot send that cross-origin without a
preflight, which is refused); a body over the limit (64 KiB by default; ``/verify``: 8 MiB,
the saved-answer bound) answers 413 ``request-too-large``. Errors are ``{"error": {"code", "message"}}``; messages never
carry paths or exception text. The corpus is opened read-only; the only write the API
ever does is the non-blocking start-up repair of a lagging index
(:meth:`node.corpus.store.Corpus.repair_lag`).

Serving uses the HTTP plumbing shared with the community server (:mod:`node.common.http`:
socket binding, the uvicorn config with its connection bounds, signal handling).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from node.answer import contract
from node.answer import envelope as env_mod
from node.answer.holder import CorpusHolder
from node.answer.service import answer_local
from node.common.errors import AgentError, ConfigError, CorpusError, KithError
from node.local.agents import Operation, Scope as AgentScope, api_operation, authorize, bearer_token
from node.common.http import (
    MAX_JSON_DEPTH,
    base_url_of,
    bind_socket,
    error_response,
    is_loopback,
    read_body,
    serve_app_in_thread,
    serve_forever,
    too_deep,
)

DEFAULT_PORT = 8765
DEFAULT_MAX_BODY_BYTES = 64 * 1024
SERVICE = "kith-local-api"
#: the non-GET routes (both read-only)
#: The outbox (specs/outbox.md): GET reads it; POST is the API's one write — it keeps a
#: question in this node's own outbox (never the corpus, settings or policy).
SEARCH_PATH, VERIFY_PATH, OUTBOX_PATH = env_mod.API_ROUTES["POST"]
GET_PATHS = env_mod.API_ROUTES["GET"]
#: Host names the API answers to (with the server's own port); DNS rebinding defence.
LOOPBACK_HOST_NAMES = ("127.0.0.1", "localhost", "[::1]")


# --- the OpenAPI document ---------------------------------------------------------------
def _err_schema() -> dict[str, Any]:
    return {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of this API (``specs/openapi.json`` is a copy of it)."""
    err = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    envelope_ref = {"$ref": "https://kith.invalid/specs/search-envelope.schema.json"}
    refused = {"description": "Read-only API: refused, nothing changed (api-read-only), a "
                              "non-loopback client (api-loopback-only), a Host/Origin "
                              "header that is not loopback with this port (api-bad-host), or "
                              "an operation outside the agent's scope (agent-scope).",
               **err}
    unauthorized = {"description": "No agent credential (agent-token-required), a token no current "
                                   "agent has (agent-token-invalid: wrong, rotated or removed), an "
                                   "expired agent (agent-expired), or a home made before agents that "
                                   "this user may not write (agents-read-only); WWW-Authenticate: Bearer.",
                    **err}

    def ok(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
        """A 200 answer of JSON (``schema``; default: an object)."""
        return {"description": description, "content": {"application/json": {"schema": schema or {"type": "object"}}}}

    def json_body(name: str) -> dict[str, Any]:
        """A required JSON request body: ``components/schemas/<name>``."""
        return {"required": True, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}

    not_json = {"description": "Content-Type is not application/json (api-content-type)", **err}
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "Kith local read-only API", "version": str(env_mod.SCHEMA_VERSION),
                 "description": (
            "Loopback-only, read-only search over the node's own corpus (DESIGN §11). Every "
            "method other than GET on any path but POST /search, POST /verify and POST /outbox "
            "answers 403. POST /outbox is the one write: it keeps a question in this node's "
            "outbox (specs/outbox.md), never the corpus, settings or policy.")},
        "servers": [{"url": f"http://127.0.0.1:{DEFAULT_PORT}"}],
        "paths": {
            "/health": {"get": {"summary": "Readiness and the usage policy (without a credential: only "
                                           "{service, status: up})", "security": [{}, {"agentToken": []}], "responses": {
                "200": ok("ready or not; see available/reason"),
                "403": refused}}},
            "/stats": {"get": {"summary": "Corpus counts (no paths)", "responses": {
                "200": ok("counts"),
                "403": refused}}},
            "/contract": {"get": {"summary": "The read-only search contract", "responses": {
                "200": ok("contract"),
                "403": refused}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {
                "200": ok("OpenAPI 3.1")}}},
            SEARCH_PATH: {"post": {
                "summary": "Search the local corpus; answers the schemaVersion 2 envelope",
                "requestBody": json_body("SearchRequest"),
                "responses": {
                    "200": ok("an envelope (also when unavailable: available=false with a reason)", envelope_ref),
                    "400": {"description": "invalid request, malformed or too deeply "
                                           "nested JSON (query-invalid); the body also "
                                           "carries the invalid-request envelope",
                            "content": {"application/json": {"schema": {
                                "$ref": "#/components/schemas/InvalidRequest"}}}},
                    "403": refused,
                    "413": {"description": "body over the limit (request-too-large)", **err},
                    "415": not_json}}},
            VERIFY_PATH: {"post": {
                "summary": "Check the signed citations of a saved answer (read-only; asks no host)",
                "requestBody": json_body("VerifyRequest"),
                "responses": {
                    "200": ok("one row per result (specs/citations.md §3); ok is true only when every row "
                              "is genuine", {"$ref": "#/components/schemas/VerifyReport"}),
                    "400": {"description": "not a saved answer (answer-invalid)", **err},
                    "403": refused,
                    "413": {"description": "body over 8 MiB (request-too-large)", **err},
                    "415": not_json}}},
            OUTBOX_PATH: {
                "get": {"summary": "The outbox: kept questions (or ?id=PREFIX: one, with its merged answer); "
                                   "reading changes nothing (specs/outbox.md)",
                        "parameters": [{"name": "id", "in": "query", "required": False,
                                        "schema": {"type": "string", "pattern": "^[0-9a-fA-F]{4,32}$"}}],
                        "responses": {
                            "200": ok("{questions, usage}, or one record"),
                            "403": refused,
                            "404": {"description": "no such question (outbox-not-found, outbox-id-ambiguous)", **err},
                            "500": {"description": "the outbox file is damaged (outbox-corrupt)", **err}}},
                "post": {
                    "summary": "Queue (the API's one write, to this node's outbox only): ask pinned peers "
                               "now and keep the question for those offline, pending approval or "
                               "answered from this node's copy of them; delivered by the home's "
                               "background runner when they are back",
                    "requestBody": json_body("OutboxRequest"),
                    "responses": {
                        "200": ok("the merged envelope (specs/ask.schema.json) with outbox {id, peers, expiresAt} "
                                  "or null"),
                        "400": {"description": "invalid request (query-invalid, outbox-keep-invalid)", **err},
                        "403": refused,
                        "415": not_json,
                        "500": {"description": "the outbox file is damaged (outbox-corrupt); nobody was asked", **err},
                        "507": {"description": "the outbox is full (outbox-full); nothing was kept", **err}}}},
        },
        "security": [{"agentToken": []}],
        "components": {"securitySchemes": {"agentToken": {
            "type": "http", "scheme": "bearer",
            "description": "An agent's token (`kith agent add|rotate`, specs/agents.md), in the "
                           "Authorization header only: never a query string or a cookie. Every "
                           "route but GET /health needs it; GET /health without it answers only "
                           "{service, status: up}."}}, "schemas": {
            "OutboxRequest": {**contract.core_schema(), "required": ["query", "peers"],
                              "properties": {**contract.core_schema()["properties"],
                                             "peers": {"oneOf": [{"const": "all"}, {
                                                 "type": "array", "minItems": 1, "maxItems": 16,
                                                 "items": {"type": "string", "minLength": 1, "maxLength": 64}}]},
                                             "citations": {"type": "boolean"},
                                             "keep": {"description": "seconds, or a duration: 30m, 12h, 7d, 2w "
                                                                     "(default 7d, 1 minute to 30 days)",
                                                      "oneOf": [{"type": "integer"}, {"type": "string"}]}}},
            "VerifyRequest": {"type": "object", "additionalProperties": False, "required": ["answer"],
                              "properties": {"answer": {"description": "The saved answer: its JSON, "
                                                        "or a string of JSON or JSON lines"}}},
            "VerifyReport": {"type": "object", "required": ["ok", "counts", "rows"], "properties": {
                "ok": {"type": "boolean"}, "counts": {"type": "object"},
                "rows": {"type": "array", "items": {"type": "object", "required": ["result"], "properties": {
                    "result": {"enum": list(_verify_results())}, "source": {"type": ["string", "null"]},
                    "hostKey": {"type": ["string", "null"]}, "version": {"type": ["string", "null"]},
                    "peer": {"type": ["string", "null"]}, "person": {"type": ["string", "null"]},
                    "detail": {"type": "string"}, "where": {"type": "string"},
                    "fromCopy": {"type": "boolean", "description": "only on a result from a copy (citations.md §7)"},
                    "copySignedAt": {"type": ["string", "null"]}}}}}},
            "Error": _err_schema(),
            "InvalidRequest": {**_err_schema(), "required": ["error", "envelope"],
                               "properties": {**_err_schema()["properties"],
                                              "envelope": envelope_ref}},
            # the request contract's core, unchanged (node.answer.contract); local-only
            # fields would be added to its properties here, never a core limit changed
            "SearchRequest": contract.core_schema(),
        }},
    }
    for ops in doc["paths"].values():  # every route: the agent's credential and scope
        for op in ops.values():
            op["responses"]["401"] = unauthorized
            op["responses"].setdefault("403", refused)
            op["responses"] = dict(sorted(op["responses"].items()))
    return doc


def _verify_results() -> tuple[str, ...]:
    from node.answer.citation import RESULTS

    return tuple(RESULTS)


# --- handlers ----------------------------------------------------------------------------
def _contract() -> dict[str, Any]:
    return {
        "service": SERVICE,
        "schemaVersion": env_mod.SCHEMA_VERSION,
        "readOnly": True,
        "routes": {"GET": list(GET_PATHS), "POST": [SEARCH_PATH, VERIFY_PATH, OUTBOX_PATH]},
        "refused": "any other method on any path answers 403 api-read-only and changes nothing",
        "writes": {f"POST {OUTBOX_PATH}": "queue: ask pinned peers now and keep the question for those "
                                           "offline, pending approval or answered from this node's copy "
                                           "of them in this node's outbox (specs/outbox.md); the only "
                                           "operation that writes, and only the outbox"},
        "request": openapi_document()["components"]["schemas"]["SearchRequest"],
        "envelopeKeys": list(env_mod.ENVELOPE_KEYS),
        "reasons": list(env_mod.KNOWN_REASONS),
        "externalAgentContract": env_mod._external_contract(),
    }


class _PoolKeeper:
    """The API's one warm session pool for ``peers`` searches and its background runner
    (node/guest/pool.py), started on the server's event loop by the first that needs it
    (the runner, as it starts: :func:`background_runner`) and kept by a background task
    until the server stops (the loop's end cancels it). It is made by ``guest``, the
    server process's :class:`node.guest.owner.Guest`. A pool that cannot start (a damaged
    key, a bad ``[transport]`` table) raises its refusal to each caller of :meth:`get`."""

    def __init__(self, guest: Any) -> None:
        self.guest = guest
        self.pool: Any = None
        self._lock: Any = None
        self._error: BaseException | None = None

    async def get(self) -> Any:
        """The running :class:`node.guest.pool.SessionPool`, started on the running loop by
        the first call.

        Raises:
            KithError: the pool's refusal when it cannot start (``transport-mode-invalid``,
                ``identity-corrupt``, ...), to each call until it starts.
        """
        import asyncio

        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self.pool is None:
                ready = anyio.Event()
                self._task = asyncio.get_running_loop().create_task(self._keep(ready))
                await ready.wait()
                if self.pool is None:
                    error, self._error = self._error, None
                    raise error if error is not None else RuntimeError("pool did not start")
        return self.pool

    async def _keep(self, ready: Any) -> None:
        try:
            async with self.guest.session_pool() as pool:
                self.pool = pool
                ready.set()
                await anyio.sleep_forever()
        except Exception as exc:  # noqa: BLE001 - handed to the waiting caller, who raises it
            self._error = exc
        finally:
            self.pool = None
            ready.set()


#: The ASGI scope key the guard leaves the request's bearer token under for the handlers.
TOKEN_KEY = "kith.agent_token"


class _Handlers:
    def __init__(self, holder: CorpusHolder, max_body_bytes: int, pools: _PoolKeeper | None = None) -> None:
        self.holder = holder
        self.max_body_bytes = max_body_bytes
        self.pools = pools

    def _authorize(self, request: Request, body: Any = None) -> AgentScope:
        """The one scope check (:func:`node.local.agents.authorize`) for this request's
        route and body; raises ``AgentError`` (answered 401/403 by ``_on_kith_error``)."""
        return authorize(self.holder.home, request.scope.get(TOKEN_KEY),
                         api_operation(request.method, request.url.path, body))

    async def health(self, request: Request) -> JSONResponse:
        scope = self._authorize(request)
        st = await anyio.to_thread.run_sync(lambda: self.holder.get().stats())
        syncing = st["processing"] or st["index_lag"] or (st["last_sync"] is None
                                                          and st["documents"])
        reason = None if st["ready"] else ("index-syncing" if syncing
                                           else "index-unavailable")
        peers = await anyio.to_thread.run_sync(lambda: self._peers_health(scope))
        ok = bool(st["ready"]) or peers["available"]
        return JSONResponse({"service": SERVICE, "status": "ok" if ok else "unavailable",
                             "available": bool(st["ready"]), "reason": reason, "peers": peers,
                             "schemaVersion": env_mod.SCHEMA_VERSION, "readOnly": True,
                             "externalAgentContract": env_mod._external_contract()})

    def _peers_health(self, scope: AgentScope) -> dict[str, Any]:
        """``{"available", "pinned", "error"}``: can ``POST /search`` with ``peers`` ask
        anyone — peer search is served, this home has an identity, and ``pinned`` (the peers
        ``"all"`` asks for this agent: the pinned, unblocked ones it may ask) is not 0.
        Whether each answers shows in the search's rows. ``error`` is null, or when
        ``peers.json`` cannot be read (nobody can be asked) ``{"file": "peers.json",
        "code", "message", "hint"}`` — the code the CLI refuses it with (``config-invalid``,
        ``io-error``; :func:`node.common.home.read_json_state`)."""
        from node.guest.fanout import askable_peers
        from node.trust.identity import key_path
        from node.trust.peers import PEERS_FILE

        home = self.holder.home
        if self.pools is None or not key_path(home).is_file():
            return {"available": False, "pinned": 0, "error": None}
        try:
            n = len([p for p in askable_peers(self.pools.guest.peers.now()) if scope.may_ask(p)])
        except KithError as exc:  # an unreadable peers.json: nobody can be asked, and it says why
            return {"available": False, "pinned": 0,
                    "error": {"file": PEERS_FILE, "code": exc.code, "message": exc.message, "hint": exc.hint}}
        return {"available": n > 0, "pinned": n, "error": None}

    async def stats(self, request: Request) -> JSONResponse:
        self._authorize(request)
        st = await anyio.to_thread.run_sync(lambda: self.holder.get().stats())
        keep = ("roots", "documents", "done", "chunks", "failed", "empty", "processing",
                "stale", "ready", "last_sync", "index_lag")
        return JSONResponse({k: st.get(k) for k in keep})

    async def contract(self, request: Request) -> JSONResponse:
        self._authorize(request)
        return JSONResponse(_contract())

    async def openapi(self, request: Request) -> JSONResponse:
        self._authorize(request)
        return JSONResponse(openapi_document())

    async def _json_body(self, request: Request) -> Any:
        """The request's JSON body (at most ``max_body_bytes``, at most ``MAX_JSON_DEPTH``
        levels deep), or the 400 ``request-invalid`` response to send instead."""
        raw = await read_body(request, self.max_body_bytes)
        try:
            body = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            return _invalid("The body is not JSON.")
        if too_deep(body):
            return _invalid(f"The body nests deeper than {MAX_JSON_DEPTH} levels.")
        return body

    async def search(self, request: Request) -> JSONResponse:
        body = await self._json_body(request)
        if isinstance(body, JSONResponse):
            return body
        scope = self._authorize(request, body)
        if isinstance(body, dict) and "peers" in body and self.pools is not None:
            return await self._peers_search(body, scope=scope)
        answer = await anyio.to_thread.run_sync(
            lambda: answer_local(self.holder.get(), body, scope_sources=scope.source_filter()))
        if answer["status"] == "invalid-request":
            err = answer.get("error") or {"code": "query-invalid", "message": "invalid request"}
            return JSONResponse({"error": err, "envelope": answer["envelope"]}, status_code=400)
        return JSONResponse(answer["envelope"], headers={"X-Kith-Status": answer["status"]})


    async def verify(self, request: Request) -> JSONResponse:
        """``POST /verify``: the signed citations of a saved answer (specs/citations.md)."""
        from node.answer.citation import MAX_ANSWER_BYTES, known_keys, verify_request
        from node.guest.copies.search import copy_texts

        self._authorize(request)
        raw = await read_body(request, MAX_ANSWER_BYTES + 64)
        try:
            body = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            raise ConfigError("answer-invalid", "The body is not JSON.") from None
        home = self.holder.home
        # answer-invalid (400) from a body that is not a saved answer
        return JSONResponse(await anyio.to_thread.run_sync(lambda: verify_request(body, known_keys(home), copy_texts(home))))

    async def _peers_search(self, body: dict[str, Any], keep_s: int | None = None, *,
                            scope: AgentScope) -> JSONResponse:
        """``peers`` (a local-only extension, specs/ask.md §5): taken off, the rest checked
        against the one request contract, then every named pinned peer asked at once. With
        ``keep_s`` (``POST /outbox``) the question is then kept in the outbox for the peers
        that did not answer (:func:`node.guest.outbox.keep_for_later`). ``scope``: the
        agent's (``"all"`` becomes the peers it may ask: :meth:`node.local.agents.Scope.peers_for`)."""
        from node.guest.fanout import PEERS_TIMEOUT_S, peers_request_refusal, peers_search

        body = dict(body)
        peers = body.pop("peers")
        citations = body.pop("citations", False)  # a peers-only field: ask them to sign
        if not isinstance(citations, bool):
            return _invalid("The field 'citations' must be true or false.")
        bad = peers_request_refusal(peers, body)
        if bad is not None:
            return _invalid(bad)
        peers = scope.peers_for(peers)
        if citations:
            body["citations"] = True
        home = self.holder.home
        request = {**body, "topK": body.get("topK", contract.TOP_K_DEFAULT)}  # as the outbox keeps it
        if keep_s is not None:  # outbox-full before anyone is asked
            from node.guest.outbox import OutboxStore

            def check() -> None:
                with OutboxStore(home) as store:
                    store.check_room(request)
            await anyio.to_thread.run_sync(check)
        assert self.pools is not None
        from node.policy.outbound import door_gate

        # the outbound gate, before the first byte leaves (outbound-held / -needs-confirmation: 403)
        ticket = await anyio.to_thread.run_sync(lambda: door_gate(home, scope, body, peers))
        pool = await self.pools.get()
        merged = await peers_search(self.pools.guest, peers, body, pool=pool, timeout_s=PEERS_TIMEOUT_S)
        await anyio.to_thread.run_sync(lambda: ticket.done(merged))
        if keep_s is not None:
            from node.guest.outbox import keep_for_later

            await anyio.to_thread.run_sync(lambda: keep_for_later(home, request, merged, keep_s=keep_s))
        untrusted = "peer-evidence" if any(r.get("untrusted") for r in merged["results"]) else "none"
        return JSONResponse(merged, headers={"X-Kith-Status": "ok" if merged["answered"] else "no-verified-results",
                                             "X-Kith-Untrusted": untrusted})

    async def outbox_read(self, request: Request) -> JSONResponse:
        """``GET /outbox``: every kept question (``{"questions", "usage"}``); ``?id=PREFIX``:
        one record with its merged answer (specs/outbox.md §2). Reading marks nothing, and a
        home this process may not write is read read-only (:meth:`OutboxStore.for_reading`)."""
        from node.guest.outbox import OUTBOX_FILE, OutboxStore, empty_usage, public_record

        home = self.holder.home
        scope = self._authorize(request)
        qid = request.query_params.get("id")

        def read() -> dict[str, Any]:
            if not (home / OUTBOX_FILE).exists():
                if qid is not None:
                    raise ConfigError("outbox-not-found", "the outbox is empty", status=404)
                return {"questions": [], "usage": empty_usage()}
            with OutboxStore.for_reading(home) as store:
                if qid is None:  # only the questions kept for peers the agent may ask
                    return {"questions": [q for q in store.list() if scope.may_read(q)], "usage": store.usage()}
                try:
                    found = store.resolve(qid)
                except ConfigError as exc:
                    raise ConfigError(exc.code, exc.message, status=404) from None
                record = store.get(found)
                assert record is not None
                if not scope.may_read(record):
                    raise ConfigError("outbox-not-found", f"no kept question {qid[:40]!r}", status=404)
                return public_record(record)
        return JSONResponse(await anyio.to_thread.run_sync(read))

    async def outbox_queue(self, request: Request) -> JSONResponse:
        """``POST /outbox``: the ``POST /search`` body with ``peers`` (required) and
        ``keep`` (seconds or a duration, default 7 days): the peers are asked now and the
        question is kept for those that did not answer; the merged envelope carries
        ``outbox`` (specs/outbox.md §6). ``outbox-full`` is 507."""
        from node.guest.outbox import parse_keep

        self._authorize(request, {})
        body = await self._json_body(request)
        if isinstance(body, JSONResponse):
            return body
        scope = self._authorize(request, body)
        if not isinstance(body, dict) or "peers" not in body:
            return _invalid("POST /outbox asks pinned peers: the field 'peers' is required.")
        body = dict(body)
        keep = body.pop("keep", None)
        if keep is not None and not isinstance(keep, (str, int)):
            return _invalid("The field 'keep' must be a number of seconds or a duration (30m, 12h, 7d).")
        try:
            keep_s = parse_keep(keep)
        except KithError as exc:
            return error_response(exc.code, exc.message, 400)
        try:
            return await self._peers_search(body, keep_s=keep_s, scope=scope)
        except ConfigError as exc:
            if exc.code == "outbox-full":
                return error_response(exc.code, exc.message, 507)
            raise


def _invalid(message: str) -> JSONResponse:
    """400 ``query-invalid`` with the invalid-request envelope (specs/local-api.md)."""
    return JSONResponse({"error": {"code": "query-invalid", "message": message},
                         "envelope": env_mod.empty_envelope("invalid-request")},
                        status_code=400)


async def _on_kith_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, KithError)
    status = exc.status  # 400 unless the raise site gave one (KithError.status)
    if exc.code == "agents-file-invalid":
        status = 500
    return error_response(exc.code, exc.message, status, _challenge(status))


def _challenge(status: int) -> dict[str, str] | None:
    """``WWW-Authenticate: Bearer`` on a 401 (RFC 6750)."""
    return {"WWW-Authenticate": 'Bearer realm="kith"'} if status == 401 else None


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    return error_response("internal-error", "an internal error occurred", 500)


def _header(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lowercase bytes), or None."""
    for key, value in scope.get("headers") or ():
        if key == name:
            return value.decode("latin-1")
    return None


def _loopback_authority(authority: str, port: int | None,
                        names: tuple[str, ...] = LOOPBACK_HOST_NAMES) -> bool:
    """True for ``NAME[:PORT]`` where NAME is one of ``names`` (loopback names, lowercase)
    and PORT (80 when absent) is the server's ``port``."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        name, _, rest = authority.partition("]")
        name += "]"
        if rest and not rest.startswith(":"):
            return False
        port_text = rest[1:] if rest else ""
    else:
        name, _, port_text = authority.partition(":")
    if name not in names:
        return False
    if not port_text:
        return port in (None, 80)
    return port_text.isdigit() and len(port_text) <= 5 and int(port_text) == port


def host_refusal(scope: Scope) -> str | None:
    """Why the Host/Origin headers are refused (DNS rebinding), or None when they are a
    loopback name with the server's port (an absent Origin is fine: not a browser)."""
    server = scope.get("server")
    port = int(server[1]) if server and server[1] is not None else None
    names = LOOPBACK_HOST_NAMES
    if server and server[0] and is_loopback(str(server[0])):  # the bound address too
        bound = str(server[0]).lower()
        names = (*names, f"[{bound}]" if ":" in bound else bound)
    host = _header(scope, b"host")
    if host is None or not _loopback_authority(host, port, names):
        return "the Host header must be 127.0.0.1, localhost or [::1] with this port"
    origin = _header(scope, b"origin")
    if origin is not None:
        scheme, sep, authority = origin.partition("://")
        if (not sep or scheme.lower() != "http" or "/" in authority
                or not _loopback_authority(authority, port, names)):
            return "cross-origin requests are refused (the Origin is not this loopback server)"
    return None


def loopback_refusal(scope: Scope) -> tuple[str, str] | None:
    """The first check of every owner-only loopback server (the local API, the dashboard):
    ``("loopback-only", message)`` for a client that is not a loopback address,
    ``("bad-host", message)`` for a foreign Host/Origin (:func:`host_refusal`), None when
    the request may go on. Each server prefixes its own code (``api-``, ``dashboard-``)."""
    client = scope.get("client")
    if not client or not is_loopback(str(client[0])):
        return "loopback-only", "this server answers loopback clients only"
    refusal = host_refusal(scope)
    if refusal is not None:
        return "bad-host", refusal
    return None


class LoopbackGuard:
    """The outer ASGI layer of an owner-only loopback server (the local API, the dashboard):
    a lifespan scope goes on to ``app``, any other scope that is not HTTP is dropped, an HTTP
    request :func:`loopback_refusal` refuses is answered 403 by ``refusal`` with the
    code prefixed by ``prefix`` (``<prefix>-loopback-only``, ``<prefix>-bad-host``), and
    any other request goes to :meth:`admit`, the server's own checks.

    Args:
        app: the server's inner ASGI app.
        prefix: the prefix of the server's error codes (``api``, ``dashboard``).
        refusal: ``(code, message, status)`` → the ASGI app answering a refused request.
    """

    def __init__(self, app: ASGIApp, prefix: str, refusal: Callable[[str, str, int], ASGIApp]) -> None:
        self.app = app
        self.prefix = prefix
        self.refusal = refusal

    async def admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve an HTTP request from a loopback client with a loopback Host/Origin."""
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self.app(scope, receive, send)
            return
        refused = loopback_refusal(scope)
        if refused is not None:
            code, message = refused
            await self.refusal(f"{self.prefix}-{code}", message, 403)(scope, receive, send)
            return
        await self.admit(scope, receive, send)


def _json_content_type(scope: Scope) -> bool:
    """True when the request's media type is ``application/json`` (parameters allowed)."""
    value = _header(scope, b"content-type")
    return value is not None and value.split(";", 1)[0].strip().lower() == "application/json"


class _Guard(LoopbackGuard):
    """Outer ASGI layer: loopback clients only, loopback Host/Origin only, an agent's
    credential (``Authorization: Bearer``; only ``GET /health`` answers without one, and
    then only "up"), then read-only routing and the JSON content type — before Starlette
    (so no handler, body read or corpus access happens for a refused request). Each
    handler then checks its own operation with the same :func:`node.local.agents.authorize`."""

    def __init__(self, app: ASGIApp, home: Path) -> None:
        super().__init__(app, "api", error_response)
        self.home = home

    async def admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"].upper()
        path = scope["path"]
        # never a query string or a cookie: the Authorization header alone, and only one
        if sum(1 for key, _ in scope.get("headers") or () if key == b"authorization") > 1:
            await error_response("agent-token-invalid", "The request carries more than one Authorization header.",
                                 401, _challenge(401))(scope, receive, send)
            return
        token = bearer_token(_header(scope, b"authorization"))
        if token is None and method in ("GET", "HEAD") and path == "/health":
            await JSONResponse({"service": SERVICE, "status": "up"})(scope, receive, send)
            return
        try:
            authorize(self.home, token, Operation("connect"))
        except KithError as exc:
            status = exc.status if isinstance(exc, AgentError) else 500
            await error_response(exc.code, exc.message, status, _challenge(status))(scope, receive, send)
            return
        scope[TOKEN_KEY] = token
        if method == "POST" and path in (SEARCH_PATH, VERIFY_PATH, OUTBOX_PATH):
            if not _json_content_type(scope):
                await error_response("api-content-type", f"POST {path} takes "
                                     "Content-Type: application/json", 415)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        if method not in ("GET", "HEAD"):
            await error_response("api-read-only", "the local API is read-only: "
                                 f"{method} is refused here", 403)(scope, receive, send)
            return
        if path not in GET_PATHS:
            await error_response("not-found", "no such route", 404)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(home: Path | str, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               offline: bool = False) -> ASGIApp:
    """Build the local API for the node home ``home`` (its corpus, opened read-only).

    Args:
        home: the node home (``<home>/corpus/``).
        max_body_bytes: the largest ``POST /search`` body, in bytes (default 64 KiB).
        offline: iroh local mode (relay disabled, loopback) for ``peers`` searches.

    Returns:
        An ASGI app (the loopback/read-only guard around a Starlette app).
    """
    from node.guest.owner import Guest

    guest = Guest(Path(home), local=offline)  # the asking side of this server's process
    h = _Handlers(CorpusHolder(Path(home)), max_body_bytes, _PoolKeeper(guest))
    routes = [
        Route("/health", h.health, methods=["GET"]),
        Route("/stats", h.stats, methods=["GET"]),
        Route("/contract", h.contract, methods=["GET"]),
        Route("/openapi.json", h.openapi, methods=["GET"]),
        Route(SEARCH_PATH, h.search, methods=["POST"]),
        Route(VERIFY_PATH, h.verify, methods=["POST"]),
        Route(OUTBOX_PATH, h.outbox_read, methods=["GET"]),
        Route(OUTBOX_PATH, h.outbox_queue, methods=["POST"]),
    ]
    inner = Starlette(routes=routes, exception_handlers={
        KithError: _on_kith_error, Exception: _on_unexpected})
    guard = _Guard(inner, Path(home))
    guard.holder = h.holder  # type: ignore[attr-defined]
    guard.guest = guest  # type: ignore[attr-defined]
    guard.pools = h.pools  # type: ignore[attr-defined]
    return guard


def check_host(host: str) -> None:
    """Refuse a non-loopback listen address (DESIGN §11).

    Raises:
        CorpusError: ``api-loopback-only``.
    """
    if not is_loopback(host):
        raise CorpusError("api-loopback-only",
                          f"refusing to serve the local API on non-loopback address {host}")


def _listening(home: Path | str, host: str, port: int, *, warn: Callable[[str], None] | None,
               offline: bool, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> tuple[Any, Any]:
    """The API's app, its holder started (a lagging index repaired when the writer lock is
    free), and a socket bound to ``host:port``, for :func:`serve` and
    :func:`run_api_in_thread`; the holder is closed again when binding fails.

    Raises:
        CorpusError: ``api-loopback-only``. CommunityError: ``server-start-failed``.
        UsageError: ``transport-mode-invalid`` (exit 2) for a bad ``[transport]`` table in
            the home's ``config.toml``, before anything is served — as ``kith mcp`` refuses
            it (:func:`node.local.mcp.run_stdio`) and ``kith ask`` does.
    """
    from node.transport.modes import mode_from

    check_host(host)
    mode_from(offline=offline, home=Path(home))  # the mode the pool reads later: a bad table refused now
    app = create_app(home, max_body_bytes=max_body_bytes, offline=offline)
    try:
        app.holder.start(warn)  # type: ignore[attr-defined]
        sock = bind_socket(host, port)
    except BaseException:
        app.holder.close()  # type: ignore[attr-defined]
        raise
    return app, sock

def serve(home: Path | str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
          on_listening: Any = None, access_log: bool = False,
          warn: Callable[[str], None] | None = None, offline: bool = False) -> None:
    """Serve the API in this (main) thread until SIGINT/SIGTERM.

    Before listening, a lagging index is repaired if the writer lock is free (never
    waiting for it); otherwise ``warn`` is called with one line.

    Args:
        home: the node home. host: a loopback address. port: TCP port (0 = a free one).
        on_listening: called with the base URL once the socket is bound.
        warn: called with a one-line warning (start-up repair not possible).
        offline: iroh local mode for ``peers`` searches.

    Raises:
        CorpusError: ``api-loopback-only`` for a non-loopback ``host``.
        CommunityError: ``server-start-failed`` when the address cannot be bound.
        UsageError: ``transport-mode-invalid`` for a bad ``[transport]`` table in the
            home's ``config.toml`` (nothing is served).
    """
    app, sock = _listening(home, host, port, warn=warn, offline=offline)
    try:
        if on_listening is not None:
            on_listening(base_url_of(sock))
        serve_forever(app, sock, access_log=access_log,  # type: ignore[arg-type]
                      on_loop=background_runner(app))
    finally:
        sock.close()
        app.holder.close()  # type: ignore[attr-defined]


def background_runner(app: Any) -> Callable[[], Any]:
    """The async callable the API's server runs on its loop while it serves: the home's
    background runner of the app's :class:`node.guest.owner.Guest` (``app.guest``;
    node/guest/runner.py; the outbox's delivery, specs/outbox.md §5), asking peers through
    the API's one warm pool (``app.pools``, started by whichever needs it first): one pool
    and one iroh endpoint per process (specs/ask.md §4).

    Args:
        app: an app of :func:`create_app`.
    """

    async def run() -> None:
        await app.guest.run_background(command="kith api serve", pool=app.pools.get)
    return run


@contextlib.contextmanager
def run_api_in_thread(home: Path | str, host: str = "127.0.0.1", port: int = 0, *,
                      max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                      startup_timeout_s: float = 10.0,
                      warn: Callable[[str], None] | None = None, offline: bool = False,
                      background: bool = False) -> Iterator[str]:
    """Serve the API in a daemon thread for a ``with`` block (tests, embedding); a lagging
    index is repaired first when the writer lock is free (see :func:`serve`).
    ``background``: also run the home's background runner (:func:`background_runner`), as
    ``kith api serve`` does.

    Yields:
        The base URL, e.g. ``"http://127.0.0.1:41234"``.

    Raises:
        CorpusError: ``api-loopback-only``. CommunityError: ``server-start-failed``.
        UsageError: ``transport-mode-invalid`` for a bad ``[transport]`` table.
    """
    app, sock = _listening(home, host, port, warn=warn, offline=offline, max_body_bytes=max_body_bytes)
    try:
        with serve_app_in_thread(app, sock, what="the local API", startup_timeout_s=startup_timeout_s,
                                 on_loop=background_runner(app) if background else None) as url:
            yield url
    finally:
        app.holder.close()  # type: ignore[attr-defined]


def search_via_api(base_url: str, body: dict[str, Any], budget: env_mod.SearchBudget,
                   *, token: str, timeout_s: float = 65.0) -> dict[str, Any]:
    """Client helper: one ``POST /search`` inside a shared :class:`SearchBudget`.

    Args:
        base_url: the API's base URL. body: the request (without ``remainingBudgetMs``).
        budget: the loop's budget; its deadline is never reset.
        token: an agent's token (``Authorization: Bearer``; specs/agents.md).
        timeout_s: HTTP timeout (s), never longer than the budget left.

    Returns:
        The envelope.

    Raises:
        CorpusError: ``budget-exhausted`` (no request is sent), ``query-invalid`` (400).
    """
    import httpx

    req = budget.next_request(body)
    timeout = min(timeout_s, req["remainingBudgetMs"] / 1000.0 + 5.0)
    r = httpx.post(base_url.rstrip("/") + SEARCH_PATH, json=req, timeout=timeout,
                   headers={"Authorization": f"Bearer {token}"})
    if r.status_code == 400:
        raise CorpusError("query-invalid", str(r.json().get("error", {}).get("message", ""))[:200]
                          or None)
    r.raise_for_status()
    return r.json()


__all__ = ["DEFAULT_PORT", "LoopbackGuard", "check_host", "create_app", "host_refusal", "loopback_refusal",
           "openapi_document", "run_api_in_thread", "search_via_api", "serve"]
