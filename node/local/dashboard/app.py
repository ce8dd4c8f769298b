"""``kith dashboard``: the owner's loopback dashboard (issue 12; specs/dashboard.md).

Server-rendered pages (Jinja2 templates, one CSS file, no script needed) on the Starlette
and uvicorn plumbing the local API uses (:mod:`node.common.http`), behind the
:class:`node.local.dashboard.guard.Guard` (loopback clients, loopback Host/Origin, the
one-time login token, the session cookie, CSRF on every POST). Every page reads the
home's own files through the modules the CLI uses — nothing is computed twice:

======================  ==============================================================
``/``                   overview: identity, index counts, rules, peers, the live host
``/roots``              :meth:`Corpus.status_report`; add / remove / sync a root
``/policy``             rules, overrides, quotas (:class:`Policy`); explain a source
                        (:meth:`Policy.decide`, as ``kith policy explain``); set / unset
``/peers``              pinned peers with their profiles, blocked keys (:class:`PeerRegistry`)
``/sessions``           live sessions from the host's control channel; end one
``/approvals``          the queue (:class:`Approvals`); approve / deny [remember]
                        through :func:`node.policy.approvals.decide_as_owner`
``/outbox``              questions kept for offline peers and their answers
                        (:class:`node.guest.outbox.OutboxStore`); remove one
``/search``             the owner's corpus through the one answer path: as the owner
                        (:func:`answer_local`) or *as a peer would see it*
                        (:class:`AnswerService` with the host's gate, a :class:`PeerView`)
======================  ==============================================================

A POST does its one change, then redirects (303) to its page with a one-line notice;
a refusal of the change (a :class:`KithError`) is that notice, with its code.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

import logging

import anyio.to_thread
import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from node.answer import readable
from node.common.errors import ConfigError, CorpusError, KithError
from node.common.http import base_url_of, bind_socket, is_loopback, read_body, serve_app_in_thread, serve_forever
from node.answer import contract
from node.common.grants import until_text
from node.common.home import read_json_state
from node.answer.holder import CorpusHolder
from node.local.dashboard.guard import COOKIE, SECURITY_HEADERS, Door, Guard, refusal_page, session_cookie

log = logging.getLogger("kith.dashboard")

DEFAULT_PORT = 8766
#: largest POST body (a form), bytes
MAX_FORM_BYTES = 64 * 1024
#: the tiers a rule may give (DESIGN §10), in the order the form lists them
TIERS = ("public", "peers", "ask", "private", "never")
HERE = Path(__file__).parent
_env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                          autoescape=True, undefined=jinja2.StrictUndefined,
                          trim_blocks=True, lstrip_blocks=True)
# a preview's code (between the envelope's fence lines) is shown as code (issue 20 item 5)
# and each list item on a line of its own (readable.blocks)
_env.filters["preview_blocks"] = lambda text: readable.blocks(text or "")
_env.globals["until_text"] = until_text  # a grant's end: "until X" or "ended X", as the CLI words it


def check_host(host: str) -> None:
    """Refuse a non-loopback listen address.

    Raises:
        CorpusError: ``dashboard-loopback-only`` (exit status 2).
    """
    if not is_loopback(host):
        raise CorpusError("dashboard-loopback-only",
                          f"refusing to serve the dashboard on non-loopback address {host}",
                          hint="use 127.0.0.1 or ::1: the dashboard is for this machine's owner only",
                          exit_code=2)


def live_state(home: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The running host's live state from its control channel
    (:meth:`node.host.control.ControlClient.state`, specs/control.md), or
    ``(None, why)``: ``why`` is ``"host not running"`` when no host serves this home, else
    the channel's refusal as ``"code: message"``."""
    from node.host.control import ControlClient

    try:
        return ControlClient(home).state(), None
    except KithError as exc:
        if exc.code == "host-not-running":
            return None, "host not running"
        return None, f"{exc.code}: {exc.message}"


