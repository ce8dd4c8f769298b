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
import sqlite3
import time
from pathlib import Path

import pytest

from node.common.errors import CommunityError
from node.community.client import CommunityClient
from node.community.server import run_server_in_thread
from node.community.store import open_store
from node.host.sealed_host import HELD_MAIL_FILE, hold_mail, person_devices
from node.trust.identity import Identity
from node.trust.sealed import seal

from support.cli import ask_later, kith, outbox_run_until
from support.community import NO_LIMITS, free_port
from support.waits import answered_and_acked, wait_for
from support.devices import pair_device
from support.hosts import HostProcess, notes_host

QUESTION = "when does the staging server restart"


def _held_ids(home: Path) -> list[str]:
    path = home / HELD_MAIL_FILE
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        return [r[0] for r in conn.execute("SELECT record_id FROM mailbox").fetchall()]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


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
    (tmp_path / "l").mkdir()
    laptop = notes_host(tmp_path / "l")
    person = json.loads(kith(laptop, "device", "list", "--json").stdout)["person_key"]
    always_on = tmp_path / "always-on"
    always_on_key = pair_device(laptop, always_on, name="always-on")
    assert person_devices(always_on) >= {always_on_key}
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    store = open_store(tmp_path / "server.sqlite3")
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS) as server:  # no --mailbox: finding only
            holder, holder_url = _holding_mail(always_on, "--invite-file", str(tmp_path / "always-on.inv"))
            try:
                # 2. the laptop is up once: its card names the holder
                first = HostProcess(laptop, "--server", server, "--holder", holder_url)
                try:
                    import httpx

                    def card_names_holder() -> bool:
                        r = httpx.get(f"{server}/api/v1/cards/{person}", timeout=10)
                        return r.status_code == 200 and any(c.get("mailboxes") == [holder_url]
                                                            for c in r.json()["cards"])

                    wait_for("the laptop's card naming the holder", card_names_holder, timeout_s=30)
                finally:
                    first.stop()
                # 3. the guest alone (and the always-on device): the question is left with it
                r = kith(guest, "peers", "add", "bea", person, "--devices", "--server", server)
                assert r.returncode == 0, r.stderr
                qid = ask_later(guest, QUESTION, "bea")
                outbox_run_until(guest, "the row left with the holder", lambda: json.loads(kith(
                    guest, "outbox", "show", qid, "--json").stdout)["peers"][0].get("leftWith") == holder_url)
                question_ids = _held_ids(always_on)
                assert len(question_ids) == 1
                # 4. the laptop wakes: takes, answers, leaves the answer at the holder
                t0 = time.monotonic()
                second = HostProcess(laptop, "--server", server, "--holder", holder_url)
                try:
                    wait_for("the sealed answer at the holder",
                             answered_and_acked(lambda: _held_ids(always_on), question_ids), timeout_s=60, every_s=0.05)
                    took = time.monotonic() - t0
                finally:
                    second.stop()
                print(f"answer at the always-on device {took:.2f} s after the laptop's `kith host` was started")
                # 5. the guest wakes: the row is answered
                outbox_run_until(guest, "the answer in the outbox", lambda: json.loads(kith(
                    guest, "outbox", "show", qid, "--json").stdout)["state"] == "answered")
                assert _held_ids(always_on) == []  # taken and acked: the holder keeps nothing
            finally:
                code, _out, err = holder.stop()
            assert code == 0, err
    finally:
        store.close()
    shown = json.loads(kith(guest, "outbox", "show", qid, "--json").stdout)
    assert "noon" in shown["answer"]["results"][0]["textPreview"]
    raw = b"".join(p.read_bytes() for p in always_on.iterdir() if p.name.startswith(HELD_MAIL_FILE))
    for plain in (QUESTION, "staging server", "noon"):
        assert plain.encode() not in raw, plain


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
        assert len(_held_ids(laptop)) == 1


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
