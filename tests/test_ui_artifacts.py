"""UI artifacts on disk: the Host's bundle loader refuses links and unsafe trees; the
Guest installs a verified bundle into a fresh session folder and nothing else; the shipped
knowledge-query UI is a real, self-contained bundle."""

from __future__ import annotations

import json
import os
import re

import pytest

from node.engine import ui as UI
from node.common.errors import HandshakeError
from node.runtime.ui_artifacts import install_bundle, load_bundle, local_ui_dir, write_results_js

from support.homes import PROTOCOLS

SID = "ab" * 32


def proto(tmp_path, files: dict[str, bytes]):
    d = tmp_path / "p"
    for rel, data in files.items():
        (d / "ui" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "ui" / rel).write_bytes(data)
    return d


def test_loads_a_folder_as_a_sorted_checked_bundle(tmp_path):
    d = proto(tmp_path, {"index.html": b"<p>", "js/app.js": b"1", "css/s.css": b""})
    b = load_bundle(d)
    assert [f.path for f in b.files] == ["css/s.css", "index.html", "js/app.js"]
    assert b.data["js/app.js"] == b"1" and b.total_bytes == 4


def test_refuses_symlinks_anywhere(tmp_path):
    d = proto(tmp_path, {"index.html": b"<p>"})
    secret = tmp_path / "secret.txt"
    secret.write_text("key")
    os.symlink(secret, d / "ui" / "leak.txt")
    with pytest.raises(HandshakeError) as e:
        load_bundle(d)
    assert e.value.code == "ui-bundle-invalid" and "link" in e.value.message


def test_refuses_a_linked_directory_and_a_linked_ui_folder(tmp_path):
    d = proto(tmp_path, {"index.html": b"<p>"})
    os.symlink(tmp_path, d / "ui" / "up")
    with pytest.raises(HandshakeError):
        load_bundle(d)
    e = tmp_path / "q"
    e.mkdir()
    os.symlink(d / "ui", e / "ui")
    with pytest.raises(HandshakeError) as exc:
        load_bundle(e)
    assert exc.value.code == "ui-bundle-invalid"
    assert local_ui_dir(e) is None


def test_refuses_missing_index_and_oversize(tmp_path):
    with pytest.raises(HandshakeError, match="index.html"):
        load_bundle(proto(tmp_path, {"app.js": b"1"}))
    big = tmp_path / "big"
    (big / "ui").mkdir(parents=True)
    (big / "ui" / "index.html").write_bytes(b"x")
    with open(big / "ui" / "blob", "wb") as fh:
        fh.truncate(UI.MAX_FILE_BYTES + 1)
    with pytest.raises(HandshakeError, match="limits"):
        load_bundle(big)


def test_install_writes_a_fresh_session_folder(tmp_path):
    files = {"index.html": b"<p>hi", "a/b.js": b"js"}
    index = install_bundle(tmp_path, SID, files)
    assert index == tmp_path / "ui" / "sessions" / SID / "index.html"
    assert index.read_bytes() == b"<p>hi" and (index.parent / "a" / "b.js").read_bytes() == b"js"
    assert not [p for p in (tmp_path / "ui" / "sessions").iterdir() if p.name.startswith(".install-")]
    with pytest.raises(HandshakeError) as e:  # never over an existing install
        install_bundle(tmp_path, SID, files)
    assert e.value.code == "ui-install-failed"


@pytest.mark.parametrize("sid", ["../x", "AB" * 32, "", "a" * 63])
def test_install_refuses_a_bad_session_id(tmp_path, sid):
    with pytest.raises(HandshakeError) as e:
        install_bundle(tmp_path, sid, {"index.html": b""})
    assert e.value.code == "ui-install-failed"


@pytest.mark.parametrize("path", ["../escape.html", "/abs.html", "a/../../b"])
def test_install_rechecks_paths_and_leaves_nothing_behind(tmp_path, path):
    with pytest.raises(HandshakeError) as e:
        install_bundle(tmp_path, SID, {"index.html": b"", path: b"x"})
    assert e.value.code == "ui-path-invalid"
    assert not (tmp_path / "escape.html").exists() and not (tmp_path / "ui" / "sessions" / SID).exists()
    assert not [p for p in (tmp_path / "ui" / "sessions").iterdir()]


def test_results_js_cannot_close_the_script(tmp_path):
    msg = {"action": "results", "query_id": "q1", "status": "ok",
           "envelope": {"results": [{"textPreview": "</script><script>alert(1)</script>"}]}}
    path = write_results_js(tmp_path, [msg])
    text = path.read_text("ascii")
    assert "</script" not in text and text.startswith("window.KITH_RESULTS = ")
    decoded = json.loads(text[len("window.KITH_RESULTS = "):].rstrip().rstrip(";"))
    assert decoded == [msg]


def test_shipped_knowledge_query_ui_is_self_contained():
    ui = local_ui_dir(PROTOCOLS / "knowledge-query")
    assert ui is not None
    b = load_bundle(PROTOCOLS / "knowledge-query")
    html = b.data["index.html"].decode()
    js = b.data["app.js"].decode()
    # no build step, no network: every referenced file is local, CSP forbids remote loads
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert set(refs) <= set(b.data) | {"results.js"}
    assert "default-src 'none'" in html and "connect-src 'none'" in html
    assert not re.search(r"https?://", html + js)
    # renders results and citations, text only (no innerHTML with peer data)
    assert "citationPack" in js and "answerSynthesis" in js and "textPreview" in js
    assert "innerHTML" not in js
