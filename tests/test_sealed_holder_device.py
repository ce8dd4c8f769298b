"""A device of the host's own person holds mail (issue 43 item 2b; specs/sealed.md §7b):
two homes never up at the same time complete a question and an answer through a third —
the host person's always-on device running `kith host --hold-mail` — all real `kith`
processes on loopback.

1. the always-on device (paired to the laptop's person) runs `kith host --hold-mail` all along;
2. the laptop `kith host --server S --holder H` runs once: its card, naming the holder H,
   goes to the server S (a server without a mailbox: it only lets peers find each other);
3. the guest pins the person with `--devices --server S`, asks `--later`, and its runner
   leaves the question sealed (to the laptop only) with the holder H, then stops;
4. the laptop wakes, takes the question from H, answers, leaves the sealed answer there, stops;
5. the guest wakes and its row is answered. The holder's database holds no plaintext.

And the holder is no open relay: a record neither from nor to its person's devices is
refused `mailbox-not-held` and nothing of it is kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from node.common.errors import CommunityError
from node.community.client import CommunityClient
from node.community.server import run_server_in_thread
from node.community.store import open_store
from node.host.sealed_host import HELD_MAIL_FILE, hold_mail
from node.trust.identity import Identity
from node.trust.sealed import seal

from support.cli import kith
from support.community import NO_LIMITS, free_port
from support.held_mail import held_ids, never_up_together_through_a_holder
from support.hosts import HostProcess, notes_host


def _holding_mail(home: Path, *args: str) -> tuple[HostProcess, str]:
    """`kith host ARGS --hold-mail 127.0.0.1:PORT` on a free port, and its holder URL. The
    laptop's --holder must name the port before the holder runs, so the port is picked
    first (:func:`support.community.free_port`) and bound later by the host: another process
    may take it between the two, so a start refused ``server-start-failed`` tries another."""
    for _ in range(5):
        url = f"http://127.0.0.1:{free_port()}"
        try:
            return HostProcess(home, *args, "--hold-mail", url.removeprefix("http://")), url
        except AssertionError as exc:
            if "server-start-failed" not in str(exc):
                raise
    raise AssertionError("five free ports were all taken before kith host bound them")


def test_two_homes_never_up_together_through_a_device_of_the_hosts_person(tmp_path: Path) -> None:
    trip = never_up_together_through_a_holder(tmp_path, lambda always_on: _holding_mail(
        always_on, "--invite-file", str(tmp_path / "always-on.inv")))
    print(f"answer at the always-on device {trip.took_s:.2f} s after the laptop's `kith host` was started")


def test_a_held_mailbox_refuses_records_of_strangers_and_keeps_its_persons(tmp_path: Path) -> None:
    (tmp_path / "l").mkdir()
    laptop = notes_host(tmp_path / "l")
    laptop_key = json.loads(kith(laptop, "status", "--json").stdout)["identity"]["key"]
    stranger, other = Identity(os.urandom(32)), Identity(os.urandom(32))

    def record(sender: Identity, to: str, qid: str) -> dict:
        return seal(sender.secret, None, kind="question", question_id=qid, body={"request": {"query": "q"}},
                    recipients=[to], now=time.time(), expires=time.time() + 600)

    async def scenario(url: str) -> None:
        async with CommunityClient(url, stranger) as client:
            with pytest.raises(CommunityError) as refused:  # a stranger to a stranger: no relay
                await client.put_sealed(record(stranger, other.public_key, "1" * 32))
            assert refused.value.code == "mailbox-not-held"
            await client.put_sealed(record(stranger, laptop_key, "2" * 32))  # to the person's device: kept

    with hold_mail(laptop, "127.0.0.1:0") as held:  # port 0: bound at once, never a port another took
        asyncio.run(scenario(held.url))
        assert len(held_ids(laptop)) == 1


def test_hold_mail_and_holder_refuse_what_is_not_an_address(tmp_path: Path) -> None:
    home = tmp_path / "h"
    assert kith(home, "init").returncode == 0
    for args, what in ((["--hold-mail", "nonsense"], "--hold-mail takes HOST:PORT"),
                       (["--holder", "ftp://x"], "--holder takes a holder's base URL"),
                       (["--holder", "http://a", "--holder", "http://b", "--holder", "http://c", "--holder",
                         "http://d"], "--holder: at most 3"),
                       (["--hold-mail", "iroh:x"], "--hold-mail takes HOST:PORT (e.g. 127.0.0.1:8740) or iroh"),
                       (["--holder", "iroh:endpoint" + "b" * 60], "not an iroh ticket")):
        r = kith(home, "host", "--offline", "--invite-file", str(tmp_path / "inv"), *args)
        assert r.returncode == 2 and "error [usage]" in r.stderr and what in r.stderr, r.stderr
    assert not (home / HELD_MAIL_FILE).exists() and not (tmp_path / "inv").exists()


def test_more_holders_than_a_card_names_are_refused_not_one_dropped_silently(tmp_path: Path) -> None:
    """A card names at most 4 holders (specs/sealed.md §6). `--hold-mail`, three `--holder`
    and `--mailbox` make 5: the start is refused `usage`, naming the bound — never a host that
    silently drops the server's mailbox from its card and its takes (asked for with
    `--mailbox`, so askers' questions left there would wait for nothing)."""
    home = tmp_path / "h"
    assert kith(home, "init").returncode == 0
    holders = [a for i in range(3) for a in ("--holder", f"http://127.0.0.1:{18861 + i}")]
    r = kith(home, "host", "--offline", "--server", "http://127.0.0.1:9", "--mailbox", *holders,
             "--hold-mail", "127.0.0.1:18851")
    assert r.returncode == 2 and "error [usage]" in r.stderr, r.stderr
    assert "at most 4" in r.stderr and "--mailbox" in r.stderr, r.stderr
    assert not (home / HELD_MAIL_FILE).exists()
    # the same URL twice is said as such, not as a count
    r = kith(home, "host", "--offline", "--invite-file", str(tmp_path / "inv"), "--holder", "http://a",
             "--holder", "http://a")
    assert r.returncode == 2 and "--holder http://a is given twice" in r.stderr, r.stderr


def test_a_host_taking_from_a_server_that_keeps_no_mailbox_says_so(tmp_path: Path) -> None:
    """`kith host --server URL --mailbox` against a community server run without
    `--mailbox`: the warning says that server keeps no mailbox and how to turn it on — not
    that sealed questions "wait there", which none can (every put is refused mailbox-off)."""
    (tmp_path / "h").mkdir()
    home = notes_host(tmp_path / "h")
    store = open_store(tmp_path / "server" / "community.sqlite3")
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS) as url:  # no mailbox
            from support.cli import lines_until

            host = HostProcess(home, "--server", url, "--mailbox")
            try:
                seen = lines_until(host.proc, host.proc.stderr,
                                   lambda line: line.startswith("warning:") and "mailbox" in line, timeout=30)
            finally:
                code, _out, rest = host.stop()
    finally:
        store.close()
    err = "".join(seen) + rest
    assert code == 0, err
    assert "Traceback" not in err, err
    assert "wait there" not in err, err
    assert "keeps no mailbox" in err and "kith community serve --mailbox" in err, err