def end_live_session(home: Path, session_id: str) -> dict[str, Any]:
    """End one live session through the host's control channel (the guest is told
    ``session-ended-by-owner``). Returns ``{"ended": id, "peer": {"key", "name"}}``.

    Raises:
        KithError: ``host-not-running``, ``live-session-not-found``,
            ``live-session-ambiguous`` (:meth:`ControlClient.end_session`).
    """
    from node.host.control import ControlClient

    return ControlClient(home).end_session(session_id)


class _Pages:
    """The page and action handlers of one dashboard (module docstring)."""

    def __init__(self, home: Path, door: Door) -> None:
        self.home = Path(home)
        self.door = door
        self.corpus = CorpusHolder(self.home)  # read-only, reopened when a corpus appears
        self._notice: tuple[str, str] | None = None  # (kind "ok"/"error", text): shown once
        self._lock = threading.Lock()
        self._services: dict[Any, Any] = {}

    # --- plumbing --------------------------------------------------------------------------
    def _render(self, name: str, request: Request, **ctx: Any) -> HTMLResponse:
        with self._lock:
            notice, self._notice = self._notice, None
        page = _env.get_template(name).render(
            csrf=self.door.csrf_for(session_cookie(request.scope)), notice=notice, page=name.removesuffix(".html"),
            **ctx)
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    def _done(self, where: str, kind: str, text: str) -> RedirectResponse:
        with self._lock:
            self._notice = (kind, text)
        return RedirectResponse(where, status_code=303, headers=SECURITY_HEADERS)

    async def _form(self, request: Request) -> dict[str, str]:
        """The POST form (one value per name, the last one wins), after its CSRF check.

        Raises:
            KithError: ``dashboard-csrf`` (403), ``dashboard-form-invalid`` (400),
                ``request-too-large`` (413).
        """
        raw = await read_body(request, MAX_FORM_BYTES)
        try:
            pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                              max_num_fields=64)
        except (UnicodeDecodeError, ValueError):
            raise CorpusError("dashboard-form-invalid", "the form is not valid", status=400) from None
        form = dict(pairs)
        if not self.door.csrf_ok(form.get("csrf"), session_cookie(request.scope)):
            raise CorpusError("dashboard-csrf", "the form's CSRF token is missing or wrong; reload "
                              "the page and send it again", status=403)
        return form

    @staticmethod
    def _field(form: dict[str, str], name: str) -> str:
        value = form.get(name, "").strip()
        if not value:
            raise CorpusError("dashboard-form-invalid", f"the form needs a value for {name!r}", status=400)
        return value

    async def _act(self, request: Request, where: str,
                   action: Callable[[dict[str, str]], str]) -> Response:
        """Run one change (in a worker thread) and redirect to ``where`` with its notice: a
        refusal's code and message, a local I/O failure's too (``io-error``, ``disk-full``:
        :func:`node.common.dbfaults.refusal_of` — a home the dashboard may read but not
        write refuses every change so)."""
        from node.common.dbfaults import refusal_of

        form = await self._form(request)
        try:
            text = await anyio.to_thread.run_sync(action, form)
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is a refusal
            refusal = refusal_of(exc)
            if refusal is None:
                raise
            return self._done(where, "error", f"{refusal.code}: {refusal.message}")
        return self._done(where, "ok", text)

    def _corpus(self) -> Any:
        """The read-only corpus, or None when the home has none yet (or it cannot be read:
        :meth:`_corpus_and_fault` says why)."""
        return self._corpus_and_fault()[0]

    def _corpus_and_fault(self) -> tuple[Any, str | None]:
        """``(corpus, None)``, ``(None, None)`` when the home has none yet, or ``(None,
        "code: message — hint")`` when it cannot be read (a damaged record is not "no
        corpus": the page says so, with its way out)."""
        try:
            return self.corpus.get(), None
        except KithError as exc:
            if exc.code == "index-unavailable":
                return None, None
            return None, f"{exc.code}: {exc.message}" + (f" — {exc.hint}" if exc.hint else "")

    # --- overview -------------------------------------------------------------------------
    async def overview(self, request: Request) -> HTMLResponse:
        def gather() -> dict[str, Any]:
            from node.policy.approvals import Approvals
            from node.policy.store import Policy
            from node.trust.identity import fingerprint, load_identity
            from node.trust.peers import PeerRegistry

            try:
                ident = load_identity(self.home)
                identity = {"key": ident.public_key, "fingerprint": fingerprint(ident.public_key)}
            except KithError as exc:
                identity = {"error": f"{exc.code}: {exc.message}"}
            corpus, fault = self._corpus_and_fault()
            stats = corpus.stats() if corpus is not None else None
            policy = Policy.load(self.home)
            registry = PeerRegistry.load(self.home)
            live, why = live_state(self.home)
            from node.guest.kept import kept_report
            from node.host.grants import sharing_report

            return {"identity": identity, "stats": stats, "corpus_fault": fault, "rules": len(policy.rules),
                    "overrides": len(policy.overrides), "peers": len(registry.peers),
                    "blocked": len(registry.blocked), "pending": len(Approvals(self.home).pending()),
                    "live": live, "live_why": why, "home": str(self.home),
                    "sharing": sharing_report(self.home), "kept": kept_report(self.home)}

        return self._render("overview.html", request, **await anyio.to_thread.run_sync(gather))

    # --- roots ----------------------------------------------------------------------------
    async def roots(self, request: Request) -> HTMLResponse:
        def gather() -> dict[str, Any]:
            corpus, fault = self._corpus_and_fault()
            return {"status": corpus.status_report(max_listed=200) if corpus is not None else None,
                    "corpus_fault": fault}

        return self._render("roots.html", request, **await anyio.to_thread.run_sync(gather))

    def _writable(self) -> Any:
        from node.corpus.store import Corpus

        return Corpus(self.home)

    async def roots_add(self, request: Request) -> Response:
        def action(form: dict[str, str]) -> str:
            with self._writable() as corpus:
                root = corpus.add_root(self._field(form, "path"))
            return f"added root /{root.prefix}/ (sync it next)"

        return await self._act(request, "/roots", action)

    async def roots_remove(self, request: Request) -> Response:
        def action(form: dict[str, str]) -> str:
            prefix = self._field(form, "prefix").strip("/")
            with self._writable() as corpus:
                out = corpus.remove_root(prefix)
            from node.policy.store import Policy

            policy = Policy.load(self.home)
            named = policy.rules_naming(prefix)
            extra = f"; policy rules that named it: {', '.join(named)}" if named else ""
            return f"removed root /{out['prefix']}/ and its {out['documents']} document(s){extra}"

        return await self._act(request, "/roots", action)

    async def roots_sync(self, request: Request) -> Response:
        def action(form: dict[str, str]) -> str:
            mode = form.get("mode") or "new_only"
            with self._writable() as corpus:
                rep = corpus.sync(mode=mode)
            from node.policy.outbound import write_fingerprints

            write_fingerprints(self.home)  # the outbound gate's, at index time (specs/agents.md §6)
            return (f"sync ({rep['mode']}): indexed {rep['indexed']}, updated {rep['updated']}, "
                    f"skipped {rep['skipped']}, removed {rep['removed']}, failed {rep['failed']}, "
                    f"empty {rep['empty']}; {rep['chunks']} chunks in {rep['seconds']:.2f} s")

        return await self._act(request, "/roots", action)

    # --- policy ---------------------------------------------------------------------------
    async def policy(self, request: Request) -> HTMLResponse:
        source = request.query_params.get("source", "").strip()
        as_peer = request.query_params.get("peer", "").strip()

        def gather() -> dict[str, Any]:
            from node.policy.store import Policy, check_peer_names
            from node.trust.peers import PeerRegistry

            policy = Policy.load(self.home)
            names = sorted(PeerRegistry.load(self.home).peers)
            quotas = [("default (each peer, each anonymous key)", policy.quota_for(None)),
                      ("anonymous peers together", policy.anonymous_quota()),
                      *((name, policy.quota_for(name)) for name in names)]
            explained = error = None
            if source:
                try:
                    if as_peer:
                        check_peer_names([as_peer], "peer name")
                    corpus = self._corpus()
                    roots = corpus.roots() if corpus is not None else []
                    explained = policy.decide(source, as_peer or None, roots=roots)
                except KithError as exc:
                    error = f"{exc.code}: {exc.message}"
            from node.policy.coverage import check_policy, indexed_sources

            # the same counts as `kith policy check` (issue 20)
            check = check_policy(policy, indexed_sources(self.home))
            coverage = {f"{c.rule.glob}|{c.rule.peer or ''}": c for c in check.rules}
            return {"rules": policy.rules, "overrides": policy.overrides, "quotas": quotas,
                    "check": check, "coverage": coverage,
                    "names": names, "tiers": TIERS, "source": source, "as_peer": as_peer,
                    "explained": explained, "explain_error": error}

        return self._render("policy.html", request, **await anyio.to_thread.run_sync(gather))

    async def policy_set(self, request: Request) -> Response:
        def action(form: dict[str, str]) -> str:
            from node.policy.store import Policy

            glob, tier = self._field(form, "glob"), self._field(form, "tier")
            peers = [p.strip() for p in form.get("peers", "").replace(",", " ").split() if p.strip()]
            for_peer = form.get("for", "").strip() or None
            from node.policy.scrub_coverage import refuse_unscrubbing

            # Policy.set checks the glob, the tier, the names and their combination
            before = Policy.load(self.home)
            policy = Policy.load(self.home)
            rule = policy.set(glob, tier, peers or None, for_peer=for_peer)
            # no confirmation here: a rule that would stop scrubbing is refused (specs/policy.md §9.5)
            refuse_unscrubbing(self.home, before, policy, policy.save, how="kith policy set")
            from node.policy.coverage import indexed_sources, rule_coverage

            sources = indexed_sources(self.home)
            cov = rule_coverage(policy, rule, sources)
            who = f" for {rule.peer}" if rule.peer else ""
            said = cov.warning(len(sources)) or "; ".join(cov.lines())
            return (f"rule {rule.glob} → {rule.tier}{who} saved: {said} "
                    "(a running host applies it from its next query)")

        return await self._act(request, "/policy", action)

    async def policy_unset(self, request: Request) -> Response:
        def action(form: dict[str, str]) -> str:
            from node.policy.store import Policy

            glob = self._field(form, "glob")
            for_peer = form.get("for", "").strip() or None
            from node.policy.scrub_coverage import refuse_unscrubbing

            before = Policy.load(self.home)
            policy = Policy.load(self.home)
            if not policy.unset(glob, for_peer=for_peer):
                return f"no rule for {glob}; nothing changed"
            refuse_unscrubbing(self.home, before, policy, policy.save, how="kith policy unset")
            return f"removed rule {glob}" + (f" for {for_peer}" if for_peer else "")

        return await self._act(request, "/policy", action)

    # --- peers ----------------------------------------------------------------------------
    async def peers(self, request: Request) -> HTMLResponse:
        def gather() -> dict[str, Any]:
            from node.trust.identity import fingerprint
            from node.trust.peers import PeerRegistry

            registry = PeerRegistry.load(self.home)
            from node.policy.store import Policy

            policy = Policy.load(self.home)
            from node.trust.revocation_list import revoked_seen_devices

            member_of = policy.groups_by_member()
            revoked = revoked_seen_devices(self.home, registry)
            pinned = [{**registry.to_json(p), "fingerprint": fingerprint(p.public_key),
                       "groups": sorted(member_of.get(p.name, {}).items()),
                       "revokedDevices": sorted(revoked.get(p.name, ()))}
                      for _, p in sorted(registry.peers.items())]
            blocked = [registry.block_json(b) for _, b in sorted(registry.blocked.items())]
            groups = [{"name": g.name, "members": sorted(g.members.items())}
                      for _, g in sorted(policy.groups.items())]
            return {"pinned": pinned, "blocked": blocked, "groups": groups}

        return self._render("peers.html", request, **await anyio.to_thread.run_sync(gather))

    # --- live sessions --------------------------------------------------------------------
    async def sessions(self, request: Request) -> HTMLResponse:
        live, why = await anyio.to_thread.run_sync(live_state, self.home)
        return self._render("sessions.html", request, live=live, live_why=why)

    async def sessions_end(self, request: Request) -> Response:
        def action(form: dict[str, str]) -> str:
            sid = self._field(form, "session")
            done = end_live_session(self.home, sid)
            who = done["peer"].get("name") or "an anonymous peer"
            return f"ended session {done['ended'][:12]} of {who}"

        return await self._act(request, "/sessions", action)

    # --- approvals ------------------------------------------------------------------------
    async def approvals(self, request: Request) -> HTMLResponse:
        def gather() -> dict[str, Any]:
            from node.policy.approvals import Approvals

            store = Approvals(self.home)
            decided = sorted((r for r in store.requests().values() if r.decision is not None),
                             key=lambda r: (r.decided_at or "", r.id), reverse=True)[:50]
            return {"pending": store.pending(), "decided": decided}

        return self._render("approvals.html", request, **await anyio.to_thread.run_sync(gather))

    async def approvals_decide(self, request: Request) -> Response:
        def action(form: dict[str, str]) -> str:
            from node.policy.approvals import decide_as_owner

            rid, verdict = self._field(form, "id"), self._field(form, "decision")
            if verdict not in ("approve", "deny"):
                raise CorpusError("dashboard-form-invalid", "decision is approve or deny", status=400)
            remember = form.get("remember") in ("1", "on", "yes")
            done = decide_as_owner(self.home, rid, verdict == "approve", remember=remember)
            text = (f"{done.request.decision} {rid} "
                    + ("for every query of this peer (remembered)" if remember else "for this query"))
            if done.settled:
                text += f"; also settled {', '.join(done.settled)}"
            if done.closed:
                text += (f"; {len(done.closed)} source(s) are no longer 'ask' and stay closed: "
                         + ", ".join(done.closed[:5]))
            return text

        return await self._act(request, "/approvals", action)

    # --- outbox ---------------------------------------------------------------------------
    async def outbox(self, request: Request) -> HTMLResponse:
        """The kept questions, newest first, each with its rows and — once answered — its
        merged answer (:func:`node.guest.outbox.public_record`); viewing marks nothing, and a
        home this process may not write is read read-only (:meth:`OutboxStore.for_reading`)."""
        def gather() -> dict[str, Any]:
            from node.guest.outbox import OUTBOX_FILE, OutboxStore, public_record

            if not (self.home / OUTBOX_FILE).exists():
                return {"questions": [], "usage": None, "outbox_error": None}
            try:
                with OutboxStore.for_reading(self.home) as store:
                    records = [public_record(r) for r in store.records(limit=100)]
                    return {"questions": records, "usage": store.usage(), "outbox_error": None}
            except KithError as exc:  # outbox-corrupt: said on the page, as `kith outbox list` says it
                return {"questions": [], "usage": None, "outbox_error": f"{exc.code}: {exc.message}"}

        return self._render("outbox.html", request, **await anyio.to_thread.run_sync(gather))

    async def outbox_remove(self, request: Request) -> Response:
        def action(form: dict[str, str]) -> str:
            from node.guest.outbox import OutboxStore

            with OutboxStore(self.home) as store:
                qid = store.resolve(self._field(form, "id"))
                store.remove(qid)
            return f"removed {qid[:12]} from the outbox"

        return await self._act(request, "/outbox", action)

    # --- agents and the outbound log (specs/agents.md) --------------------------------------
    async def agents(self, request: Request) -> HTMLResponse:
        """The agents of the local doors and their scopes (never a token or its hash)."""
        def gather() -> dict[str, Any]:
            from node.local.agents import load_agents

            try:
                rows = [a.public() for a in sorted(load_agents(self.home).values(), key=lambda a: a.name)]
                return {"agents": rows, "agents_error": None}
            except KithError as exc:
                return {"agents": [], "agents_error": f"{exc.code}: {exc.message}"}

        return self._render("agents.html", request, **await anyio.to_thread.run_sync(gather))

    async def agents_add(self, request: Request) -> Response:
        """Add an agent from the form; its token is shown once, in the page's notice."""
        def action(form: dict[str, str]) -> str:
            from node.common.grants import parse_until
            from node.local.agents import add_agent

            until = form.get("until", "").strip()
            agent, token = add_agent(self.home, self._field(form, "name"), sources=form.get("sources", "").split(),
                                     peers=form.get("peers", "").split(), queue=form.get("queue") == "on",
                                     outbound=form.get("outbound", "ask"), until=parse_until(until) if until else None)
            return f"added agent {agent.name}; its token (shown once): {token}"

        return await self._act(request, "/agents", action)

    async def agents_remove(self, request: Request) -> Response:
        def action(form: dict[str, str]) -> str:
            from node.local.agents import remove_agent

            return f"removed agent {remove_agent(self.home, self._field(form, 'name')).name}; its token no longer works"

        return await self._act(request, "/agents", action)

    async def sent(self, request: Request) -> HTMLResponse:
        """The outbound log, newest first (the last 200 decisions)."""
        def gather() -> dict[str, Any]:
            from node.policy.outbound import read_log

            return {"sent": list(reversed(read_log(self.home)[-200:]))}

        return self._render("sent.html", request, **await anyio.to_thread.run_sync(gather))

    # --- search ---------------------------------------------------------------------------
    def _peer_service(self, corpus: Any) -> Any:
        """One :class:`AnswerService` with the host's kind of gate over the read-only corpus
        (policy re-read on change, as the host does); no quota is charged and no approval
        request is written (the views it answers have no key)."""
        from node.answer.service import AnswerService
        from node.policy.gate import EgressGate
        from node.policy.store import Policy

        with self._lock:
            key = (id(corpus), tuple(corpus.roots()))
            service = self._services.get(key)
            if service is None:
                gate = EgressGate(corpus.roots(), Policy.load(self.home), self.home)
                service = AnswerService(corpus, gate)
                self._services = {key: service}  # roots changed or the corpus reopened: rebuild
            return service

    async def search(self, request: Request) -> HTMLResponse:
        query = request.query_params.get("q", "").strip()
        view = request.query_params.get("as", "owner").strip() or "owner"

        def gather() -> dict[str, Any]:
            from node.answer.service import PeerView, answer_local
            from node.trust.peers import PeerRegistry

            names = sorted(PeerRegistry.load(self.home).peers)
            out: dict[str, Any] = {"query": query, "view": view, "names": names, "answer": None,
                                   "error": None}
            if not query:
                return out
            if view not in ("owner", "anonymous", *names):
                out["error"] = f"peer-not-found: no pinned peer named {view!r}"
                return out
            corpus = self._corpus()
            body = {"query": query, "topK": contract.TOP_K_DEFAULT}
            if view == "owner" or corpus is None:
                answer = answer_local(corpus, body)
            else:
                peer = PeerView(None if view == "anonymous" else view, None)
                answer = self._peer_service(corpus).answer(body, peer)
            out["answer"] = answer
            return out

        return self._render("search.html", request, **await anyio.to_thread.run_sync(gather))

    # --- login ----------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        session = self.door.redeem(request.query_params.get("token"))
        if session is None:
            return refusal_page("dashboard-login-invalid", "this login link is wrong or was used "
                                "already; `kith dashboard --login-link` prints a new one", 403)
        resp = RedirectResponse("/", status_code=303, headers=SECURITY_HEADERS)
        resp.set_cookie(COOKIE, session, httponly=True, samesite="strict", path="/")
        return resp


