"""Several community server instances on one database behave as one server (issue 14):
two real uvicorn servers on 127.0.0.1 over one real PostgreSQL (the throwaway cluster of
``test_community_backends``) share rate limits, request nonces, single-use claims and the
whole lifecycle of a post; SQLite refuses a second server process clearly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from node.community.ratelimit import RateLimit, RateLimits
from node.community.requests import signed_headers
from node.community.server import run_server_in_thread
from node.trust.identity import Identity

from support.cli import readline
from support.community import (  # noqa: F401
    NO_LIMITS,
    error_of,
    fresh_pg_database as _fresh_pg_database,
    invitation,
    pg_server,
    session_proof,
)
from support.homes import new_identity


class FrozenClock:
    """One clock both instances read: time stands still unless a test moves it, so token
    counts are exact (no timing in the assertions)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def two_instances(database: str, **kwargs) -> Iterator[tuple[str, str]]:
    with run_server_in_thread(database, **kwargs) as a, run_server_in_thread(database, **kwargs) as b:
        assert a != b
        yield a, b


@pytest.fixture
def pg_url(pg_server: str) -> str:  # noqa: F811
    return _fresh_pg_database(pg_server)


def post(base: str, path: str, doc: dict | None, signer: Identity, *,
         headers: dict | None = None, now: float | None = None) -> httpx.Response:
    body = b"" if doc is None else json.dumps(doc).encode()
    headers = headers or signed_headers(signer, "POST", path, body, now=now)
    return httpx.post(base + path, content=body, headers=headers, timeout=20)


def test_a_key_rate_limit_holds_across_two_instances(pg_url: str) -> None:
    clock = FrozenClock()
    limits = RateLimits(per_key=RateLimit(2.0, 4), per_address=RateLimit(0, 1))
    key = new_identity()
    with two_instances(pg_url, rate_limits=limits, clock=clock) as (a, b):
        # alternate instances: together they grant the one bucket's burst, not twice it
        codes = [post(base, "/api/v1/identities", {"display_name": "Shared Key"}, key,
                      now=clock.now).status_code for base in (a, b) * 4]
        assert codes.count(429) == 4 and sorted(codes[:4]) == [200, 200, 200, 201]
        refused = post(b, "/api/v1/identities", {"display_name": "Shared Key"}, key,
                       now=clock.now)
        assert error_of(refused) == "rate-limited" and int(refused.headers["retry-after"]) >= 1
        clock.now += 1.0  # two tokens (2 per second), whichever instance asks
        codes = [post(base, "/api/v1/identities", {"display_name": "Shared Key"}, key,
                      now=clock.now).status_code for base in (b, a, b)]
        assert codes == [200, 200, 429]
        # another key has its own bucket on both instances
        assert post(a, "/api/v1/identities", {"display_name": "Other"}, new_identity(),
                    now=clock.now).status_code == 201


def test_an_address_rate_limit_holds_across_two_instances(pg_url: str) -> None:
    clock = FrozenClock()
    limits = RateLimits(per_key=RateLimit(0, 1), per_address=RateLimit(1.0, 3))
    with two_instances(pg_url, rate_limits=limits, clock=clock) as (a, b):
        codes = [httpx.get(f"{base}/api/v1/health", timeout=20).status_code
                 for base in (a, b, a, b, a)]
        assert codes == [200, 200, 200, 429, 429]


def test_a_nonce_used_on_one_instance_is_a_replay_on_the_other(pg_url: str) -> None:
    key = new_identity()
    with two_instances(pg_url, rate_limits=NO_LIMITS) as (a, b):
        body = json.dumps({"display_name": "Nonce Key"}).encode()
        headers = signed_headers(key, "POST", "/api/v1/identities", body)
        assert httpx.post(f"{a}/api/v1/identities", content=body, headers=headers).status_code == 201
        replay = httpx.post(f"{b}/api/v1/identities", content=body, headers=headers)
        assert replay.status_code == 409 and error_of(replay) == "request-replayed"


def test_a_single_use_post_admits_one_proof_across_instances(pg_url: str) -> None:
    host = new_identity()
    with two_instances(pg_url, rate_limits=NO_LIMITS) as (a, b):
        post_id = post(a, "/api/v1/invitations", invitation(host, max_sessions=1).to_dict(),
                       host).json()["post_id"]

        async def race() -> list[int]:
            async with httpx.AsyncClient(timeout=30) as client:
                async def one(base: str) -> int:
                    g = new_identity()
                    body = json.dumps(session_proof(host, g, post_id)).encode()
                    return (await client.post(f"{base}/api/v1/sessions", content=body,
                                              headers=signed_headers(g, "POST", "/api/v1/sessions",
                                                                     body))).status_code
                return await asyncio.gather(*(one(base) for base in (a, b) * 5))

        assert sorted(asyncio.run(race())) == [201] + [409] * 9


def test_the_lifecycle_of_a_post_across_two_instances(pg_url: str) -> None:
    host, guest = new_identity(), new_identity()
    with two_instances(pg_url, rate_limits=NO_LIMITS) as (a, b):
        assert post(a, "/api/v1/identities", {"display_name": "Host Two"}, host).status_code == 201
        # the display name is folded on every instance: a look-alike is refused on the other
        look_alike = post(b, "/api/v1/identities", {"display_name": "host tw0"}, guest)
        assert look_alike.status_code == 409 and error_of(look_alike) == "display-name-taken"
        post_id = post(a, "/api/v1/invitations", invitation(host, tags=["two"]).to_dict(),
                       host).json()["post_id"]
        listed = httpx.get(f"{b}/api/v1/invitations", params={"tag": "two"}).json()
        assert [(p["post_id"], p["online"], p["host_display_name"])
                for p in listed["invitations"]] == [(post_id, True, "Host Two")]
        proof = session_proof(host, guest, post_id)
        assert post(b, "/api/v1/sessions", proof, guest).status_code == 201
        assert error_of(post(a, "/api/v1/sessions", proof, host)) == "session-duplicate"
        sid = proof["session_id"]
        assert post(a, f"/api/v1/sessions/{sid}/close", {"reason": "completed"},
                    guest).json()["state"] == "closed"
        assert post(b, f"/api/v1/sessions/{sid}/feedback", {"rating": 4}, guest).status_code == 201
        assert httpx.get(f"{a}/api/v1/identities/{host.public_key}").json()["ratings"] == \
            {"count": 1, "average": 4.0}
        assert post(b, f"/api/v1/invitations/{post_id}/withdraw", None, host).json()["state"] == \
            "withdrawn"
        gone = httpx.get(f"{a}/api/v1/invitations/{post_id}")
        assert gone.status_code == 410 and error_of(gone) == "invitation-withdrawn"


def test_sqlite_refuses_a_second_server_process(tmp_path: Path) -> None:
    def serve() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "node", "--home", str(tmp_path),
                                 "community", "serve", "--port", "0", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = serve()
    try:
        assert json.loads(readline(first, 60))["database"] == "sqlite"
        second = serve()
        out, err = second.communicate(timeout=60)
        assert second.returncode == 1 and "Traceback" not in err
        refusal = json.loads(out)["error"]
        assert refusal["code"] == "database-in-use" and "PostgreSQL" in refusal["message"]
    finally:
        first.terminate()
        first.communicate(timeout=30)
    assert first.returncode == 0
