"""Pure checks of what a host sent for a copy: its manifest, each document against it and
the host's key, and the copy grant state of its handshake (specs/copies.md §3, §5). No
file, no network: tested as :mod:`node.trust.card` is."""

from __future__ import annotations

from typing import Any

from node.common.errors import KithError, PolicyError, ProtocolViolation, SigningError

#: The most bytes one copy may hold whatever the host says (a host with no budget).
MAX_LOCAL_BYTES = 4 << 30
#: Longest source id kept (the citation's bound).
MAX_SOURCE_CHARS = 1024
_HEX = frozenset("0123456789abcdef")
#: verify_citation results that are a fault of the signature (the rest: the text).
_BAD_SIGNATURE = frozenset({"malformed", "unknown-version", "wrong-host", "span-mismatch", "wrong-domain",
                            "signed-json", "bad-signature"})


def _is_hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def check_manifest(message: Any, *, check_budget: bool = True) -> dict[str, dict[str, Any]]:
    """The manifest's entries ``{source: {"version", "bytes", "textSha256"}}``; with
    ``check_budget`` False the entries are checked but not their sum (what an over-budget
    manifest still lists: :func:`sync_copy` deletes what it no longer lists).

    Raises:
        ProtocolViolation: ``copy-manifest-invalid`` (a duplicate or ill-formed entry; a
            source that is not its own canonical id,
            :func:`node.corpus.sources.lexical_form`: relative, ``.``/``..`` segments,
            NUL, a backslash or doubled slash, over 1024 characters, a newline).
        PolicyError: ``copy-over-budget`` (the entries' bytes exceed the grant's
            ``maxBytes``, or :data:`MAX_LOCAL_BYTES`).
    """
    from node.corpus.sources import lexical_form

    docs = message.get("documents") if isinstance(message, dict) else None
    if not isinstance(docs, list):
        raise ProtocolViolation("copy-manifest-invalid", "the manifest has no document list")
    out: dict[str, dict[str, Any]] = {}
    total = 0
    for d in docs:
        src = d.get("source") if isinstance(d, dict) else None
        if (not isinstance(src, str) or len(src) > MAX_SOURCE_CHARS or lexical_form(src) != src
                or "\n" in src or src in out or not _is_hex64(d.get("version"))
                or not _is_hex64(d.get("textSha256"))
                or isinstance(d.get("bytes"), bool) or not isinstance(d.get("bytes"), int) or d["bytes"] < 0):
            raise ProtocolViolation("copy-manifest-invalid", "a manifest entry is ill-formed or repeated")
        out[src] = {"version": d["version"], "bytes": d["bytes"], "textSha256": d["textSha256"]}
        total += d["bytes"]
    budget = message.get("maxBytes")
    limit = min(budget, MAX_LOCAL_BYTES) if isinstance(budget, int) and not isinstance(budget, bool) else MAX_LOCAL_BYTES
    if check_budget and total > limit:
        raise PolicyError("copy-over-budget", f"the copy would hold {total:,} bytes, over its budget of {limit:,}")
    return out


def check_document(doc: Any, wanted: dict[str, dict[str, Any]], host_key: str) -> tuple[str, str, dict[str, Any]]:
    """``(source, text, citation)`` of one document the host sent, checked against the
    manifest entries asked for (``wanted``) and the host's key (specs/copies.md §3).

    Raises:
        SigningError: ``copy-outside-grant`` (a source not asked for / not in the
            manifest), ``copy-bad-signature`` (the citation does not verify as
            ``host_key``'s over this source and the whole text), ``copy-version-mismatch``
            (its version, text hash or size is not the manifest's, or its text is not the
            text signed).
    """
    from node.answer.citation import text_digest, verify_citation

    src = doc.get("source") if isinstance(doc, dict) else None
    if not isinstance(src, str) or src not in wanted:
        raise SigningError("copy-outside-grant", "the host sent a document the manifest does not list for this copy")
    entry = wanted[src]
    text, citation = doc.get("text"), doc.get("citation")
    if not isinstance(text, str) or not isinstance(citation, dict):
        raise SigningError("copy-bad-signature", f"{src[:200]}: no text or no citation")
    row = verify_citation(citation, text=text, shown_sources=(src,), expected_host=host_key)
    if row.result in _BAD_SIGNATURE:
        raise SigningError("copy-bad-signature", f"{src[:200]}: {row.result}: {row.detail}")
    if row.result == "text-changed":
        raise SigningError("copy-version-mismatch", f"{src[:200]}: the text is not the text the host signed")
    span = citation.get("span") or {}
    if span.get("chars") != [0, len(text)] or span.get("lines") is not None or span.get("pages") is not None:
        raise SigningError("copy-bad-signature", f"{src[:200]}: the signature is not over the whole document")
    if (doc.get("version") != entry["version"] or citation.get("version") != entry["version"]
            or text_digest(text) != entry["textSha256"]
            or len(text.encode("utf-8", "surrogatepass")) != entry["bytes"]):
        raise SigningError("copy-version-mismatch", f"{src[:200]}: its version or text is not the manifest's")
    return src, text, citation


def check_copy_state(raw: Any) -> dict[str, Any]:
    """The ``copy_state`` of a host's ``_session_proof`` (specs/session.md §4.2), checked:
    ``{"granted": bool, "stamp": 32 lowercase hex, "until": RFC 3339 UTC | None}``.

    Raises:
        ProtocolViolation: ``copy-state-invalid`` for any other shape (the session goes on;
            the state is ignored).
    """
    from node.common.grants import until_time

    if (not isinstance(raw, dict) or set(raw) != {"granted", "stamp", "until"}
            or not isinstance(raw["granted"], bool) or not isinstance(raw["stamp"], str)
            or len(raw["stamp"]) != 32 or not set(raw["stamp"]) <= _HEX):
        raise ProtocolViolation("copy-state-invalid", "the host's copy_state is not {granted, stamp, until}")
    if raw["until"] is not None:
        try:
            until_time(raw["until"])
        except KithError:
            raise ProtocolViolation("copy-state-invalid", "the host's copy_state has a bad until") from None
    return {"granted": raw["granted"], "stamp": raw["stamp"], "until": raw["until"]}
