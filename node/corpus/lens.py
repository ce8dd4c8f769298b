"""The lens: what one peer may see of the corpus, as one frozen value (issue 29 item 1;
specs/corpus.md "Views", specs/policy.md §9).

The policy decides; the corpus only reads the answer. A :class:`Lens` is made above the
corpus by the egress gate (:meth:`node.policy.gate.EgressGate.lens`, per folder as
:meth:`~node.policy.gate.EgressGate.decide_many` decides) for one (policy stamp, peer,
corpus generation) and handed down to the corpus search (:meth:`Corpus.search_hits
<node.corpus.store.Corpus.search_hits>`), its views (:mod:`node.corpus.views`), the
answer's screening (:mod:`node.answer.screen`) and version checks. The owner's own
search passes no lens. Everything cached per view is keyed on :attr:`Lens.key`.

Tools and tests that name a view by a predicate make their lens with :func:`lens_of`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

#: No kinds: the source is sent as stored.
NO_KINDS: frozenset[str] = frozenset()


class Lens:
    """One peer's view of the corpus at one generation (immutable).

    Attributes:
        key: what the lens is a function of — the gate's ``(gate token, policy stamp,
            grants in force, peer name, generation)`` (any hashable; :func:`lens_of` makes
            its own). Two lenses with one key are the same lens; every cache of a view
            (visible documents, scrubbed ids) is keyed on it.
        generation: the corpus generation (:func:`node.corpus.views.generation`) the
            lens was decided at: documents indexed later are not in it until a lens of
            the new generation is made.
        visible: the source ids the view may see or be asked about (the ``ask`` tier
            too), as stored and as canonical (NFC) ids.
        scrub: ``source id -> frozenset`` of the kinds (:data:`node.common.scrub.KINDS`)
            scrubbed from that source for this peer (stored and canonical ids; sources
            scrubbed of nothing are absent).
    """

    __slots__ = ("key", "generation", "visible", "scrub")

    key: Hashable
    generation: int
    visible: frozenset[str]
    scrub: Mapping[str, frozenset[str]]

    def __init__(self, key: Hashable, generation: int, visible: Iterable[str],
                 scrub: Mapping[str, frozenset[str]] | None = None) -> None:
        kinds = {s: frozenset(k) for s, k in (scrub or {}).items() if k}
        for name, value in (("key", key), ("generation", int(generation)),
                            ("visible", frozenset(visible)), ("scrub", MappingProxyType(kinds))):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Lens is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("a Lens is immutable")

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lens) and other.key == self.key

    def __repr__(self) -> str:
        return (f"Lens(key={self.key!r}, generation={self.generation}, "
                f"visible={len(self.visible)} ids, scrubbed={len(self.scrub)} ids)")

    @property
    def scrubs(self) -> bool:
        """True when some source of the view is scrubbed of something."""
        return bool(self.scrub)

    def sees(self, source_id: str) -> bool:
        """May the view see ``source_id`` (or be asked about it)?"""
        return source_id in self.visible

    def kinds(self, source_id: str) -> frozenset[str]:
        """The kinds scrubbed from ``source_id`` for this view (empty: none)."""
        return self.scrub.get(source_id, NO_KINDS)


def lens_of(corpus: Any, visible: Callable[[str], bool],
            scrub: Callable[[str], Iterable[str]] | None = None, *, key: Hashable = None) -> Lens:
    """A lens over ``corpus``'s ``done`` documents at its current generation, from a
    predicate (tools, tests, benchmarks; a host's peers get theirs from the gate).

    Args:
        corpus: a :class:`node.corpus.store.Corpus`.
        visible: ``source id -> bool``.
        scrub: ``source id -> kinds`` for the visible ones, or None (nothing scrubbed).
        key: what the lens is keyed on besides the generation (default: the predicate
            and scrub functions themselves — a new function is a new lens).

    Raises:
        CorpusError: ``index-unavailable`` (no record).
    """
    generation, ids = corpus.lens_basis()
    seen = [s for s in ids if visible(s)]
    kinds = {s: frozenset(scrub(s)) for s in seen} if scrub is not None else {}
    return Lens((key if key is not None else (visible, scrub), generation), generation, seen, kinds)


__all__ = ["Lens", "NO_KINDS", "lens_of"]
