"""The community server over real HTTP: a uvicorn server on 127.0.0.1, real httpx, real
Ed25519 signatures, real SQLite (DESIGN §4, §5, §12; specs/community-api.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import msgspec
import pytest

from node.community.client import CommunityClient
from node.community.ratelimit import RateLimit, RateLimits
from node.community.requests import REQUEST_WINDOW_S, signed_headers
from node.community.server import run_server_in_thread
from node.community.store import TABLES, SqliteStore
from node.common.errors import CommunityError, InvitationError, ProtocolViolation, UsageError
from node.trust.identity import Identity, init_identity
from node.trust.invitation import POST_ID_RE, Invitation
from node.trust.signing import role_message, session_payload
from node.protocol.spec import load_spec

from support.community import PROTOCOL_ID, assert_no_content_columns, error_of, invitation, session_proof
from support.homes import PROTOCOLS

MAX_BODY = 65536


class Clock:
    """The server's clock: real time plus an offset a test can move."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    clock = Clock()
    db = tmp_path_factory.mktemp("community") / "community" / "community.sqlite3"
    no_limits = RateLimits(per_key=RateLimit(0, 1), per_address=RateLimit(0, 1))
    # leases far longer than any clock move here: these tests are about expiry, not liveness
    with run_server_in_thread(db, max_body_bytes=MAX_BODY, clock=clock,
                              rate_limits=no_limits, lease_ttl_s=60 * 24 * 3600.0) as url:
        yield url, clock, db


@pytest.fixture
def url(server) -> str:
    base, clock, _ = server
    clock.offset = 0.0
    yield base
    clock.offset = 0.0


@pytest.fixture
def clock(server) -> Clock:
    return server[1]


@pytest.fixture
def http(url: str):
    with httpx.Client(base_url=url, timeout=10) as client:
        yield client


def identity(tmp_path: Path, name: str) -> Identity:
    return init_identity(tmp_path / name)[0]


@pytest.fixture
def host(tmp_path: Path) -> Identity:
    return identity(tmp_path, "host")


@pytest.fixture
def guest(tmp_path: Path) -> Identity:
    return identity(tmp_path, "guest")


def signed_post(http: httpx.Client, path: str, body: bytes, signer: Identity, *,
                now: float | None = None) -> httpx.Response:
    headers = signed_headers(signer, "POST", path, body, now=now)
    return http.post(path, content=body, headers=headers)


def publish(http: httpx.Client, doc: dict | bytes, signer: Identity, **kw) -> httpx.Response:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return signed_post(http, "/api/v1/invitations", body, signer, **kw)


def published(http: httpx.Client, host: Identity) -> dict:
    response = publish(http, invitation(host).to_dict(), host)
    assert response.status_code == 201, response.text
    return response.json()


