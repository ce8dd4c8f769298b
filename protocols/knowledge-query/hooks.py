"""Hooks of the ``knowledge-query`` protocol (DESIGN §8; see README.md).

Host: answers each ``query`` with ``results`` from ``ctx.knowledge`` — the peer's view of
the answer service (node/answer/service.py), whose evidence already passed the policy. Hooks never touch the
raw index. A ``query``'s ``citations`` is not the hooks' business: the host's egress seam
signs (node/answer/citation.py). Each ``check`` is answered ``checked`` from
``ctx.knowledge.check_versions``.

Copies (specs/copies.md): the Host answers ``copy_list`` with ``copy_manifest`` from
``ctx.knowledge.copy_manifest()`` and ``copy_fetch`` with ``copy_docs`` from
``ctx.knowledge.copy_documents(sources)`` (only what the peer may keep, scrubbed and
signed); either is charged to the peer's quota, and when the quota cannot pay
(``{"refused": "copy-rate-limited"}``) nothing of it is sent: that request alone is answered
``results`` with status ``rate-limited`` and ``retry_after_s`` (the copy messages have no
such status) and the session goes on. The Guest sends one when the ``ask`` callback returns ``{"action": "copy_list"}``
or ``{"action": "copy_fetch", "sources": [...]}``; the reply goes to ``on_results``.

Guest: asks the questions in ``ctx.options["queries"]`` one at a time, or, when
``ctx.options["ask"]`` is given, calls it for the next question (None ends; a dict is a
whole flat request: ``query``, ``topK`` and filters for that question alone, or
``{"action": "check", "versions": [...]}`` for a ``check``; a ``query_id`` in the dict is
sent as the question's id — the outbox's idempotency key; an awaitable of any of these
is awaited first); every ``results`` (and ``checked``) message goes to
``ctx.options["on_results"]`` when given. It ends with ``end``. ``ctx.options["inline"]``
says ``ask`` and ``on_results`` never block (``_small``).
Options ``topK`` (1-20) and ``filters`` (a dict of the flat filter fields) apply to every
query.
"""

import inspect
import itertools

from node.answer.contract import TOP_K_DEFAULT
from node.runtime.hooks import HookResult

#: The ``query`` message's own fields; everything else in it is the search request
#: (``node.answer.contract``; the engine already checked it against spec.json).
#: ``citations`` is read at the host's egress seam (node/answer/citation.py), not here.
_MESSAGE_FIELDS = ("action", "query_id", "citations")

#: A guest whose options say ``inline`` takes an answer whose marks read at most this many
#: characters of text (``_answer_chars``) on the event loop; a larger one in a worker thread.
#: The marks of such an answer cost at most about a millisecond of CPU for documentation
#: (a 5-result python-docs answer reads about 4,000), and up to about 30 ms for text made
#: to make the fence's patterns backtrack (``ignore all `` repeated).
INLINE_ANSWER_CHARS = 16_384


def on_start(ctx):
    if ctx.role == "guest":
        ctx.state["ids"] = itertools.count(1)
        ctx.state["queue"] = list(ctx.options.get("queries") or [])
        return _next_query(ctx)
    return None


def on_message(ctx, message):
    if ctx.role == "host":
        if message["action"] == "check":  # are these cited versions still current?
            checked = ctx.knowledge.check_versions(message["versions"])
            return {"action": "checked", "query_id": message["query_id"], **checked}
        if message["action"] in ("copy_list", "copy_fetch"):  # specs/copies.md §2, §3
            got = (ctx.knowledge.copy_manifest() if message["action"] == "copy_list"
                   else ctx.knowledge.copy_documents(message["sources"]))
            if "refused" in got and isinstance(got["refused"], str):  # the peer's quota: nothing of it is sent
                # this request alone is refused, as a rate-limited answer; the session goes on
                from node.answer.render import empty  # the host's side only: a guest never loads it

                return {"action": "results", "query_id": message["query_id"], "status": "rate-limited",
                        "retry_after_s": min(86_400, max(1, int(got.get("retry_after_s") or 1))),
                        "envelope": empty("rate-limited", None)["envelope"]}
            return {"action": "copy_manifest" if message["action"] == "copy_list" else "copy_docs",
                    "query_id": message["query_id"], **got}
        if message["action"] != "query":
            return None
        request = {k: v for k, v in message.items() if k not in _MESSAGE_FIELDS}
        answer = ctx.knowledge.search(request)
        reply = {"action": "results", "query_id": message["query_id"],
                 "status": answer["status"], "envelope": answer["envelope"]}
        for key in ("retry_after_s", "approval_id"):  # rate-limited / pending-approval
            if answer.get(key) is not None:
                reply[key] = answer[key]
        return reply
    if message["action"] in ("results", "checked", "copy_manifest", "copy_docs"):
        if message["query_id"] != ctx.state.get("pending"):
            # an answer to a question we did not ask (or asked earlier): refuse it
            return HookResult(abort="message-out-of-turn")
        ctx.state["pending"] = None
        callback = ctx.options.get("on_results")
        if callback is not None:
            callback(message)
        return _next_query(ctx)
    return None


