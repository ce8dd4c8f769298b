"""Signed citations: what a host signs for each served result, and how anyone checks it.

Issue 24 items 1-2; the payload is ``kith-citation-v1`` (``specs/signed-payloads.md`` §4),
the citation object and the verify results are in ``specs/citations.md``.

Host side — :class:`CitationSigner` runs at the egress seam
(:meth:`node.host.connection.Connection.egress`), the last step before a ``results``
frame leaves, so it signs exactly the evidence text that is sent (after every step that may
change it). It signs only when the owner allows it (``kith host --sign-citations``); a
query asking for citations from a host that does not sign gets its results without them and
the message field ``citations: "signing-off"``.

The document version is never the document's hash: it is ``HMAC-SHA256(host secret,
content hash)`` (:func:`keyed_version`) under a 32-byte secret kept in
``<home>/citation.key`` (mode 0600, :func:`load_version_key`), so a guest can neither
confirm a guess of a whole document nor watch its edits; only the host can say whether a
version is still current (:meth:`node.answer.service.AnswerService.check_versions`). A
peer whose lens scrubs something from a document is given a version over the text it
receives instead (:func:`scrubbed_version`, :class:`PeerVersions`), so an edit of a value
scrubbed for it changes no version it sees.

Verifier side — :func:`verify_citation` judges one citation against the result that carries
it; :func:`verify_answer` walks a saved answer (``kith join --json`` lines, ``kith ask``,
MCP or API JSON) and judges every citation in it; :func:`verify_copy_result` judges a
result answered from a copy — the host's signature over the whole copied document, then
the result's text at its ``copySpan`` — against the copy document this home keeps (through
the lookup the caller passes, :func:`node.guest.copies.search.copy_texts`; specs/citations.md
§7). Nothing here does I/O but :func:`load_version_key` and :func:`read_answer`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from node.answer import readable
from node.common.errors import ConfigError, SigningError
from node.common.home import atomic_write
from node.trust import signing
from node.trust.signing import PUBLIC_KEY_HEX_LEN, SHA256_HEX_LEN, SIGNATURE_HEX_LEN, TAG_CITATION
from node.common.kept import keep

#: The citation object's ``v`` (= its payload's domain tag).
CITATION_VERSION = TAG_CITATION
#: ``<home>/citation.key``: the 32-byte secret the document versions are keyed with.
KEY_FILE = "citation.key"
#: The HMAC input's own prefix, so the keyed version of a hash is never another HMAC's.
_VERSION_DOMAIN = b"kith-document-version-v1\n"
#: The HMAC input's prefix of a version over a scrubbed text (:func:`scrubbed_version`).
_SCRUBBED_VERSION_DOMAIN = b"kith-scrubbed-version-v1\n"
#: The ``results`` message field telling the guest what became of ``citations: true``.
SIGNED, SIGNING_OFF = "signed", "signing-off"
#: Largest answer file ``kith verify`` reads (bytes), and citations it judges in one file.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
MAX_CITATIONS = 10_000
#: Deepest a result is looked for in a saved answer; anything deeper is a ``malformed`` row.
MAX_DEPTH = 64
#: Longest source id a citation may name (the source-id bound of a result).
MAX_SOURCE_CHARS = 1024

#: Every verify result, in the order a check finds them (specs/citations.md §3).
RESULTS = {
    "genuine": "signature, span and text verify, and the key is a pinned peer",
    "unpinned-key": "signature and text verify, but the signing key is not a pinned peer",
    "stale": "genuine, but the host says this document version is no longer current",
    "malformed": "the citation is not a kith-citation-v1 object (missing or ill-formed field)",
    "unknown-version": "the citation names a format this verifier does not know",
    "wrong-host": "signed by another key than the host the answer names for this result",
    "span-mismatch": "the result's location or source is not the span that was signed (cut or moved)",
    "wrong-domain": "the signature is over these lines under another signing domain",
    "signed-json": "the signature is over a JSON serialisation, not the citation payload",
    "bad-signature": "the signature does not verify",
    "text-changed": "the evidence text is not the text that was signed",
    "no-citation": "a result without a citation",
    "copy-not-held": "a result from a copy: this home keeps no copy of the document version it cites, "
                     "so its text cannot be checked against the host's signature",
    "unchecked": "--against-host: the host could not say whether this version is current",
}
#: Results that count as verified (``kith verify`` exits 0 only when every row is one).
VERIFIED = frozenset({"genuine"})


# --- the host's secret and keyed versions ----------------------------------------------

def load_version_key(home: Path, *, create: bool) -> bytes | None:
    """The 32-byte document-version secret of ``home`` (``citation.key``, 64 hex).

    Args:
        home: the node home.
        create: make one (random, mode 0600) when missing — ``kith host --sign-citations``.

    Returns:
        The secret, or None when missing and not ``create``.

    Raises:
        ConfigError: ``config-invalid`` when the file is not 64 lowercase hex.
    """
    path = Path(home) / KEY_FILE
    try:
        text = path.read_text("ascii").strip()
    except FileNotFoundError:
        if not create:
            return None
        key = secrets.token_bytes(32)
        atomic_write(path, key.hex().encode() + b"\n", mode=0o600)
        return key
    except (OSError, UnicodeDecodeError):
        raise ConfigError("config-invalid", f"{KEY_FILE} cannot be read") from None
    try:
        return bytes.fromhex(signing.check_hex(text, 64, KEY_FILE))
    except SigningError:
        raise ConfigError("config-invalid", f"{KEY_FILE} is not 64 lowercase hex characters") from None


def keyed_version(key: bytes, content_hash: str) -> str:
    """The document version a citation names for a peer whose lens scrubs nothing from
    the document: HMAC-SHA256 of the document's content hash (as indexed) under the host
    secret ``key``, 64 lowercase hex (specs/citations.md §2)."""
    return hmac.new(key, _VERSION_DOMAIN + content_hash.encode("ascii", "replace"),
                    hashlib.sha256).hexdigest()


def scrubbed_version(key: bytes, scrubbed_sha256: str) -> str:
    """The document version a citation names for a peer whose lens scrubs some kind from
    the document: HMAC-SHA256 of the SHA-256 hex of the whole document text *as scrubbed
    for that peer* (:func:`text_digest`) under ``key``, 64 lowercase hex — so an edit of
    a value the peer never sees changes no version it is given (specs/citations.md §2)."""
    return hmac.new(key, _SCRUBBED_VERSION_DOMAIN + scrubbed_sha256.encode("ascii", "replace"),
                    hashlib.sha256).hexdigest()


class PeerVersions:
    """The document versions each peer is given (specs/citations.md §2): :func:`keyed_version`
    of the content hash when the peer's lens scrubs nothing from the document, else
    :func:`scrubbed_version` of its whole text scrubbed of those kinds — the text a copy of
    it holds (node/answer/copies.py), so a signed search result, a copy's manifest and a
    ``check`` name one version per peer and document. Thread-safe.

    Args:
        key: the host's document-version secret (:func:`load_version_key`).
        text_of: ``stored source id -> (content hash, text) | None``, the document as
            indexed (:meth:`node.corpus.store.Corpus.document_text`).
        max_kept: scrubbed digests kept (by stored id, content hash and kinds; all are
            dropped when full).
    """

    def __init__(self, key: bytes, text_of: Callable[[str], tuple[str, str] | None], *,
                 max_kept: int = 20000) -> None:
        self.key = key
        self._text_of = text_of
        self._max = max_kept
        self._digests: dict[tuple[str, str, frozenset[str]], str] = {}
        self._lock = threading.Lock()

    def version(self, stored: str, content_hash: str, kinds: frozenset[str]) -> str | None:
        """The version a peer scrubbed of ``kinds`` (empty: none) is given of the document
        stored as ``stored`` at ``content_hash``; None when it cannot be said — the
        document is gone or re-indexed since (its text has another hash), or a detector
        failed on it (fail closed: no version, so no citation and a ``check`` says
        ``unknown``)."""
        from node.common.scrub import ScrubFailed, scrub

        if not kinds:
            return keyed_version(self.key, content_hash)
        at = (stored, content_hash, kinds)
        with self._lock:
            digest = self._digests.get(at)
        if digest is None:
            found = self._text_of(stored)
            if found is None or found[0] != content_hash:
                return None
            try:
                digest = text_digest(scrub(found[1], kinds))
            except ScrubFailed:
                return None
            with self._lock:
                keep(self._digests, at, digest, self._max)
        return scrubbed_version(self.key, digest)


# --- spans ------------------------------------------------------------------------------

_RANGES = ("lines", "pages", "chars")


def span_of(location: Any, chars: tuple[int | None, int | None] | None) -> dict[str, Any]:
    """The span of a result: ``{"lines": [a, b] | None, "pages": [a, b] | None,
    "chars": [a, b] | None}`` from its ``provenance.location`` (``lineStart``/``lineEnd``,
    ``page``/``pageEnd``, 1-based inclusive) and the chunk's character offsets in the
    normalised document text (``[start, end)``; None on a record indexed before offsets
    were kept)."""
    loc = location if isinstance(location, dict) else {}

    def pair(a: Any, b: Any) -> list[int] | None:
        if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool):
            return [a, b]
        return None

    c = chars or (None, None)
    return {"lines": pair(loc.get("lineStart"), loc.get("lineEnd")),
            "pages": pair(loc.get("page"), loc.get("pageEnd")),
            "chars": pair(c[0], c[1])}


def span_text(span: Any) -> str:
    """The span's one canonical line value: ``lines=A-B pages=A-B chars=A-B``, ``-`` for a
    range that is absent (e.g. ``lines=10-42 pages=- chars=1200-2411``).

    Raises:
        SigningError: ``bad-payload-value`` when ``span`` is not an object with exactly
            ``lines``, ``pages`` and ``chars``, each null or two integers ``0 <= a <= b <
            2^53`` (a truncated range such as ``[10]`` fails here).
    """
    if not isinstance(span, dict) or set(span) != set(_RANGES):
        raise SigningError("bad-payload-value", "span must have exactly lines, pages and chars")
    parts = []
    for name in _RANGES:
        r = span[name]
        if r is None:
            parts.append(f"{name}=-")
            continue
        if (not isinstance(r, list) or len(r) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2 ** 53 for v in r)
                or r[0] > r[1]):
            raise SigningError("bad-payload-value", f"span.{name} must be null or [start, end] integers")
        parts.append(f"{name}={r[0]}-{r[1]}")
    return " ".join(parts)


def text_digest(text: str) -> str:
    """SHA-256 hex of the evidence text's UTF-8 bytes (exactly as sent)."""
    return signing.sha256_hex(text.encode("utf-8", "surrogatepass"))


