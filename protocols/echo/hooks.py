"""Hooks of the ``echo`` example protocol (see README.md).

Host: answers each ``say`` with ``echo`` (the text upper-cased and a running count).
Guest: says each string of ``ctx.options["texts"]`` in turn, hands every ``echo`` to
``ctx.options["on_message"]`` when given, then says ``bye``.
"""


def on_start(ctx):
    if ctx.role == "guest":
        return _next(ctx)
    ctx.state["count"] = 0
    return None


def on_message(ctx, message):
    if ctx.role == "host":
        if message["action"] == "say":
            ctx.state["count"] += 1
            return {"action": "echo", "text": message["text"].upper(), "count": ctx.state["count"]}
        return None
    callback = ctx.options.get("on_message")
    if callback is not None:
        callback(message)
    return _next(ctx)


def on_end(ctx, reason):
    ctx.logger.info("echo session ended: %s", reason)


def _next(ctx):
    texts = ctx.state.setdefault("texts", list(ctx.options.get("texts", ["hello"])))
    if texts:
        return {"action": "say", "text": texts.pop(0)}
    return {"action": "bye"}
