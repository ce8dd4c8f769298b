"""The optional UI artifact branch of the handshake (DESIGN §6), engine level: who may ask,
what the host sends, and every refusal of a hostile bundle."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from node.engine import ui as UI
from node.engine.session import SessionClosed, SessionReady, State, UiArtifactReceived, UiArtifactRefused
from node.trust.signing import session_id_of, session_payload
from node.protocol.spec import load_spec

from support.engines import (
    GOOD,
    POST_ID,
    UI_FILES as FILES,
    UiPair as Pair,
    frame as _frame,
    hostile,
    ui_manifest as _manifest,
)
from support.homes import PROTOCOLS


@pytest.fixture(scope="module")
def echo():
    return load_spec(PROTOCOLS / "echo")


def test_bundle_transfers_and_verifies_before_session_ready(echo, host_id, guest_id):
    pair = Pair(echo, host_id, guest_id, bundle=UI.Bundle.from_files(FILES)).run()
    got = pair.of(pair.ge, UiArtifactReceived)
    assert len(got) == 1 and got[0].files == FILES and got[0].total_bytes == sum(map(len, FILES.values()))
    assert pair.host.state is State.READY and pair.guest.state is State.READY
    # order: proof, begin, file*, end; the guest's ack precedes its _session_ready
    acts = pair.h2g_actions()
    assert acts[0] == "_session_proof" and acts[1] == "_ui_artifact_begin" and acts[-1] == "_ui_artifact_end"
    assert pair.host.ui_bytes_sent == got[0].total_bytes
    assert not pair.of(pair.ge, UiArtifactRefused) and not pair.of(pair.he, UiArtifactRefused)


def test_ui_data_is_not_in_the_session_payload(echo, host_id, guest_id):
    pair = Pair(echo, host_id, guest_id, bundle=UI.Bundle.from_files(FILES)).run()
    proof = pair.of(pair.he, SessionReady)[0].proof
    payload = session_payload(post_id=POST_ID, protocol_id=echo.protocol_id, host_public_key=host_id.public_key,
                              guest_public_key=guest_id.public_key, guest_nonce=proof["guest_nonce"],
                              host_nonce=proof["host_nonce"])
    assert session_id_of(payload) == proof["session_id"]
    assert not any(k.startswith("ui") for k in proof)


def test_large_bundle_is_chunked_beyond_the_protocol_line_limit(echo, host_id, guest_id):
    big = {"index.html": b"x" * (3 * UI.CHUNK_BYTES + 17)}
    pair = Pair(echo, host_id, guest_id, bundle=UI.Bundle.from_files(big)).run()
    assert pair.of(pair.ge, UiArtifactReceived)[0].files == big
    assert pair.h2g_actions().count("_ui_artifact_file") == 4
    # after the branch the guest's line limit is the protocol's again
    assert pair.guest._framer.max_line_bytes == echo.limits.max_message_bytes


@pytest.mark.parametrize("caps,want", [((), True), ((UI.CAPABILITY,), False)])
def test_no_request_means_no_transfer(echo, host_id, guest_id, caps, want):
    pair = Pair(echo, host_id, guest_id, bundle=UI.Bundle.from_files(FILES), caps=caps, want=want).run()
    assert pair.guest.state is State.READY
    assert not any(a.startswith("_ui_artifact") for a in pair.h2g_actions())
    assert not pair.of(pair.ge, UiArtifactReceived)


def test_guest_without_offer_never_asks(echo, host_id, guest_id):
    pair = Pair(echo, host_id, guest_id, bundle=None).run()
    assert pair.guest.state is State.READY
    assert b"_ui_artifact" not in bytes(pair.wire_h2g)


def test_request_without_offer_is_answered_ui_not_offered(echo, host_id, guest_id):
    pair = Pair(echo, host_id, guest_id, bundle=None)
    pair.guest.initiate()
    pair.host.receive_data(pair.guest.data_to_send())
    proof = pair.host.data_to_send()
    pair.ge += pair.guest.receive_data(proof)
    pair.he += pair.host.receive_data(b'{"action":"_ui_artifact_request"}\n')
    out = pair.host.data_to_send()
    assert json.loads(out)["code"] == "ui-not-offered"
    assert pair.host.state is State.HANDSHAKE  # the session may still complete
    pair.ge += pair.guest.confirm_ready()
    pair.he += pair.host.receive_data(pair.guest.data_to_send())
    assert pair.host.state is State.READY


def _chunks(files):
    return [_frame({"action": "_ui_artifact_file", "path": p, "offset": 0, "data": base64.b64encode(b).decode()})
            for p, b in files.items() if b]


@pytest.mark.parametrize("path", ["../evil.html", "a/../../x", "/etc/passwd", "C:evil", "c:/x", "a\\b", "a//b",
                                  "./index.html", "a/./b", "", "x" * 300, "bad\x00name", "bad\nname", " lead",
                                  "a/\u202eevil"])
def test_guest_refuses_bad_paths(echo, host_id, guest_id, path):
    files = {"index.html": b"<p>ok</p>", path: b"data"}
    pair = hostile(echo, host_id, guest_id, [_frame(_manifest(files)), *_chunks(files),
                                             _frame({"action": "_ui_artifact_end"})])
    refused = pair.of(pair.ge, UiArtifactRefused)
    assert [r.code for r in refused] == ["ui-path-invalid"] and refused[0].by == "guest"
    assert not pair.of(pair.ge, UiArtifactReceived)
    # the UI is refused, the session still starts (no UI) and the host learns the code
    assert pair.guest.state is State.READY and pair.host.state is State.READY
    assert [r.code for r in pair.of(pair.he, UiArtifactRefused)] == ["ui-path-invalid"]


def test_guest_refuses_case_duplicates(echo, host_id, guest_id):
    files = {"index.html": b"a", "INDEX.html": b"b"}
    pair = hostile(echo, host_id, guest_id, [_frame(_manifest(files)), _frame({"action": "_ui_artifact_end"})])
    assert [r.code for r in pair.of(pair.ge, UiArtifactRefused)] == ["ui-path-invalid"]


@pytest.mark.parametrize("kind", ["symlink", "link", "dir", "device"])
def test_guest_refuses_links_and_special_entries(echo, host_id, guest_id, kind):
    m = _manifest(GOOD)
    m["files"].append({"path": "ln", "size": 0, "sha256": hashlib.sha256(b"").hexdigest(), "type": kind})
    pair = hostile(echo, host_id, guest_id, [_frame(m), _frame({"action": "_ui_artifact_end"})])
    assert [r.code for r in pair.of(pair.ge, UiArtifactRefused)] == ["ui-link-refused"]


@pytest.mark.parametrize("m,code", [
    (lambda: _manifest(GOOD, total_bytes=UI.MAX_TOTAL_BYTES + 1), "ui-too-large"),
    (lambda: {"action": "_ui_artifact_begin", "total_bytes": UI.MAX_FILE_BYTES + 1,
              "files": [{"path": "index.html", "size": UI.MAX_FILE_BYTES + 1, "sha256": "0" * 64}]}, "ui-too-large"),
    (lambda: {"action": "_ui_artifact_begin", "total_bytes": 0,
              "files": [{"path": f"f{i}", "size": 0, "sha256": "0" * 64} for i in range(UI.MAX_FILES + 1)]},
     "ui-too-large"),
    (lambda: _manifest(GOOD, total_bytes=3), "ui-manifest-mismatch"),
    (lambda: {"action": "_ui_artifact_begin", "total_bytes": 1,
              "files": [{"path": "index.html", "size": 1, "sha256": "A" * 64}]}, "ui-manifest-mismatch"),
    (lambda: _manifest({"app.js": b"x"}), "ui-no-index"),
    (lambda: _manifest({"sub/index.html": b"x"}), "ui-no-index"),
])
def test_guest_refuses_bad_manifests(echo, host_id, guest_id, m, code):
    pair = hostile(echo, host_id, guest_id, [_frame(m()), _frame({"action": "_ui_artifact_end"})])
    assert [r.code for r in pair.of(pair.ge, UiArtifactRefused)] == [code]
    assert pair.guest.state is State.READY


def test_guest_refuses_hash_mismatch(echo, host_id, guest_id):
    m = _manifest(GOOD)
    tampered = {"index.html": b"<p>XX</p>"}  # same size, other bytes
    pair = hostile(echo, host_id, guest_id, [_frame(m), *_chunks(tampered), _frame({"action": "_ui_artifact_end"})])
    assert [r.code for r in pair.of(pair.ge, UiArtifactRefused)] == ["ui-hash-mismatch"]
    assert not pair.of(pair.ge, UiArtifactReceived)


@pytest.mark.parametrize("frames", [
    # data beyond the declared size
    lambda: [_frame(_manifest(GOOD)), *_chunks({"index.html": b"<p>ok</p>!!"}), _frame({"action": "_ui_artifact_end"})],
    # wrong offset
    lambda: [_frame(_manifest(GOOD)), _frame({"action": "_ui_artifact_file", "path": "index.html", "offset": 5,
                                              "data": base64.b64encode(b"<p>ok</p>").decode()}),
             _frame({"action": "_ui_artifact_end"})],
    # a file not in the manifest
    lambda: [_frame(_manifest(GOOD)), *_chunks({"other.html": b"<p>ok</p>"}), _frame({"action": "_ui_artifact_end"})],
    # end before every file arrived
    lambda: [_frame(_manifest(GOOD)), _frame({"action": "_ui_artifact_end"})],
])
def test_guest_refuses_transfers_that_break_the_manifest(echo, host_id, guest_id, frames):
    pair = hostile(echo, host_id, guest_id, frames())
    assert [r.code for r in pair.of(pair.ge, UiArtifactRefused)] == ["ui-manifest-mismatch"]
    assert pair.guest.state is State.READY


def test_unrequested_ui_data_rejects_the_session(echo, host_id, guest_id):
    pair = Pair(echo, host_id, guest_id, bundle=None, caps=(), want=False)

    def tamper(data: bytes) -> bytes:
        if b'"_session_proof"' in data:
            return data + _frame(_manifest(GOOD))
        return data

    pair.run(tamper)
    closed = pair.of(pair.ge, SessionClosed)
    assert closed and closed[0].reason == "rejected" and closed[0].code == "ui-not-requested"


def test_host_refuses_ready_before_the_ui_answer(echo, host_id, guest_id):
    pair = Pair(echo, host_id, guest_id, bundle=UI.Bundle.from_files(FILES))
    pair.guest.initiate()
    pair.host.receive_data(pair.guest.data_to_send())
    pair.guest.receive_data(pair.host.data_to_send())
    pair.host.receive_data(pair.guest.data_to_send())  # the request → the bundle is queued
    ready = {"action": "_session_ready", "session_id": pair.host.session_id, "guest_signature": "0" * 128}
    events = pair.host.receive_data(_frame(ready))
    assert events[-1].code == "handshake-unexpected-frame"


def test_host_bundle_of_the_shipped_protocol_has_an_index():
    from node.runtime.ui_artifacts import load_bundle

    b = load_bundle(PROTOCOLS / "knowledge-query")
    assert "index.html" in b.data and b.total_bytes > 0
    UI.check_manifest(list(b.files), b.total_bytes)


_BEGIN, _END = _frame(_manifest(GOOD)), _frame({"action": "_ui_artifact_end"})
_ERROR = _frame({"action": "_ui_artifact_error", "code": "ui-too-large", "message": "x"})


@pytest.mark.parametrize("frames", [
    [_chunks(GOOD)[0]],                                 # file data before the manifest
    [_END],                                             # end before the manifest
    [_BEGIN, _BEGIN],                                   # a second manifest while receiving
    [_BEGIN, *_chunks(GOOD), _END, _BEGIN],             # a second manifest after the branch
    [_BEGIN, *_chunks(GOOD), _END, _ERROR],             # a UI error after the branch
], ids=["file-first", "end-first", "begin-twice", "begin-after-end", "error-after-end"])
def test_ui_frames_out_of_the_branch_order_reject_the_handshake(echo, host_id, guest_id, frames):
    """Every UI frame that has no row in the guest's transition table
    (node/engine/ui_branch.py) ends the whole handshake, not only the branch."""
    pair = hostile(echo, host_id, guest_id, frames)
    closed = pair.of(pair.ge, SessionClosed)
    assert closed and closed[0].reason == "rejected" and closed[0].code == "handshake-unexpected-frame"
    assert not pair.of(pair.ge, SessionReady)


def test_ui_branch_states_and_tables_cover_every_state():
    """The UI states are an enum and each role's table only names them: every state but
    DONE can be left, every state but NONE can be reached."""
    from node.engine.ui_branch import GUEST_TRANSITIONS, HOST_TRANSITIONS, UiState

    for table, states in ((HOST_TRANSITIONS, {UiState.NONE, UiState.OFFERED, UiState.SENT, UiState.DONE}),
                          (GUEST_TRANSITIONS, {UiState.NONE, UiState.REQUESTED, UiState.RECEIVING,
                                               UiState.DRAINING, UiState.DONE})):
        left = {s for s, _ in table}
        reached = set(table.values())
        assert left == states - {UiState.DONE}
        assert reached == states - {UiState.NONE}
