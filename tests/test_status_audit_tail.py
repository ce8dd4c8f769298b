"""`kith status` reads only the end of the audit log (issue 42): the copies sent it shows
come from the log's last 2 MiB, read backwards, and it says so when the log holds more —
never the whole log (up to 32 MiB over its rotated files) for one status line."""

from __future__ import annotations

import json
from pathlib import Path

from node.host.grants import SHARING_AUDIT_BYTES
from node.trust.audit_log import read_audit, read_audit_tail

from support.cli import kith, kith_init


def _rec(i: int, **kw) -> str:
    return json.dumps({"ts": f"2026-12-05T10:{i // 3600 % 60:02d}:{i % 60:02d}Z", "event": "query", "i": i,
                       "pad": "x" * 160, **kw}) + "\n"


def _sent(i: int, peer: str, name: str, sources: list[str]) -> str:
    return json.dumps({"ts": f"2026-12-05T11:00:{i % 60:02d}Z", "event": "copy-sent", "peer": peer, "peer_name": name,
                       "sources": sources, "versions": ["ab" * 32] * len(sources), "documents": len(sources),
                       "scrubbed": {}, "refused": 0}) + "\n"


def test_status_shows_copies_sent_from_the_end_of_a_large_audit_log_and_says_so(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kith_init(home)
    old_peer, new_peer = "11" * 32, "22" * 32
    filler = "".join(_rec(i) for i in range(3 * SHARING_AUDIT_BYTES // 200))
    # the oldest send is in a rotated file, further back than 2 MiB; the newest at the end
    (home / "audit.jsonl.1").write_text(_sent(0, old_peer, "old", ["/kb/a.md"]) + filler)
    (home / "audit.jsonl").write_text(filler[: SHARING_AUDIT_BYTES // 2 - 1].rsplit("\n", 1)[0] + "\n"
                                      + _sent(1, new_peer, "bea", ["/kb/a.md", "/kb/b.md"])
                                      + _sent(2, new_peer, "bea", ["/kb/b.md", "/kb/c.md"]) + _rec(99))
    r = kith(home, "status", "--json")
    assert r.returncode == 0, r.stderr
    sharing = json.loads(r.stdout)["sharing"]
    assert [(c["peer_name"], c["documents"]) for c in sharing["copiesSent"]] == [("bea", 3)]
    assert sharing["copiesSentFrom"] == {"bytes": SHARING_AUDIT_BYTES, "whole": False}
    text = kith(home, "status")
    assert text.returncode == 0, text.stderr
    assert "copies sent (peers that may hold them) (from the audit log's last 2 MiB; `kith audit` for all): 1" \
        in text.stdout, text.stdout


def test_a_small_audit_log_is_read_whole(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kith_init(home)
    (home / "audit.jsonl.1").write_text(_sent(0, "11" * 32, "old", ["/kb/a.md"]))
    (home / "audit.jsonl").write_text(_rec(1) + _sent(2, "22" * 32, "bea", ["/kb/b.md"]))
    sharing = json.loads(kith(home, "status", "--json").stdout)["sharing"]
    assert [(c["peer_name"], c["documents"]) for c in sharing["copiesSent"]] == [("bea", 1), ("old", 1)]
    assert sharing["copiesSentFrom"]["whole"] is True


def test_the_tail_reader_yields_what_the_whole_reader_does_newest_first(tmp_path: Path) -> None:
    """Over rotated files, a line cut by a crash (no newline), a line that is not a record
    and blocks that split lines anywhere: the same records as `kith audit` reads, reversed."""
    lines = [_rec(i) for i in range(300)]
    (tmp_path / "audit.jsonl.2").write_text("".join(lines[:100]))
    (tmp_path / "audit.jsonl.1").write_text("".join(lines[100:200]) + "not json\n")
    (tmp_path / "audit.jsonl").write_text("".join(lines[200:]) + '{"ts": "2026-12-05T10:00:00Z", "ev')
    whole = [r["i"] for r in read_audit(tmp_path, [])]
    assert whole == list(range(300))
    for block in (7, 181, 64 << 10):
        assert [r["i"] for r in read_audit_tail(tmp_path, 1 << 30, block)] == whole[::-1]
        recent = [r["i"] for r in read_audit_tail(tmp_path, 10 * len(lines[299]), block)]
        assert recent == list(range(299, 299 - len(recent), -1)) and 8 <= len(recent) <= 10


def test_odd_values_are_written_and_kith_audit_reads_every_line_back(tmp_path: Path) -> None:
    """attack49: a lone surrogate in a query (hashed, or its text with --audit-queries),
    NaN, a huge string, an int past 64 bits — the writer never raises, and a real ``kith
    audit`` (text and --json) reads every line; so does an older writer's ``NaN`` line. A
    lone surrogate's line printed a traceback (UnicodeEncodeError), NaN was not JSON."""
    import math

    from node.trust.audit_log import AuditLog

    home = tmp_path / "home"
    kith_init(home)
    for text_kept in (False, True):
        log = AuditLog(home, audit_queries=text_kept)
        log.record("query", peer="ab" * 32, **log.query_fields("a\ud800b"), score=math.nan)
        log.record("query", peer="ab" * 32, **log.query_fields("x" * 70_000), big=2 ** 80)
        log.close()
    with (home / "audit.jsonl").open("a") as fh:  # an older writer's line (json.dumps wrote NaN)
        fh.write('{"ts":"2026-12-01T09:00:00.000Z","event":"query","score":NaN,"q":"\\udfff"}\n')
    out = kith(home, "audit", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # one document, valid JSON (no NaN)
    assert doc["skipped"] == [] and len(doc["records"]) == 5
    assert [r.get("score") for r in doc["records"] if "score" in r] == [None, None, None]
    assert doc["records"][2]["query"] == "a\ufffdb"  # the text kept, its lone surrogate shown as U+FFFD
    assert doc["records"][0]["query_hmac"] != AuditLog(home).query_fields("ab")["query_hmac"]
    text = kith(home, "audit")
    assert text.returncode == 0 and "Traceback" not in text.stderr, text.stderr
    assert len(text.stdout.splitlines()) >= 5