def payload_of(citation: dict[str, Any], *, tag: str = TAG_CITATION) -> bytes:
    """The ``kith-citation-v1`` payload a citation object's fields rebuild.

    Raises:
        SigningError: ``bad-hex`` / ``bad-payload-value`` for a malformed field.
    """
    source = citation.get("source")
    if not isinstance(source, str) or not source or len(source) > MAX_SOURCE_CHARS:
        raise SigningError("bad-payload-value", "source must be a non-empty source id")
    signed_at = citation.get("signedAt")
    if not isinstance(signed_at, str) or not 1 <= len(signed_at) <= 64:
        raise SigningError("bad-payload-value", "signedAt must be an RFC 3339 time")
    return signing.citation_payload(
        host_public_key=citation.get("hostKey"), source=source, version=citation.get("version"),  # type: ignore[arg-type]
        span=span_text(citation.get("span")), text_sha256=citation.get("textSha256"),  # type: ignore[arg-type]
        signed_at=signed_at, tag=tag)


# --- the host side ----------------------------------------------------------------------

class Evidence(NamedTuple):
    """What the host's record says of a served chunk: its document's content hash, the
    chunk's character offsets in the normalised text (None when not recorded) and its
    document's source id as stored (None when not said: only its :func:`keyed_version`
    can be given)."""

    content_hash: str
    char_start: int | None
    char_end: int | None
    source_id: str | None = None


