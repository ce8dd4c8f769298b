"""Liveness leases (issue 14): a post stays in browse only while its host refreshes its
lease; a lapsed post answers ``invitation-host-offline`` at once (``kith join`` exits with
it instead of waiting for the transport); a running host learns from its refreshes that
its post was withdrawn, renewed elsewhere or lost, says so, and republishes when it should.

Real servers on 127.0.0.1, real SQLite and PostgreSQL, real ``kith`` processes. Lease
lengths are made small through ``lease_ttl_s``; every wait polls with a bounded deadline."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from pathlib import Path

import anyio
import httpx
import pytest

from node.community.client import CommunityClient
from node.community.keeper import MIN_REFRESH_S, PostKeeper
from node.community.ratelimit import RateLimit, RateLimits
from node.community.server import run_server_in_thread
from node.trust.identity import Identity

from support.cli import kith_argv as kith, readline
from support.community import (  # noqa: F401
    NO_LIMITS,
    error_of,
    fresh_pg_database as _fresh_pg_database,
    invitation,
    pg_server,
    post,
)
from support.homes import initialized, new_identity
from support.waits import wait_for

SHORT_LEASE_S = 2.0


def listed(base: str, **params: str) -> list[str]:
    page = httpx.get(f"{base}/api/v1/invitations", params=params, timeout=20).json()
    return [p["post_id"] for p in page["invitations"]]


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path: Path) -> str | Path:
    if request.param == "sqlite":
        return tmp_path / "community.sqlite3"
    return _fresh_pg_database(request.getfixturevalue("pg_server"))


def test_a_post_whose_lease_lapses_leaves_browse_and_is_refused_at_once(
        database, tmp_path: Path) -> None:
    host = new_identity()
    with run_server_in_thread(database, rate_limits=NO_LIMITS,
                              lease_ttl_s=SHORT_LEASE_S) as base:
        published = post(base, "/api/v1/invitations", invitation(host, tags=["lease"]).to_dict(),
                         host)
        post_id = published.json()["post_id"]
        page = httpx.get(f"{base}/api/v1/invitations", params={"tag": "lease"}).json()
        assert [(p["post_id"], p["state"], p["online"]) for p in page["invitations"]] == \
            [(post_id, "live", True)]
        fetched = httpx.get(f"{base}/api/v1/invitations/{post_id}")
        assert fetched.status_code == 200 and "kith-lease-expires-at" in fetched.headers
        # nobody refreshes: the post drops out of browse once the lease lapses
        wait_for("the post leaving browse", lambda: post_id not in listed(base, tag="lease"))
        status = httpx.get(f"{base}/api/v1/invitations/{post_id}/status").json()
        assert (status["state"], status["online"]) == ("offline", False)
        gone = httpx.get(f"{base}/api/v1/invitations/{post_id}")
        assert gone.status_code == 410 and error_of(gone) == "invitation-host-offline"
        # kith join fails with that code instead of trying to reach a dead host
        r = subprocess.run([*kith(initialized(tmp_path / "guest"), "join", post_id), "--server", base,
                            "--local", "--trust", "--query", "anything", "--json"],
                           capture_output=True, text=True, timeout=90)
        assert r.returncode == 1
        assert json.loads(r.stdout.splitlines()[-1])["error"]["code"] == "invitation-host-offline"
        # a host back after a partition refreshes and its post is live again
        refreshed = post(base, f"/api/v1/invitations/{post_id}/lease", None, host)
        assert refreshed.status_code == 200
        body = refreshed.json()
        assert (body["state"], body["online"]) == ("live", True)
        assert body["lease"] == {"ttl_s": SHORT_LEASE_S, "refresh_s": round(SHORT_LEASE_S / 3, 3)}
        assert post_id in listed(base, tag="lease")


def test_the_default_lease_takes_a_killed_host_out_of_browse_within_30_s(tmp_path: Path) -> None:
    """Issue 30: a server with its defaults leases for 24 s and asks for a refresh every
    8 s, so a killed host's post leaves browse within 24 s of its last refresh — inside
    30 s of the kill — and two refreshes may still be lost."""
    host = new_identity()
    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS) as base:
        post_id = post(base, "/api/v1/invitations", invitation(host).to_dict(), host).json()["post_id"]
        lease = post(base, f"/api/v1/invitations/{post_id}/lease", None, host).json()["lease"]
    assert lease == {"ttl_s": 24.0, "refresh_s": 8.0}
    assert lease["ttl_s"] <= 30 and lease["ttl_s"] / lease["refresh_s"] >= 3


def test_lease_refresh_refusals(tmp_path: Path) -> None:
    host, other = new_identity(), new_identity()
    limits = RateLimits(per_key=RateLimit(1.0, 5), per_address=RateLimit(0, 1))
    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=limits) as base:
        post_id = post(base, "/api/v1/invitations", invitation(host).to_dict(),
                       host).json()["post_id"]
        path = f"/api/v1/invitations/{post_id}/lease"
        forbidden = post(base, path, None, other)  # another key's post
        assert forbidden.status_code == 403 and error_of(forbidden) == "forbidden"
        unknown = post(base, f"/api/v1/invitations/{'0' * 32}/lease", None, host)
        assert unknown.status_code == 404 and error_of(unknown) == "invitation-not-found"
        bad = post(base, path, {"lease": 5}, host)
        assert bad.status_code == 400 and error_of(bad) == "request-invalid"
        # a renewal storm: the key's bucket runs dry; the post stays live meanwhile
        codes = [post(base, path, None, host).status_code for _ in range(20)]
        assert 429 in codes and set(codes) <= {200, 429}
        assert httpx.get(f"{base}/api/v1/invitations/{post_id}/status").json()["state"] == "live"


def test_a_withdrawn_post_is_not_revived_by_a_refresh(tmp_path: Path) -> None:
    host = new_identity()
    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS) as base:
        post_id = post(base, "/api/v1/invitations", invitation(host).to_dict(),
                       host).json()["post_id"]
        assert post(base, f"/api/v1/invitations/{post_id}/withdraw", None, host).status_code == 200
        answer = post(base, f"/api/v1/invitations/{post_id}/lease", None, host).json()
        assert answer["state"] == "withdrawn" and post_id not in listed(base)


def test_leases_are_shared_by_two_instances(pg_server: str) -> None:  # noqa: F811
    url = _fresh_pg_database(pg_server)
    host = new_identity()
    with run_server_in_thread(url, rate_limits=NO_LIMITS, lease_ttl_s=SHORT_LEASE_S) as a, \
            run_server_in_thread(url, rate_limits=NO_LIMITS, lease_ttl_s=SHORT_LEASE_S) as b:
        post_id = post(a, "/api/v1/invitations", invitation(host).to_dict(), host).json()["post_id"]
        wait_for("the lease lapsing on instance B", lambda: post_id not in listed(b))
        assert error_of(httpx.get(f"{a}/api/v1/invitations/{post_id}")) == "invitation-host-offline"
        assert post(b, f"/api/v1/invitations/{post_id}/lease", None, host).json()["online"] is True
        assert post_id in listed(a)


# --- the host's side: PostKeeper ---------------------------------------------------------------
class KeeperRun:
    """A PostKeeper running in a blocking portal's event loop, its notices collected."""

    def __init__(self, base: str, host: Identity, inv) -> None:
        from anyio.from_thread import start_blocking_portal

        self.notices: list[dict] = []
        self.republished: list[tuple[str, str, str]] = []
        self._portal_cm = start_blocking_portal()
        self.portal = self._portal_cm.__enter__()

        def make() -> PostKeeper:
            return PostKeeper(
                base, host, inv, make_invitation=lambda: invitation(host),
                on_republished=lambda prev, reason, fresh: self.republished.append(
                    (prev, reason, fresh.post_id)),
                on_notice=self.notices.append, poll_s=30)

        self.keeper = self.portal.call(make)
        self.future = self.portal.start_task_soon(self.keeper.run)

    def finished(self, timeout_s: float) -> bool:
        import concurrent.futures

        try:
            self.future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            return False
        return True

    def stop(self) -> None:
        if not self.future.done():
            self.portal.call(self.keeper.stop)
        assert self.finished(30), "the keeper did not stop"
        self._portal_cm.__exit__(None, None, None)


