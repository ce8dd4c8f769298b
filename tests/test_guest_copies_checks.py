"""The pure checks of what a host sent for a copy (node/guest/copies/checks.py; specs/copies.md
§3, §5): a manifest, each document against it and the host's key, and the grant state of a
handshake — no file, no network, as tests/test_trust_card.py checks cards."""

from __future__ import annotations

import hashlib
import os

import pytest

from node.answer.citation import CitationSigner, Evidence, keyed_version, text_digest
from node.common.errors import KithError
from node.guest.copies.checks import MAX_LOCAL_BYTES, check_copy_state, check_document, check_manifest
from node.trust.signing import public_key_of

SEED = os.urandom(32)
VKEY = os.urandom(32)
HOST = public_key_of(SEED)
TEXT = "# Deploy\n\nThe staging server is in rack 4.\n"


def _entry(text: str = TEXT) -> dict:
    content = hashlib.sha256(text.encode()).hexdigest()
    return {"version": keyed_version(VKEY, content), "bytes": len(text.encode()), "textSha256": text_digest(text)}


def _doc(source: str = "/kb/deploy.md", text: str = TEXT, seed: bytes = SEED) -> dict:
    signer = CitationSigner(seed, VKEY, lambda ids: {}, lambda: "2026-12-01T10:00:00Z")
    content = hashlib.sha256(text.encode()).hexdigest()
    citation = signer.cite({"source": source, "textPreview": text}, Evidence(content, 0, len(text)),
                           "2026-12-01T10:00:00Z")
    return {"source": source, "version": citation["version"], "text": text, "citation": citation}


def _code(fn, *args, **kw) -> str:
    with pytest.raises(KithError) as exc:
        fn(*args, **kw)
    return exc.value.code


# ----------------------------------------------------------------------------- the manifest
def test_a_manifest_lists_its_entries_by_source():
    row = {"source": "/kb/deploy.md", **_entry()}
    assert check_manifest({"documents": [row], "maxBytes": 10_000}) == {"/kb/deploy.md": _entry()}


@pytest.mark.parametrize("source", ["kb/relative.md", "/kb/../up.md", "/kb//double.md", "/kb/a\nb.md",
                                    "/kb/" + "x" * 1100, 7])
def test_a_source_that_is_not_its_own_canonical_id_is_copy_manifest_invalid(source):
    assert _code(check_manifest, {"documents": [{"source": source, **_entry()}]}) == "copy-manifest-invalid"


@pytest.mark.parametrize("change", [{"version": "ab"}, {"textSha256": "AB" * 32}, {"bytes": -1}, {"bytes": True}])
def test_an_ill_formed_entry_is_copy_manifest_invalid(change):
    row = {"source": "/kb/deploy.md", **_entry(), **change}
    assert _code(check_manifest, {"documents": [row]}) == "copy-manifest-invalid"


def test_a_repeated_source_or_no_list_is_copy_manifest_invalid():
    row = {"source": "/kb/deploy.md", **_entry()}
    assert _code(check_manifest, {"documents": [row, row]}) == "copy-manifest-invalid"
    assert _code(check_manifest, {"documents": "all of them"}) == "copy-manifest-invalid"
    assert _code(check_manifest, ["not", "a", "message"]) == "copy-manifest-invalid"


def test_over_its_budget_or_the_local_bound_is_copy_over_budget_unless_only_listed():
    row = {"source": "/kb/deploy.md", **_entry()}
    small = {"documents": [row], "maxBytes": row["bytes"] - 1}
    assert _code(check_manifest, small) == "copy-over-budget"
    assert list(check_manifest(small, check_budget=False)) == ["/kb/deploy.md"]  # what it still lists
    huge = {"documents": [{**row, "bytes": MAX_LOCAL_BYTES + 1}], "maxBytes": None}
    assert _code(check_manifest, huge) == "copy-over-budget"


# ----------------------------------------------------------------------------- a document
def test_a_document_signed_by_the_host_over_its_whole_text_is_taken():
    src, text, citation = check_document(_doc(), {"/kb/deploy.md": _entry()}, HOST)
    assert (src, text, citation["hostKey"]) == ("/kb/deploy.md", TEXT, HOST)


def test_a_document_the_manifest_does_not_list_for_the_batch_is_copy_outside_grant():
    assert _code(check_document, _doc("/kb/other.md"), {"/kb/deploy.md": _entry()}, HOST) == "copy-outside-grant"


def test_another_keys_signature_is_copy_bad_signature():
    forged = _doc(seed=os.urandom(32))
    assert _code(check_document, forged, {"/kb/deploy.md": _entry()}, HOST) == "copy-bad-signature"


def test_a_text_other_than_the_one_signed_or_listed_is_copy_version_mismatch():
    doc = _doc()
    doc["text"] = TEXT.replace("4", "5")
    assert _code(check_document, doc, {"/kb/deploy.md": _entry()}, HOST) == "copy-version-mismatch"
    other = _entry("# Deploy\n\nanother version\n")
    assert _code(check_document, _doc(), {"/kb/deploy.md": other}, HOST) == "copy-version-mismatch"


def test_a_document_without_text_or_citation_is_copy_bad_signature():
    for missing in ("text", "citation"):
        doc = {k: v for k, v in _doc().items() if k != missing}
        assert _code(check_document, doc, {"/kb/deploy.md": _entry()}, HOST) == "copy-bad-signature"


# ------------------------------------------------------------------- the handshake's grant state
def test_a_grant_state_is_granted_stamp_and_until():
    state = {"granted": True, "stamp": "ab" * 16, "until": "2026-12-01T10:00:00Z"}
    assert check_copy_state(state) == state
    assert check_copy_state({**state, "granted": False, "until": None})["granted"] is False


@pytest.mark.parametrize("bad", [None, {"granted": True, "stamp": "ab" * 16},
                                 {"granted": 1, "stamp": "ab" * 16, "until": None},
                                 {"granted": True, "stamp": "AB" * 16, "until": None},
                                 {"granted": True, "stamp": "ab" * 16, "until": "tomorrow"},
                                 {"granted": True, "stamp": "ab" * 16, "until": None, "extra": 1}])
def test_any_other_grant_state_is_copy_state_invalid(bad):
    assert _code(check_copy_state, bad) == "copy-state-invalid"