# --- health and routing ---------------------------------------------------------------------
def test_health(http: httpx.Client) -> None:
    response = http.get("/api/v1/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["service"] == "kith-community"


def test_unknown_route_and_wrong_method_answer_json(http: httpx.Client) -> None:
    response = http.get("/api/v1/nope")
    assert response.status_code == 404 and error_of(response) == "not-found"
    response = http.delete("/api/v1/health")
    assert response.status_code == 405 and error_of(response) == "method-not-allowed"


# --- invitations -----------------------------------------------------------------------------
def test_publish_then_get_roundtrip_with_server_assigned_post_id(
        http: httpx.Client, host: Identity) -> None:
    inv = invitation(host, message="python docs")
    doc = inv.to_dict()
    response = publish(http, doc, host)
    assert response.status_code == 201, response.text
    stored = response.json()
    assert stored["post_id"] != inv.post_id  # the client's post_id is ignored
    assert POST_ID_RE.fullmatch(stored["post_id"]) and 22 <= len(stored["post_id"]) <= 32
    assert {k: v for k, v in stored.items() if k != "post_id"} == \
        {k: v for k, v in doc.items() if k != "post_id"}
    assert response.headers["location"] == f"/api/v1/invitations/{stored['post_id']}"
    fetched = http.get(f"/api/v1/invitations/{stored['post_id']}")
    assert fetched.status_code == 200 and fetched.json() == stored


def test_publish_without_client_post_id(http: httpx.Client, host: Identity) -> None:
    doc = invitation(host).to_dict()
    del doc["post_id"]
    response = publish(http, doc, host)
    assert response.status_code == 201
    assert POST_ID_RE.fullmatch(response.json()["post_id"])


def _tamper_ticket(doc: dict) -> None:
    ticket = doc["transport_info"]["ticket"]
    changed = ticket[:-1] + ("x" if ticket[-1] != "x" else "y")
    doc["transport_info"]["ticket"] = changed
    doc["iroh_ticket"] = changed  # keep them equal: only the signature can catch it


def _ticket_mismatch(doc: dict) -> None:
    doc["iroh_ticket"] = "someotherticket"


def _endpoint_mismatch(doc: dict) -> None:
    doc["transport_info"]["endpoint_id"] = "cd" * 32


def _uppercase_signature(doc: dict) -> None:
    doc["transport_binding_signature"] = doc["transport_binding_signature"].upper()


def _missing_field(doc: dict) -> None:
    del doc["transport_info"]


@pytest.mark.parametrize("tamper, code", [
    (_tamper_ticket, "invitation-bad-signature"),
    (_ticket_mismatch, "invitation-ticket-mismatch"),
    (_endpoint_mismatch, "invitation-endpoint-mismatch"),
    (_uppercase_signature, "invitation-bad-hex"),
    (_missing_field, "invitation-malformed"),
])
def test_publish_refuses_a_bad_invitation(http: httpx.Client, host: Identity, tamper,
                                          code: str) -> None:
    doc = invitation(host).to_dict()
    tamper(doc)
    response = publish(http, doc, host)
    assert response.status_code == 400
    assert error_of(response) == code


def test_publish_refuses_an_expired_invitation(http: httpx.Client, host: Identity) -> None:
    from datetime import datetime, timedelta, timezone
    old = invitation(host, ttl_s=60, now=datetime.now(timezone.utc) - timedelta(hours=1))
    response = publish(http, old.to_dict(), host)
    assert response.status_code == 400 and error_of(response) == "invitation-expired"


def test_publish_signed_by_another_key_is_forbidden(http: httpx.Client, host: Identity,
                                                    guest: Identity) -> None:
    response = publish(http, invitation(host).to_dict(), guest)
    assert response.status_code == 403 and error_of(response) == "forbidden"


@pytest.mark.parametrize("dropped", ["X-Kith-Key", "X-Kith-Timestamp", "X-Kith-Nonce",
                                     "X-Kith-Signature", "all"])
def test_publish_unsigned_is_refused(http: httpx.Client, host: Identity, dropped: str) -> None:
    body = json.dumps(invitation(host).to_dict()).encode()
    headers = signed_headers(host, "POST", "/api/v1/invitations", body)
    headers = {} if dropped == "all" else {k: v for k, v in headers.items() if k != dropped}
    response = http.post("/api/v1/invitations", content=body, headers=headers)
    assert response.status_code == 401 and error_of(response) == "request-unsigned"


def test_publish_with_a_bad_request_signature_is_refused(http: httpx.Client,
                                                         host: Identity) -> None:
    body = json.dumps(invitation(host).to_dict()).encode()
    # signed over another body
    headers = signed_headers(host, "POST", "/api/v1/invitations", body + b" ")
    response = http.post("/api/v1/invitations", content=body, headers=headers)
    assert response.status_code == 401 and error_of(response) == "request-bad-signature"
    # signed for another path
    headers = signed_headers(host, "POST", "/api/v1/sessions", body)
    response = http.post("/api/v1/invitations", content=body, headers=headers)
    assert response.status_code == 401 and error_of(response) == "request-bad-signature"
    # not strict hex
    headers = signed_headers(host, "POST", "/api/v1/invitations", body)
    headers["X-Kith-Key"] = headers["X-Kith-Key"].upper()
    response = http.post("/api/v1/invitations", content=body, headers=headers)
    assert response.status_code == 401 and error_of(response) == "request-bad-signature"
    headers = signed_headers(host, "POST", "/api/v1/invitations", body)
    headers["X-Kith-Timestamp"] = headers["X-Kith-Timestamp"] + ".5"
    response = http.post("/api/v1/invitations", content=body, headers=headers)
    assert response.status_code == 401 and error_of(response) == "request-bad-signature"


@pytest.mark.parametrize("skew", [-(REQUEST_WINDOW_S + 60), REQUEST_WINDOW_S + 60])
def test_publish_with_a_stale_timestamp_is_refused(http: httpx.Client, host: Identity,
                                                   skew: int) -> None:
    response = publish(http, invitation(host).to_dict(), host, now=time.time() + skew)
    assert response.status_code == 401 and error_of(response) == "request-stale"


def test_publish_within_the_window_is_accepted(http: httpx.Client, host: Identity) -> None:
    response = publish(http, invitation(host).to_dict(), host,
                       now=time.time() - REQUEST_WINDOW_S + 30)
    assert response.status_code == 201


def test_a_replayed_request_is_refused(http: httpx.Client, host: Identity) -> None:
    body = json.dumps(invitation(host).to_dict()).encode()
    headers = signed_headers(host, "POST", "/api/v1/invitations", body)
    first = http.post("/api/v1/invitations", content=body, headers=headers)
    assert first.status_code == 201
    again = http.post("/api/v1/invitations", content=body, headers=headers)
    assert again.status_code == 409 and error_of(again) == "request-replayed"


def test_an_oversize_body_is_refused(http: httpx.Client, host: Identity) -> None:
    doc = invitation(host).to_dict()
    doc["message"] = "x" * (MAX_BODY + 10)
    response = publish(http, doc, host)
    assert response.status_code == 413 and error_of(response) == "request-too-large"


def test_an_oversize_streamed_body_without_length_is_refused(http: httpx.Client,
                                                             host: Identity) -> None:
    body = b"x" * (MAX_BODY + 10)
    headers = signed_headers(host, "POST", "/api/v1/invitations", body)

    def chunks():
        for i in range(0, len(body), 8192):
            yield body[i:i + 8192]

    response = http.post("/api/v1/invitations", content=chunks(), headers=headers)
    assert "content-length" not in response.request.headers
    assert response.status_code == 413 and error_of(response) == "request-too-large"


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_a_body_that_is_not_a_json_object_is_refused(http: httpx.Client, host: Identity,
                                                     body: bytes) -> None:
    response = publish(http, body, host)
    assert response.status_code == 400 and error_of(response) == "request-invalid"


def test_get_unknown_or_malformed_post_id_is_not_found(http: httpx.Client) -> None:
    for post_id in ("abcdefghijklmnopqrstuv", "short", "bad%20chars%21%21"):
        response = http.get(f"/api/v1/invitations/{post_id}")
        assert response.status_code == 404 and error_of(response) == "invitation-not-found"


def test_get_an_expired_invitation_answers_410(http: httpx.Client, host: Identity,
                                               clock: Clock) -> None:
    response = publish(http, invitation(host, ttl_s=60).to_dict(), host)
    post_id = response.json()["post_id"]
    assert http.get(f"/api/v1/invitations/{post_id}").status_code == 200
    clock.offset = 120
    response = http.get(f"/api/v1/invitations/{post_id}")
    assert response.status_code == 410 and error_of(response) == "invitation-expired"


# --- sessions ---------------------------------------------------------------------------------
def test_a_valid_session_proof_is_recorded_once(http: httpx.Client, host: Identity,
                                                guest: Identity) -> None:
    post = published(http, host)
    proof = session_proof(host, guest, post["post_id"])
    body = json.dumps(proof).encode()
    response = signed_post(http, "/api/v1/sessions", body, guest)
    assert response.status_code == 201, response.text
    record = response.json()
    assert set(record) == set(proof) | {"created_at", "state", "closed_at", "closed_by",
                                        "close_reason"}
    assert {k: record[k] for k in proof} == proof
    assert record["state"] == "open" and record["closed_at"] is None
    fetched = http.get(f"/api/v1/sessions/{proof['session_id']}")
    assert fetched.status_code == 200 and fetched.json() == record
    # the same proof again (even signed by the other participant) is a duplicate
    again = signed_post(http, "/api/v1/sessions", body, host)
    assert again.status_code == 409 and error_of(again) == "session-duplicate"


def test_session_with_a_wrong_session_id_is_refused(http: httpx.Client, host: Identity,
                                                    guest: Identity) -> None:
    post = published(http, host)
    proof = session_proof(host, guest, post["post_id"])
    proof["session_id"] = "0" * 64
    response = signed_post(http, "/api/v1/sessions", json.dumps(proof).encode(), guest)
    assert response.status_code == 400 and error_of(response) == "session-invalid"


def test_swapped_role_signatures_are_refused(http: httpx.Client, host: Identity,
                                             guest: Identity) -> None:
    post = published(http, host)
    # the host's signature presented as the guest's
    proof = session_proof(host, guest, post["post_id"])
    proof["guest_signature"] = proof["host_signature"]
    response = signed_post(http, "/api/v1/sessions", json.dumps(proof).encode(), host)
    assert response.status_code == 400 and error_of(response) == "session-invalid"
    # a real guest signature made with the host's role tag does not count as the guest's
    proof = session_proof(host, guest, post["post_id"])
    payload = session_payload(**{k: proof[k] for k in (
        "post_id", "protocol_id", "host_public_key", "guest_public_key", "guest_nonce",
        "host_nonce")})
    proof["guest_signature"] = guest.sign(role_message("host", payload))
    response = signed_post(http, "/api/v1/sessions", json.dumps(proof).encode(), guest)
    assert response.status_code == 400 and error_of(response) == "session-invalid"


def test_a_session_with_oneself_is_refused(http: httpx.Client, host: Identity) -> None:
    post = published(http, host)
    response = submit_raw(http, session_proof(host, host, post["post_id"]), host)
    assert response.status_code == 400 and error_of(response) == "session-invalid"


def submit_raw(http: httpx.Client, proof: dict, signer: Identity) -> httpx.Response:
    return signed_post(http, "/api/v1/sessions", json.dumps(proof).encode(), signer)


def test_session_submitted_by_a_non_participant_is_forbidden(
        http: httpx.Client, host: Identity, guest: Identity, tmp_path: Path) -> None:
    post = published(http, host)
    proof = session_proof(host, guest, post["post_id"])
    stranger = identity(tmp_path, "stranger")
    response = signed_post(http, "/api/v1/sessions", json.dumps(proof).encode(), stranger)
    assert response.status_code == 403 and error_of(response) == "forbidden"


def test_session_must_match_a_published_post(http: httpx.Client, host: Identity,
                                             guest: Identity) -> None:
    proof = session_proof(host, guest, "nosuchpost12345")
    response = signed_post(http, "/api/v1/sessions", json.dumps(proof).encode(), guest)
    assert response.status_code == 404 and error_of(response) == "invitation-not-found"
    post = published(http, host)
    proof = session_proof(host, guest, post["post_id"], protocol_id="cd" * 32)
    response = signed_post(http, "/api/v1/sessions", json.dumps(proof).encode(), guest)
    assert response.status_code == 400 and error_of(response) == "session-invalid"
    # a post of another host: the proof's host key differs from the post's
    proof = session_proof(guest, host, post["post_id"])
    response = signed_post(http, "/api/v1/sessions", json.dumps(proof).encode(), guest)
    assert response.status_code == 400 and error_of(response) == "session-invalid"


def test_session_body_with_extra_or_missing_fields_is_refused(
        http: httpx.Client, host: Identity, guest: Identity) -> None:
    post = published(http, host)
    proof = session_proof(host, guest, post["post_id"])
    extra = dict(proof, query="what is asyncio?")
    response = signed_post(http, "/api/v1/sessions", json.dumps(extra).encode(), guest)
    assert response.status_code == 400 and error_of(response) == "request-invalid"
    missing = {k: v for k, v in proof.items() if k != "guest_signature"}
    response = signed_post(http, "/api/v1/sessions", json.dumps(missing).encode(), guest)
    assert response.status_code == 400 and error_of(response) == "request-invalid"


def test_get_unknown_session_is_not_found(http: httpx.Client) -> None:
    for session_id in ("0" * 64, "nothex"):
        response = http.get(f"/api/v1/sessions/{session_id}")
        assert response.status_code == 404 and error_of(response) == "session-not-found"


# --- the client ---------------------------------------------------------------------------------
def test_client_roundtrip_and_error_mapping(url: str, host: Identity, guest: Identity) -> None:
    async def scenario() -> None:
        async with CommunityClient(url, host) as client:
            assert (await client.health())["service"] == "kith-community"
            stored = await client.publish_invitation(invitation(host))
            assert await client.get_invitation(stored.post_id) == stored
            with pytest.raises(InvitationError) as err:
                await client.get_invitation("abcdefghijklmnopqrstuv")
            assert err.value.code == "invitation-not-found" and err.value.status == 404
            with pytest.raises(CommunityError) as err:
                await client.publish_invitation(invitation(guest))
            assert err.value.code == "forbidden" and err.value.status == 403
        async with CommunityClient(url + "/", guest) as client:
            proof = session_proof(host, guest, stored.post_id)
            record = await client.submit_session(proof)
            assert record["session_id"] == proof["session_id"] and "created_at" in record
            assert await client.get_session(proof["session_id"]) == record
            with pytest.raises(CommunityError) as err:
                await client.submit_session(proof)
            assert err.value.code == "session-duplicate" and err.value.status == 409
        async with CommunityClient(url) as anonymous:
            with pytest.raises(UsageError):
                await anonymous.publish_invitation(invitation(host))

    asyncio.run(scenario())


def test_client_concurrent_publishes_all_land(url: str, host: Identity) -> None:
    async def scenario() -> list[Invitation]:
        async with CommunityClient(url, host) as client:
            return await asyncio.gather(*(client.publish_invitation(invitation(host))
                                          for _ in range(20)))

    stored = asyncio.run(scenario())
    assert len({inv.post_id for inv in stored}) == 20


def test_client_unreachable_server_names_the_url() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"

    async def scenario() -> None:
        async with CommunityClient(url, timeout_s=2) as client:
            await client.health()

    with pytest.raises(CommunityError) as err:
        asyncio.run(scenario())
    assert err.value.code == "server-unreachable"
    assert url in err.value.message and "Errno" not in err.value.message


@pytest.mark.parametrize("bad", ["ftp://example.org", "127.0.0.1:8787", "http://", "",
                                 "http://h:99999"])
def test_client_refuses_a_non_http_url(bad: str) -> None:
    with pytest.raises(UsageError):
        CommunityClient(bad)


def test_client_maps_an_unregistered_server_code_to_server_error(tmp_path: Path) -> None:
    # a tiny non-Kith server answering an error with an unknown code
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    import uvicorn
    import threading

    async def bad(request):
        return JSONResponse({"error": {"code": "teapot", "message": "short and stout"}}, 418)

    config = uvicorn.Config(Starlette(routes=[Route("/api/v1/health", bad)]), host="127.0.0.1",
                            port=0, log_config=None, lifespan="off")
    srv = uvicorn.Server(config)
    from node.common.http import base_url_of, bind_socket
    sock = bind_socket("127.0.0.1", 0)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not srv.started:
            time.sleep(0.01)

        async def scenario() -> None:
            async with CommunityClient(base_url_of(sock)) as client:
                await client.health()

        with pytest.raises(CommunityError) as err:
            asyncio.run(scenario())
        assert err.value.code == "server-error" and err.value.status == 418
        assert err.value.message == "short and stout"
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()


# --- storage ------------------------------------------------------------------------------------
def test_store_prunes_nonces_older_than_the_window(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "c.sqlite3")
    now = 1_000_000.0
    assert store.remember_nonce("a" * 64, "k" * 64, int(now), now=now, window_s=300)
    assert not store.remember_nonce("a" * 64, "k" * 64, int(now), now=now + 10, window_s=300)
    assert store.remember_nonce("b" * 64, "k" * 64, int(now) + 400, now=now + 400, window_s=300)
    assert store.nonce_count() == 1  # the first one is past the window and forgotten


def test_database_has_no_place_for_queries_or_answers(server) -> None:
    db = server[2]
    with sqlite3.connect(db) as conn:
        tables = {row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        columns = {col for table in tables
                   for col in (r[1] for r in conn.execute(f"PRAGMA table_info({table})"))}
    assert tables == set(TABLES)
    assert mode == "wal"
    assert_no_content_columns(columns)


def test_server_module_does_not_import_iroh() -> None:
    code = ("import sys, node.community.server, node.community.client; "
            "assert 'iroh' not in sys.modules, 'iroh imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_invitation_json_is_what_the_client_decodes(http: httpx.Client, host: Identity) -> None:
    stored = published(http, host)
    msgspec.convert(stored, Invitation)  # the server answers the invitation schema exactly


# =============================================================================================
# The complete server: identities, protocols, browse, status, renew, withdraw, max_sessions,
# session close, feedback, rate limits, hostile input.
# =============================================================================================
#: Words that would betray a query, an answer or corpus data being stored (DESIGN §12).
def signed(http: httpx.Client, method: str, path: str, doc: dict | bytes | None,
           signer: Identity, **kw) -> httpx.Response:
    body = b"" if doc is None else doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    headers = signed_headers(signer, method, path, body, **kw)
    return http.request(method, path, content=body, headers=headers)


def submit(http: httpx.Client, proof: dict, signer: Identity) -> httpx.Response:
    return signed(http, "POST", "/api/v1/sessions", proof, signer)


def publish_with(http: httpx.Client, host: Identity, **kw) -> dict:
    response = publish(http, invitation(host, **kw).to_dict(), host)
    assert response.status_code == 201, response.text
    return response.json()


def a_session(http: httpx.Client, host: Identity, guest: Identity) -> dict:
    post = published(http, host)
    proof = session_proof(host, guest, post["post_id"])
    response = submit(http, proof, guest)
    assert response.status_code == 201, response.text
    return response.json()


# --- identities ------------------------------------------------------------------------------
def test_register_identity_with_proof_of_possession_then_get(http: httpx.Client,
                                                             host: Identity) -> None:
    response = signed(http, "POST", "/api/v1/identities",
                      {"display_name": "Ada's notes", "about": "python, sqlite"}, host)
    assert response.status_code == 201, response.text
    record = response.json()
    assert record["public_key"] == host.public_key and record["display_name"] == "Ada's notes"
    assert record["ratings"] == {"count": 0, "average": None}
    assert http.get(f"/api/v1/identities/{host.public_key}").json() == record
    # registering again replaces the profile (200, not 201)
    response = signed(http, "POST", "/api/v1/identities", {"display_name": "Ada"}, host)
    assert response.status_code == 200 and response.json()["display_name"] == "Ada"
    assert response.json()["about"] == ""


def test_an_identity_is_only_ever_the_signing_key(http: httpx.Client, host: Identity,
                                                  guest: Identity) -> None:
    # no field can name another key: the signer is the identity
    response = signed(http, "POST", "/api/v1/identities",
                      {"display_name": "x", "public_key": guest.public_key}, host)
    assert response.status_code == 400 and error_of(response) == "request-invalid"
    # claiming the guest's key in the header with the host's signature fails
    body = json.dumps({"display_name": "mallory"}).encode()
    headers = signed_headers(host, "POST", "/api/v1/identities", body)
    headers["X-Kith-Key"] = guest.public_key
    response = http.post("/api/v1/identities", content=body, headers=headers)
    assert response.status_code == 401 and error_of(response) == "request-bad-signature"
    response = http.post("/api/v1/identities", content=body)
    assert response.status_code == 401 and error_of(response) == "request-unsigned"
    assert http.get(f"/api/v1/identities/{guest.public_key}").status_code == 404


@pytest.mark.parametrize("profile", [
    {"display_name": ""}, {"display_name": "   "}, {"display_name": "a" * 65},
    {"display_name": "bell\x07"}, {"display_name": "ok", "about": "x" * 501},
    {"display_name": "ok", "about": "line\nbreak"}, {"display_name": 5}, {},
    {"display_name": "evil\u202etxt.exe"}, {"display_name": "\x1b[31mred"},
])
def test_register_refuses_a_bad_profile(http: httpx.Client, host: Identity, profile) -> None:
    response = signed(http, "POST", "/api/v1/identities", profile, host)
    assert response.status_code == 400 and error_of(response) == "request-invalid"


def test_get_unknown_or_malformed_identity(http: httpx.Client) -> None:
    for key in ("ab" * 32, "AB" * 32, "short"):
        response = http.get(f"/api/v1/identities/{key}")
        assert response.status_code == 404 and error_of(response) == "identity-not-found"


# --- protocols ---------------------------------------------------------------------------------
def _bundled_spec(name: str = "knowledge-query"):
    return load_spec(PROTOCOLS / name)


def test_publish_a_spec_by_content_and_fetch_it_by_protocol_id(http: httpx.Client,
                                                               host: Identity,
                                                               guest: Identity) -> None:
    spec = _bundled_spec()
    response = signed(http, "POST", "/api/v1/protocols", spec.raw, host)
    assert response.status_code in (200, 201), response.text
    record = response.json()
    assert record["protocol_id"] == spec.protocol_id  # the server recomputed the same id
    assert record["name"] == "knowledge-query" and record["spec"] == spec.raw
    assert response.headers["location"] == f"/api/v1/protocols/{spec.protocol_id}"
    # the same spec again (by anyone, keys reordered) is the same record
    reordered = dict(reversed(list(spec.raw.items())))
    again = signed(http, "POST", "/api/v1/protocols", reordered, guest)
    assert again.status_code == 200 and again.json() == http.get(
        f"/api/v1/protocols/{spec.protocol_id}").json()
    assert again.json()["protocol_id"] == spec.protocol_id


def test_publish_protocol_refuses_an_invalid_spec(http: httpx.Client, host: Identity) -> None:
    raw = json.loads(json.dumps(_bundled_spec("echo").raw))
    for broken, code in [
        ({k: v for k, v in raw.items() if k != "messages"}, "spec-invalid"),
        (dict(raw, messages={"_sneaky": next(iter(raw["messages"].values()))}), "spec-invalid"),
        (dict(raw, limits={"max_messages": 2 ** 60}), "spec-invalid"),  # meta-schema max
        (dict(raw, description={"a": {"b": 1}}), "spec-invalid"),
    ]:
        response = signed(http, "POST", "/api/v1/protocols", broken, host)
        assert response.status_code == 400 and error_of(response) == code, response.text
    # a value RFC 8785 cannot canonicalise is refused, not a crash
    action, message = next(iter(raw["messages"].items()))
    message = json.loads(json.dumps(message))
    message["schema"]["properties"]["n"] = {"type": "integer", "maximum": 2 ** 60}
    response = signed(http, "POST", "/api/v1/protocols",
                      dict(raw, messages={action: message}), host)
    assert response.status_code == 400 and error_of(response) == "spec-invalid"


def test_get_unknown_protocol_id(http: httpx.Client) -> None:
    for pid in ("0" * 64, "zz", "AB" * 32):
        response = http.get(f"/api/v1/protocols/{pid}")
        assert response.status_code == 404 and error_of(response) == "protocol-id-not-found"


def test_client_checks_a_fetched_spec_hashes_to_its_id(url: str, host: Identity) -> None:
    spec = _bundled_spec("echo")

    async def scenario() -> None:
        async with CommunityClient(url, host) as client:
            published_record = await client.publish_protocol(spec.raw)
            assert published_record["protocol_id"] == spec.protocol_id
            fetched = await client.get_protocol(spec.protocol_id)
            assert fetched["spec"] == spec.raw
            with pytest.raises(CommunityError) as err:
                await client.get_protocol("0" * 64)
            assert err.value.code == "protocol-id-not-found"

    asyncio.run(scenario())


def test_client_refuses_a_spec_that_does_not_hash_to_its_id(tmp_path: Path) -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    spec = _bundled_spec("echo")

    async def lying(request):  # answers any id with the echo spec
        return JSONResponse({"protocol_id": request.path_params["pid"], "name": "echo",
                             "version": "1", "spec": spec.raw, "published_by": "ab" * 32,
                             "created_at": "2030-01-01T00:00:00Z"})

    with _tiny_server(Starlette(routes=[Route("/api/v1/protocols/{pid}", lying)])) as base:
        async def scenario() -> None:
            async with CommunityClient(base) as client:
                assert (await client.get_protocol(spec.protocol_id))["spec"] == spec.raw
                await client.get_protocol("cd" * 32)

        with pytest.raises(CommunityError) as err:
            asyncio.run(scenario())
    assert err.value.code == "server-error"


@contextlib.contextmanager
def _tiny_server(app):
    import threading

    import uvicorn

    from node.common.http import base_url_of, bind_socket
    srv = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    sock = bind_socket("127.0.0.1", 0)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not srv.started:
            time.sleep(0.01)
        yield base_url_of(sock)
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()



# --- browse ------------------------------------------------------------------------------------
def test_browse_filters_by_protocol_tag_and_host_and_pages(http: httpx.Client, host: Identity,
                                                          guest: Identity) -> None:
    tag = "t" + secrets_hex(6)
    signed(http, "POST", "/api/v1/identities", {"display_name": "Browse Host"}, host)
    first = publish_with(http, host, tags=[tag, "Python"], message="the python docs")
    second = publish_with(http, host, tags=[tag.upper()])
    other = publish_with(http, guest, tags=["elsewhere"])
    page = http.get("/api/v1/invitations", params={"tag": tag}).json()
    assert [p["post_id"] for p in page["invitations"]] == [second["post_id"], first["post_id"]]
    assert page["next_cursor"] is None
    item = page["invitations"][1]
    assert item["invitation"] == first and item["state"] == "live"
    assert item["host_display_name"] == "Browse Host" and item["sessions"] == 0
    # host filter; protocol by name and by id
    mine = http.get("/api/v1/invitations", params={"host": guest.public_key}).json()
    assert [p["post_id"] for p in mine["invitations"]] == [other["post_id"]]
    for proto in ("knowledge-query", PROTOCOL_ID):
        got = http.get("/api/v1/invitations", params={"protocol": proto, "tag": tag}).json()
        assert len(got["invitations"]) == 2
    none = http.get("/api/v1/invitations", params={"protocol": "echo", "tag": tag}).json()
    assert none == {"invitations": [], "next_cursor": None}
    # paging: limit 1, then the cursor
    p1 = http.get("/api/v1/invitations", params={"tag": tag, "limit": 1}).json()
    assert [p["post_id"] for p in p1["invitations"]] == [second["post_id"]]
    p2 = http.get("/api/v1/invitations",
                  params={"tag": tag, "limit": 1, "cursor": p1["next_cursor"]}).json()
    assert [p["post_id"] for p in p2["invitations"]] == [first["post_id"]]


def secrets_hex(n: int) -> str:
    return secrets.token_hex(n)


def test_browse_lists_only_live_posts(http: httpx.Client, host: Identity, guest: Identity,
                                      clock: Clock) -> None:
    tag = "live" + secrets_hex(4)
    live = publish_with(http, host, tags=[tag])
    withdrawn = publish_with(http, host, tags=[tag])
    consumed = publish_with(http, host, tags=[tag], max_sessions=1)
    expiring = publish_with(http, host, tags=[tag], ttl_s=60)
    assert signed(http, "POST", f"/api/v1/invitations/{withdrawn['post_id']}/withdraw", None,
                  host).status_code == 200
    assert submit(http, session_proof(host, guest, consumed["post_id"]), guest).status_code == 201
    clock.offset = 120
    listed = http.get("/api/v1/invitations", params={"tag": tag}).json()["invitations"]
    assert [p["post_id"] for p in listed] == [live["post_id"]]
    states = {p["post_id"]: http.get(f"/api/v1/invitations/{p['post_id']}/status").json()["state"]
              for p in (live, withdrawn, consumed, expiring)}
    assert states == {live["post_id"]: "live", withdrawn["post_id"]: "withdrawn",
                      consumed["post_id"]: "consumed", expiring["post_id"]: "expired"}


@pytest.mark.parametrize("query", [
    "nope=1", "tag=a&tag=b", "limit=0", "limit=101", "limit=x", "tag=-bad", "tag=" + "a" * 33,
    "protocol=Bad_Name", "host=ABC", "cursor=0", "cursor=abc",
])
def test_browse_refuses_bad_parameters(http: httpx.Client, query: str) -> None:
    response = http.get(f"/api/v1/invitations?{query}")
    assert response.status_code == 400 and error_of(response) == "request-invalid"


# --- invitation bounds ------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    {"max_sessions": 0}, {"max_sessions": 1_000_001}, {"tags": ["t"] * 17},
    {"tags": ["has space"]}, {"tags": ["-dash"]}, {"message": "bell\x07"},
    {"message": "m" * 1001}, {"ttl_s": 40 * 24 * 3600},
])
def test_publish_refuses_out_of_bounds_fields(http: httpx.Client, host: Identity, kw) -> None:
    response = publish(http, invitation(host, **kw).to_dict(), host)
    assert response.status_code == 400 and error_of(response) == "invitation-malformed"


# --- renew and withdraw -------------------------------------------------------------------------
def _renewal(host: Identity, doc: dict, expires: datetime) -> dict:
    inv = msgspec.convert(doc, Invitation)
    inv.expires_at = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"expires_at": inv.expires_at,
            "transport_binding_signature": host.sign(inv.binding_payload())}


