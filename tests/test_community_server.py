"""The community server over real HTTP: a uvicorn server on 127.0.0.1, real httpx, real
Ed25519 signatures, real SQLite (DESIGN §4, §5, §12; specs/community-api.md)."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from node.community.client import CommunityClient
from node.community.requests import REQUEST_WINDOW_S, signed_headers
from node.community.server import run_server_in_thread
from node.community.store import CommunityStore
from node.errors import CommunityError, UsageError
from node.identity import Identity, init_identity
from node.invitation import POST_ID_RE, Invitation, create_invitation
from node.signing import new_nonce, role_message, session_id_of, session_payload

PROTOCOL_ID = "ab" * 32
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
    with run_server_in_thread(db, max_body_bytes=MAX_BODY, clock=clock) as url:
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


def invitation(host: Identity, **kw) -> Invitation:
    return create_invitation(host, protocol_name="knowledge-query", protocol_version="1",
                             protocol_id=PROTOCOL_ID, ticket="endpointfaketicket", **kw)


def signed_post(http: httpx.Client, path: str, body: bytes, signer: Identity, *,
                now: float | None = None) -> httpx.Response:
    headers = signed_headers(signer, "POST", path, body, now=now)
    return http.post(path, content=body, headers=headers)


def publish(http: httpx.Client, doc: dict | bytes, signer: Identity, **kw) -> httpx.Response:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return signed_post(http, "/api/v1/invitations", body, signer, **kw)


def error_of(response: httpx.Response) -> str:
    data = response.json()
    assert set(data) == {"error"} and set(data["error"]) == {"code", "message"}
    assert "\n" not in data["error"]["message"]
    return data["error"]["code"]


def published(http: httpx.Client, host: Identity) -> dict:
    response = publish(http, invitation(host).to_dict(), host)
    assert response.status_code == 201, response.text
    return response.json()


def session_proof(host: Identity, guest: Identity, post_id: str,
                  protocol_id: str = PROTOCOL_ID) -> dict[str, str]:
    fields = dict(post_id=post_id, protocol_id=protocol_id, host_public_key=host.public_key,
                  guest_public_key=guest.public_key, guest_nonce=new_nonce(),
                  host_nonce=new_nonce())
    payload = session_payload(**fields)
    return dict(fields, session_id=session_id_of(payload),
                host_signature=host.sign(role_message("host", payload)),
                guest_signature=guest.sign(role_message("guest", payload)))


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
    assert set(record) == set(proof) | {"created_at"}
    assert {k: record[k] for k in proof} == proof
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
        assert response.status_code == 404 and error_of(response) == "not-found"


# --- the client ---------------------------------------------------------------------------------
def test_client_roundtrip_and_error_mapping(url: str, host: Identity, guest: Identity) -> None:
    async def scenario() -> None:
        async with CommunityClient(url, host) as client:
            assert (await client.health())["service"] == "kith-community"
            stored = await client.publish_invitation(invitation(host))
            assert await client.get_invitation(stored.post_id) == stored
            with pytest.raises(CommunityError) as err:
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
    from node.community.server import bind_socket, base_url_of
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
    store = CommunityStore(tmp_path / "c.sqlite3")
    now = 1_000_000.0
    assert store.remember_nonce("a" * 64, "k" * 64, int(now), now=now, window_s=300)
    assert not store.remember_nonce("a" * 64, "k" * 64, int(now), now=now + 10, window_s=300)
    assert store.remember_nonce("b" * 64, "k" * 64, int(now) + 400, now=now + 400, window_s=300)
    assert store.nonce_count() == 1  # the first one is past the window and forgotten


def test_database_has_no_place_for_queries_or_answers(server) -> None:
    db = server[2]
    with sqlite3.connect(db) as conn:
        tables = {row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert tables == {"meta", "invitations", "sessions", "request_nonces"}
    assert mode == "wal"


def test_server_module_does_not_import_iroh() -> None:
    code = ("import sys, node.community.server, node.community.client; "
            "assert 'iroh' not in sys.modules, 'iroh imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_invitation_json_is_what_the_client_decodes(http: httpx.Client, host: Identity) -> None:
    stored = published(http, host)
    msgspec.convert(stored, Invitation)  # the server answers the invitation schema exactly
