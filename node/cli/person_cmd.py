"""``kith person``: this home's person key — show it, rotate it, take a rotated record
(specs/peers.md §11).

``kith person show`` prints the person key, its words (a fingerprint read aloud), the
devices and the rotation history. ``kith person rotate`` makes a successor person key
signed by the old one (or, with ``--recovery``, by the recovery words when the device
holding the person key is lost); every later binding chain carries the rotation, so hosts
follow it on the next handshake. ``kith person import FILE`` takes the rotated record on
the person's other devices. ``kith community identity`` is unrelated: it is this device's
key as the community server knows it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from node.cli.common import (confirm_or_refuse, emit_json, err_console, home_of, stdin_is_terminal, stdin_line,
                             untrusted_console as console, json_option)

person_app = typer.Typer(help="This home's person key (show, rotate, import).", no_args_is_help=True)

_JSON = json_option("Print JSON.")


def person_words(person_key: str) -> str:
    """The five words of a person key alone (the pairing code of the key with itself,
    node/trust/pairing.py): what the owner reads aloud to say which person key is theirs;
    they change with every rotation."""
    from node.trust.pairing import pairing_code

    return pairing_code(person_key, person_key)


def _record(home: Path):
    from node.trust.person import load_person
    from node.trust.rotation import finish_pending_key

    finish_pending_key(home)
    rec = load_person(home)
    if rec is None:
        from node.trust.person import no_record_error

        raise no_record_error(home)
    return rec


def _history(rec) -> list[dict]:
    return [{"from": link["person_key"], "to": link["successor_key"], "created": link["created"],
             "via": "recovery" if link["type"] == "recovery" else "person"} for link in rec.successors]


@person_app.command("show")
def show_cmd(ctx: typer.Context, json_out: bool = _JSON) -> None:
    """Show the person key, its words, this person's devices and its rotations."""
    from node.trust.identity import load_identity
    from node.trust.person import load_person_secret

    home = home_of(ctx)
    rec = _record(home)
    me = load_identity(home).public_key
    from node.trust.revocation_list import device_marks, own_devices

    devices = own_devices(home, rec, me)
    out = {"person_key": rec.person_key, "words": person_words(rec.person_key),
           "holds_person_key": load_person_secret(home) is not None, "devices": devices,
           "rotations": _history(rec), "record": rec.as_json()}
    if json_out:
        emit_json(out)
        return
    console.print(f"person {rec.person_key}", highlight=False, markup=False)
    console.print(f"  words: {out['words']}", highlight=False, markup=False)
    console.print("  this device holds the person key" if out["holds_person_key"] else
                  "  the person key is on another device", highlight=False, markup=False)
    for d in devices:
        console.print(f"  device {d['name']}  {d['key'][:16]}…  binding {d['seq']}{device_marks(d)}",
                      highlight=False, markup=False)
    if not out["rotations"]:
        console.print("  no rotations", highlight=False, markup=False)
    for r in out["rotations"]:
        console.print(f"  rotated {r['from'][:16]}… → {r['to'][:16]}… on {r['created']} (signed by the {r['via']} key)",
                      highlight=False, markup=False)


