"""Views warm before the first question (issue 29 item 4; specs/corpus.md "Views").

A peer is ranked on its own view index (:mod:`node.corpus.views`); building one for a
large corpus takes seconds. A running host therefore builds the views of the peers it
expects — the anonymous guests and every pinned peer in force (a person pin's devices
are that pin's name, so one view serves them all) — at start and again whenever one of
their lenses changes (a ``policy.toml`` change, a sync or watch batch, a grant that
ended, a pin added), in a worker thread, outside the corpus lock (searches go on
meanwhile). At most :data:`node.corpus.views.MAX_VIEWS` distinct views are warmed (the
view cap: more would only evict each other); peers past it are built at their first
question, as before.

Each round that built or brought views up to date reports ``views-warmed`` {``peers``
(names warmed, ``null`` for anonymous), ``views`` (distinct views), ``built`` (indexes
built from scratch), ``seconds``}.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio

log = logging.getLogger("kith.host")

#: seconds between two checks of the warmed lenses (one ``stat`` of policy.toml and one
#: read of the corpus generation each)
WARM_POLL_S = 0.5


class ViewWarmer:
    """Keeps the views of a host's expected peers built.

    Args:
        service: the host's :class:`node.answer.service.AnswerService`.
        gate: its :class:`node.policy.gate.EgressGate`.
        corpus: its :class:`node.corpus.store.Corpus`.
        pinned: ``() -> [registry name]``: the pins in force now (the host's peers watcher).
        on_event: the host's event sink (``views-warmed``).
        interval_s: poll period (s).
    """

    def __init__(self, service: Any, gate: Any, corpus: Any, pinned: Callable[[], list[str]], *,
                 on_event: Callable[[dict[str, Any]], None] = lambda _e: None,
                 interval_s: float = WARM_POLL_S) -> None:
        self.service = service
        self.gate = gate
        self.corpus = corpus
        self.pinned = pinned
        self.on_event = on_event
        self.interval_s = interval_s
        self._warmed: tuple[Any, ...] | None = None  # the lens keys of the last round
        #: set once a round has warmed every target (``kith status``: the index is ready)
        self.warmed = threading.Event()

    def targets(self) -> list[str | None]:
        """The peers whose views are warmed, in order: anonymous first, then the pins in
        force by name."""
        return [None, *sorted(set(self.pinned()))]

    def warm_once(self) -> dict[str, Any] | None:
        """One round (blocking; run it in a worker thread): when a target's lens changed
        since the last round, build or update the targets' views (at most the view cap of
        distinct ones). Returns the ``views-warmed`` event it emitted, or None (nothing
        changed).

        Raises:
            CorpusError: ``index-unavailable`` (no index yet).
        """
        from node.corpus.views import MAX_VIEWS
        from node.answer.service import PeerView

        policy = self.gate.current_policy()
        generation = self.corpus.generation()
        targets = self.targets()
        keys = tuple(self.gate.lens_key(policy, name, generation) for name in targets)
        if keys == self._warmed:
            return None
        started = time.monotonic()
        built_before = self.corpus.view_builds()
        seen: set[Any] = set()
        warmed: list[str | None] = []
        for name in targets:
            lens = self.service.lens_for(PeerView(name), policy)
            shape = (lens.visible, frozenset(lens.scrub.items()))
            if shape not in seen and len(seen) >= MAX_VIEWS:
                continue  # past the view cap: built at its first question
            seen.add(shape)
            self.corpus.warm_view(lens)
            warmed.append(name)
        self._warmed = keys
        self.warmed.set()
        ev = {"event": "views-warmed", "peers": warmed, "views": len(seen),
              "built": self.corpus.view_builds() - built_before,
              "seconds": round(time.monotonic() - started, 3)}
        self.on_event(ev)
        return ev

    async def run(self) -> None:
        """Warm at start, then after every change, until cancelled; a failure (no index
        yet, the corpus closed by a quick stop) is logged and tried again next period."""
        while True:
            try:
                # abandoned on cancel: a stopping host does not wait for a build
                await anyio.to_thread.run_sync(self.warm_once, abandon_on_cancel=True)
            except Exception as exc:  # noqa: BLE001 - warming is an optimisation only
                log.debug("could not warm the views: %s", type(exc).__name__)
            await anyio.sleep(self.interval_s)


__all__ = ["ViewWarmer", "WARM_POLL_S"]
