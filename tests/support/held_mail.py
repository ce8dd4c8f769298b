"""Two homes never up together through a device of the host's own person that holds mail
(specs/sealed.md §7b), all real `kith` processes on loopback: the one scenario that
tests/test_sealed_holder_device.py (the holder over HTTP) and
tests/test_sealed_holder_iroh.py (over iroh) run with their own holder
(:func:`never_up_together_through_a_holder`), and what a holder keeps (:func:`held_ids`)."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

from node.community.server import run_server_in_thread
from node.community.store import open_store
from node.host.sealed_host import HELD_MAIL_FILE, person_devices

from support.cli import ask_later, kith, outbox_run_until
from support.community import NO_LIMITS
from support.devices import pair_device
from support.hosts import HostProcess, notes_host
from support.waits import answered_and_acked, wait_for

#: The question the guest leaves (the laptop's notes answer it: "restarts at noon").
QUESTION = "when does the staging server restart"


def held_ids(home: Path) -> list[str]:
    """The record ids the mail ``home`` holds keeps now (``<home>/mailbox.sqlite3``, read
    only; empty when there is no file or no table yet)."""
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


@dataclass
class Trip:
    """What :func:`never_up_together_through_a_holder` leaves for its test to look at.

    Attributes:
        guest: the guest's home. qid: the outbox id of its question.
        holder_url: the holder the laptop's card named (``http://…`` or ``iroh:<ticket>``).
        woken_out: the laptop's second `kith host --json` run's stdout (its host events).
        took_s: seconds from that run's start to the answer at the holder.
    """

    guest: Path
    qid: str
    holder_url: str
    woken_out: str
    took_s: float


def never_up_together_through_a_holder(
        tmp: Path, start_holder: Callable[[Path], tuple[HostProcess, str]], *,
        on_left: Callable[[Path, str, str], None] | None = None) -> Trip:
    """Run the whole scenario, asserting each step:

    1. the always-on device, paired to the laptop's person, holds mail all along
       (``start_holder(always_on home)`` → its `kith host` process and holder URL);
    2. the laptop `kith host --server S --holder H` runs once: its card, naming H, is on the
       server S (no mailbox there: it only lets peers find each other);
    3. the guest pins the person (``--devices``), asks ``--later``, and its runner leaves
       the question with H (``on_left(guest, qid, holder_url)`` looks at it then);
    4. the laptop wakes, takes the question from H, answers, leaves the answer there, stops;
    5. the guest wakes, its row is answered ("noon"), the holder keeps nothing, the holder
       stops with exit 0, and its file holds no plaintext.
    """
    (tmp / "l").mkdir()
    laptop = notes_host(tmp / "l")
    person = json.loads(kith(laptop, "device", "list", "--json").stdout)["person_key"]
    always_on = tmp / "always-on"
    always_on_key = pair_device(laptop, always_on, name="always-on")
    assert person_devices(always_on) >= {always_on_key}
    guest = tmp / "guest"
    assert kith(guest, "init").returncode == 0
    store = open_store(tmp / "server.sqlite3")
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS) as server:  # no --mailbox: finding only
            holder, holder_url = start_holder(always_on)
            try:
                first = HostProcess(laptop, "--server", server, "--holder", holder_url)
                try:
                    def card_names_holder() -> bool:
                        r = httpx.get(f"{server}/api/v1/cards/{person}", timeout=10)
                        return r.status_code == 200 and any(c.get("mailboxes") == [holder_url]
                                                            for c in r.json()["cards"])

                    wait_for("the laptop's card naming the holder", card_names_holder, timeout_s=30)
                finally:
                    first.stop()
                r = kith(guest, "peers", "add", "bea", person, "--devices", "--server", server)
                assert r.returncode == 0, r.stderr
                qid = ask_later(guest, QUESTION, "bea")
                outbox_run_until(guest, "the row left with the holder", lambda: json.loads(kith(
                    guest, "outbox", "show", qid, "--json").stdout)["peers"][0].get("leftWith") == holder_url)
                question_ids = held_ids(always_on)
                assert len(question_ids) == 1
                if on_left is not None:
                    on_left(guest, qid, holder_url)
                t0 = time.monotonic()
                second = HostProcess(laptop, "--server", server, "--holder", holder_url)
                try:
                    wait_for("the sealed answer at the holder",
                             answered_and_acked(lambda: held_ids(always_on), question_ids), timeout_s=60, every_s=0.05)
                    took = time.monotonic() - t0
                finally:
                    _code, woken_out, _err = second.stop()
                outbox_run_until(guest, "the answer in the outbox", lambda: json.loads(kith(
                    guest, "outbox", "show", qid, "--json").stdout)["state"] == "answered")
                wait_for("the answer acked at the holder", lambda: held_ids(always_on) == [], timeout_s=30)
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
    return Trip(guest, qid, holder_url, woken_out, took)