@person_app.command("rotate")
def rotate_cmd(
    ctx: typer.Context,
    recovery: bool = typer.Option(False, "--recovery", help="Sign the rotation with the 24 recovery words (read from stdin) — when the device holding the person key is lost."),
    without: Optional[List[str]] = typer.Option(None, "--without", metavar="DEVICE", help="Do not re-bind this device (lost or stolen; repeatable): its name, or its key (8+ of its first hex characters) when another device shares the name."),
    yes: bool = typer.Option(False, "--yes", help="Rotate without being asked (without it, a terminal asks and anything else is refused: person-rotate-unconfirmed)."),
    json_out: bool = _JSON,
) -> None:
    """Replace the person key by a new one, cross-signed by the old one (or by the recovery
    words). Hosts that pinned the person follow on the next handshake of any re-bound
    device; the person's words change. It cannot be undone, so it is confirmed first: at a
    terminal you are asked; elsewhere (a script, a pipe) only --yes rotates. Every check
    (--without's devices, the key or the recovery words) comes before that question."""
    from node.common.errors import ConfigError
    from node.trust.rotation import check_rotation, rotate_person

    home = home_of(ctx)
    rec = _record(home)
    words = None
    if recovery:
        if stdin_is_terminal():
            err_console.print("Type the 24 recovery words, then Enter:", highlight=False, markup=False)
        words = stdin_line()
    without = tuple(without or ())
    check_rotation(home, words=words, without=without)  # a refusal comes before the question, not after a "y"
    confirm_or_refuse(
        f"rotate the person key {rec.person_key[:16]}…? Its words change and hosts follow the new key on your "
        "next handshake; it cannot be undone", yes=yes,
        off_terminal=ConfigError("person-rotate-unconfirmed", "not rotated: nobody is at a terminal to confirm a "
                                 "rotation of the person key (it cannot be undone)"),
        declined=ConfigError("person-rotate-unconfirmed", "not rotated (not confirmed)"))
    got = rotate_person(home, words=words, without=without)
    out = {"old_person_key": got.old_key, "person_key": got.new_key, "via": got.via,
           "old_words": person_words(got.old_key), "words": person_words(got.new_key),
           "devices": list(got.devices), "dropped": list(got.dropped),
           "recovery_words": got.recovery_words, "rotations": len(rec.successors) + 1}
    if json_out:
        emit_json(out)
        return
    console.print(f"rotated person {got.old_key[:16]}… → {got.new_key}", highlight=False, markup=False)
    console.print(f"  signed by the {got.via} key; re-bound: {', '.join(got.devices)}"
                  + (f"; left out: {', '.join(got.dropped)}" if got.dropped else ""), highlight=False, markup=False)
    console.print(f"  the person's words changed: {out['old_words']} → {out['words']}", highlight=False, markup=False)
    console.print("  tell the people who check your words; every host follows the rotation on your next "
                  "handshake from a re-bound device", highlight=False, markup=False)
    me = _this_key(home)
    others = [d["device_name"] for d in _record(home).devices if d["device_key"] != me]
    if others:
        console.print(f"  on your other devices ({', '.join(others)}): copy the record (`kith person show --json`, "
                      "its \"record\") and run `kith person import FILE`", highlight=False, markup=False)
    if got.recovery_words:
        err_console.print("New recovery words (write them on paper; they are shown only now, the old ones no longer "
                          "work):", highlight=False, markup=False)
        err_console.print(f"  {got.recovery_words}", highlight=False, markup=False)


def _this_key(home: Path) -> str:
    from node.trust.identity import load_identity

    return load_identity(home).public_key


#: The way out of a ``kith person import FILE`` whose FILE is not a person record.
_IMPORT_HINT = "give the file `kith person show --json` wrote on the device that rotated the person key"


@person_app.command("import")
def import_cmd(
    ctx: typer.Context,
    file: Path = typer.Argument(..., metavar="FILE", help="The rotated person record (`kith person show --json` on the device that rotated; its \"record\", or the whole output)."),
    json_out: bool = _JSON,
) -> None:
    """Take the person record a rotation made on your other device: it must descend from
    this home's person key and bind this device."""
    from node.common.errors import ConfigError
    from node.trust.rotation import adopt_person

    home = home_of(ctx)
    try:
        raw = json.loads(Path(file).read_text("utf-8"))
    except FileNotFoundError:
        raise ConfigError("file-not-found", f"{file} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: "[[[[…"
        raise ConfigError("config-invalid", f"{file} is not a JSON person record", hint=_IMPORT_HINT) from None
    if isinstance(raw, dict) and isinstance(raw.get("record"), dict):
        raw = raw["record"]
    try:
        rec = adopt_person(home, raw)
    except ConfigError as exc:  # the file given is at fault, not a file of the home: say which file to give
        if exc.code == "config-invalid" and exc.message.startswith("the imported person record"):
            raise ConfigError(exc.code, exc.message, hint=_IMPORT_HINT) from None
        raise
    if json_out:
        emit_json({"person_key": rec.person_key, "words": person_words(rec.person_key), "rotations": _history(rec)})
        return
    console.print(f"this device is now bound by person {rec.person_key} ({person_words(rec.person_key)})",
                  highlight=False, markup=False)


__all__ = ["person_app", "person_words"]