def publish(base: str, host: Identity):
    async def go():
        async with CommunityClient(base, host) as client:
            return await client.publish_invitation(invitation(host))
    return anyio.run(go)


def test_the_keeper_keeps_the_post_live_and_follows_a_renewal_and_a_withdrawal(
        tmp_path: Path) -> None:
    host = new_identity()
    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS,
                              lease_ttl_s=3.0) as base:
        inv = publish(base, host)
        first_lease = httpx.get(f"{base}/api/v1/invitations/{inv.post_id}/status").json()[
            "lease_expires_at"]
        run = KeeperRun(base, host, inv)
        try:
            wait_for("a lease refresh", lambda: httpx.get(
                f"{base}/api/v1/invitations/{inv.post_id}/status").json()["lease_expires_at"]
                > first_lease)
            # renewed elsewhere (kith community renew): the keeper adopts the new expiry
            async def renew():
                async with CommunityClient(base, host) as client:
                    return await client.renew_invitation(inv, ttl_s=7200)
            renewed = anyio.run(renew)
            ev = wait_for("a post-renewed notice", lambda: next(
                (n for n in run.notices if n["event"] == "post-renewed"), None))
            assert ev == {"event": "post-renewed", "post_id": inv.post_id,
                          "expires_at": renewed.expires_at}
            # withdrawn elsewhere: the keeper says so and stops, without republishing
            assert post(base, f"/api/v1/invitations/{inv.post_id}/withdraw", None,
                        host).status_code == 200
            assert run.finished(30), "the keeper kept going after the withdrawal"
            assert run.notices[-1] == {"event": "post-ended", "post_id": inv.post_id,
                                       "reason": "withdrawn", "republish": False}
            assert run.republished == []
        finally:
            run.stop()


