"""``kith host``'s lines for its events: one function per kind of host event.

The host reports what happens as host events (node/common/host_events.py), the plain
dicts ``serve_host``'s ``on_event`` receives. :class:`HostEventPrinter` is that
``on_event`` for ``kith host``: with ``--json`` it prints the dict as it came, serialised
once, at print time; otherwise it reads the dict as its typed event and calls the one
function :data:`RENDER` holds for that type, which writes the owner's line(s).
"""

from __future__ import annotations

from typing import Any, Callable

import msgspec

from node.cli.common import console, emit_json, err_console, safe_text
from node.common.host_events import (AnyHostEvent, ConfigInvalid, DeviceRevoked, EventPath, GrantExpired,
                                     HostEvent, IndexUpdated, PeerRevoked, PersonDeviceNew, PersonRotated,
                                     PolicyReloaded, PostEnded, PostExpired, PostRenewed, PostRestored,
                                     PostRetired, Republished, SealedTaken, SessionEnded, SessionEvicted,
                                     SessionPathChanged, SessionRefused, SessionStarted)


def path_text(path: EventPath | None) -> str:
    """An event's path for people (``direct (ADDR)``, ``relayed via URL``, ``unknown``)."""
    from node.transport.paths import PathInfo

    if path is None:
        return "unknown"
    return safe_text(PathInfo(path.kind or "unknown", relay_url=path.relay_url, remote=path.remote).describe())


class HostEventPrinter:
    """``kith host``'s ``on_event``: the owner's lines for each host event, or with
    ``json_out`` the event as one JSON line on stdout.

    Args:
        json_out: ``--json``: print each event's dict, nothing else.
        server: the community server the host publishes to (``--server``), or None
            (file mode): the post lines say whether a new post follows.
    """

    def __init__(self, *, json_out: bool, server: str | None) -> None:
        self.json_out = json_out
        self.server = server
        #: unknown guests whose pairing code was printed (once each)
        self.codes_shown: set[str] = set()

    def __call__(self, ev: dict[str, Any]) -> None:
        if self.json_out:
            emit_json(ev)
            return
        try:
            event = msgspec.convert(ev, AnyHostEvent)
        except (msgspec.ValidationError, TypeError):  # not in the table: the closing line, as for an end
            err_console.print(f"session {(ev.get('session_id') or '-')[:12]} ended: {ev.get('code') or ev.get('reason')}")
            return
        RENDER[type(event)](self, event)


# ----------------------------------------------------------------------------- posts (stdout)
def _republished(p: HostEventPrinter, ev: Republished) -> None:
    console.print(f"  new post_id: [bold]{ev.post_id}[/bold]  ({ev.previous_post_id} was {ev.reason};"
                  f" expires {ev.expires_at})")


def _post_ended(p: HostEventPrinter, ev: PostEnded) -> None:
    console.print(f"  post {ev.post_id} {ev.reason}" + ("; republishing" if ev.republish else "; not republishing"))


def _post_renewed(p: HostEventPrinter, ev: PostRenewed) -> None:
    console.print(f"  post {ev.post_id} now expires {ev.expires_at}")


def _post_restored(p: HostEventPrinter, ev: PostRestored) -> None:
    # a post of an earlier run, honoured again (issue 30)
    uses = f"{ev.uses} of {ev.max_sessions}" if ev.max_sessions is not None else str(ev.uses)
    console.print(f"  {'this invitation' if ev.current else 'earlier invitation ' + ev.post_id} "
                  f"is kept from the last run ({uses} session(s) used, expires {ev.expires_at}): "
                  "invitations saved from it keep working" + ("" if not ev.current else
                  "; --new-invitation signs a new one"), highlight=False, markup=False)


# ----------------------------------------------------------------------------- stderr
def _post_retired(p: HostEventPrinter, ev: PostRetired) -> None:
    err_console.print(f"post {ev.post_id} is no longer honoured: {ev.reason}"
                      + (" (a new one replaces it)" if p.server else ""))


def _post_expired(p: HostEventPrinter, ev: PostExpired) -> None:
    err_console.print(f"post {ev.post_id} expired"
                      + ("; republishing" if p.server else "; no new guest can join (restart kith host)"))


def _session_started(p: HostEventPrinter, ev: SessionStarted) -> None:
    who = f"{ev.peer[:16]}…"
    if ev.via_person:  # a device holding a person pin's grants (specs/peers.md §10)
        who = f"{ev.peer_name}'s device {safe_text(ev.device_name or '')!r} ({who})"
    elif ev.person:  # a verified binding chain: the person and this device's name
        who += f" (person {ev.person[:16]}…, device {safe_text(ev.device_name or '')!r})"
    err_console.print(f"session {ev.session_id} started with {who}, path {path_text(ev.path)}",
                      highlight=False, markup=False)
    if ev.peer_name is None and ev.pairing_code and ev.peer not in p.codes_shown:
        p.codes_shown.add(ev.peer)
        err_console.print(f"  unknown guest {ev.peer[:16]}… pairing code: [bold]{ev.pairing_code}[/bold]"
                          " (compare it with the guest's; `kith peers code KEY`)", highlight=False)