class CitationSigner:
    """Adds signed citations to ``results`` frames at the egress seam.

    Args:
        secret: the host identity's 32-byte Ed25519 seed (signs).
        version_key: the document-version secret (:func:`load_version_key`).
        evidence: ``[chunk ids] → {chunk id: (content hash, char_start, char_end,
            stored source id)}`` (:class:`Evidence` or a plain tuple) from the host's
            corpus (:meth:`node.corpus.store.Corpus.chunk_evidence`); ids it does not
            return get no citation.
        now: ``() → RFC 3339 UTC`` (the host's clock).
        enabled: False — the owner did not pass ``--sign-citations``: asked-for citations
            are answered ``signing-off`` and nothing is signed.
        versions_for: ``peer name | None → version | None``, where ``version`` is
            ``(stored source id | None, content hash) → the version that peer is given |
            None`` (:meth:`node.answer.service.AnswerService.versions_for`: the per-peer
            version of :class:`PeerVersions`); the outer None, or no ``versions_for``,
            means :func:`keyed_version` of the content hash. A result whose version is
            None is sent without a citation.
    """

    def __init__(self, secret: bytes | None, version_key: bytes | None,
                 evidence: Callable[[list[str]], dict[str, Any]], now: Callable[[], str],
                 *, enabled: bool = True,
                 versions_for: Callable[[str | None], Callable[[str | None, str], str | None] | None] | None = None,
                 ) -> None:
        self.enabled = bool(enabled and secret is not None and version_key is not None)
        self._sign = signing.signer_of(secret) if self.enabled and secret is not None else None
        self.host_key = signing.public_key_of(secret) if secret is not None else ""
        self._version_key = version_key
        self._evidence = evidence
        self._now = now
        self._versions_for = versions_for

    def rewrite(self, message: dict[str, Any], replying_to: dict[str, Any] | None,
                peer_name: str | None = None) -> dict[str, Any] | None:
        """The ``results`` message with citations (or the ``signing-off`` marker) when the
        query it answers asked ``citations: true``; None when there is nothing to change.
        ``message`` is not modified (a new message, envelope and result objects).
        ``peer_name`` is the pinned name of the peer it goes to (None: anonymous): each
        version is the one that peer is given (``versions_for``). A result that cannot be
        cited (its chunk is gone from the record, its version cannot be said, or its source
        id holds a line break, which no payload line may) is sent without a citation; this
        never raises for the content of a result."""
        if (message.get("action") != "results" or not isinstance(replying_to, dict)
                or replying_to.get("citations") is not True):
            return None
        if not self.enabled:
            return {**message, "citations": SIGNING_OFF}
        envelope = message.get("envelope")
        results = envelope.get("results") if isinstance(envelope, dict) else None
        if not results:
            return {**message, "citations": SIGNED}
        found = self._evidence([r["id"] for r in results if isinstance(r.get("id"), str)])
        version_of = self._versions_for(peer_name) if self._versions_for is not None else None
        at = self._now()
        cited = []
        for r in results:
            ev = found.get(r.get("id")) if isinstance(r.get("id"), str) else None
            try:
                if ev is None:
                    cited.append(r)
                    continue
                ev = Evidence(*ev)
                version = version_of(ev.source_id, ev.content_hash) if version_of is not None else None
                if version_of is not None and version is None:
                    cited.append(r)  # no version can be said of it for this peer: uncited
                    continue
                cited.append({**r, "citation": self.cite(r, ev, at, version)})
            except (SigningError, KeyError, TypeError):  # e.g. a source id with a line break:
                cited.append(r)  # that result goes uncited, the answer still leaves
        return {**message, "citations": SIGNED, "envelope": {**envelope, "results": cited}}

    def cite(self, result: dict[str, Any], ev: Evidence, signed_at: str,
             version: str | None = None) -> dict[str, Any]:
        """The citation object of one result (specs/citations.md §1): the text signed is
        the result's ``textPreview`` exactly as sent; ``version`` the document version the
        peer is given (default :func:`keyed_version` of ``ev.content_hash``).

        Raises:
            SigningError: from :func:`node.trust.signing.citation_payload` (a source id
                with a line break cannot be cited).
        """
        assert self._sign is not None and self._version_key is not None
        prov = result.get("provenance")
        span = span_of(prov.get("location") if isinstance(prov, dict) else None,
                       (ev.char_start, ev.char_end))
        citation = {"v": CITATION_VERSION, "hostKey": self.host_key, "source": result["source"],
                    "version": version or keyed_version(self._version_key, ev.content_hash), "span": span,
                    "textSha256": text_digest(result.get("textPreview") or ""), "signedAt": signed_at}
        citation["signature"] = self._sign(payload_of(citation))
        return citation


