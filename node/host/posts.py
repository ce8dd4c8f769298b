"""The host's posts: which invitations guests may join, until when, and what becomes of them.

:class:`Posts` owns the live posts of one host process (``post_id`` → ``protocol_id``),
their expiry, the failure cap that retires a single-use or file-mode post, republishing
(through :class:`node.community.keeper.PostKeeper` when there is a community server) and
withdrawal on stop. It reads time only through the host's
:class:`node.runtime.clock.Clock`, so expiry is tested by advancing a clock. The session
table (:class:`node.host.sessions.SessionTable`) counts a post's *uses*; this class
decides whether a post can be named at all.

In file mode the live posts are kept in ``<home>/posts.json`` (:data:`POSTS_FILE`; issue
30, specs/invitation.md "Across restarts"): each signed invitation as it was written and
the sessions it admitted, rewritten atomically at each change. A restarted host honours
them again until their own expiry or use count (:meth:`Posts.restore`) and writes the same
document again when it still describes the endpoint (:meth:`Posts.reusable`): nothing is
ever re-signed.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Callable

from node.common.errors import HandshakeError
from node.common.home import atomic_write, read_json_state
from node.common.host_events import PostExpired, PostRetired, Republished
from node.runtime.clock import SYSTEM_CLOCK, Clock, rfc3339, unix_of
from node.host.sessions import MAX_FAILED_HANDSHAKES, is_failure
from node.trust.invitation import Invitation

log = logging.getLogger("kith.host")

#: Expired-and-republished post ids remembered to answer ``handshake-post-expired``.
MAX_EXPIRED_POSTS = 1024
#: On SIGINT/SIGTERM, how long withdrawing the host's posts on the server may take (s).
WITHDRAW_TIMEOUT_S = 3.0
#: Longest wait of the expiry watch between two looks (s).
EXPIRY_LOOK_S = 60.0
#: Where file-mode posts are kept across restarts (under the home).
POSTS_FILE = "posts.json"
#: Posts kept at most (the oldest beyond are no longer honoured, with a warning).
MAX_KEPT_POSTS = 32
#: Largest ``posts.json`` read (bytes): 32 invitations of at most 64 KiB each, and room.
MAX_POSTS_FILE_BYTES = MAX_KEPT_POSTS * 64 * 1024 + 4096


class Posts:
    """The posts one host serves.

    Args:
        keep_in: the home whose :data:`POSTS_FILE` keeps the posts across restarts (file
            mode), or None (a community server's posts are withdrawn at exit instead).
        protocol_id: the protocol every post of this host names.
        server_url: the community server the posts are published on, or None (file mode).
        identity: the host's identity (signs republished posts and withdrawals).
        invite_file: where the current invitation is written (file mode, or with a server
            when ``--invite-file`` is given too), or None.
        max_failures: failed handshakes (any keys) that retire a post when
            ``retire_on_failures``; the host sets that for file mode and for single-use
            posts only: post ids are public in ``browse``, so a stranger must never be able
            to rotate a public multi-use post.
        emit / warn: the host's event sink and owner warning.
        clock: the host's clock.
    """

    def __init__(self, protocol_id: str, *, server_url: str | None, identity: Any,
                 invite_file: Path | None, emit: Callable[[dict[str, Any]], None],
                 warn: Callable[[str], None], clock: Clock = SYSTEM_CLOCK,
                 max_failures: int = MAX_FAILED_HANDSHAKES, retire_on_failures: bool = False,
                 unlisted: bool = False, keep_in: Path | None = None) -> None:
        self.protocol_id = protocol_id
        self.keep_in = keep_in  # the home whose posts.json keeps them across restarts, or None
        self._docs: dict[str, Invitation] = {}  # post_id -> its signed document (kept posts)
        self._uses: dict[str, int] = {}  # post_id -> sessions it admitted (ready), all runs
        self.unlisted = unlisted  # posts on the server are absent from browse (specs/community-api.md)
        self.server_url = server_url
        self.identity = identity
        self.invite_file = invite_file
        self.emit = emit
        self.warn = warn
        self.clock = clock
        self.max_failures = max_failures
        self.retire_on_failures = retire_on_failures
        self.keeper: Any = None
        #: called with each invitation that becomes live (the host's device card follows it)
        self.on_live: Callable[[Invitation], None] = lambda inv: None
        self._live: dict[str, str] = {}
        self._expiry: dict[str, float] = {}
        self._expired: set[str] = set()
        self._retired: set[str] = set()
        self._failures: dict[str, int] = {}
        self._withdrawn = not server_url

    # ------------------------------------------------------------ publishing
    def add(self, inv: Invitation) -> None:
        """``inv`` is published (or written): guests may join it until it expires (and,
        with :attr:`keep_in`, after a restart too)."""
        self._live[inv.post_id] = self.protocol_id
        self._expiry[inv.post_id] = unix_of(inv.expires_at)
        self._docs.setdefault(inv.post_id, inv)
        self._uses.setdefault(inv.post_id, 0)
        self._write(inv)
        self._save()
        self.on_live(inv)

    # ------------------------------------------------------------ across restarts
    def restore(self, table: Any, host_key: str) -> list[dict[str, Any]]:
        """Honour again the posts an earlier run of this host kept in :data:`POSTS_FILE`
        (file mode): each one not expired on this host's clock, not used up, for this
        protocol and this host key, with its use count given back to ``table``
        (:meth:`node.host.sessions.SessionTable.restore_post`).

        Returns:
            ``[{"post_id", "uses", "max_sessions", "expires_at"}]`` of the posts restored.

        Raises:
            ConfigError: ``config-invalid`` for a ``posts.json`` that is not one this host
                wrote (not JSON, another shape, an invitation of another key).
        """
        out: list[dict[str, Any]] = []
        if self.keep_in is None:
            return out
        now = self.clock.time()
        for inv, uses in _load_kept(Path(self.keep_in), host_key):
            limit = inv.max_sessions
            if inv.protocol.protocol_id != self.protocol_id or unix_of(inv.expires_at) <= now \
                    or (limit is not None and uses >= limit) or inv.post_id in self._live:
                continue
            self._live[inv.post_id] = self.protocol_id
            self._expiry[inv.post_id] = unix_of(inv.expires_at)
            self._docs[inv.post_id], self._uses[inv.post_id] = inv, uses
            table.restore_post(inv.post_id, uses, limit)
            out.append({"post_id": inv.post_id, "uses": uses, "max_sessions": limit, "expires_at": inv.expires_at})
        # read only: what expired or was used up meanwhile is dropped from the file when this
        # run publishes (add/reuse), so a start refused later leaves it as it was
        return out

    def reusable(self, fresh: Invitation) -> Invitation | None:
        """A restored post to write again instead of ``fresh`` (a new invitation built but
        not yet added): one whose message, tags and ``max_sessions`` are ``fresh``'s, with
        uses left, and whose ticket names the same relay and addresses as ``fresh``'s —
        it still describes this endpoint (the same kept port, node/transport/port.py).
        The one expiring last; None when there is none."""
        from node.transport.hygiene import ticket_addresses

        try:
            relay, direct = ticket_addresses(fresh.transport_info.ticket)
        except ValueError:
            return None
        best: Invitation | None = None
        for post_id, inv in self._docs.items():
            if not self.joinable(post_id) or (inv.message, inv.tags, inv.max_sessions) != \
                    (fresh.message, fresh.tags, fresh.max_sessions):
                continue
            if inv.max_sessions is not None and self._uses.get(post_id, 0) >= inv.max_sessions:
                continue
            try:
                old_relay, old_direct = ticket_addresses(inv.transport_info.ticket)
            except ValueError:
                continue
            if (old_relay, sorted(old_direct)) == (relay, sorted(direct)) and \
                    (best is None or unix_of(inv.expires_at) > unix_of(best.expires_at)):
                best = inv
        return best

    def reuse(self, inv: Invitation) -> None:
        """Write the restored ``inv`` again (``--invite-file``): the document as signed; it
        is the live one now (``on_live``); :data:`POSTS_FILE` drops what expired or was used
        up since the last run."""
        self._write(inv)
        self._save()
        self.on_live(inv)

    def forget_kept(self) -> list[str]:
        """``kith host --new-invitation``: every restored post is no longer honoured (its
        guests are told ``handshake-unknown-post``). Returns their post ids. The file is
        rewritten when the new invitation is added (:meth:`add`), so a start refused before
        it keeps them."""
        gone = [p for p in list(self._live) if p in self._docs]
        for post_id in gone:
            self._live.pop(post_id, None)
            self._docs.pop(post_id, None)
            self._uses.pop(post_id, None)
        return gone

    def used(self, post_id: str) -> None:
        """A session named ``post_id`` and became ready: one use more, kept at once (a
        restart goes on counting from here)."""
        if post_id in self._docs:
            self._uses[post_id] = self._uses.get(post_id, 0) + 1
            self._save()

    def _save(self) -> None:
        """Rewrite :data:`POSTS_FILE` with the posts a restart may honour (joinable, not
        expired, uses left; at most :data:`MAX_KEPT_POSTS`, the newest) — atomically."""
        if self.keep_in is None:
            return
        now = self.clock.time()
        keep = [(p, inv) for p, inv in self._docs.items()
                if self.joinable(p) and self._expiry.get(p, 0) > now
                and (inv.max_sessions is None or self._uses.get(p, 0) < inv.max_sessions)]
        keep.sort(key=lambda item: item[1].created_at)
        for post_id, _inv in keep[:-MAX_KEPT_POSTS]:
            self.warn(f"more than {MAX_KEPT_POSTS} invitations are live: the oldest, {post_id}, is no longer "
                      "honoured")
            self._live.pop(post_id, None)
        keep = keep[-MAX_KEPT_POSTS:]
        doc = {"version": 1, "posts": [{"invitation": inv.to_dict(), "uses": self._uses.get(p, 0)}
                                       for p, inv in keep]}
        atomic_write(Path(self.keep_in) / POSTS_FILE, _json(doc))

    def keep(self, current: Invitation, make_invitation: Callable[[], Invitation]) -> Any:
        """With a server: start a :class:`node.community.keeper.PostKeeper` for ``current``
        (republishes a consumed or expired post, follows renewals, closes ended sessions).
        Returns the keeper (its ``run`` is the host's to start), or None in file mode."""
        if not self.server_url:
            return None
        from node.community.keeper import PostKeeper

        self.keeper = PostKeeper(self.server_url, self.identity, current, make_invitation=make_invitation,
                                 on_republished=self._republished, on_notice=self._noticed, unlisted=self.unlisted,
                                 clock=self.clock.time, sleep=self.clock.sleep)
        return self.keeper

    def _write(self, inv: Invitation) -> None:
        if self.invite_file is not None:
            atomic_write(Path(self.invite_file), _json(inv.to_dict()), mode=0o644)

    def _republished(self, previous: str, reason: str, fresh: Invitation) -> None:
        self._live.pop(previous, None)  # a consumed/expired post is not joinable here either
        if reason == "expired" and len(self._expired) < MAX_EXPIRED_POSTS:
            self._expired.add(previous)  # still refused as expired, not as unknown
        self.add(fresh)
        self.emit(Republished(post_id=fresh.post_id, previous_post_id=previous, reason=reason,
                              expires_at=fresh.expires_at).to_dict())

    def _noticed(self, ev: dict[str, Any]) -> None:  # the server's word on the post
        if ev["event"] == "post-renewed":  # renewed elsewhere: follow its expiry
            self._expiry[ev["post_id"]] = unix_of(ev["expires_at"])
        elif ev["event"] == "post-ended" and not ev["republish"]:
            self._live.pop(ev["post_id"], None)  # withdrawn: nobody can join it
        self.emit(ev)

    # ------------------------------------------------------------ the handshake's questions
    def joinable(self, post_id: str) -> bool:
        """Is ``post_id`` a live post of this host that is not retired?"""
        return post_id in self._live and post_id not in self._retired

    def protocol_for(self, post_id: str) -> str | None:
        """The ``protocol_id`` a guest naming ``post_id`` must speak, or None (unknown or
        retired post → ``handshake-unknown-post``).

        Raises:
            HandshakeError: ``handshake-post-expired`` for a post past its ``expires_at``
                on this host's clock, or one that expired and was republished.
        """
        protocol = self._live.get(post_id)
        if protocol is None and post_id in self._expired:
            raise HandshakeError("handshake-post-expired", "the invitation expired on this host")
        if protocol is None or post_id in self._retired:
            return None
        if self._expiry.get(post_id, math.inf) <= self.clock.time():
            raise HandshakeError("handshake-post-expired", "the invitation expired on this host")
        return protocol

    def expires_at(self, post_id: str) -> float | None:
        """Unix time (s) ``post_id`` expires, or None."""
        return self._expiry.get(post_id)

    def record_failure(self, post_id: str, code: str) -> None:
        """A handshake that named the live post ``post_id`` failed with ``code``: with
        ``retire_on_failures``, the post's ``max_failures``-th failure (from any keys)
        retires it — a ``post-retired`` event; with a server the keeper withdraws and
        republishes it, in file mode the owner is told to restart."""
        if not is_failure(code) or not self.retire_on_failures or post_id in self._retired:
            return
        self._failures[post_id] = self._failures.get(post_id, 0) + 1
        if self._failures[post_id] < self.max_failures:
            return
        self._retired.add(post_id)
        self._live.pop(post_id, None)
        self._save()
        self.emit(PostRetired(post_id=post_id, reason="too-many-failures").to_dict())
        if self.keeper is not None:
            self.keeper.replace(post_id, "too-many-failures")  # withdrawn, then republished
        else:
            self.warn(f"post {post_id} had {self.max_failures} failed handshakes and is no longer "
                      "honoured; restart `kith host` for a new invitation")

    def retired(self, post_id: str) -> bool:
        """``post_id`` collected ``max_failures`` failed handshakes and is not honoured."""
        return post_id in self._retired

    # ------------------------------------------------------------ what the owner sees
    def listing(self) -> list[dict[str, Any]]:
        """``[{"postId", "server", "expiresAt"}]``: the posts guests may join now (the
        control channel's shape, specs/control.md)."""
        return [{"postId": p, "server": self.server_url,
                 "expiresAt": rfc3339(self._expiry[p]) if p in self._expiry else None}
                for p in self._live if p not in self._retired]

    async def watch_expiry(self) -> None:
        """Say so when a post expires (``post-expired``): with a server the keeper
        republishes it; in file mode no new guest can join any more (refused with
        ``handshake-post-expired``), and the owner is warned once none is left. Runs until
        cancelled; waits on the host's clock."""
        told: set[str] = set()
        while True:
            now = self.clock.time()
            for post_id, at in list(self._expiry.items()):
                if post_id in self._live and post_id not in told and at <= now:
                    told.add(post_id)
                    self.emit(PostExpired(post_id=post_id, expires_at=rfc3339(at)).to_dict())
                    if self.keeper is None and not any(self._expiry.get(p, 0) > now for p in self._live):
                        self.warn("the invitation expired: no new guest can join; restart `kith host` "
                                  "for a new one")
            upcoming = [at - now for p, at in self._expiry.items() if p in self._live and p not in told]
            await self.clock.sleep(min([EXPIRY_LOOK_S] + [max(0.05, t) for t in upcoming]))

    async def withdraw(self) -> None:
        """Withdraw this host's posts on the server (once, bounded by
        :data:`WITHDRAW_TIMEOUT_S`; failures are only logged). A no-op in file mode."""
        if self._withdrawn:
            return
        self._withdrawn = True
        from node.community.keeper import withdraw_posts

        assert self.server_url is not None
        await withdraw_posts(self.server_url, self.identity, list(self._live), timeout_s=WITHDRAW_TIMEOUT_S)

    @property
    def withdrawn(self) -> bool:
        """The posts were withdrawn (or there is no server to withdraw them from)."""
        return self._withdrawn or not self._live


def _json(obj: Any) -> bytes:
    import json

    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


def _load_kept(home: Path, host_key: str) -> list[tuple[Invitation, int]]:
    """The ``(invitation, uses)`` pairs of ``<home>/posts.json`` ([] without the file).

    Raises:
        ConfigError: ``config-invalid``: unreadable, larger than
            :data:`MAX_POSTS_FILE_BYTES`, not ``{"version": 1, "posts": [{"invitation",
            "uses"}]}``, an invitation that does not parse, whose signature does not
            verify (hand-edited) or is of another host key.
    """
    import json

    from node.common.errors import ConfigError, KithError
    from node.trust.invitation import check_binding, parse_invitation

    path = home / POSTS_FILE
    if not path.exists():
        return []

    def bad(why: str) -> ConfigError:
        return ConfigError("config-invalid", f"{POSTS_FILE}: {why}",
                           hint="start `kith host --new-invitation`: it replaces the file and signs a new "
                                "invitation (the old ones are no longer honoured)")
    try:
        too_large = path.stat().st_size > MAX_POSTS_FILE_BYTES
        data = None if too_large else read_json_state(path)
    except (OSError, ConfigError):
        raise bad("not readable JSON") from None
    if too_large:
        raise bad("larger than a host ever writes")
    if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("posts"), list) \
            or set(data) != {"version", "posts"} or len(data["posts"]) > MAX_KEPT_POSTS:
        raise bad('not {"version": 1, "posts": [...]}')
    out: list[tuple[Invitation, int]] = []
    for entry in data["posts"]:
        if not isinstance(entry, dict) or set(entry) != {"invitation", "uses"} \
                or not isinstance(entry["uses"], int) or isinstance(entry["uses"], bool) or entry["uses"] < 0:
            raise bad('a post is not {"invitation": {...}, "uses": N}')
        try:
            inv = parse_invitation(json.dumps(entry["invitation"]))
            check_binding(inv)  # a hand-edited document (a later expires_at) no longer verifies
        except KithError as exc:
            raise bad(f"a kept invitation is not valid ({exc.code})") from None
        if inv.host_public_key != host_key:
            raise bad("a kept invitation is another host's")
        out.append((inv, entry["uses"]))
    return out


__all__ = ["EXPIRY_LOOK_S", "MAX_EXPIRED_POSTS", "MAX_KEPT_POSTS", "POSTS_FILE", "Posts", "WITHDRAW_TIMEOUT_S"]