def _session_ended(p: HostEventPrinter, ev: SessionEnded) -> None:
    err_console.print(f"session {(ev.session_id or '-')[:12]} ended: {ev.code or ev.reason}")


def _session_refused(p: HostEventPrinter, ev: SessionRefused) -> None:
    why = " (it holds no grant: --presence granted)" if ev.reason == "no-grant" else ""
    err_console.print(f"refused a session from {(ev.peer or '?')[:16]}…: {ev.code}{why}",
                      highlight=False, markup=False)


def _session_evicted(p: HostEventPrinter, ev: SessionEvicted) -> None:
    err_console.print(f"evicted an idle anonymous session of {ev.peer[:16]}… for a newcomer")


def _session_path_changed(p: HostEventPrinter, ev: SessionPathChanged) -> None:
    err_console.print(f"session {ev.session_id[:12]} path changed: {path_text(ev.previous)}"
                      f" -> {path_text(ev.path)}", highlight=False, markup=False)


def _peer_revoked(p: HostEventPrinter, ev: PeerRevoked) -> None:
    who = ev.peer_name or ev.peer[:16] + "…"
    err_console.print(f"{ev.cause} {who}: ended {ev.sessions_ended} session(s), cancelled "
                      f"{len(ev.approvals_cancelled)} pending approval(s)", highlight=False, markup=False)


def _grant_expired(p: HostEventPrinter, ev: GrantExpired) -> None:
    what = {"pin": "the pin of", "group": f"the membership in @{ev.group} of",
            "override": f"the override {safe_text(ev.glob or '')} → {ev.tier} for"}[ev.kind]
    err_console.print(f"{what} {ev.peer_name} ended at {ev.until}: ended {ev.sessions_ended} "
                      "session(s)", highlight=False, markup=False)


def _person_rotated(p: HostEventPrinter, ev: PersonRotated) -> None:
    err_console.print(f"person {ev.old_person[:16]}… rotated to {ev.person[:16]}… ({ev.via} key; "
                      f"seen from device {safe_text(ev.device_name or '')!r}): followed, the old key "
                      "is retired here", highlight=False, markup=False)


def _person_device_new(p: HostEventPrinter, ev: PersonDeviceNew) -> None:
    # a new device of a person pin (specs/peers.md §10)
    err_console.print(f"{ev.peer_name}'s new device {safe_text(ev.device_name)!r} "
                      f"({ev.device[:16]}…)", highlight=False, markup=False)


def _device_revoked(p: HostEventPrinter, ev: DeviceRevoked) -> None:
    who = ev.peer_name or f"person {ev.person[:16]}…"
    err_console.print(f"{who} revoked {len(ev.devices)} device(s) (list {ev.seq}, via {ev.via}): "
                      f"ended {ev.sessions_ended} session(s)", highlight=False, markup=False)


def _policy_reloaded(p: HostEventPrinter, ev: PolicyReloaded) -> None:
    err_console.print("policy.toml changed: " + (f"{ev.rules} rule(s) in force" if ev.ok else
                      f"not valid ({ev.code}); the last good policy stays in force"),
                      highlight=False, markup=False)


def _config_invalid(p: HostEventPrinter, ev: ConfigInvalid) -> None:
    err_console.print(f"{ev.file} is not valid; the host keeps the registry it last read",
                      highlight=False, markup=False)


def _index_updated(p: HostEventPrinter, ev: IndexUpdated) -> None:
    from node.cli.index_cmd import _stamp

    stamp = _stamp()
    for change in ev.changes:
        err_console.print(f"{stamp} index: {change.op} {safe_text(change.source)}", highlight=False, markup=False)
    err_console.print(f"{stamp} index: indexed {ev.indexed}, updated {ev.updated}, removed "
                      f"{ev.removed}, failed {ev.failed + ev.empty}", highlight=False)


def _sealed_taken(p: HostEventPrinter, ev: SealedTaken) -> None:
    dropped = ", ".join(f"{n} {code}" for code, n in sorted(ev.dropped.items()))
    from node.common.names import holder_text

    err_console.print(f"sealed questions at {safe_text(holder_text(ev.holder))}: answered {ev.answered}"
                      + (f", dropped {dropped}" if dropped else ""), highlight=False, markup=False)


#: the table: each host event type -> the one function that prints it
RENDER: dict[type[HostEvent], Callable[[HostEventPrinter, Any], None]] = {
    Republished: _republished, PostEnded: _post_ended, PostRenewed: _post_renewed, PostRestored: _post_restored,
    PostRetired: _post_retired, PostExpired: _post_expired,
    SessionStarted: _session_started, SessionEnded: _session_ended, SessionRefused: _session_refused,
    SessionEvicted: _session_evicted, SessionPathChanged: _session_path_changed,
    PeerRevoked: _peer_revoked, GrantExpired: _grant_expired, PersonRotated: _person_rotated,
    PersonDeviceNew: _person_device_new, DeviceRevoked: _device_revoked, PolicyReloaded: _policy_reloaded,
    ConfigInvalid: _config_invalid, IndexUpdated: _index_updated, SealedTaken: _sealed_taken,
}

__all__ = ["HostEventPrinter", "RENDER", "path_text"]