# --- the verifier side ------------------------------------------------------------------

class Row(NamedTuple):
    """One verify row (``kith verify`` prints one per cited result)."""

    result: str
    source: str | None
    host_key: str | None
    version: str | None
    peer: str | None
    person: str | None
    detail: str
    where: str
    #: None for a result's own citation; for a result from a copy (judged by
    #: :func:`verify_copy_result`) the time the host signed the copied document when it
    #: verified, else ``""``.
    copy: str | None = None

    def as_json(self) -> dict[str, Any]:
        """``{"result", "source", "hostKey", "version", "peer", "person", "detail", "where"}``,
        and for a result from a copy ``fromCopy: true`` and ``copySignedAt`` (the signed
        time of the copied document, null unless it verified)."""
        out = {"result": self.result, "source": self.source, "hostKey": self.host_key,
               "version": self.version, "peer": self.peer, "person": self.person,
               "detail": self.detail, "where": self.where}
        if self.copy is not None:
            out.update(fromCopy=True, copySignedAt=self.copy or None)
        return out


#: ``host key → (pinned peer name, person key or None)``, or None when not pinned.
KnownKey = Callable[[str], "tuple[str, str | None] | None"]
#: ``(host key, source id) → (text, textSha256 its manifest lists) | None``: the document
#: this home's copy of that host keeps for that source (:func:`node.guest.copies.search.copy_texts`).
CopyText = Callable[[str, str], "tuple[str, str] | None"]


def _json_variants(citation: dict[str, Any]) -> Iterator[bytes]:
    body = {k: v for k, v in citation.items() if k != "signature"}
    for sort in (True, False):
        for seps in ((",", ":"), (", ", ": ")):
            yield json.dumps(body, sort_keys=sort, separators=seps, ensure_ascii=False).encode("utf-8")
    try:
        import rfc8785

        yield rfc8785.dumps(body)
    except Exception:  # noqa: BLE001 - not canonicalisable: that variant does not apply
        return


def _verifies(key: str, message: bytes, signature: str) -> bool:
    try:
        signing.verify(key, message, signature)
    except SigningError:
        return False
    return True