async def _on_kith_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, KithError)
    from node.common.errors import CODES

    code = exc.code if exc.code in CODES else "internal-error"
    return refusal_page(code, exc.message, exc.status if exc.status >= 400 else 400)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.error("dashboard: %s %s failed", request.method, request.url.path, exc_info=exc)
    return refusal_page("internal-error", "an internal error occurred", 500)


def create_app(home: Path | str) -> Guard:
    """Build the dashboard for node home ``home``.

    Returns:
        The ASGI app (:class:`Guard` around Starlette); ``app.door`` holds the login token
        (:class:`Door`), ``app.pages.corpus`` the read-only corpus holder (closed by
        :func:`close_app`).
    """
    door = Door()
    p = _Pages(Path(home), door)
    routes = [
        Route("/", p.overview, methods=["GET"]),
        Route("/login", p.login, methods=["GET"]),
        Route("/roots", p.roots, methods=["GET"]),
        Route("/roots/add", p.roots_add, methods=["POST"]),
        Route("/roots/remove", p.roots_remove, methods=["POST"]),
        Route("/roots/sync", p.roots_sync, methods=["POST"]),
        Route("/policy", p.policy, methods=["GET"]),
        Route("/policy/set", p.policy_set, methods=["POST"]),
        Route("/policy/unset", p.policy_unset, methods=["POST"]),
        Route("/peers", p.peers, methods=["GET"]),
        Route("/sessions", p.sessions, methods=["GET"]),
        Route("/sessions/end", p.sessions_end, methods=["POST"]),
        Route("/approvals", p.approvals, methods=["GET"]),
        Route("/approvals/decide", p.approvals_decide, methods=["POST"]),
        Route("/outbox", p.outbox, methods=["GET"]),
        Route("/outbox/remove", p.outbox_remove, methods=["POST"]),
        Route("/search", p.search, methods=["GET"]),
        Route("/agents", p.agents, methods=["GET"]),
        Route("/agents/add", p.agents_add, methods=["POST"]),
        Route("/agents/remove", p.agents_remove, methods=["POST"]),
        Route("/sent", p.sent, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    inner = Starlette(routes=routes, exception_handlers={KithError: _on_kith_error,
                                                          Exception: _on_unexpected})
    guard = Guard(inner, door)
    guard.pages = p  # type: ignore[attr-defined]
    return guard


def close_app(app: Guard) -> None:
    """Close what :func:`create_app` opened (the read-only corpus)."""
    app.pages.corpus.close()  # type: ignore[attr-defined]


def login_url(base_url: str, app: Guard) -> str:
    """The one-time login URL for ``app`` served at ``base_url``."""
    return f"{base_url}/login?token={quote(app.door.login_token)}"


#: ``<home>/dashboard.login`` (0600): the running dashboard's pid and current one-time
#: login URL, rewritten on SIGUSR1 with a new token (``kith dashboard --login-link``).
LOGIN_FILE = "dashboard.login"


def keeps_login_file(home: Path | str) -> bool:
    """Whether a dashboard of ``home`` keeps ``<home>/dashboard.login``: False on a home
    this user may read but not write (a read-only copy, a chmod, a read-only mount), where
    the dashboard keeps its login link in memory only and ``kith dashboard --login-link``
    cannot reach it (:func:`node.common.home.may_write`)."""
    from node.common.home import may_write

    return may_write(Path(home) / LOGIN_FILE)


def _write_login(home: Path, base: str, app: Guard) -> None:
    import json
    import os

    from node.common.home import atomic_write

    atomic_write(Path(home) / LOGIN_FILE, json.dumps(
        {"pid": os.getpid(), "url": base, "login": login_url(base, app)}).encode(), mode=0o600)


def new_login_link(home: Path | str, *, timeout_s: float = 5.0) -> str:
    """Ask the dashboard running on ``home`` for a new one-time login URL (SIGUSR1 to the
    pid in ``<home>/dashboard.login``; it rotates the token, :meth:`Door.rotate`, and
    rewrites the file) and return it.

    Raises:
        CorpusError: ``dashboard-not-running`` when no dashboard of this home runs (no
            file, or its pid is gone) or it did not answer within ``timeout_s``.
    """
    import os
    import signal
    import time

    path = Path(home) / LOGIN_FILE
    hint = "start one with `kith dashboard`"
    try:
        before = read_json_state(path)
        pid = int(before["pid"])
        os.kill(pid, signal.SIGUSR1)
    except (OSError, ConfigError, ValueError, KeyError, TypeError):
        if not path.exists() and not keeps_login_file(home):
            raise CorpusError(
                "dashboard-not-running", f"No `kith dashboard` of {home} can be asked for a new login URL: this "
                "home is read-only for you, so a dashboard serving it keeps its login URL in memory only.",
                hint="use the login URL the dashboard printed when it started, or stop it and start it again "
                     "(`kith dashboard`) for a new one") from None
        raise CorpusError("dashboard-not-running", f"No `kith dashboard` is running for {home}.", hint=hint) from None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            now = read_json_state(path)
        except (OSError, ConfigError):
            now = before
        if now.get("login") != before.get("login"):
            return str(now["login"])
        time.sleep(0.05)
    raise CorpusError("dashboard-not-running", f"The `kith dashboard` of {home} (pid {pid}) did not answer.",
                      hint=hint)


def serve(home: Path | str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *,
          on_listening: Callable[[str, str], None] | None = None) -> None:
    """Serve the dashboard in this (main) thread until SIGINT/SIGTERM. While it runs,
    ``<home>/dashboard.login`` holds its current login URL, and SIGUSR1 makes a new one
    (:func:`new_login_link`); the file is removed at the end. On a home this user may read
    but not write (:func:`keeps_login_file` False) no file is written: the login URL
    ``on_listening`` gets is the only one.

    Args:
        home: the node home. host: a loopback address. port: TCP port (0 = a free one).
        on_listening: called with ``(base_url, login_url)`` once the socket is bound.

    Raises:
        CorpusError: ``dashboard-loopback-only``.
        CommunityError: ``server-start-failed`` when the address cannot be bound.
    """
    check_host(host)
    app = create_app(home)
    keep = keeps_login_file(home)
    try:
        sock = bind_socket(host, port)
        try:
            import signal

            base = base_url_of(sock)
            if keep:
                _write_login(Path(home), base, app)

            def rotate(_signum: int, _frame: Any) -> None:
                app.door.rotate()
                _write_login(Path(home), base, app)

            if keep and hasattr(signal, "SIGUSR1"):
                signal.signal(signal.SIGUSR1, rotate)
            if on_listening is not None:
                on_listening(base, login_url(base, app))
            serve_forever(app, sock)  # type: ignore[arg-type]
        finally:
            sock.close()
            if keep:
                (Path(home) / LOGIN_FILE).unlink(missing_ok=True)
    finally:
        close_app(app)


@contextlib.contextmanager
def run_dashboard_in_thread(home: Path | str, host: str = "127.0.0.1", port: int = 0) -> Iterator[tuple[str, str]]:
    """Serve the dashboard in a daemon thread for a ``with`` block (tests, embedding).

    Yields:
        ``(base_url, login_url)``.

    Raises:
        CorpusError: ``dashboard-loopback-only``. CommunityError: ``server-start-failed``.
    """
    check_host(host)
    app = create_app(home)
    try:
        sock: socket.socket = bind_socket(host, port)
        with serve_app_in_thread(app, sock, what="the dashboard") as base:
            yield base, login_url(base, app)
    finally:
        close_app(app)


__all__ = ["DEFAULT_PORT", "MAX_FORM_BYTES", "check_host", "close_app", "create_app", "end_live_session",
           "live_state", "login_url", "run_dashboard_in_thread", "serve"]
