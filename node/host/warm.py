"""Views warm before the first question (issue 29 item 4; specs/corpus.md "Views").

A peer is ranked on its own view index (:mod:`node.corpus.views`); building one for a
large corpus takes seconds. A running host therefore builds the views of the peers it
expects — the anonymous guests (unless ``--peers-only`` or ``--presence granted`` keeps
every one out) and every pinned peer in force (a person pin's devices are that pin's
name, so one view serves them all) — at start and again whenever one of
their lenses changes (a ``policy.toml`` change, a sync or watch batch, a grant that
ended, a pin added), in a worker thread, outside the corpus lock (searches go on
meanwhile). At most :data:`node.corpus.views.MAX_VIEWS` distinct views are warmed (the
view cap: more would only evict each other); peers past it are built at their first
question, as before.

Each round is kept as :attr:`ViewWarmer.last` {``peers`` (names warmed, ``None`` for
anonymous), ``views`` (distinct views), ``built`` (indexes built from scratch),
``seconds``}, counted in :attr:`ViewWarmer.rounds` and logged (``kith.host``, info); it
is not a host event (the ``kith host --json`` stream is unchanged). ``kith status`` says
``warming up`` while the views in force are not built — before the first round, and
again after a change until the round it starts is done (:meth:`ViewWarmer.is_warm`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio

from node.runtime.clock import SYSTEM_CLOCK, Clock

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
        on_round: called with each round's report (:attr:`last`); default: logged.
        interval_s: poll period (s).
        anonymous: warm the anonymous guests' view too (False on a host that answers no
            anonymous guest: ``--peers-only``, ``--presence granted``).
    """

    def __init__(self, service: Any, gate: Any, corpus: Any, pinned: Callable[[], list[str]], *,
                 on_round: Callable[[dict[str, Any]], None] | None = None,
                 interval_s: float = WARM_POLL_S, anonymous: bool = True) -> None:
        self.service = service
        self.gate = gate
        self.corpus = corpus
        self.pinned = pinned
        self.on_round = on_round if on_round is not None else _log_round
        self.interval_s = interval_s
        self.anonymous = anonymous
        self._warmed: tuple[Any, ...] | None = None  # the lens keys of the last round
        #: set once a round has warmed every target (the first time; :meth:`is_warm` says
        #: whether the views in force now are built)
        self.warmed = threading.Event()
        #: rounds done, and the last one's report (module docstring)
        self.rounds = 0
        self.last: dict[str, Any] | None = None

    def targets(self) -> list[str | None]:
        """The peers whose views are warmed, in order: anonymous first (when
        :attr:`anonymous`), then the pins in force by name."""
        return ([None] if self.anonymous else []) + sorted(set(self.pinned()))

    def _keys(self, policy: Any, generation: int, targets: list[str | None]) -> tuple[Any, ...]:
        return tuple(self.gate.lens_key(policy, name, generation) for name in targets)

    def is_warm(self) -> bool:
        """Did the last round warm the lenses in force now (the current policy, corpus
        generation and pins)? False before the first round and from a change until the
        round after it is done. Cheap: one ``stat`` of policy.toml, one read of the
        generation, no decision. A corpus that cannot say its generation is not warm."""
        if self._warmed is None:
            return False
        try:
            keys = self._keys(self.gate.current_policy(), self.corpus.generation(), self.targets())
        except Exception:  # noqa: BLE001 - no index, or a closed corpus: not warm
            return False
        return keys == self._warmed

    def warm_once(self) -> dict[str, Any] | None:
        """One round (blocking; run it in a worker thread): when a target's lens changed
        since the last round, build or update the targets' views (at most the view cap of
        distinct ones). Returns the round's report (:attr:`last`), or None (nothing
        changed).

        Raises:
            CorpusError: ``index-unavailable`` (no index yet).
        """
        from node.corpus.views import MAX_VIEWS
        from node.answer.service import PeerView

        policy = self.gate.current_policy()
        generation = self.corpus.generation()
        targets = self.targets()
        keys = self._keys(policy, generation, targets)
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
        report = {"peers": warmed, "views": len(seen),
                  "built": self.corpus.view_builds() - built_before,
                  "seconds": round(time.monotonic() - started, 3)}
        self._warmed, self.last = keys, report
        self.rounds += 1
        self.warmed.set()
        self.on_round(report)
        return report

    async def run(self, clock: Clock = SYSTEM_CLOCK) -> None:
        """Warm at start, then after every change, until cancelled; a failure (no index
        yet, the corpus closed by a quick stop) is logged and tried again next period.

        Args:
            clock: the host's :class:`node.runtime.clock.Clock`; the period
                (:attr:`interval_s`) is waited on it, so a test's
                :class:`~node.runtime.clock.ManualClock` starts the next round.
        """
        while True:
            try:
                # abandoned on cancel: a stopping host does not wait for a build
                await anyio.to_thread.run_sync(self.warm_once, abandon_on_cancel=True)
            except Exception as exc:  # noqa: BLE001 - warming is an optimisation only
                log.debug("could not warm the views: %s", type(exc).__name__)
            await clock.sleep(self.interval_s)


def _log_round(report: dict[str, Any]) -> None:
    if report["built"]:
        log.info("guests' views ready (%d peer(s), %d view(s)): built %d index(es) in %.1f s",
                 len(report["peers"]), report["views"], report["built"], report["seconds"])


__all__ = ["ViewWarmer", "WARM_POLL_S"]
