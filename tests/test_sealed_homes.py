"""Two homes that are never up at the same time complete a question and an answer through a
third — a community server with `--mailbox` — all real `kith` processes on loopback (issue
43 "done when" (a); README "Questions between homes that are never up together").

1. the host `kith host --server URL --mailbox` runs once (its card, naming the mailbox,
   goes to the server), then stops;
2. the guest pins the host's person with `--devices --server URL` and asks `--later`: the
   host is down, the question is kept, and `kith outbox run` leaves it sealed with the
   mailbox, then stops;
3. the host wakes (`kith host --server URL --mailbox`), answers, stops;
4. the guest wakes (`kith outbox run`) and its row is answered; `kith outbox show` prints
   the answer. The server's database holds neither the question nor the answer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


from support.cli import ask_later, kith, outbox_run_until
from support.community import mailbox_server, record_ids
from support.hosts import HostProcess, card_posted, notes_host, woken_to_answer

QUESTION = "when does the staging server restart"


def test_two_homes_never_up_together_through_a_community_mailbox(tmp_path: Path) -> None:
    host_home = notes_host(tmp_path)
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    db = tmp_path / "server" / "community.sqlite3"
    with mailbox_server(db) as (store, url):
        # 1. the host is up once: its card (naming the mailbox) is on the server
        person = card_posted(host_home, url)
        # 2. the guest, alone: asks --later, the runner leaves the question at the mailbox
        r = kith(guest, "peers", "add", "bea", person, "--devices", "--server", url)
        assert r.returncode == 0, r.stderr
        qid = ask_later(guest, QUESTION, "bea")
        said = outbox_run_until(guest, "the row saying where it waits", lambda: json.loads(kith(
            guest, "outbox", "show", qid, "--json").stdout)["peers"][0]["leftWith"] == url)
        assert store.mailbox_usage()["records"] == 1
        assert f"outbox {qid[:12]}: bea unreachable; left sealed with {url}" in said, said
        listed = kith(guest, "outbox", "list")
        compact = "".join(listed.stdout.split())  # the table wraps its cells
        assert f"[leftwith{url}]" in compact, listed.stdout
        # 3. the host, alone: takes, answers, acks
        took = woken_to_answer(host_home, url, lambda: record_ids(store))
        print(f"answer at the holder {took:.2f} s after `kith host` was started")
        # 4. the guest, alone again: the row is answered
        t0 = time.monotonic()
        said = outbox_run_until(guest, "the answer in the outbox", lambda: json.loads(kith(
            guest, "outbox", "show", qid, "--json").stdout)["state"] == "answered")
        print(f"answer in the guest's outbox {time.monotonic() - t0:.2f} s after `kith outbox run` was started")
        assert f"outbox {qid[:12]}: bea answered" in said, said  # said as a live answer is
        raw = b"".join(p.read_bytes() for p in db.parent.iterdir() if p.name.startswith(db.name))
    shown = json.loads(kith(guest, "outbox", "show", qid, "--json").stdout)
    assert shown["answer"]["results"] and "noon" in shown["answer"]["results"][0]["textPreview"]
    for plain in (QUESTION, "staging server", "noon"):
        assert plain.encode() not in raw, plain


def test_a_device_pin_is_reached_through_the_mailbox_its_own_card_names(tmp_path: Path) -> None:
    """A peer pinned by its device key (no `--devices`): the card it sent in a live
    handshake names its mailbox, so `--later` leaves the question there, sealed to that
    device, while it sleeps; it answers when it wakes (issue 43: device pins use the holder)."""
    host_home = notes_host(tmp_path)
    device = json.loads(kith(host_home, "status", "--json").stdout)["identity"]["key"]
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    with mailbox_server(tmp_path / "server" / "community.sqlite3") as (store, url):
        # 1. met live once: the device's card (naming the mailbox) is kept for its pin
        first = HostProcess(host_home, "--server", url, "--mailbox")
        try:
            r = kith(guest, "peers", "add", "bea", device, "--invite", first.invitation["post_id"],
                     "--server", url)
            assert r.returncode == 0, r.stderr
            r = kith(guest, "ask", QUESTION, "--peer", "bea", "--offline", "--json", "--timeout", "20",
                     timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
        finally:
            first.stop()
        cards = json.loads((guest / "cards.json").read_text())
        assert url in json.dumps(cards)  # the format-2 card, kept under the device pin
        # 2. the host sleeps: the question is left with its mailbox, sealed to the device
        qid = ask_later(guest, QUESTION, "bea")
        outbox_run_until(guest, "the row left with the mailbox", lambda: json.loads(kith(
            guest, "outbox", "show", qid, "--json").stdout)["peers"][0].get("leftWith") == url)
        assert store.mailbox_usage()["records"] == 1
        # 3. the host wakes and answers; 4. the guest wakes and takes it
        woken_to_answer(host_home, url, lambda: record_ids(store))
        outbox_run_until(guest, "the answer in the outbox", lambda: json.loads(kith(
            guest, "outbox", "show", qid, "--json").stdout)["state"] == "answered")
    shown = json.loads(kith(guest, "outbox", "show", qid, "--json").stdout)
    assert "noon" in shown["answer"]["results"][0]["textPreview"]


def _met_live_and_pinned(host_home: Path, guest: Path, url: str) -> str:
    """The guest meets the host live once (`kith join POST --pin bea --query ...` through the
    server at ``url``), then the host stops: it sleeps from here on. Returns the join's stderr."""
    first = HostProcess(host_home, "--server", url, "--mailbox")
    try:
        r = kith(guest, "join", first.invitation["post_id"], "--server", url, "--offline", "--trust",
                 "--pin", "bea", "--query", QUESTION, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        first.stop()
    return r.stderr


def test_a_host_pinned_by_join_pin_is_reached_through_the_mailbox_its_card_names(tmp_path: Path) -> None:
    """`kith join POST --pin bea` pins the host after the session that met it live: the card
    that host sent in that very handshake names its mailbox and must be kept for the new pin,
    so a `--later` question for bea is left there while bea sleeps (README "Device pins
    too": a device pin uses the holder "once this home has met it live")."""
    host_home = notes_host(tmp_path)
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    with mailbox_server(tmp_path / "server" / "community.sqlite3") as (store, url):
        assert "pinned the host as 'bea'" in _met_live_and_pinned(host_home, guest, url)
        qid = ask_later(guest, QUESTION, "bea")
        outbox_run_until(guest, "the row left with the mailbox", lambda: json.loads(kith(
            guest, "outbox", "show", qid, "--json").stdout)["peers"][0].get("leftWith") == url, timeout_s=30)
        assert store.mailbox_usage()["records"] == 1


def test_every_question_for_a_sleeping_peer_is_left_with_its_mailbox_not_only_the_oldest(tmp_path: Path) -> None:
    """Two `--later` questions for the same sleeping peer: the runner leaves both with the
    mailbox its card names. The live delivery tries a peer that cannot be reached on its
    oldest open question only (it stops at the first that cannot reach it), so a newer
    question that was never tried itself must count as tried once a try of that peer failed
    after it was kept — else it waits for a live delivery only (README "Questions between
    homes that are never up together")."""
    host_home = notes_host(tmp_path)
    guest = tmp_path / "guest"
    assert kith(guest, "init").returncode == 0
    with mailbox_server(tmp_path / "server" / "community.sqlite3") as (store, url):
        _met_live_and_pinned(host_home, guest, url)
        qids = [ask_later(guest, QUESTION, "bea"), ask_later(guest, "who restarts the staging server", "bea")]

        def left() -> list:
            return [json.loads(kith(guest, "outbox", "show", q, "--json").stdout)["peers"][0].get("leftWith")
                    for q in qids]

        outbox_run_until(guest, "both rows left with the mailbox", lambda: left() == [url, url], timeout_s=45)
        assert store.mailbox_usage()["records"] == 2
