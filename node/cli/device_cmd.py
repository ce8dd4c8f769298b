"""``kith device``: this person's devices (specs/peers.md §9).

``kith device list`` shows the devices the person key of this home has bound (name, key,
binding sequence number, when), marking this device. Pairing another device of one's own
(``kith device add`` / ``kith device join``) is not built yet.
"""

from __future__ import annotations

import typer

from node.cli.common import emit_json, home_of, untrusted_console

device_app = typer.Typer(help="This person's devices (list).", no_args_is_help=True)


@device_app.command("list")
def device_list_cmd(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the devices this home's person key has bound (this device marked)."""
    from node.common.errors import ConfigError
    from node.common.home import init_hint
    from node.trust.identity import load_identity
    from node.trust.person import load_person, load_person_secret

    home = home_of(ctx)
    ident = load_identity(home)
    person = load_person(home)
    if person is None:
        raise ConfigError("home-not-initialized", "This home has no person key yet.", hint=init_hint(home))
    rows = [{"name": d["device_name"], "key": d["device_key"], "seq": d["seq"], "created": d["created"],
             "this": d["device_key"] == ident.public_key} for d in person.devices]
    if json_out:
        emit_json({"person_key": person.person_key, "holds_person_key": load_person_secret(home) is not None,
                   "devices": rows})
        return
    untrusted_console.print(f"person {person.person_key}")
    for r in rows:
        mark = "  (this device)" if r["this"] else ""
        untrusted_console.print(f"  {r['name']}  {r['key'][:16]}…  binding {r['seq']}  since {r['created']}{mark}")


__all__ = ["device_app"]