def verify_citation(citation: Any, *, text: Any, location: Any = None, shown_sources: Any = (),
                    expected_host: str | None = None,
                    known: KnownKey | None = None, where: str = "") -> Row:
    """Judge one citation against the result carrying it (specs/citations.md §3).

    Args:
        citation: the result's ``citation`` value (anything: malformed input is a row).
        text: the result's ``textPreview`` as saved.
        location: the result's location as saved (``provenance.location`` or a merged
            result's ``location``), compared with the signed span; None skips that check.
        shown_sources: the source ids the result shows as saved (its ``source``, its
            ``provenance.sourceId``); each must be the signed ``source``
            (``span-mismatch``: a quote moved to another document).
        expected_host: the key the answer names as this result's host (a merged answer's
            ``peer.key``, a saved join line's ``peer.key``), or None when it names none.
        known: ``key → (peer name, person)`` for pinned peers.
        where: a short pointer into the file (``results[2]``) for the table.

    Returns:
        A :class:`Row` whose ``result`` is a key of :data:`RESULTS`. Never raises.
    """
    if not isinstance(citation, dict):
        return Row("malformed", None, None, None, None, None, "the citation is not an object", where)
    src = citation.get("source") if isinstance(citation.get("source"), str) else None
    key = citation.get("hostKey") if isinstance(citation.get("hostKey"), str) else None
    version = citation.get("version") if isinstance(citation.get("version"), str) else None

    def row(result: str, detail: str | None = None, peer: tuple[str, str | None] | None = None) -> Row:
        return Row(result, src and src[:MAX_SOURCE_CHARS], key and key[:PUBLIC_KEY_HEX_LEN],
                   version and version[:SHA256_HEX_LEN], peer[0] if peer else None,
                   peer[1] if peer else None, detail or RESULTS[result], where)

    v = citation.get("v")
    if v != CITATION_VERSION:
        if isinstance(v, str) and v.startswith("kith-citation-"):
            return row("unknown-version", f"unknown citation format {v[:40]!r}")
        return row("malformed", "no citation format (v) of kith-citation-v1")
    try:
        payload = payload_of(citation)
        signature = signing.check_hex(citation.get("signature"), SIGNATURE_HEX_LEN, "signature")
    except SigningError as exc:
        return row("malformed", exc.message)
    if set(citation) - {"v", "hostKey", "source", "version", "span", "textSha256", "signedAt", "signature"}:
        return row("malformed", "the citation has fields kith-citation-v1 does not define")
    if not isinstance(text, str):
        return row("malformed", "the result carries no evidence text (textPreview)")
    assert key is not None
    if expected_host is not None and expected_host != key:
        return row("wrong-host", f"signed by {key[:16]}…, but the answer names {str(expected_host)[:16]}…")
    if any(isinstance(shown, str) and shown != src for shown in shown_sources):
        return row("span-mismatch", "the result names another source than the one that was signed")
    if location is not None:
        shown = span_of(location, None)
        if (shown["lines"], shown["pages"]) != (citation["span"]["lines"], citation["span"]["pages"]):
            return row("span-mismatch")
    if not _verifies(key, payload, signature):
        # name what the signature IS over, when it is one of the known mistakes
        lines = payload.split(b"\n", 1)[1]
        for tag in signing.DOMAIN_TAGS:
            if tag != TAG_CITATION and _verifies(key, tag.encode() + b"\n" + lines, signature):
                return row("wrong-domain", f"the signature is for the {tag} domain")
        if any(_verifies(key, variant, signature) for variant in _json_variants(citation)):
            return row("signed-json")
        return row("bad-signature")
    if text_digest(text) != citation["textSha256"]:
        return row("text-changed")
    peer = known(key) if known is not None else None
    if peer is None:
        return row("unpinned-key")
    return row("genuine", f"signed by pinned peer {peer[0]}", peer)


_WORD = re.compile(r"[^\W_]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.casefold())


@lru_cache(maxsize=16)
def _readable_words(text: str) -> tuple[str, ...]:
    """The words of ``text``'s readable form (kept for the few documents one answer's
    results from a copy point into)."""
    return tuple(_words(readable.clean(text)))


def _find(hay: tuple[str, ...], need: list[str], start: int, cut: bool) -> int:
    """The first index ``>= start`` where ``need`` occurs in ``hay`` (its last word may be
    a prefix when ``cut``), or -1."""
    m, first, last = len(need), need[0], need[-1]
    for i in range(start, len(hay) - m + 1):
        w = hay[i]
        if m == 1:
            if w == first or (cut and w.startswith(first)):
                return i
            continue
        if w != first:
            continue
        end = hay[i + m - 1]
        if (end == last or (cut and end.startswith(last))) and all(hay[i + k] == need[k] for k in range(1, m - 1)):
            return i
    return -1


def shown_in(preview: str, text: str) -> bool:
    """True when the evidence text ``preview`` (a ``textPreview``: the chunk's readable
    text, :func:`node.answer.readable.clean`, from its best sentence on, cut, with
    :data:`node.answer.readable.ELLIPSIS` where text was left out) is made of ``text``:
    the words of each part between ellipses occur in ``clean(text)`` contiguously, the
    parts in order (the last word before an ellipsis may be cut: a prefix). Words are
    runs of letters and digits, compared case-folded; punctuation, whitespace and markup
    are not compared (the preview joins sentences with its own separators).
    specs/citations.md §7 step 4."""
    hay = _readable_words(text)
    pos = 0
    parts = preview.split(readable.ELLIPSIS)
    for n, part in enumerate(parts):
        need = _words(part)
        if not need:
            continue
        found = _find(hay, need, pos, cut=n < len(parts) - 1)
        if found < 0:
            return False
        pos = found + len(need)
    return True


def char_range(value: Any) -> list[int] | None:
    """``value`` when it is a character range ``[start, end]`` (two integers ``0 <= start
    <= end < 2^53``, as a span's ``chars``), else None."""
    if (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 53 for v in value)
            and value[0] <= value[1]):
        return value
    return None


