"""The host side of copies a peer may keep (issue 33; specs/copies.md is normative).

A peer granted a copy (``[[copy]]`` in policy.toml, :meth:`node.policy.store.Policy.copy_allowed`)
pulls, over an ordinary knowledge-query session, first the **manifest** — one entry
``{source, version, bytes, textSha256}`` per document it may keep — then the documents
that changed, a batch at a time. :class:`CopyServer` answers both for one peer view:

- only ``done`` documents whose canonical id the peer may keep (a grant in force covers it
  and its tier is ``public`` or ``peers`` for the peer); anything else asked for is listed
  in ``refused``, never sent;
- the text is the document as indexed (:meth:`node.corpus.store.Corpus.document_text`)
  scrubbed of the kinds the policy scrubs from it for that peer
  (:meth:`node.policy.store.Policy.scrub_kinds`, :func:`node.common.scrub.scrub`): the copy
  holds what the peer could be served, never more;
- each document carries a ``kith-citation-v1`` citation (the same object and payload a
  signed search result carries, node/answer/citation.py) over the whole text: span
  ``chars=[0, len]``, ``version`` the document version this peer is given (the keyed
  version of the content hash, or for a document its lens scrubs something from, the
  keyed version of the scrubbed text: :func:`node.answer.citation.scrubbed_version`, so an
  edit of a value scrubbed for the peer changes nothing it holds or is told),
  ``textSha256`` of the text sent — so :func:`node.answer.citation.verify_citation` is the
  peer's check, and ``kith verify --against-host`` can ask whether a version is current;
- the manifest says the grant's byte budget; a copy over it is ``copy-over-budget``
  (nothing is sent).

Nothing here does network I/O; the hooks (protocols/knowledge-query/hooks.py) call it
through ``ctx.knowledge.copy_manifest`` / ``copy_documents``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from node.answer.citation import (CITATION_VERSION, keyed_version, load_version_key, payload_of, scrubbed_version,
                                   text_digest)
from node.trust import signing
from node.common.kept import keep

#: Most documents one ``copy_fetch`` may name (spec.json bounds it the same).
MAX_FETCH = 64
#: Most manifest entries one answer holds (spec.json bounds it the same); a peer granted
#: more documents gets the first ones by source id and ``truncated: true``.
MAX_MANIFEST = 20000
#: Bytes of a ``copy_docs`` message outside its documents' texts and citations.
DOCS_OVERHEAD_BYTES = 4096
#: Peers whose copyable set is kept decided at once (more: all are decided again).
MAX_KEPT_PEERS = 256


class CopyServer:
    """Answers one host's copy requests (module docstring).

    Args:
        corpus: the host's read-only :class:`node.corpus.store.Corpus` (or None: nothing to copy).
        gate: the :class:`node.policy.gate.EgressGate` (its current policy decides).
        home: the host home (its ``citation.key`` is created on the first copy when missing).
        secret: the host identity's 32-byte Ed25519 seed (signs every document).
        now: ``() -> RFC 3339 UTC`` (the host's clock).
        max_message_bytes: the protocol's longest message; a batch of documents stays under it.
    """

    def __init__(self, corpus: Any, gate: Any, home: Path, secret: bytes, now: Callable[[], str],
                 *, max_message_bytes: int = 8 * 1024 * 1024) -> None:
        self._corpus = corpus
        self._gate = gate
        self._home = home
        self._secret = secret
        self._sign = signing.signer_of(secret)
        self.host_key = signing.public_key_of(secret)
        self._now = now
        self._limit = max_message_bytes
        self._key: bytes | None = None
        self._lock = threading.Lock()
        #: (stored id, content hash, kinds) -> (text, bytes, sha256, {kind: spans scrubbed},
        #: version): the scrubbed text once made
        self._texts: dict[tuple[str, str, frozenset[str]], tuple[str, int, str, dict[str, int], str]] = {}
        #: peer name -> (:meth:`_copyable_key`, what it may keep): decided once per key
        self._copyables: dict[str | None, tuple[tuple[Any, ...], dict[str, tuple[str, str]]]] = {}

    def _version_key(self) -> bytes:
        with self._lock:
            if self._key is None:
                self._key = load_version_key(self._home, create=True)
            assert self._key is not None
            return self._key

    def _copyable_key(self, policy: Any, peer_name: str | None, grants: list[Any]) -> tuple[Any, ...]:
        """What :meth:`_copyable` is a function of: the peer's lens key (policy stamp, its
        groups and overrides in force, the corpus generation:
        :meth:`node.policy.gate.EgressGate.lens_key`), its copy grants in force and the
        corpus roots. The generation is read before the documents, so a key is never
        newer than what is kept under it."""
        return (self._gate.lens_key(policy, peer_name, self._corpus.generation()),
                tuple((c.glob, c.recipient, c.until) for c in grants), tuple(self._corpus.roots()))

    def _copyable(self, peer_name: str | None) -> tuple[Any, dict[str, tuple[str, str]]]:
        """``(policy, {canonical id: (stored id, content hash)})`` of what the peer may keep,
        decided once per :meth:`_copyable_key` (a manifest and each batch of a sync ask
        for it: one decision of every document, not one per request)."""
        from node.corpus.sources import SourceNormalizer

        policy = self._gate.current_policy()
        grants = policy.copy_grants_for(peer_name)
        if self._corpus is None or not grants:
            return policy, {}
        key = self._copyable_key(policy, peer_name, grants)
        with self._lock:
            kept = self._copyables.get(peer_name)
        if kept is not None and kept[0] == key:
            return policy, kept[1]
        normalize = SourceNormalizer(self._corpus.roots())
        out: dict[str, tuple[str, str]] = {}
        for stored, content_hash in self._corpus.done_documents():
            canonical = normalize(stored)
            if canonical is not None and policy.copy_allowed(canonical, peer_name) is not None:
                out[canonical] = (stored, content_hash)
        with self._lock:
            keep(self._copyables, peer_name, (key, out), MAX_KEPT_PEERS)
        return policy, out

    def _text(self, policy: Any, peer_name: str | None, canonical: str, stored: str,
              content_hash: str) -> tuple[str, int, str, dict[str, int], str] | None:
        """The text the peer may hold of one document, its UTF-8 bytes, SHA-256 hex, the
        spans scrubbed from it per kind and the version the peer is given of it
        (:func:`node.answer.citation.keyed_version` of the content hash when nothing is
        scrubbed from it for the peer, else :func:`node.answer.citation.scrubbed_version`
        of the scrubbed text: the version a signed search result and a ``check`` name too,
        :class:`node.answer.citation.PeerVersions`)."""
        from node.common.scrub import scrub

        kinds = policy.scrub_kinds(canonical, peer_name)
        key = (stored, content_hash, kinds)
        got = self._texts.get(key)
        if got is None:
            found = self._corpus.document_text(stored)
            if found is None or found[0] != content_hash:
                return None  # re-indexed since the manifest: the next sync sees the new one
            spans: dict[str, int] = {}
            text = scrub(found[1], kinds, spans) if kinds else found[1]
            digest = text_digest(text)
            version_key = self._version_key()
            version = scrubbed_version(version_key, digest) if kinds else keyed_version(version_key, content_hash)
            got = (text, len(text.encode("utf-8", "surrogatepass")), digest, spans, version)
            keep(self._texts, key, got, 50000)
        return got

    def state(self, peer_name: str | None) -> dict[str, Any]:
        """The copy grant state the handshake tells ``peer_name`` (``{"granted", "stamp",
        "until"}``: :meth:`node.policy.store.Policy.copy_state` under the current policy;
        specs/copies.md §5). Cheap: no source is decided."""
        return self._gate.current_policy().copy_state(peer_name)

    def manifest(self, peer_name: str | None) -> dict[str, Any]:
        """The ``copy_manifest`` fields for ``peer_name``: ``status`` (``ok`` or
        ``copy-not-granted`` / ``copy-over-budget``), ``maxBytes`` (the grant's budget or
        None), ``bytes`` (the whole copy's), ``documents`` ``[{source, version, bytes,
        textSha256}]`` by source id, ``truncated``. Never raises for the peer's input."""
        policy, docs = self._copyable(peer_name)
        budget = policy.copy_budget(peer_name)
        if not policy.copy_grants_for(peer_name):
            return {"status": "copy-not-granted", "maxBytes": None, "bytes": 0, "documents": [], "truncated": False}
        entries, total = [], 0
        for canonical in sorted(docs)[:MAX_MANIFEST]:
            stored, content_hash = docs[canonical]
            got = self._text(policy, peer_name, canonical, stored, content_hash)
            if got is None:
                continue
            total += got[1]
            entries.append({"source": canonical, "version": got[4], "bytes": got[1], "textSha256": got[2]})
        status = "ok" if budget is None or total <= budget else "copy-over-budget"
        # over budget the entries are still listed (nothing will be fetched), so the peer
        # can delete what it may no longer hold (specs/copies.md §2)
        return {"status": status, "maxBytes": budget, "bytes": total,
                "documents": entries, "truncated": len(docs) > MAX_MANIFEST}

    def documents(self, peer_name: str | None, sources: list[str],
                  scrubbed: dict[str, int] | None = None) -> dict[str, Any]:
        """The ``copy_docs`` fields for the sources asked: ``documents`` ``[{source, version,
        text, citation}]`` as many as fit one message (in the order asked), ``refused`` (the
        sources the peer may not keep, or gone), ``more`` (asked, not sent yet: ask again),
        ``tooLarge`` (a document larger than one message; never sent). ``scrubbed``, when
        given, is increased by the spans scrubbed per kind from the documents sent (the
        audit's ``copy-sent`` record; never values)."""
        policy, docs = self._copyable(peer_name)
        signed_at = self._now()
        out: dict[str, Any] = {"documents": [], "refused": [], "more": [], "tooLarge": []}
        room = self._limit - DOCS_OVERHEAD_BYTES
        for source in list(dict.fromkeys(sources))[:MAX_FETCH]:
            if out["more"]:
                out["more"].append(source)
                continue
            found = docs.get(source)
            got = self._text(policy, peer_name, source, *found) if found is not None else None
            if got is None or found is None:
                out["refused"].append(source)
                continue
            text, size, digest, spans, version = got
            cost = 2 * size + 1024  # JSON escaping, the citation
            if cost > self._limit - DOCS_OVERHEAD_BYTES:
                out["tooLarge"].append(source)
                continue
            if cost > room and out["documents"]:
                out["more"].append(source)
                continue
            room -= cost
            citation = {"v": CITATION_VERSION, "hostKey": self.host_key, "source": source,
                        "version": version,
                        "span": {"lines": None, "pages": None, "chars": [0, len(text)]},
                        "textSha256": digest, "signedAt": signed_at}
            citation["signature"] = self._sign(payload_of(citation))
            if scrubbed is not None:
                for kind, n in spans.items():
                    scrubbed[kind] = scrubbed.get(kind, 0) + n
            out["documents"].append({"source": source, "version": citation["version"], "text": text,
                                     "citation": citation})
        return out


__all__ = ["CopyServer", "MAX_FETCH", "MAX_MANIFEST"]