def _small(ctx, message):
    """``on_message.inline`` (node/runtime/hooks.py): on the host, a ``query`` the
    knowledge handle says it answers from warm state with a bounded candidate count
    (``ctx.knowledge.small``) is answered on the event loop, any other in the host's
    bounded hook threads. On the guest, an answer of at most :data:`INLINE_ANSWER_CHARS`
    of text is taken on the event loop when ``ctx.options["inline"]`` says the caller's
    ``ask`` and ``on_results`` never block (the warm pool, node/guest/pool.py: its ``ask``
    returns an awaitable); any other guest call keeps its worker thread (``ask`` may be a
    prompt)."""
    if ctx.role != "host":
        if not ctx.options.get("inline") or message.get("action") not in ("results", "checked"):
            return None
        return _answer_chars(message) <= INLINE_ANSWER_CHARS or None
    small = getattr(ctx.knowledge, "small", None)
    if message.get("action") != "query" or small is None:
        return False
    return bool(small({k: v for k, v in message.items() if k not in _MESSAGE_FIELDS}))


def _answer_chars(message):
    """The work the guest's fence does to mark a ``results`` message's envelope, in
    characters of text (node/answer/fence.py, ``marks_size``: every text it scans — each
    result's text, source, heading path, metadata and ``alsoIn`` sources, each citation's
    excerpt, each synthesis sentence — and each item it marks), counted no further than
    just past :data:`INLINE_ANSWER_CHARS`: this runs on the event loop, whatever the host
    sent."""
    from node.answer.fence import marks_size  # the guest's side only

    return marks_size(message.get("envelope"), INLINE_ANSWER_CHARS)


on_message.inline = _small


def on_end(ctx, reason):
    ctx.logger.info("knowledge-query session %s ended: %s", ctx.session_id[:12], reason)


def _next_query(ctx):
    queue = ctx.state["queue"]
    if queue:
        text = queue.pop(0)
    elif ctx.options.get("ask") is not None:
        text = ctx.options["ask"]()
        if inspect.isawaitable(text):  # the warm pool: the next question when it comes
            return _QueryLater(ctx, text)
    else:
        text = None
    return _query_message(ctx, text)


class _QueryLater:
    """The message for the question an awaitable (``ask``'s) resolves to; awaited on the
    event loop by the driver (node/runtime/driver.py, ``_call_hook``). Not a coroutine:
    a call the driver abandons (a worker thread's, cancelled by the caller's deadline)
    drops it without a "never awaited" warning."""

    __slots__ = ("ctx", "question")

    def __init__(self, ctx, question):
        self.ctx, self.question = ctx, question

    def __await__(self):
        text = yield from self.question.__await__()
        return _query_message(self.ctx, text)


def _query_message(ctx, text):
    """The message that asks ``text`` (a question, a whole request dict, a ``check`` or a
    copy request; None or ``""`` ends the session with ``end``)."""
    if not text:
        return {"action": "end"}
    query_id = f"q{next(ctx.state['ids'])}"
    if isinstance(text, dict) and text.get("query_id"):  # the outbox's idempotency key (specs/outbox.md §3)
        query_id = str(text["query_id"])
    ctx.state["pending"] = query_id
    if isinstance(text, dict) and text.get("action") == "check":  # kith verify --against-host
        return {"action": "check", "query_id": query_id, "versions": list(text["versions"])}
    if isinstance(text, dict) and text.get("action") == "copy_list":  # kith copies sync
        return {"action": "copy_list", "query_id": query_id}
    if isinstance(text, dict) and text.get("action") == "copy_fetch":
        return {"action": "copy_fetch", "query_id": query_id, "sources": list(text["sources"])}
    if isinstance(text, dict):  # a whole request (the warm pool: topK and filters per question)
        request = {k: v for k, v in text.items() if k != "query_id"}
        message = {"action": "query", "query_id": query_id, "query": request.pop("query"),
                   "topK": int(request.pop("topK", ctx.options.get("topK", TOP_K_DEFAULT)))}
        message.update(request)
        return message
    message = {"action": "query", "query_id": query_id, "query": text,
               "topK": int(ctx.options.get("topK", TOP_K_DEFAULT))}
    message.update(ctx.options.get("filters") or {})
    return message
