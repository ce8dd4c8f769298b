"""Revocation that cuts live sessions (specs/peers.md §5): the running host learns of
``kith peers remove`` / ``kith peers block`` by a cheap ``stat`` of ``peers.json`` and
ends that peer's open sessions with ``session-revoked``.

:class:`PeersWatcher` polls the stamps of
``peers.json`` and ``policy.toml`` (:func:`node.policy.store.file_stamp`, one ``os.stat``
each per :data:`POLL_INTERVAL_S`), diffs the registry and ends the revoked peer's sessions through the host's one session table
(:meth:`node.host.sessions.SessionTable.end_sessions`); pending approvals of a
revoked peer are denied (:func:`cancel_approvals`). New handshakes of a blocked key are
refused by the host's admission predicate (``handshake-peer-blocked``), which re-reads the
registry for every connection, so they never depend on the watcher.

Stolen-device revocation (specs/peers.md §10) takes the same path: a revocation list that
arrives in a handshake (:meth:`PeersWatcher.apply_list`, at once) or lands in
``revocations.json`` (``kith peers import-revocation``, ``kith device revoke``: the same
stat poll) ends the revoked devices' live sessions with ``session-device-revoked``
(``handshake-device-revoked`` to one still in its handshake); new handshakes of a revoked
key are refused by the admission predicate, which reads the store the watcher keeps.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from node.common.errors import ConfigError, KithError, PolicyError
from node.common.host_events import ConfigInvalid, DeviceRevoked, PeerRevoked, PolicyReloaded
from node.policy.store import file_stamp
from node.runtime.clock import SYSTEM_CLOCK, Clock, rfc3339
from node.trust.peers import PEERS_FILE, PeerRegistry, person_pin
from node.trust.revocation_list import REVOCATIONS_FILE, RevocationList, RevocationStore

log = logging.getLogger("kith.revocation")

#: How often the host stats ``peers.json`` and ``policy.toml`` (s): a revocation ends
#: live sessions within about this long (the issue asks for 5 s).
POLL_INTERVAL_S = 0.5
#: How often a host with ``--server`` asks it for its person pins' revocation lists (s).
SERVER_FETCH_S = 60.0


def cancel_approvals(home: Path, peer_key: str) -> list[str]:
    """Deny every pending approval request of ``peer_key`` (a revoked peer's requests
    must not be approvable later). Returns the ids denied."""
    from node.policy.approvals import Approvals

    store = Approvals(home)
    out = []
    for req in store.pending():
        if req.peer_key != peer_key:
            continue
        try:
            store.decide(req.id, False)
        except PolicyError:  # decided meanwhile by `kith approvals`
            continue
        out.append(req.id)
    return out


class PeersWatcher:
    """Polls ``peers.json`` (and ``policy.toml``) while the host runs.

    Args:
        home: the node home.
        sessions: the host's :class:`node.host.sessions.SessionTable`.
        on_event: the host's event sink; gets ``peer-revoked`` {``peer``, ``peer_name``,
            ``cause`` (``removed`` | ``blocked``), ``code``, ``sessions_ended``,
            ``approvals_cancelled``}, ``policy-reloaded`` {``ok``, ``rules`` | ``code``}
            ``config-invalid`` {``file``} (the last good registry or store stays in force)
            and ``device-revoked`` {``person``, ``peer_name``, ``devices``, ``seq``,
            ``via``, ``code``, ``sessions_ended``}.
        interval_s: poll period (s), waited on ``clock``.
        clock: the host's :class:`node.runtime.clock.Clock`: its Unix time is what pins'
            ``until`` is compared with, and :meth:`run` and :meth:`watch_server` sleep on it
            (a test's :class:`~node.runtime.clock.ManualClock` drives the polls).
        own_person: this home's person key (its own list is kept from any device), or None.
        on_devices_revoked: told the keys of newly revoked devices after their sessions
            ended (the command that runs both roles wires the guest's copy ending here:
            specs/copies.md §5), or None.
    """

    def __init__(self, home: Path, sessions: Any, *, on_event: Callable[[dict[str, Any]], None],
                 interval_s: float = POLL_INTERVAL_S, clock: Clock = SYSTEM_CLOCK,
                 own_person: str | None = None,
                 on_devices_revoked: Callable[[list[str]], None] | None = None) -> None:
        self.home = Path(home)
        self.clock = clock
        self.now = clock.time
        self.sessions = sessions
        self.on_event = on_event
        self.on_devices_revoked = on_devices_revoked
        self.interval_s = interval_s
        self._peers_stamp = file_stamp(self.home / PEERS_FILE)
        self._policy_stamp = file_stamp(self.home / "policy.toml")
        self._record_scrub_at_start()
        registry = PeerRegistry.load(self.home)
        self._registry = registry
        self._pinned = {r.public_key: r.name for r in registry.peers.values()}
        self._blocked = set(registry.blocked)
        self._bad_stamp: Any = None
        self.own_person = own_person
        self._rev_stamp = file_stamp(self.home / REVOCATIONS_FILE)
        self._rev_bad_stamp: Any = None
        self._revocations = RevocationStore.load(self.home)

    def revocations(self) -> RevocationStore:
        """The revocation lists kept, as ``revocations.json`` says now (one ``stat``; a list
        imported since the last poll takes effect here, its live sessions ending first); a
        broken file keeps the last good store."""
        self._poll_revocations()
        return self._revocations

    def apply_list(self, checked: RevocationList, *, via: str, registry: PeerRegistry | None = None,
                   lineage: list[str] | None = None) -> dict[str, Any] | None:
        """Take a verified revocation list (one a guest carried, ``via="handshake"``): kept
        when its person is pinned here with ``--devices`` (or is this home's own person) and
        it is newer than the one kept; then the newly revoked devices' live sessions end at
        once. An older list is ignored (the newer stays); a stranger's list is not kept.

        Args:
            lineage: the person keys the carrying chain descends from (newest first,
                :meth:`node.trust.rotation.RotationLedger.lineage`): a list signed by a
                rotated person key is kept when a pin is on any of them (specs/peers.md §11).

        Returns:
            the ``device-revoked`` event emitted, or None (not kept, or nothing new).
        """
        registry = registry or self._registry
        pin = next((p for p in map(lambda k: person_pin(registry, k), lineage or [checked.person]) if p), None)
        if checked.person != self.own_person and pin is None:
            return None
        self._poll_revocations()  # an import meanwhile is not overwritten
        offered = self._revocations.offer(checked, via=via, now=rfc3339(self.sessions.clock.time()))
        self._rev_stamp = file_stamp(self.home / REVOCATIONS_FILE)  # our own write: no second pass
        if offered.outcome != "new":
            return None
        return self._devices_revoked(checked.person, offered.newly_revoked, checked.seq, via, registry, pin, lineage)

    async def watch_server(self, server_url: str, identity: Any, interval_s: float = SERVER_FETCH_S) -> None:
        """With ``kith host --server``: at start and every ``interval_s`` on the clock, fetch the newest
        revocation list of each person pinned with ``--devices`` — of its pinned key and of
        every key this host followed it rotating to — from the community server
        and take it like one carried in a handshake (``via="server"``; checked here, an older
        one ignored). A server that cannot be reached changes nothing. Runs until cancelled."""
        from node.community.client import CommunityClient
        from node.trust.revocation_list import check_list

        from node.trust.rotation import RotationLedger

        while True:
            pins = [r.public_key for r in self._registry.peers.values() if r.devices]
            try:  # a pin on an earlier key: the keys it was rotated to publish the newer lists
                lineages = [RotationLedger.load(self.home).forward(pin)[::-1] for pin in pins]
            except ConfigError:
                lineages = [[pin] for pin in pins]
            if lineages:
                try:
                    async with CommunityClient(server_url, identity) as client:
                        for lineage in lineages:
                            for person in lineage:
                                doc = await client.get_revocation(person)
                                if doc is None:
                                    continue
                                try:
                                    checked = check_list(doc, person=person)
                                except KithError:
                                    log.warning("the server sent a revocation list that does not verify")
                                    continue
                                self.apply_list(checked, via="server", lineage=lineage)
                except KithError as exc:
                    log.info("could not fetch revocation lists: %s", exc.code)
            await self.clock.sleep(interval_s)

    def _devices_revoked(self, person: str, devices: list[str], seq: int, via: str,
                         registry: PeerRegistry, pin: Any = None, lineage: list[str] | None = None
                         ) -> dict[str, Any]:
        from node.trust.peers import persons_of_device

        # a device a pin of this person saw is that person's, chain or not; any other session
        # of the key ends only when its own verified chain names this person (a list speaks
        # for its own person's devices only)
        persons = {person, *(lineage or ()), *((pin.public_key,) if pin else ())}
        n = sum(self.sessions.end_sessions(key, "session-device-revoked", handshake_code="handshake-device-revoked",
                                           message="this device was revoked by its person",
                                           of_persons=None if persons & set(persons_of_device(registry, key))
                                           else persons)
                for key in devices)
        if self.on_devices_revoked is not None:  # copies this home keeps of them go (specs/copies.md §5)
            self.on_devices_revoked(list(devices))
        pin = pin or person_pin(registry, person)
        ev = DeviceRevoked(person=person, peer_name=pin.name if pin else None, devices=list(devices), seq=seq,
                           via=via, sessions_ended=n).to_dict()
        self.on_event(ev)
        return ev

    def _poll_revocations(self) -> None:
        stamp = file_stamp(self.home / REVOCATIONS_FILE)
        if stamp == self._rev_stamp:
            return
        try:
            store = RevocationStore.load(self.home)
        except ConfigError:
            if stamp != self._rev_bad_stamp:
                self._rev_bad_stamp = stamp
                log.warning("%s is not valid; the host keeps the lists it last read", REVOCATIONS_FILE)
                self.on_event(ConfigInvalid(file=REVOCATIONS_FILE).to_dict())
            return
        self._rev_stamp = stamp
        before = self._revocations
        self._revocations = store
        for person, rec in store.persons.items():
            old = set(before.persons.get(person, {}).get("revoked", []))
            new = [k for k in rec["revoked"] if k not in old]
            if new:
                self._devices_revoked(person, new, rec["list"]["seq"], rec.get("via") or "import", self._registry)

    def current(self) -> PeerRegistry:
        """The registry as ``peers.json`` says now, without the pins whose ``until`` has
        passed (:func:`node.trust.peers.pins_in_force`); the last one that loaded when the
        file is broken (a corrupt or half-edited ``peers.json`` never stops the host)."""
        from node.trust.peers import pins_in_force

        try:
            registry = PeerRegistry.load(self.home)
        except ConfigError:
            return pins_in_force(self._registry, self.now())
        self._registry = registry
        return pins_in_force(registry, self.now())

    def known(self) -> PeerRegistry:
        """The registry as last read (by :meth:`current` or a poll), without reading the file:
        what a person's grants are decided on at ``_session_ready``, so a pin removed during
        a handshake that a poll has seen already grants nothing, nor one whose ``until``
        has passed (:func:`node.trust.peers.pins_in_force`)."""
        from node.trust.peers import pins_in_force

        return pins_in_force(self._registry, self.now())

    async def run(self) -> None:
        """Poll every :attr:`interval_s` on the clock until cancelled; never raises for a
        bad file."""
        while True:
            await self.clock.sleep(self.interval_s)
            try:
                self.poll()
            except KithError as exc:  # e.g. approvals unreadable: keep serving
                log.warning("revocation check failed: %s", exc.code)

    def poll(self) -> list[dict[str, Any]]:
        """One check. Returns the ``peer-revoked`` events it emitted (``device-revoked``
        events go to ``on_event`` only)."""
        self._poll_policy()
        self._poll_revocations()
        stamp = file_stamp(self.home / PEERS_FILE)
        if stamp == self._peers_stamp:
            return []
        try:
            registry = PeerRegistry.load(self.home)
        except ConfigError:
            if stamp != self._bad_stamp:  # say so once per broken version of the file
                self._bad_stamp = stamp
                log.warning("%s is not valid; the host keeps the registry it last read", PEERS_FILE)
                self.on_event(ConfigInvalid(file=PEERS_FILE).to_dict())
            return []
        self._peers_stamp = stamp
        self._registry = registry
        pinned = {r.public_key: r.name for r in registry.peers.values()}
        blocked = set(registry.blocked)
        out: list[dict[str, Any]] = []
        for key in sorted(blocked - self._blocked):
            n = self.sessions.end_sessions(key, "session-revoked", handshake_code="handshake-peer-blocked")
            out.append(self._revoked(key, self._pinned.get(key) or registry.blocked[key].name, "blocked",
                                     "session-revoked", n))
        for key, name in sorted(self._pinned.items()):
            if key in blocked or pinned.get(key) == name:
                continue
            # unpinned (or pinned under another name): sessions admitted under the old name end
            n = self.sessions.end_sessions(key, "session-revoked", admitted_as=name)
            out.append(self._revoked(key, name, "removed", "session-revoked", n))
        for key, name in sorted(pinned.items()):
            if key not in self._pinned and key not in blocked:
                # newly pinned: its live anonymous sessions are listed under the name from now
                # on (and a later `peers remove` of that name ends them)
                for token in self.sessions.tokens_of(key):
                    self.sessions.rename(token, name)
        self._pinned, self._blocked = pinned, blocked
        return out

    def _revoked(self, key: str, name: str | None, cause: str, code: str, n: int) -> dict[str, Any]:
        ev = PeerRevoked(peer=key, peer_name=name, cause=cause, code=code, sessions_ended=n,
                         approvals_cancelled=cancel_approvals(self.home, key)).to_dict()
        self.on_event(ev)
        return ev

    def _record_scrub_at_start(self) -> None:
        """Add the policy in force at start to the scrub record (specs/policy.md §9.5), so
        a scrub entry later removed by hand still counts as "once covered"."""
        from node.policy.scrub_coverage import record_scrub
        from node.policy.store import Policy

        try:
            record_scrub(self.home, Policy.load(self.home))
        except KithError:
            pass  # a broken policy is reported by the first poll that sees it change

    def _poll_policy(self) -> None:
        stamp = file_stamp(self.home / "policy.toml")
        if stamp == self._policy_stamp:
            return
        self._policy_stamp = stamp
        from node.policy.store import Policy

        try:
            policy = Policy.load(self.home)
        except KithError as exc:
            self.on_event(PolicyReloaded(ok=False, code=exc.code).to_dict())
            return
        from node.policy.scrub_coverage import record_scrub

        record_scrub(self.home, policy)  # what it scrubs counts as "once covered" (specs/policy.md §9.5)
        self.on_event(PolicyReloaded(ok=True, rules=len(policy.rules)).to_dict())


__all__ = ["PeersWatcher", "POLL_INTERVAL_S", "SERVER_FETCH_S", "cancel_approvals"]