def verify_copy_result(result: dict[str, Any], *, host: str | None, known: KnownKey | None,
                       copies: CopyText | None, where: str = "") -> Row:
    """Judge a result answered from a copy (it carries ``copyCitation``, the host's
    signature over the whole copied document, and ``copySpan``; specs/citations.md §7):

    1. the copy document this home keeps for (``copyCitation.hostKey``, its ``source``)
       is looked up (``copies``); none, or one of another version (the copy was
       re-synced since) → ``copy-not-held``, unless the citation itself is forged
       (malformed, another host than ``host``, a bad signature: that row);
    2. :func:`verify_citation` of ``copyCitation`` over that document's whole text:
       ``text-changed`` when the document was changed on disk; the host, source and
       signature checks as for any citation;
    3. the signature must cover the whole document (``span.chars == [0, len]``, no lines
       or pages) and ``copySpan`` must be a range of it, else ``span-mismatch``;
    4. :func:`shown_in` (``textPreview``, the text at ``copySpan``): else ``span-mismatch``
       when the preview is made of the document elsewhere, ``text-changed`` when not.

    Args:
        result: the saved result (a merged ``kith ask`` result).
        host: the key the answer names as its host (``peer.key``), or None.
        known: ``key → (peer name, person)`` for pinned peers.
        copies: the copy documents of this home (None: none are kept).
        where: the result's place in the file.

    Returns:
        A :class:`Row` with ``copy`` set. Never raises.
    """
    citation = result.get("copyCitation")
    prov = result.get("provenance")
    shown = (result.get("source"), prov.get("sourceId") if isinstance(prov, dict) else None)
    text = result.get("textPreview")

    def judged(r: Row, detail: str | None = None, signed: bool = False) -> Row:
        if signed:
            return r._replace(detail=detail or r.detail, copy=str(citation.get("signedAt"))[:64])
        return r._replace(detail=f"from a copy: {detail or r.detail}", copy="")

    key = citation.get("hostKey") if isinstance(citation, dict) else None
    src = citation.get("source") if isinstance(citation, dict) else None
    found = None
    if copies is not None and isinstance(key, str) and isinstance(src, str):
        try:
            found = copies(key, src)
        except Exception:  # noqa: BLE001 - an unreadable copy holds nothing to check against
            found = None
    if found is None or found[1] != citation.get("textSha256"):
        probe = verify_citation(citation, text="", shown_sources=shown, expected_host=host, where=where)
        if probe.result not in ("text-changed", "unpinned-key"):  # the signature itself fails
            return judged(probe)
        detail = ("this home keeps no copy of this document from that host" if found is None else
                  "this home's copy now holds another version of this document (re-synced since)")
        return judged(probe._replace(result="copy-not-held"),
                      f"{detail}: the host's signature covers the whole document, so the result's text "
                      "cannot be checked here (verify on the home that asked, or ask again)")
    document = found[0]
    row = verify_citation(citation, text=document, shown_sources=shown, expected_host=host, known=known,
                          where=where)
    if row.result == "text-changed":
        return judged(row, "this home's copy of the document is not the text the host signed (changed on disk)")
    if row.result not in ("genuine", "unpinned-key"):
        return judged(row)
    if citation["span"] != {"lines": None, "pages": None, "chars": [0, len(document)]}:
        return judged(row._replace(result="span-mismatch"), "the host's signature is not over the whole document")
    span = char_range(result.get("copySpan"))
    if span is None or span[1] > len(document):
        return judged(row._replace(result="span-mismatch"), "copySpan is not a character range of the copied document")
    if not isinstance(text, str):
        return judged(row._replace(result="malformed"), "the result carries no evidence text (textPreview)")
    if not shown_in(text, document[span[0]:span[1]]):
        if shown_in(text, document):
            return judged(row._replace(result="span-mismatch"), "the result's text is in the document, but not at copySpan")
        return judged(row._replace(result="text-changed"), "the result's text is not in the document the host signed")
    when = str(citation.get("signedAt"))[:64]
    if row.result == "unpinned-key":
        return judged(row, f"from a copy of {when}: the signature over the whole document and the result's words "
                           "at copySpan verify, but the signing key is not a pinned peer", signed=True)
    return judged(row, f"that host's, from a copy of {when}: signed by pinned peer {row.peer} over the whole "
                       "document; the result's words are in it at copySpan", signed=True)


def _host_of(obj: dict[str, Any], inherited: str | None) -> str | None:
    """The host key ``obj``'s ``peer`` names: its ``device.key`` for a person pin's answer
    (the device that answered signs, specs/peers.md §13), else its ``key``."""
    peer = obj.get("peer")
    if isinstance(peer, dict):
        device = peer.get("device")
        if isinstance(device, dict) and isinstance(device.get("key"), str):
            return device["key"]
        if isinstance(peer.get("key"), str):
            return peer["key"]
    return inherited


#: Stands for evidence an agent reads that cannot be checked (:func:`_results`).
_UNREADABLE_FENCE = {"detail": "a fenced block of peer evidence that cannot be read (its fence lines "
                               "or its JSON were changed): what an agent reads is not checked"}
_FORGED_FENCE = {"detail": "the merged answer's fence text is not its results' text"}
_TOO_DEEP = {"detail": "an object nested deeper than the verifier walks: it was not judged"}
_FENCE_BEGIN = "<<<BEGIN UNTRUSTED PEER EVIDENCE "


