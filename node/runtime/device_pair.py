"""Pairing two devices of one person over iroh (``kith device add`` / ``kith device join``;
specs/peers.md §9). The rules of the code are :mod:`node.trust.device_pairing`'s.

Wire (ALPN :data:`PAIR_ALPN`, JSON Lines, one bi-stream per try, lines ≤ 64 KiB):

- new → offering: ``{"action": "pair_hello", "secret", "device_name"}``; the new device's
  key is the QUIC remote id;
- offering → new: ``{"action": "pair_refused", "code"}`` and close, or
  ``{"action": "pair_confirm"}`` (the secret was right; the owner is comparing the words),
  then ``{"action": "pair_bound", "person": <person.json object>}`` once confirmed (or
  ``pair_refused`` ``pairing-not-confirmed``).

The offering device serves one try at a time until a try succeeds, the code expires
(10 minutes) or 3 wrong tries were made. The person key signs the binding only after the
owner confirmed that both devices show the same pairing words.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import anyio

from node.common.errors import ConfigError, KithError, UsageError, error_for
from node.engine.framing import LineFramer, decode_frame, encode_frame
from node.trust.binding import check_device_name
from node.trust.device_pairing import TTL_S, PairingOffer, make_code, new_secret, parse_code
from node.trust.identity import Identity
from node.trust.pairing import pairing_code
from node.trust.person import bind_device, load_person, load_person_secret, person_from_json, person_lock, save_person

PAIR_ALPN = b"kith/device-pair/1"
MAX_LINE = 64 * 1024
#: How long one side waits for the other's next line (the owner may be reading words).
STEP_S = 120.0


def _mode(home: Path, local: bool) -> Any:
    """The pairing endpoint's transport mode: ``--offline`` (``local``), else the home's
    ``[transport]`` table (specs/transport.md §1), never a relay the owner did not choose."""
    from node.transport.modes import mode_from

    return mode_from(offline=local, home=home)


async def _read_line(stream: Any, framer: LineFramer, timeout_s: float) -> dict[str, Any] | None:
    with anyio.move_on_after(timeout_s):
        while True:
            data = await stream.receive()
            if not data:
                return None
            lines = framer.feed(data)
            if lines:
                return decode_frame(lines[0])
    return None


async def offer_device(home: Path, identity: Identity, *, local: bool, on_code: Callable[[str], None],
                       confirm: Callable[[str, str, str], bool], clock: Callable[[], float] = time.monotonic
                       ) -> dict[str, Any]:
    """Offer a one-time code and bind the device that presents it (``kith device add``).

    Args:
        on_code: called once with the code to carry to the new device.
        confirm: ``(words, device_name, device_key)`` → True when the owner confirms the
            new device shows the same words (called in a worker thread).

    Returns:
        the new device link.

    Raises:
        ConfigError: ``device-no-person-key`` on a device that does not hold the person key.
        KithError: ``pairing-expired``, ``pairing-too-many-tries``, ``pairing-not-confirmed``,
            ``pairing-person-rotated`` (the person key was rotated while the pairing waited).
    """
    from node.transport.iroh import bind_node

    rec, secret_seed = load_person(home), load_person_secret(home)
    if rec is None or secret_seed is None:
        raise ConfigError("device-no-person-key")
    offer = PairingOffer(new_secret(), clock())
    async with bind_node(identity.secret, PAIR_ALPN, mode=_mode(home, local)) as node:
        on_code(make_code(offer.secret, node.ticket()))
        while True:
            left = TTL_S - (clock() - offer.created)
            conn = None
            with anyio.move_on_after(max(0.0, left)):
                conn = await node.accept()
            closed = offer.state(clock())
            if conn is None or closed is not None:
                raise error_for(closed or "pairing-expired")
            try:
                stream = await node.accept_stream(conn, timeout_s=10.0)
            except KithError:
                continue
            try:
                link = await _serve_try(home, rec, secret_seed, identity, offer, stream, confirm, clock)
            finally:
                await stream.aclose()
            if link is not None:
                return link
            closed = offer.state(clock())
            if closed is not None:
                raise error_for(closed)


def _revoked_own(home: Path, device_key: str) -> bool:
    """Has this home's person revoked ``device_key`` (its own revocation list)?"""
    from node.trust.person import own_revocation

    kept = own_revocation(home)
    return kept is not None and device_key in kept.get("revoked", ())


