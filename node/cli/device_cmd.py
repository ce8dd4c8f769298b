"""``kith device``: this person's devices (specs/peers.md §9).

``kith device list`` shows the devices the person key of this home has bound (name, key,
binding sequence number, when), marking this device. ``kith device add`` (on the device
holding the person key) prints a one-time code; ``kith device join CODE`` on the new
device presents it; both show the pairing words and the owner confirms on the first before
the person key signs the new device's binding (:mod:`node.runtime.device_pair`).
``kith device revoke NAME`` signs a new revocation list (specs/peers.md §10).
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from node.cli.common import (console, emit_json, err_console, home_of, new_home_of, server_option, stdin_line,
                             untrusted_console)

device_app = typer.Typer(help="This person's devices (list, add, join, revoke).", no_args_is_help=True)


@device_app.command("list")
def device_list_cmd(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the devices this home's person key has bound (this device marked, revoked ones too)."""
    from node.trust.identity import load_identity
    from node.trust.person import load_person, load_person_secret
    from node.trust.revocation_list import device_marks, own_devices

    home = home_of(ctx)
    ident = load_identity(home)
    person = load_person(home)
    if person is None:
        from node.trust.person import no_record_error

        raise no_record_error(home)
    rows = own_devices(home, person, ident.public_key)
    if json_out:
        emit_json({"person_key": person.person_key, "holds_person_key": load_person_secret(home) is not None,
                   "devices": rows})
        return
    untrusted_console.print(f"person {person.person_key}")
    for r in rows:
        untrusted_console.print(f"  {r['name']}  {r['key'][:16]}…  binding {r['seq']}  since {r['created']}"
                                f"{device_marks(r)}")


@device_app.command("add")
def device_add_cmd(
    ctx: typer.Context,
    local: bool = typer.Option(False, "--offline", "--local", envvar="KITH_OFFLINE", help="Offline: loopback only, relays off (--local: the old spelling, deprecated)."),
    yes_words: bool = typer.Option(False, "--yes-words", help="Confirm the pairing words from stdin without a prompt (a line 'yes'); for scripts that relay what the owner typed."),
    json_out: bool = typer.Option(False, "--json", help="Print the code and the result as JSON lines."),
) -> None:
    """Pair a new device of yours: print a one-time code (80 bits, single use, 10 minutes,
    3 tries) for `kith device join CODE` on it, then confirm the pairing words both show.
    Run on the device that holds the person key; the key never leaves it."""
    import anyio

    from node.runtime.device_pair import offer_device
    from node.trust.identity import load_identity

    home = home_of(ctx)
    ident = load_identity(home)

    def on_code(code: str) -> None:
        if json_out:
            from node.common.host_events import DeviceCode, checked

            emit_json(checked(DeviceCode(code=code).to_dict(), command=True))
        else:
            console.print("On the new device run (the code works once, for 10 minutes, 3 tries):",
                          highlight=False, markup=False)
            console.print(f"  kith device join {code}", highlight=False, markup=False, soft_wrap=True)
        sys.stdout.flush()

    def confirm(words: str, name: str, key: str) -> bool:
        err_console.print(f"device {name!r} ({key[:16]}…) presented the code; pairing words: {words}",
                          highlight=False, markup=False)
        if not yes_words:
            err_console.print("Does the new device show the same words? [y/N] ", end="", highlight=False, markup=False)
        answer = stdin_line().strip().lower()
        return answer in ("y", "yes")

    link = anyio.run(lambda: offer_device(home, ident, local=local, on_code=on_code, confirm=confirm),
                     backend="asyncio")
    if json_out:
        from node.common.host_events import DeviceBound, checked

        emit_json(checked(DeviceBound(name=link["device_name"], key=link["device_key"], seq=link["seq"]).to_dict(),
                          command=True))
        return
    untrusted_console.print(f"bound device {link['device_name']!r} ({link['device_key'][:16]}…) as binding {link['seq']}")