def _results(node: Any, where: str, host: str | None, depth: int = 0) -> Iterator[tuple[dict[str, Any], str, str | None]]:
    """Every result object (a dict with ``textPreview`` and ``source``) under ``node``,
    with its path and the host key its nearest enclosing ``peer.key`` names. A string
    holding a JSON object (an MCP tool answer's ``content[].text``, also inside the fence
    of :func:`node.answer.fence.fenced`) is looked into; a fenced block that cannot be
    read, or a merged answer's ``fence`` that is not its results' text, yields a marker
    (:data:`_UNREADABLE_FENCE`, :data:`_FORGED_FENCE`) that :func:`verify_answer` makes a
    ``malformed`` row, as is an object or list deeper than :data:`MAX_DEPTH`
    (:data:`_TOO_DEEP`)."""
    if depth > MAX_DEPTH:
        if isinstance(node, (dict, list)) or (isinstance(node, str) and node[:1] in ("{", "<")):
            yield _TOO_DEEP, where, host
        return
    if isinstance(node, str):
        fenced_block = node.startswith(_FENCE_BEGIN)
        if fenced_block:  # an MCP answer's fenced peer evidence
            from node.answer.fence import unfenced

            node = (unfenced(node) or "") if len(node) <= MAX_ANSWER_BYTES else ""
        if node[:1] == "{" and len(node) <= MAX_ANSWER_BYTES:
            try:
                inner = json.loads(node)
            except ValueError:
                inner = None
            if isinstance(inner, (dict, list)):
                yield from _results(inner, where, host, depth + 1)
                return
        if fenced_block:
            yield _UNREADABLE_FENCE, where, host
        return
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _results(item, f"{where}[{i}]", host, depth + 1)
        return
    if not isinstance(node, dict):
        return
    host = _host_of(node, host)
    if isinstance(node.get("source"), str) and "textPreview" in node:
        yield node, where, host
        return
    for k, v in node.items():
        if k in ("citationPack", "answerSynthesis", "eventAggregation", "queryPlan", "fence"):
            continue  # copies of the results' own text: judged once, on the result
        yield from _results(v, f"{where}.{k}" if where else str(k), host, depth + 1)
    if "fence" in node and isinstance(node.get("results"), list):  # a merged (kith-ask) answer
        from node.answer.fence import merged_fence_holds

        if not merged_fence_holds(node["fence"], node["results"]):
            yield _FORGED_FENCE, f"{where}.fence" if where else "fence", host


def verify_answer(answer: Any, *, known: KnownKey | None = None, copies: CopyText | None = None) -> list[Row]:
    """Judge every result of a saved answer (one JSON value or a list of JSON lines).

    A result answered from a copy (it carries ``copyCitation``) is judged against this
    home's copy document (``copies``; :func:`verify_copy_result`); a result without a
    citation is a ``no-citation`` row. At most :data:`MAX_CITATIONS`
    results are judged; when there are more, one last ``malformed`` row says the rest
    were not (so the answer is not verified). Never raises."""
    rows: list[Row] = []
    for result, where, host in _results(answer, "", None):
        if len(rows) >= MAX_CITATIONS:
            rows.append(Row("malformed", None, None, None, None, None,
                            f"more than {MAX_CITATIONS:,} results: the rest were not judged", where))
            break
        if result is _UNREADABLE_FENCE or result is _FORGED_FENCE or result is _TOO_DEEP:
            rows.append(Row("malformed", None, None, None, None, None, result["detail"], where))
            continue
        if "copyCitation" in result and result.get("copyCitation") is not None:
            rows.append(verify_copy_result(result, host=host, known=known, copies=copies, where=where))
            continue
        if "citation" not in result:
            rows.append(Row("no-citation", result["source"][:MAX_SOURCE_CHARS], None, None, None, None,
                            RESULTS["no-citation"], where))
            continue
        prov = result.get("provenance")
        location = prov.get("location") if isinstance(prov, dict) else result.get("location")
        rows.append(verify_citation(result["citation"], text=result.get("textPreview"),
                                    location=location if isinstance(location, dict) else None,
                                    shown_sources=(result.get("source"),
                                                   prov.get("sourceId") if isinstance(prov, dict) else None),
                                    expected_host=host, known=known, where=where))
    return rows


