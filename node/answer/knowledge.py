"""Who an answer is for: the owner's view, a peer's view, and the ``ctx.knowledge``
handle a Host's hooks get for one peer (DESIGN §10; :mod:`node.answer.service` answers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class Knowledge(Protocol):
    """What a Host's hooks get in ``HookContext.knowledge`` (DESIGN §10): the corpus as
    one peer may see it, and nothing else."""

    def search(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one search request (the flat body of DESIGN §8 without ``action`` /
        ``query_id``): ``{"status": str, "envelope": dict, ...}`` (statuses: :mod:`node.answer.service`).
        Never raises for bad input."""
        ...

    def small(self, request: Mapping[str, Any]) -> bool:
        """True when answering ``request`` is known to be small work — the hooks may then
        answer on the host's event loop (node/runtime/hooks.py ``inline``): see
        :meth:`node.answer.inline.InlineCosts.small`. Cheap, never blocks, never raises."""
        ...


@dataclass(frozen=True)
class OwnerView:
    """The node owner's own view: every tier, no quota, no approvals."""


#: The owner's view (one instance; views are compared by type).
OWNER = OwnerView()


@dataclass(frozen=True)
class PeerView:
    """One peer's view.

    Attributes:
        name: the peer's registry name (a person pin's name for each of its devices), or
            None for an anonymous peer (sees ``public`` sources only).
        key: the peer's public key (64 hex): quotas and approvals are per key. None
            (tests, tools) → no quota and no approvals.
    """

    name: str | None
    key: str | None = None


View = OwnerView | PeerView


class Handle:
    """:class:`Knowledge` for one peer view (holds the service privately)."""

    __slots__ = ("__service", "__view")

    def __init__(self, service: Any, view: PeerView) -> None:
        self.__service = service
        self.__view = view

    @property
    def peer_name(self) -> str | None:
        """The peer's registry name (None: anonymous)."""
        return self.__view.name

    @property
    def peer_key(self) -> str | None:
        """The peer's public key (64 hex), or None."""
        return self.__view.key

    def search(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`Knowledge.search` as this peer (the service keeps its CPU time for
        :meth:`small`)."""
        return self.__service.answer(request, self.__view)

    def small(self, request: Mapping[str, Any]) -> bool:
        """:meth:`Knowledge.small` as this peer."""
        return self.__service.inline.small(request, self.__view)

    def check_versions(self, items: Any) -> dict[str, Any]:
        """:meth:`node.answer.service.AnswerService.check_versions` as this peer."""
        return self.__service.check_versions(items, self.__view)

    def copy_manifest(self) -> dict[str, Any]:
        """:meth:`node.answer.service.AnswerService.copy_manifest` as this peer (specs/copies.md §2)."""
        return self.__service.copy_manifest(self.__view)

    def copy_documents(self, sources: Any, scrubbed: dict[str, int] | None = None) -> dict[str, Any]:
        """:meth:`node.answer.service.AnswerService.copy_documents` as this peer (specs/copies.md §3);
        ``scrubbed`` gets the spans scrubbed per kind from what is sent."""
        return self.__service.copy_documents(sources, self.__view, scrubbed)


__all__ = ["Handle", "Knowledge", "OWNER", "OwnerView", "PeerView", "View"]