async def _serve_try(home: Path, rec: Any, secret_seed: bytes, identity: Identity, offer: PairingOffer, stream: Any,
                     confirm: Callable[[str, str, str], bool], clock: Callable[[], float]) -> dict[str, Any] | None:
    remote = stream.remote_id or ""

    async def refuse(code: str) -> None:
        await stream.send(encode_frame({"action": "pair_refused", "code": code}))
        await stream.send_eof()

    try:
        hello = await _read_line(stream, LineFramer(MAX_LINE), 10.0)
    except KithError:
        hello = None
    if not isinstance(hello, dict) or hello.get("action") != "pair_hello" or set(hello) != {
            "action", "secret", "device_name"}:
        await refuse("pairing-code-wrong")
        offer.wrong += 1  # a malformed try counts like a wrong one
        return None
    verdict = offer.try_secret(hello["secret"], clock())
    if verdict is not None:
        await refuse(verdict)
        return None
    try:
        name = check_device_name(hello["device_name"])
    except KithError:
        await refuse("pairing-bad-name")
        return None
    if remote == identity.public_key or _revoked_own(home, remote):
        await refuse("pairing-device-known")
        return None
    words = pairing_code(identity.public_key, remote)
    await stream.send(encode_frame({"action": "pair_confirm"}))
    ok = await anyio.to_thread.run_sync(confirm, words, name, remote, abandon_on_cancel=True)
    if not ok:
        await refuse("pairing-not-confirmed")
        raise error_for("pairing-not-confirmed")
    # the record as it is now, not as it was when `device add` started: a rotation or another
    # pairing meanwhile is kept (and a rotation refuses this one: its words were the old key's)
    with person_lock(home):
        now, seed = load_person(home), load_person_secret(home)
        if now is None or seed is None or now.person_key != rec.person_key or seed != secret_seed:
            await refuse("pairing-person-rotated")
            raise error_for("pairing-person-rotated")
        if _revoked_own(home, remote):
            await refuse("pairing-device-known")
            raise error_for("pairing-device-known")
        # a device bound already (its first pairing's answer never reached it: killed, cut off)
        # gets its binding again, once the owner confirmed the words; nothing new is signed
        link = now.binding_for(remote)
        if link is None:
            link = bind_device(now, seed, remote, name)
            save_person(home, now)
    await stream.send(encode_frame({"action": "pair_bound", "person": now.as_json()}))
    await stream.send_eof()
    return link


async def join_device(home: Path, identity: Identity, code: str, device_name: str, *, local: bool,
                      on_words: Callable[[str], None],
                      on_waiting: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Present a code to the offering device and keep the binding it signs
    (``kith device join CODE``).

    Args:
        on_words: called with the pairing words once the secret was accepted (show them:
            the owner compares them with the offering device's).
        on_waiting: called with one sentence each time this side starts waiting for the
            other device — connecting to it, for it to check the code, for its owner to
            confirm the words — naming it by its key and saying how long it may take.

    Returns:
        ``{"person_key", "device_name", "seq"}`` of the new binding.

    Raises:
        UsageError: ``pairing-code-invalid``.
        ConfigError: ``device-has-person`` when this home already has a person.
        KithError: the offering device's refusal code (``pairing-code-wrong``, …) or
            ``pairing-failed`` when it answered nothing usable.
    """
    from node.transport.iroh import bind_node, ticket_endpoint_id

    secret, ticket = parse_code(code)
    check_device_name(device_name)
    if load_person(home) is not None:
        raise ConfigError("device-has-person")
    try:
        offering = ticket_endpoint_id(ticket)
    except ValueError:
        raise UsageError("pairing-code-invalid") from None
    say = on_waiting or (lambda _line: None)
    other = f"the device that printed the code ({offering[:16]}…)"
    async with bind_node(identity.secret, PAIR_ALPN, mode=_mode(home, local)) as node:
        say(f"connecting to {other}…")
        conn = await node.connect(ticket)
        stream = await node.open_stream(conn)
        try:
            if stream.remote_id != offering:
                raise error_for("pairing-failed", "the offering device's key differs from the code's")
            await stream.send(encode_frame({"action": "pair_hello", "secret": secret, "device_name": device_name}))
            framer = LineFramer(MAX_LINE)
            say(f"waiting for {other} to check the code (gives up after {STEP_S:.0f} s)…")
            first = await _read_line(stream, framer, STEP_S)
            if isinstance(first, dict) and first.get("action") == "pair_confirm":
                on_words(pairing_code(identity.public_key, offering))
                say(f"waiting for you to confirm the words on {other} (gives up after {STEP_S:.0f} s)…")
                first = await _read_line(stream, framer, STEP_S)
            return _accept_bound(home, identity, offering, first)
        finally:
            await stream.aclose()


def _accept_bound(home: Path, identity: Identity, offering: str, answer: Any) -> dict[str, Any]:
    from node.common.errors import CODES

    if isinstance(answer, dict) and answer.get("action") == "pair_refused":
        code = answer.get("code")
        raise error_for(code if isinstance(code, str) and code in CODES and code.startswith("pairing-")
                        else "pairing-failed")
    if not isinstance(answer, dict) or answer.get("action") != "pair_bound":
        raise error_for("pairing-failed")
    try:
        rec = person_from_json(answer.get("person"), where="the offering device's answer")
    except ConfigError:
        raise error_for("pairing-failed", "the offering device sent an invalid person record") from None
    mine, theirs = rec.binding_for(identity.public_key), rec.binding_for(offering)
    if mine is None or theirs is None:  # it must bind us, and be a device of that person itself
        raise error_for("pairing-failed", "the answer does not bind this device to the offering device's person")
    save_person(home, rec)
    return {"person_key": rec.person_key, "device_name": mine["device_name"], "seq": mine["seq"]}


__all__ = ["PAIR_ALPN", "join_device", "offer_device"]
