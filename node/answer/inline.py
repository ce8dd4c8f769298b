"""Small answers: which peer searches a host may answer on its event loop (issue 31 item 1;
specs/protocols.md §2 ``inline``).

The ``knowledge-query`` host's ``on_message.inline`` asks ``ctx.knowledge.small(request)``
(:meth:`node.answer.knowledge.Handle.small`). A request is small when it is plain
(``query`` and ``topK`` only: a filtered search may go several rounds deeper), its query
is at most :data:`INLINE_QUERY_CHARS` long (the last answer's cost says nothing about a
longer one: a peer could warm its view with a short question and then have 2,000
characters searched on the loop) and the view's last answer cost at most
:data:`INLINE_CPU_S` of CPU under the same lens key
(:meth:`node.policy.gate.EgressGate.lens_key`: policy stamp, grants in force, peer,
corpus generation) — so the view's index is built and current; a first answer, a sync,
a policy change or a grant that ended since is not small. Only *where* an answer runs
depends on it, never what it says.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any

from node.answer.knowledge import PeerView

#: The most CPU time (s) the last answer of a peer view may have cost for the next one
#: of the same shape to count as small.
INLINE_CPU_S = 0.010
#: The longest query (characters) a small request may have. Search CPU grows with the
#: query's terms: over the Python docs a plain question costs ~1 ms, a 2,000-character
#: query of many words 16-23 ms, one of 256 characters at most ~10 ms (as much as a
#: 14-character query of unknown words, whose every pass runs).
INLINE_QUERY_CHARS = 256
#: Request fields a small answer may have: no filters, no budget or dedupe changes.
INLINE_FIELDS = frozenset({"query", "topK"})
#: Peer views whose last answer's cost is kept (oldest dropped).
MAX_WARM_VIEWS = 1024


class InlineCosts:
    """The CPU time of each peer view's last answer and the lens key it was made under.

    Args:
        corpus: the service's :class:`node.corpus.store.Corpus`, or None.
        gate: its :class:`node.policy.gate.EgressGate`, or None (then the key is the
            corpus generation only).
    """

    def __init__(self, corpus: Any, gate: Any) -> None:
        self._corpus = corpus
        self._gate = gate
        self._costs: OrderedDict[PeerView, tuple[Hashable, float]] = OrderedDict()
        self._lock = threading.Lock()

    def state(self, view: PeerView, wait: bool = False) -> Hashable | None:
        """What ``view``'s answer cost depends on besides the request: its lens key now
        (the generation alone without a gate; :meth:`node.corpus.store.Corpus.generation`,
        the published generation's, read without the corpus lock). None when no
        generation is published yet and the lock is busy while ``wait`` is False (an
        event loop never waits for it), or the corpus is broken."""
        try:
            generation = self._corpus.generation(wait) if self._corpus is not None else None
            if generation is None and self._corpus is not None:
                return None
            if self._gate is None:
                return (generation,)
            return self._gate.lens_key(self._gate.current_policy(), view.name, generation)
        except Exception:  # noqa: BLE001 - a closed or broken record: not known to be small
            return None

    def small(self, body: Any, view: PeerView) -> bool:
        """True when answering ``body`` as ``view`` is known to be small work (module
        docstring). Cheap, never blocks (a busy corpus is not small), never raises."""
        try:
            if not isinstance(body, Mapping) or not INLINE_FIELDS.issuperset(body):
                return False
            query = body.get("query")
            if not isinstance(query, str) or len(query) > INLINE_QUERY_CHARS:
                return False
            with self._lock:
                last = self._costs.get(view)
            if last is None or last[1] > INLINE_CPU_S:
                return False
            state = self.state(view)
            return state is not None and state == last[0]
        except Exception:  # noqa: BLE001 - only where the answer runs depends on it
            return False

    def answered(self, view: PeerView, cpu_s: float, made_under: Hashable | None = None) -> None:
        """Keep ``cpu_s``, the CPU seconds of ``view``'s last answer, with the state it
        was made in: ``made_under``, the lens key the answer searched through (a gate's
        :meth:`~node.policy.gate.EgressGate.lens_key`, what :meth:`state` computes), or,
        when None, the state read now (before any generation is published, a worker
        thread waits for the corpus lock; the event loop does not, and forgets the view
        when it is busy)."""
        if made_under is not None and self._gate is not None:
            state: Hashable | None = made_under
        else:
            try:
                asyncio.get_running_loop()
                on_loop = True
            except RuntimeError:
                on_loop = False
            state = self.state(view, wait=not on_loop)
        with self._lock:
            if state is None:
                self._costs.pop(view, None)
                return
            self._costs[view] = (state, cpu_s)
            self._costs.move_to_end(view)
            while len(self._costs) > MAX_WARM_VIEWS:
                self._costs.popitem(last=False)


__all__ = ["INLINE_CPU_S", "INLINE_FIELDS", "INLINE_QUERY_CHARS", "InlineCosts", "MAX_WARM_VIEWS"]