def read_answer(path: Path) -> Any:
    """Read a saved answer file: one JSON value, or JSON lines (``kith join --json``).

    Raises:
        ConfigError: ``file-not-found``; ``answer-invalid`` for a file larger than
            :data:`MAX_ANSWER_BYTES`, not UTF-8, or not JSON (naming the line).
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_ANSWER_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("file-not-found", f"{path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError("answer-invalid", f"{path} is a folder, not an answer file") from None
    except OSError as exc:
        raise ConfigError("io-error", f"{path} cannot be read ({exc.strerror or type(exc).__name__})") from None
    return parse_answer(data, str(path))


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return out


def parse_answer(data: bytes, name: str = "the answer") -> Any:
    """:func:`read_answer` for bytes already read (the API's and MCP's ``verify``).
    A leading UTF-8 byte-order mark is skipped.

    Raises:
        ConfigError: ``answer-invalid`` as :func:`read_answer`, and for an object with
            a duplicate key (a reader keeping the first value would show what was not
            verified).
    """
    if len(data) > MAX_ANSWER_BYTES:
        raise ConfigError("answer-invalid", f"{name} is larger than {MAX_ANSWER_BYTES // (1024 * 1024)} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("answer-invalid", f"{name} is not UTF-8 text") from None
    text = text.removeprefix("\ufeff")  # an editor's byte-order mark
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise ConfigError("answer-invalid", f"{name} has a duplicate key {exc.key[:40]!r} in one "
                          "object (readers disagree on which value it holds)") from None
    except ValueError:
        pass
    except RecursionError:
        raise ConfigError("answer-invalid", f"{name} nests JSON too deeply") from None
    values = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line, object_pairs_hook=_unique_keys))
        except _DuplicateKey as exc:
            raise ConfigError("answer-invalid", f"{name} has a duplicate key {exc.key[:40]!r} in one "
                              f"object (line {n}; readers disagree on which value it holds)") from None
        except (ValueError, RecursionError):
            raise ConfigError("answer-invalid", f"{name} is neither JSON nor JSON lines (line {n})") from None
    if not values:
        raise ConfigError("answer-invalid", f"{name} is empty")
    return values


def known_keys(home: Path) -> KnownKey:
    """``key → (pinned name, person)`` from ``home``'s peer registry (a blocked key is not
    known); the person is named when the key is one of this home's own bound devices
    (``person.json``), or when it is a device of a person pin (``--devices``) whose card
    this home keeps (``cards.json``, its chain checked when it was kept; a device the
    person's revocation list kept here names is not known) — that pin's name and person
    key. Raises what :meth:`node.trust.peers.PeerRegistry.load` raises."""
    from node.trust.card import CardStore
    from node.trust.peers import PeerRegistry
    from node.trust.person import load_person
    from node.trust.revocation_list import RevocationStore

    registry = PeerRegistry.load(home)
    try:
        person = load_person(home)
    except Exception:  # noqa: BLE001 - a broken person.json names no person, it fails nothing
        person = None
    devices: dict[str, tuple[str, str]] | None = None  # device key -> (pin name, person key), read once

    def device_of(key: str) -> tuple[str, str] | None:
        nonlocal devices
        if devices is None:
            devices = {}
            try:
                cards, revoked = CardStore.load(home), RevocationStore.load(home)
            except Exception:  # noqa: BLE001 - unreadable cards name no device, they fail nothing
                return None
            for rec in registry.peers.values():
                if not rec.devices or registry.is_blocked(rec.public_key):
                    continue
                for device in cards.devices_of(rec.public_key):
                    if not revoked.revokes(device, [rec.public_key]):
                        devices.setdefault(device, (rec.name, rec.public_key))
        return devices.get(key)

    def known(key: str) -> tuple[str, str | None] | None:
        if registry.is_blocked(key):
            return None
        rec = registry.by_key(key)
        if rec is None:
            return device_of(key)
        owner = person.person_key if person is not None and person.binding_for(key) else None
        return rec.name, owner

    return known


def report(rows: list[Row]) -> dict[str, Any]:
    """The verify document (``kith verify --json``, MCP ``verify``, ``POST /verify``):
    ``{"ok": every row genuine and at least one, "counts": {result: n}, "rows": [...]}``."""
    return {"ok": bool(rows) and all(r.result in VERIFIED for r in rows), "counts": summary(rows),
            "rows": [r.as_json() for r in rows]}


def verify_request(body: Any, known: KnownKey | None, copies: CopyText | None = None) -> dict[str, Any]:
    """Verify the answer of an MCP ``verify`` call or a ``POST /verify`` body:
    ``{"answer": <the saved answer as JSON, or a string of JSON / JSON lines>}``.

    Args:
        known: the home's pinned keys (:func:`known_keys`).
        copies: the home's copy documents (:func:`node.guest.copies.search.copy_texts`).

    Returns:
        :func:`report` of its rows.

    Raises:
        ConfigError: ``answer-invalid`` when ``body`` is not such an object, or its string
            is not a saved answer (:func:`parse_answer`).
    """
    if not isinstance(body, dict) or set(body) != {"answer"}:
        raise ConfigError("answer-invalid", 'the request must be {"answer": <a saved Kith answer>}')
    answer = body["answer"]
    if isinstance(answer, str):
        answer = parse_answer(answer.encode("utf-8", "surrogatepass"), "answer")
    if not isinstance(answer, (dict, list)):
        raise ConfigError("answer-invalid", "the answer must be a saved Kith answer (a JSON object or list)")
    return report(verify_answer(answer, known=known, copies=copies))


def summary(rows: Iterable[Row]) -> dict[str, int]:
    """``{result: count}`` of ``rows``, in :data:`RESULTS` order."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.result] = counts.get(r.result, 0) + 1
    return {k: counts[k] for k in RESULTS if k in counts}


__all__ = ["CITATION_VERSION", "CitationSigner", "Evidence", "KEY_FILE", "MAX_ANSWER_BYTES",
           "RESULTS", "Row", "SIGNED", "SIGNING_OFF", "VERIFIED", "CopyText", "char_range", "keyed_version", "known_keys",
           "load_version_key", "parse_answer", "payload_of", "PeerVersions", "read_answer", "report",
           "scrubbed_version", "shown_in", "span_of", "span_text", "summary", "text_digest", "verify_answer",
           "verify_citation", "verify_copy_result",
           "verify_request"]