def test_the_keeper_waits_between_checks_on_the_clock_it_is_given(tmp_path: Path) -> None:
    """A host hands its keeper its clock (issue 39 item 5): after the check at start the
    keeper is asleep on that clock, and each time the clock has moved the refresh interval
    the server asked for, it refreshes the lease again."""
    from node.runtime.clock import ManualClock

    host = new_identity()
    with run_server_in_thread(tmp_path / "c.sqlite3", rate_limits=NO_LIMITS, lease_ttl_s=3.0) as base:
        inv = publish(base, host)

        def lease() -> str:
            return httpx.get(f"{base}/api/v1/invitations/{inv.post_id}/status").json()["lease_expires_at"]

        clock = ManualClock()

        async def main() -> None:
            keeper = PostKeeper(base, host, inv, make_invitation=lambda: invitation(host),
                                on_republished=lambda *_: None, poll_s=30, clock=clock.time, sleep=clock.sleep)
            async with anyio.create_task_group() as tg:
                tg.start_soon(keeper.run)
                with anyio.fail_after(30):  # the check at start, then asleep on the clock
                    while clock.sleepers() == 0:
                        await anyio.sleep(0.01)
                first = await anyio.to_thread.run_sync(lease)
                with anyio.fail_after(30):  # each period on the clock, a check: a later lease (a stamp in s)
                    while await anyio.to_thread.run_sync(lease) <= first:
                        clock.advance(max(MIN_REFRESH_S, keeper.refresh_s))
                        await anyio.sleep(0.05)
                keeper.stop()

        anyio.run(main, backend="asyncio")


def test_the_keeper_republishes_a_post_the_server_lost(tmp_path: Path) -> None:
    host = new_identity()
    db = tmp_path / "c.sqlite3"
    with run_server_in_thread(db, rate_limits=NO_LIMITS, lease_ttl_s=3.0) as base:
        inv = publish(base, host)
        with sqlite3.connect(db) as conn:  # as if the database were restored from before it
            conn.execute("DELETE FROM invitations WHERE post_id = ?", (inv.post_id,))
        run = KeeperRun(base, host, inv)
        try:
            wait_for("a republish", lambda: run.republished)
            (previous, reason, fresh), = run.republished
            assert (previous, reason) == (inv.post_id, "lost")
            assert {"event": "post-ended", "post_id": inv.post_id, "reason": "lost",
                    "republish": True} in run.notices
            assert listed(base) == [fresh]
        finally:
            run.stop()


# --- a real kith host, killed -------------------------------------------------------------------
@pytest.mark.iroh
def test_a_killed_host_leaves_browse(tmp_path: Path) -> None:
    with run_server_in_thread(tmp_path / "srv.sqlite3", rate_limits=NO_LIMITS,
                              lease_ttl_s=3.0) as base:
        proc = subprocess.Popen([*kith(initialized(tmp_path / "host"), "host", "--local", "--json"),
                                 "--server", base, "--tag", "killed"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        try:
            first = json.loads(readline(proc, 60))
            post_id = first["post_id"]
            assert listed(base, tag="killed") == [post_id]
            status_url = f"{base}/api/v1/invitations/{post_id}/status"
            lease0 = httpx.get(status_url).json()["lease_expires_at"]
            wait_for("the running host refreshing its lease",
                     lambda: httpx.get(status_url).json()["lease_expires_at"] > lease0)
            assert listed(base, tag="killed") == [post_id]
        finally:
            proc.send_signal(signal.SIGKILL)  # no chance to withdraw
            proc.communicate(timeout=30)
        wait_for("the killed host's post leaving browse",
                 lambda: listed(base, tag="killed") == [])
        assert httpx.get(status_url).json()["state"] == "offline"