def test_renew_moves_the_expiry_and_keeps_the_post_joinable(http: httpx.Client, host: Identity,
                                                            guest: Identity,
                                                            clock: Clock) -> None:
    post = publish_with(http, host, ttl_s=60)
    path = f"/api/v1/invitations/{post['post_id']}/renew"
    later = datetime.now(timezone.utc) + timedelta(hours=2)
    body = _renewal(host, post, later)
    assert signed(http, "POST", path, body, guest).status_code == 403  # not the host
    response = signed(http, "POST", path, body, host)
    assert response.status_code == 200, response.text
    renewed = response.json()
    assert renewed["expires_at"] == body["expires_at"] and renewed["post_id"] == post["post_id"]
    clock.offset = 600  # the old expiry has passed, the new one has not
    fetched = http.get(f"/api/v1/invitations/{post['post_id']}")
    assert fetched.status_code == 200 and fetched.json() == renewed
    # the stored document still verifies like join would verify it
    from node.community.server import check_invitation
    check_invitation(msgspec.convert(renewed, Invitation), now=time.time() + 600)


def test_renew_refusals(http: httpx.Client, host: Identity, clock: Clock) -> None:
    post = publish_with(http, host)
    path = f"/api/v1/invitations/{post['post_id']}/renew"
    later = datetime.now(timezone.utc) + timedelta(hours=2)
    good = _renewal(host, post, later)
    bad_sig = dict(good, expires_at=(later + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    cases = [
        (bad_sig, 400, "invitation-bad-signature"),  # signature over another expiry
        (dict(good, transport_binding_signature="AB" * 64), 400, "invitation-bad-hex"),
        (_renewal(host, post, datetime.now(timezone.utc) + timedelta(days=40)), 400,
         "invitation-malformed"),
        (_renewal(host, post, datetime.now(timezone.utc) - timedelta(hours=1)), 400,
         "invitation-expired"),
        (dict(good, expires_at="tomorrow"), 400, "invitation-bad-signature"),
        ({"expires_at": good["expires_at"]}, 400, "request-invalid"),
        (dict(good, extra=1), 400, "request-invalid"),
    ]
    for body, status, code in cases:
        response = signed(http, "POST", path, body, host)
        assert response.status_code == status and error_of(response) == code, (body, response.text)
    response = signed(http, "POST", "/api/v1/invitations/nosuchpost1234/renew", good, host)
    assert response.status_code == 404 and error_of(response) == "invitation-not-found"
    # a withdrawn post cannot be renewed
    assert signed(http, "POST", f"/api/v1/invitations/{post['post_id']}/withdraw", None,
                  host).status_code == 200
    response = signed(http, "POST", path, good, host)
    assert response.status_code == 410 and error_of(response) == "invitation-withdrawn"


def test_withdraw(http: httpx.Client, host: Identity, guest: Identity) -> None:
    post = publish_with(http, host)
    path = f"/api/v1/invitations/{post['post_id']}/withdraw"
    response = signed(http, "POST", path, None, guest)
    assert response.status_code == 403 and error_of(response) == "forbidden"
    response = signed(http, "POST", path, {"reason": "x"}, host)
    assert response.status_code == 400 and error_of(response) == "request-invalid"
    response = signed(http, "POST", path, None, host)
    assert response.status_code == 200 and response.json()["state"] == "withdrawn"
    withdrawn_at = response.json()["withdrawn_at"]
    again = signed(http, "POST", path, {}, host)  # idempotent: the first time is kept
    assert again.status_code == 200 and again.json()["withdrawn_at"] == withdrawn_at
    response = http.get(f"/api/v1/invitations/{post['post_id']}")
    assert response.status_code == 410 and error_of(response) == "invitation-withdrawn"
    response = submit(http, session_proof(host, guest, post["post_id"]), guest)
    assert response.status_code == 410 and error_of(response) == "invitation-withdrawn"


# --- max_sessions ---------------------------------------------------------------------------------
def test_a_single_use_invitation_is_consumed_by_its_first_session(
        http: httpx.Client, host: Identity, guest: Identity, tmp_path: Path) -> None:
    post = publish_with(http, host, max_sessions=1)
    assert post["max_sessions"] == 1
    assert submit(http, session_proof(host, guest, post["post_id"]), guest).status_code == 201
    second_guest = identity(tmp_path, "second")
    response = submit(http, session_proof(host, second_guest, post["post_id"]), second_guest)
    assert response.status_code == 409 and error_of(response) == "invitation-consumed"
    response = http.get(f"/api/v1/invitations/{post['post_id']}")
    assert response.status_code == 410 and error_of(response) == "invitation-consumed"
    status = http.get(f"/api/v1/invitations/{post['post_id']}/status").json()
    assert (status["state"], status["sessions"], status["max_sessions"]) == ("consumed", 1, 1)
    response = signed(http, "POST", f"/api/v1/invitations/{post['post_id']}/renew",
                      _renewal(host, post, datetime.now(timezone.utc) + timedelta(hours=3)), host)
    assert response.status_code == 410 and error_of(response) == "invitation-consumed"


def test_racing_proofs_never_exceed_max_sessions(url: str, host: Identity,
                                                 tmp_path: Path) -> None:
    with httpx.Client(base_url=url, timeout=10) as http:
        post = publish_with(http, host, max_sessions=3)
    guests = [identity(tmp_path, f"g{i}") for i in range(12)]

    async def race() -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=20) as client:
            async def one(g: Identity) -> int:
                body = json.dumps(session_proof(host, g, post["post_id"])).encode()
                headers = signed_headers(g, "POST", "/api/v1/sessions", body)
                return (await client.post("/api/v1/sessions", content=body,
                                          headers=headers)).status_code
            return await asyncio.gather(*(one(g) for g in guests))

    codes = asyncio.run(race())
    assert sorted(codes) == [201] * 3 + [409] * 9
    with httpx.Client(base_url=url, timeout=10) as http:
        assert http.get(f"/api/v1/invitations/{post['post_id']}/status").json()["sessions"] == 3


# --- session status and close ------------------------------------------------------------------
def test_close_a_session(http: httpx.Client, host: Identity, guest: Identity,
                         tmp_path: Path) -> None:
    record = a_session(http, host, guest)
    path = f"/api/v1/sessions/{record['session_id']}/close"
    stranger = identity(tmp_path, "stranger")
    response = signed(http, "POST", path, {"reason": "completed"}, stranger)
    assert response.status_code == 403 and error_of(response) == "forbidden"
    for bad in ({"reason": "Not A Code"}, {"reason": ""}, {"why": "x"}):
        response = signed(http, "POST", path, bad, guest)
        assert response.status_code == 400 and error_of(response) == "request-invalid"
    response = signed(http, "POST", path, {"reason": "peer-unresponsive"}, host)
    assert response.status_code == 200
    closed = response.json()
    assert closed["state"] == "closed" and closed["closed_by"] == host.public_key
    assert closed["close_reason"] == "peer-unresponsive" and closed["closed_at"]
    assert http.get(f"/api/v1/sessions/{record['session_id']}").json() == closed
    response = signed(http, "POST", path, None, guest)
    assert response.status_code == 409 and error_of(response) == "session-closed"
    response = signed(http, "POST", f"/api/v1/sessions/{'0' * 64}/close", None, guest)
    assert response.status_code == 404 and error_of(response) == "session-not-found"


# --- feedback ---------------------------------------------------------------------------------------
def test_feedback_once_per_participant_only_by_participants(
        http: httpx.Client, host: Identity, guest: Identity, tmp_path: Path) -> None:
    signed(http, "POST", "/api/v1/identities", {"display_name": "rated host"}, host)
    record = a_session(http, host, guest)
    sid = record["session_id"]
    path = f"/api/v1/sessions/{sid}/feedback"
    # the session may be closed (or the peer gone): the session_id stays valid for feedback
    assert signed(http, "POST", f"/api/v1/sessions/{sid}/close", None, host).status_code == 200
    response = signed(http, "POST", path, {"rating": 5, "comment": "found it fast"}, guest)
    assert response.status_code == 201, response.text
    assert [(f["rater_role"], f["rating"]) for f in response.json()["feedback"]] == [("guest", 5)]
    response = signed(http, "POST", path, {"rating": 2}, guest)
    assert response.status_code == 409 and error_of(response) == "feedback-duplicate"
    stranger = identity(tmp_path, "stranger")
    response = signed(http, "POST", path, {"rating": 1}, stranger)
    assert response.status_code == 403 and error_of(response) == "forbidden"
    response = signed(http, "POST", path, {"rating": 4}, host)
    assert response.status_code == 201
    listed = http.get(path).json()
    assert listed["session_id"] == sid
    assert {(f["rater_public_key"], f["rater_role"], f["rating"], f["comment"])
            for f in listed["feedback"]} == {(guest.public_key, "guest", 5, "found it fast"),
                                             (host.public_key, "host", 4, None)}
    # the guest's rating counts for the host's identity
    assert http.get(f"/api/v1/identities/{host.public_key}").json()["ratings"] == \
        {"count": 1, "average": 5.0}
    response = http.post(path, content=json.dumps({"rating": 5}).encode())
    assert response.status_code == 401 and error_of(response) == "request-unsigned"


@pytest.mark.parametrize("body", [
    {"rating": 0}, {"rating": 6}, {"rating": True}, {"rating": 3.5}, {"rating": "5"}, {},
    {"rating": 3, "comment": "c" * 1001}, {"rating": 3, "comment": "nul\x00"},
    {"rating": 3, "extra": 1},
])
def test_feedback_refuses_a_bad_body(http: httpx.Client, host: Identity, guest: Identity,
                                     body) -> None:
    record = a_session(http, host, guest)
    response = signed(http, "POST", f"/api/v1/sessions/{record['session_id']}/feedback",
                      body, guest)
    assert response.status_code == 400 and error_of(response) == "request-invalid"


def test_feedback_for_an_unknown_session(http: httpx.Client, guest: Identity) -> None:
    response = signed(http, "POST", f"/api/v1/sessions/{'0' * 64}/feedback", {"rating": 5}, guest)
    assert response.status_code == 404 and error_of(response) == "session-not-found"


def test_client_session_close_and_feedback(url: str, host: Identity, guest: Identity) -> None:
    async def scenario() -> None:
        async with CommunityClient(url, host) as hc, CommunityClient(url, guest) as gc:
            stored = await hc.publish_invitation(invitation(host))
            proof = session_proof(host, guest, stored.post_id)
            await gc.submit_session(proof)
            sid = proof["session_id"]
            closed = await gc.close_session(sid, "completed")
            assert closed["state"] == "closed" and closed["close_reason"] == "completed"
            with pytest.raises(ProtocolViolation) as err:
                await hc.close_session(sid)
            assert err.value.code == "session-closed" and err.value.status == 409
            got = await gc.submit_feedback(sid, 4, "good")
            assert got["feedback"][0]["rating"] == 4
            with pytest.raises(CommunityError) as err:
                await gc.submit_feedback(sid, 5)
            assert err.value.code == "feedback-duplicate"
            assert (await hc.get_feedback(sid))["feedback"] == got["feedback"]
            status = await hc.invitation_status(stored.post_id)
            assert status["sessions"] == 1 and status["state"] == "live"
            renewed = await hc.renew_invitation(stored, ttl_s=7200)
            assert renewed.expires_at != stored.expires_at
            assert (await gc.get_invitation(stored.post_id)) == renewed
            withdrawn = await hc.withdraw_invitation(stored.post_id)
            assert withdrawn["state"] == "withdrawn"
            with pytest.raises(CommunityError) as err:
                await gc.get_invitation(stored.post_id)
            assert err.value.code == "invitation-withdrawn" and err.value.status == 410
            me = await gc.register_identity("guest g")
            assert (await hc.get_identity(guest.public_key)) == me

    asyncio.run(scenario())


# --- rate limits ----------------------------------------------------------------------------------
def test_shared_bucket_refills_and_stays_bounded(tmp_path: Path) -> None:
    """The database bucket (GCRA) grants a burst, then one token per 1/rate seconds; buckets
    that are full again are pruned, so the table stays bounded."""
    store = SqliteStore(tmp_path / "rl.sqlite3")

    def take(key: str, now: float) -> float:
        return store.take_token(key, rate_per_s=2.0, burst=3, now=now)

    assert [take("k", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert take("k", 0.0) == pytest.approx(0.5)   # empty: half a second to the next token
    assert take("k", 0.5) == 0.0
    assert take("other", 0.5) == 0.0              # per key
    for i in range(200):
        take(f"key{i}", 1.0)
    take("late", 1000.0)                          # long after: the refilled buckets go
    with sqlite3.connect(tmp_path / "rl.sqlite3") as conn:
        assert conn.execute("SELECT count(*) FROM rate_limits").fetchone()[0] == 1


def test_per_key_rate_limit_answers_429_with_retry_after(tmp_path: Path, host: Identity,
                                                         guest: Identity) -> None:
    limits = RateLimits(per_key=RateLimit(0.5, 3), per_address=RateLimit(1000, 1000))
    with run_server_in_thread(tmp_path / "rl.sqlite3", rate_limits=limits) as base, \
            httpx.Client(base_url=base, timeout=10) as http:
        codes = [signed(http, "POST", "/api/v1/identities", {"display_name": "h"}, host).status_code
                 for _ in range(4)]
        assert codes == [201, 200, 200, 429]
        response = signed(http, "POST", "/api/v1/identities", {"display_name": "h"}, host)
        assert response.status_code == 429 and error_of(response) == "rate-limited"
        assert int(response.headers["retry-after"]) >= 1
        # another key has its own bucket; reads are not per-key limited
        assert signed(http, "POST", "/api/v1/identities", {"display_name": "g"},
                      guest).status_code == 201
        assert http.get(f"/api/v1/identities/{host.public_key}").status_code == 200


def test_per_address_rate_limit(tmp_path: Path) -> None:
    limits = RateLimits(per_key=RateLimit(1000, 1000), per_address=RateLimit(0.2, 5))
    with run_server_in_thread(tmp_path / "rl.sqlite3", rate_limits=limits) as base, \
            httpx.Client(base_url=base, timeout=10) as http:
        codes = [http.get("/api/v1/health").status_code for _ in range(7)]
        assert codes == [200] * 5 + [429] * 2
        response = http.get("/api/v1/invitations")
        assert error_of(response) == "rate-limited" and response.headers["retry-after"] == "5"


# --- hostile input ----------------------------------------------------------------------------------
def test_deeply_nested_json_is_refused_not_a_crash(http: httpx.Client, host: Identity) -> None:
    deep = b"[" * 50_000 + b"]" * 50_000
    for path in ("/api/v1/invitations", "/api/v1/identities", "/api/v1/protocols"):
        response = signed(http, "POST", path, b'{"a":' + deep + b"}", host)
        assert response.status_code in (400, 413), response.text
        assert error_of(response) in ("request-invalid", "request-too-large")
    shallow_but_deep = json.dumps({"display_name": "x", "about": "y"}).encode()
    assert signed(http, "POST", "/api/v1/identities", shallow_but_deep, host).status_code in (200, 201)
    nested: dict = {}
    cur = nested
    for _ in range(40):
        cur["a"] = {}
        cur = cur["a"]
    response = signed(http, "POST", "/api/v1/protocols", nested, host)
    assert response.status_code == 400 and error_of(response) == "request-invalid"


def test_oversize_spec_is_refused(http: httpx.Client, host: Identity) -> None:
    raw = dict(_bundled_spec("echo").raw, description="d" * (300 * 1024))
    response = signed(http, "POST", "/api/v1/protocols", raw, host)
    assert response.status_code == 413 and error_of(response) == "request-too-large"


def test_head_and_odd_paths_answer_json(http: httpx.Client) -> None:
    assert http.head("/api/v1/health").status_code == 200
    for path in ("/api/v1/invitations/..%2F..%2Fetc", "/api/v1/sessions/%00",
                 "/api/v1/identities/" + "a" * 5000):
        response = http.get(path)
        assert response.status_code in (404, 414), path
        if response.status_code == 404:
            assert error_of(response) in ("not-found", "invitation-not-found",
                                          "session-not-found", "identity-not-found")
    response = http.put("/api/v1/invitations")
    assert response.status_code == 405 and error_of(response) == "method-not-allowed"


def test_error_messages_never_echo_secrets_or_paths(http: httpx.Client, host: Identity,
                                                    server) -> None:
    db = server[2]
    for response in (
        signed(http, "POST", "/api/v1/identities", {"display_name": "\x00"}, host),
        http.get("/api/v1/invitations?nope=" + "x" * 100),
        signed(http, "POST", "/api/v1/protocols", {"spec_version": 2}, host),
    ):
        text = response.text
        assert str(db) not in text and "Traceback" not in text and "/work" not in text


# --- the host's post keeper ------------------------------------------------------------------------
def test_keeper_republishes_expired_and_consumed_posts_and_closes_sessions(
        url: str, host: Identity, guest: Identity, clock: Clock) -> None:
    import anyio

    from node.community.keeper import PostKeeper

    republished: list[tuple[str, str, str]] = []

    async def scenario() -> None:
        async with CommunityClient(url, host) as client:
            first = await client.publish_invitation(invitation(host, ttl_s=60))
        keeper = PostKeeper(url, host, first, make_invitation=lambda: invitation(host, max_sessions=1),
                            on_republished=lambda prev, why, new: republished.append(
                                (prev, why, new.post_id)),
                            poll_s=30)
        async with anyio.create_task_group() as tg:
            tg.start_soon(keeper.run)
            clock.offset = 120  # the server now sees the first post expired
            keeper.observe({"event": "session-started"})
            with anyio.fail_after(10):
                while not republished:
                    await anyio.sleep(0.02)
            clock.offset = 0
            second = keeper.current
            assert republished == [(first.post_id, "expired", second.post_id)]
            # a session on the single-use second post consumes it → a third post
            proof = session_proof(host, guest, second.post_id)
            async with CommunityClient(url, guest) as gc:
                await gc.submit_session(proof)
            keeper.observe({"event": "session-started", "session_id": proof["session_id"]})
            keeper.observe({"event": "session-ended", "session_id": proof["session_id"],
                            "reason": "aborted", "code": "peer-unresponsive"})
            with anyio.fail_after(10):
                while len(republished) < 2:
                    await anyio.sleep(0.02)
            assert republished[1][:2] == (second.post_id, "consumed")
            with anyio.fail_after(10):
                while True:
                    async with CommunityClient(url) as anon:
                        record = await anon.get_session(proof["session_id"])
                    if record["state"] == "closed":
                        break
                    await anyio.sleep(0.02)
            assert record["close_reason"] == "peer-unresponsive"
            assert record["closed_by"] == host.public_key
            # the owner withdraws the current post: the keeper stops, no republish
            async with CommunityClient(url, host) as client:
                await client.withdraw_invitation(keeper.current.post_id)
            keeper.observe({"event": "session-started"})
            with anyio.fail_after(10):
                while keeper.stopped_reason is None:
                    await anyio.sleep(0.02)
            assert len(republished) == 2

    asyncio.run(scenario())


def test_x_forwarded_for_is_ignored_unless_a_proxy_is_trusted(tmp_path: Path) -> None:
    """Issue 11: a fresh X-Forwarded-For per request does not get a fresh address bucket
    by default; with --trust-proxy 127.0.0.1 the header names the client."""
    limits = RateLimits(per_key=RateLimit(1000, 1000), per_address=RateLimit(0.2, 5))

    def codes(**kw) -> list[int]:
        with run_server_in_thread(tmp_path / f"xff{len(kw)}.sqlite3", rate_limits=limits, **kw) as base, \
                httpx.Client(base_url=base, timeout=10) as http:
            return [http.get("/api/v1/health", headers={"X-Forwarded-For": f"203.0.113.{i}"}).status_code
                    for i in range(8)]

    assert codes() == [200] * 5 + [429] * 3
    assert codes(trust_proxy=["127.0.0.0/8"]) == [200] * 8


def test_trust_proxy_values_are_checked() -> None:
    from node.common.http import parse_trust_proxy

    assert parse_trust_proxy(["127.0.0.1", "10.1.2.3/8", "::1"]) == ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]
    with pytest.raises(UsageError):
        parse_trust_proxy(["localhost"])