@device_app.command("join")
def device_join_cmd(
    ctx: typer.Context,
    code: str = typer.Argument(..., metavar="CODE", help="The code `kith device add` printed on your other device."),
    device_name: Optional[str] = typer.Option(None, "--device-name", metavar="NAME", help="This device's name (default: the host name, plus -HOMEDIR for a --home that is not the default one)."),
    local: bool = typer.Option(False, "--offline", "--local", envvar="KITH_OFFLINE", help="Offline: loopback only, relays off (--local: the old spelling, deprecated)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Join this new home to your person: present CODE to the device holding the person key,
    compare the pairing words, and keep the binding it signs (creates this device's key if
    the home has none; refused on a home that already has a person)."""
    import anyio

    from node.runtime.device_pair import join_device
    from node.trust.identity import init_identity
    from node.trust.person import default_device_name

    home = new_home_of(ctx)
    ident, _created = init_identity(home)

    def on_words(words: str) -> None:
        if json_out:
            from node.common.host_events import PairingWords, checked

            emit_json(checked(PairingWords(words=words).to_dict(), command=True))
        else:
            console.print(f"pairing words: {words} (your other device shows them too; confirm there)",
                          highlight=False, markup=False)
        sys.stdout.flush()

    def on_waiting(line: str) -> None:  # stderr: with --json, stdout carries only the events
        err_console.print(line, highlight=False, markup=False)

    got = anyio.run(lambda: join_device(home, ident, code, device_name or default_device_name(home), local=local,
                                        on_words=on_words, on_waiting=on_waiting), backend="asyncio")
    if json_out:
        from node.common.host_events import DeviceJoined, checked

        emit_json(checked(DeviceJoined(public_key=ident.public_key, **got).to_dict(), command=True))
        return
    untrusted_console.print(f"this device {got['device_name']!r} is bound to person {got['person_key']} "
                            f"(binding {got['seq']})")


@device_app.command("revoke")
def device_revoke_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME|KEY", help="The device's name, or its key (8+ of its first hex characters will do) when another device shares the name (`kith device list`)."),
    out: Optional[str] = typer.Option(None, "--out", metavar="FILE", help="Also write the signed list to FILE, for `kith peers import-revocation FILE` on hosts by hand."),
    server: Optional[str] = server_option("Also publish the list on this community server (hosts with --server fetch their pinned persons' lists).", from_env=False),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Revoke a stolen or lost device of yours: the person key signs a revocation list (every
    device revoked so far, a sequence number one more than the last). This device carries it
    in its next handshake with every host (which then refuses the revoked device and ends its
    sessions); --out writes it for import by hand, --server publishes it. Run on the device
    holding the person key; the other devices stay bound."""
    import json
    from pathlib import Path

    from node.common.home import atomic_write
    from node.trust.person import revoke_device

    home = home_of(ctx)
    doc, new = revoke_device(home, name)
    from node.guest.copies.lifecycle import end_copies

    for key in new:  # a copy kept here of the revoked device goes (stderr says so; specs/copies.md §5)
        end_copies(home, host_key=key, via="device-revoked")
    if out is not None:
        atomic_write(Path(out), (json.dumps(doc, indent=2) + "\n").encode("utf-8"), mode=0o644)
    published = None
    if server is not None:
        import anyio

        from node.community.client import CommunityClient
        from node.trust.identity import load_identity

        async def publish() -> dict:
            async with CommunityClient(server, load_identity(home)) as client:
                return await client.publish_revocation(doc)

        published = anyio.run(publish, backend="asyncio")
    if json_out:
        from node.common.host_events import DeviceRevokedHere, checked

        emit_json(checked(DeviceRevokedHere(name=name, newly_revoked=new, list=doc, out=out,
                                            published=published is not None).to_dict(), command=True))
        return
    if new:
        untrusted_console.print(f"revoked device {name!r} ({', '.join(k[:16] + '…' for k in new)}): revocation list "
                                f"{doc['seq']} names {len(doc['revoked'])} device(s)")
    else:
        untrusted_console.print(f"device {name!r} was revoked already (revocation list {doc['seq']})")
    console.print("this device carries the list in its next handshake with every host"
                  + (f"; written to {out}" if out else "") + ("; published on the server" if published else ""),
                  highlight=False, markup=False)


__all__ = ["device_app"]
