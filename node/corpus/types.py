"""Types shared by the corpus (search), the egress gate and the knowledge-query hooks.

A :class:`Hit` is one retrieved chunk *before* the egress gate: it still knows its real
origin (``root_path``, ``rel_path``) so the gate can check policy and serve-time origin;
only the fields the envelope copies (source id, text preview, location, provenance) may
leave the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Default cap of chunks per document in one result list (stated at the package's root,
#: node/corpus/__init__.py, so that the answer contract reads it without loading this module).
from node.corpus import MAX_PER_DOCUMENT as _MAX_PER_DOCUMENT

MAX_PER_DOCUMENT = _MAX_PER_DOCUMENT


@dataclass(frozen=True)
class Root:
    """A registered source root.

    Attributes:
        prefix: the virtual prefix without slashes, e.g. ``python-docs-3.11`` (DESIGN §10:
            the basename, ``-2``, ``-3``… on collisions; persisted, never renamed).
        path: the real absolute folder (never sent to a peer).
        chunker: chunker name (``recursive`` in the first cut).
        chunk_size: characters per chunk (ceiling).
        chunk_overlap: characters of overlap (ceiling, < chunk_size).
    """

    prefix: str
    path: str
    chunker: str = "recursive"
    chunk_size: int = 1200
    chunk_overlap: int = 150


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk, ordered by ``score`` (descending) then ``chunk_id``.

    Attributes:
        chunk_id: stable chunk identifier (``<doc_id>#<ordinal>``-like, opaque to peers).
        source_id: canonical source id ``/<prefix>/<relative path>`` (DESIGN §1).
        text: the chunk text.
        score: fused score (> 0; a zero-score hit is never returned).
        score_components: per-pass scores, e.g. ``{"bm25": 7.1, "exact": 0.0}``.
        location: citation location, e.g. ``{"lineStart": 10, "lineEnd": 42,
            "headingPath": ["tempfile", "Examples"]}``.
        content_hash: SHA-256 hex of the document's bytes at indexing time.
        indexed_at: RFC 3339 UTC time the document was indexed.
        root_prefix: the root's prefix (``None`` for datasource records).
        rel_path: path relative to the root, ``/``-separated (``None`` for records).
        metadata: optional ``date``, ``project``, ``tags``, ``workType``, ``lifecycle``,
            ``sourceSet``, ``agent`` values.
        origin_id: the canonical source id of the document's origin, resolved once when
            the corpus served it (:meth:`node.corpus.sources.SourceNormalizer.served_file`
            for a file; the normalized source id of an archive member or a datasource
            record); the egress gate decides policy on it instead of resolving the source
            again (:func:`node.corpus.sources.carried_id`). None when the hit was not
            served by the corpus (or its origin has no canonical id): the gate then
            normalizes ``source_id`` itself. Never sent.
        duplicates: other copies of this chunk's exact text in other documents of the
            same search (issue 20 item 6: "also in N other sources"), best first, each a
            full :class:`Hit` that passed the same filters and serve-time checks. The
            corpus fills it (:func:`node.corpus.retrieval.run_search`); for a peer the
            answer service keeps only the copies the gate lets it see. Not counted
            towards the search's ``limit``.
    """

    chunk_id: str
    source_id: str
    text: str
    score: float
    score_components: dict[str, float] = field(default_factory=dict)
    location: dict[str, Any] = field(default_factory=dict)
    content_hash: str = ""
    indexed_at: str = ""
    root_prefix: str | None = None
    rel_path: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    origin_id: str | None = None
    duplicates: list[Hit] = field(default_factory=list)
