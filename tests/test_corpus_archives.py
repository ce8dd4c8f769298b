"""Archives in a root (issue 3 rule 5, DESIGN §9, seed file-processing § Archives).

Every malicious archive is built here at test time with zipfile/tarfile; a refused
archive indexes nothing, says why, and nothing is ever written outside the node's own
directories."""

from __future__ import annotations

import io
import os
import sqlite3
import stat
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest

from node.corpus import archives
from node.corpus.archives import ArchiveLimits, ArchiveRefused
from node.corpus.store import Corpus

# --- builders -----------------------------------------------------------------------------


def zip_bytes(members: list[tuple[str, bytes] | zipfile.ZipInfo | tuple[zipfile.ZipInfo, bytes]],
              compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns on duplicate names: that is the point
        with zipfile.ZipFile(buf, "w", compression) as zf:
            for m in members:
                if isinstance(m, tuple) and isinstance(m[0], zipfile.ZipInfo):
                    zf.writestr(m[0], m[1])
                elif isinstance(m, zipfile.ZipInfo):
                    zf.writestr(m, b"")
                else:
                    zf.writestr(m[0], m[1])
    return buf.getvalue()


def zinfo(name: str, mode: int | None = None) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name)
    zi.compress_type = zipfile.ZIP_DEFLATED
    if mode is not None:
        zi.create_system = 3
        zi.external_attr = mode << 16
    return zi


def tgz_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return buf.getvalue()


def tinfo(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = link
    ti.mode = 0o644
    return ti


def encrypted_flag(data: bytes) -> bytes:
    """Set the 'encrypted' general-purpose flag in every local and central header
    (zipfile cannot write encrypted members)."""
    out = bytearray(data)
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = out.find(sig)
        while at != -1:
            out[at + off] |= 0x01
            at = out.find(sig, at + 4)
    return bytes(out)


def raw_name(data: bytes, placeholder: bytes, real: bytes) -> bytes:
    """Put a name zipfile refuses to write (e.g. with a NUL) into the raw headers."""
    assert len(placeholder) == len(real) and data.count(placeholder) == 2
    return data.replace(placeholder, real)


GOOD_DOC = b"# Guide\n\nThe okapi lives in the forest.\n"

MALICIOUS: dict[str, tuple[str, bytes]] = {
    "zip-traversal": ("unsafe-path", zip_bytes([("ok.md", GOOD_DOC), ("../evil.md", b"pwned")])),
    "zip-deep-traversal": ("unsafe-path", zip_bytes([("a/../../evil.md", b"pwned")])),
    "zip-absolute": ("unsafe-path", zip_bytes([("/etc/evil.md", b"pwned")])),
    "zip-drive": ("unsafe-path", zip_bytes([("C:/evil.md", b"pwned")])),
    "zip-drive-relative": ("unsafe-path", zip_bytes([("C:evil.md", b"pwned")])),
    "zip-unc": ("unsafe-path", zip_bytes([("//server/share/evil.md", b"pwned")])),
    "zip-backslash": ("unsafe-path", zip_bytes([("..\\evil.md", b"pwned")])),
    "zip-backslash-inner": ("unsafe-path", zip_bytes([("a\\b.md", b"x")])),
    "zip-control": ("unsafe-path", zip_bytes([("bell\x07.md", b"x")])),
    "zip-nul": ("unsafe-path", raw_name(zip_bytes([("a.md@.txt", b"x")]), b"a.md@", b"a.md\x00")),
    "zip-newline": ("unsafe-path", zip_bytes([("a\n.md", b"x")])),
    "zip-symlink": ("link-member", zip_bytes([(zinfo("link.md", stat.S_IFLNK | 0o777), b"/etc/passwd")])),
    "zip-fifo": ("special-member", zip_bytes([(zinfo("pipe.md", stat.S_IFIFO | 0o644), b"")])),
    "zip-chardev": ("special-member", zip_bytes([(zinfo("dev.md", stat.S_IFCHR | 0o644), b"")])),
    "zip-duplicate": ("duplicate-member", zip_bytes([("a.md", b"one"), ("a.md", b"two")])),
    "zip-dup-normalized": ("duplicate-member", zip_bytes([("a/b.md", b"one"), ("a//b.md", b"two")])),
    "zip-file-and-folder": ("duplicate-member", zip_bytes([("a", b"file"), ("a/b.md", b"x")])),
    "zip-folder-then-file": ("duplicate-member", zip_bytes([zinfo("a/"), ("a", b"file")])),
    "zip-encrypted": ("encrypted", encrypted_flag(zip_bytes([("secret.md", b"not really")]))),
    "zip-not-a-zip": ("not-an-archive", b"PK\x03\x04 this is not really a zip file"),
    "zip-plain-text": ("not-an-archive", b"just some text in a .zip"),
    "zip-bomb": ("ratio-exceeded", zip_bytes([("zeros.md", b"\0" * (8 * 1024 * 1024))])),
    "tgz-traversal": ("unsafe-path", tgz_bytes([(tinfo("../evil.md"), b"pwned")])),
    "tgz-absolute": ("unsafe-path", tgz_bytes([(tinfo("/tmp/evil.md"), b"pwned")])),
    "tgz-symlink": ("link-member", tgz_bytes([(tinfo("l.md", tarfile.SYMTYPE, "/etc/passwd"), None)])),
    "tgz-hardlink": ("link-member", tgz_bytes([(tinfo("ok.md"), GOOD_DOC),
                                               (tinfo("h.md", tarfile.LNKTYPE, "ok.md"), None)])),
    "tgz-fifo": ("special-member", tgz_bytes([(tinfo("p.md", tarfile.FIFOTYPE), None)])),
    "tgz-chardev": ("special-member", tgz_bytes([(tinfo("c.md", tarfile.CHRTYPE), None)])),
    "tgz-blockdev": ("special-member", tgz_bytes([(tinfo("b.md", tarfile.BLKTYPE), None)])),
    "tgz-duplicate": ("duplicate-member", tgz_bytes([(tinfo("a.md"), b"1"), (tinfo("a.md"), b"2")])),
    "tgz-bomb": ("ratio-exceeded", tgz_bytes([(tinfo("zeros.md"), b"\0" * (8 * 1024 * 1024))])),
    "tgz-not-gzip": ("not-an-archive", b"\x1f\x8b\x08 broken gzip stream"),
    "too-many-entries": ("too-many-entries", zip_bytes([(f"d/{i}.md", b"") for i in range(5001)],
                                                       zipfile.ZIP_STORED)),
}


def _name(key: str) -> str:
    return key + (".tar.gz" if key.startswith("tgz") else ".zip")


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _tree(base: Path, skip: Path) -> set[str]:
    return {str(p.relative_to(base)) for p in base.rglob("*") if not p.is_relative_to(skip)}


# --- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(MALICIOUS))
def test_malicious_archive_is_refused_whole_and_says_why(home: Path, tmp_path: Path, key: str) -> None:
    reason, data = MALICIOUS[key]
    root = tmp_path / "drop"
    root.mkdir()
    (root / _name(key)).write_bytes(data)
    (root / "plain.md").write_text("# Plain\n\nthe serval is fine\n")
    before = _tree(tmp_path, home)
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync()
        assert rep["archives"] == {"indexed": 0, "refused": 1}
        (err,) = rep["errors"]
        assert (err["source"], err["code"], err["reason"]) == (f"/drop/{_name(key)}",
                                                               "archive-refused", reason)
        assert err["message"].startswith(f"archive: {reason} - ")
        assert "evil" not in err["message"] and "\x07" not in err["message"]
        db = sqlite3.connect(c.db_path)
        rows = db.execute("SELECT source_id, status FROM documents ORDER BY 1").fetchall()
        db.close()
        assert set(rows) == {(f"/drop/{_name(key)}", "error"), ("/drop/plain.md", "done")}
        assert [h.source_id for h in c.search_hits("okapi pwned", limit=5)[0]] == []
        assert c.sync()["archives"] == {"indexed": 0, "refused": 0}  # recorded, not retried
    assert _tree(tmp_path, home) == before  # nothing written outside the node's home
    assert not (tmp_path / "evil.md").exists() and not Path("/tmp/evil.md").exists()


@pytest.mark.parametrize("limits, reason", [
    (ArchiveLimits(max_bytes=50_000, max_ratio=1e9), "too-large"),
    (ArchiveLimits(max_member_bytes=20_000, max_ratio=1e9), "member-too-large"),
    (ArchiveLimits(max_entries=3), "too-many-entries"),
    (ArchiveLimits(max_archive_bytes=100), "archive-too-large"),
    (ArchiveLimits(max_ratio=2.0, ratio_floor_bytes=1000), "ratio-exceeded"),
])
@pytest.mark.parametrize("fmt", ["zip", "tgz"])
def test_byte_entry_and_ratio_limits(home: Path, tmp_path: Path, limits: ArchiveLimits,
                                     reason: str, fmt: str) -> None:
    rows = [(f"part{i}.md", (f"# Part {i}\n\n" + "lorem ipsum dolor " * 1500).encode())
            for i in range(4)]
    data = (zip_bytes(rows) if fmt == "zip"
            else tgz_bytes([(tinfo(n), d) for n, d in rows]))
    root = tmp_path / "lim"
    root.mkdir()
    name = "bundle.zip" if fmt == "zip" else "bundle.tgz"
    (root / name).write_bytes(data)
    with Corpus(home, archive_limits=limits) as c:
        c.add_root(root)
        rep = c.sync()
        assert [(e["code"], e["reason"]) for e in rep["errors"]] == [("archive-refused", reason)]
        assert c.stats()["chunks"] == 0
    with Corpus(home) as c:  # the default limits accept the same archive
        rep = c.sync(mode="full")
        assert rep["archives"]["indexed"] == 1 and rep["indexed"] == 4


def test_sizes_are_measured_while_reading_not_from_headers() -> None:
    """A zip whose headers claim 10 bytes but whose data inflates to 8 MiB is refused,
    and the honest bomb is stopped after about R x its size, not after inflating it all."""
    honest = zip_bytes([("z.md", b"\0" * (8 * 1024 * 1024))])
    forged = bytearray(honest)
    info = zipfile.ZipFile(io.BytesIO(honest)).infolist()[0]
    real = info.file_size.to_bytes(4, "little")
    for at in (i for i in range(len(forged) - 3) if forged[i:i + 4] == real):
        forged[at:at + 4] = (10).to_bytes(4, "little")  # local + central header sizes
    with pytest.raises(ArchiveRefused) as e:
        archives.scan(bytes(forged), "zip")
    assert e.value.reason in ("not-an-archive", "ratio-exceeded")
    counter = archives._Counter(len(honest), archives.DEFAULT_LIMITS)
    with pytest.raises(ArchiveRefused) as e:
        for _ in range(10_000):
            counter.add(64 * 1024)
    assert e.value.reason == "ratio-exceeded"
    assert counter.total <= 100 * len(honest) + 64 * 1024 + archives.DEFAULT_LIMITS.ratio_floor_bytes


def test_member_paths_are_checked_one_by_one() -> None:
    ok = {"a.md": "a.md", "./a/b.md": "a/b.md", "a//b/./c.md": "a/b/c.md", "dir/": "dir",
          "café.md": "café.md", "e\u0301.md": "\u00e9.md"}
    for raw, want in ok.items():
        assert archives.safe_member_path(raw) == want
    for bad in ("../x", "a/../../x", "/x", "C:/x", "c:x", "\\\\srv\\x", "//srv/x", "a\\b",
                "a\tb", "a\x7fb", "a\x85b", "x" * 5000, ".."):
        with pytest.raises(ArchiveRefused):
            archives.safe_member_path(bad)


# --- accepted archives --------------------------------------------------------------------


def test_members_are_documents_with_archive_ids(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "kb"
    root.mkdir()
    (root / "bundle.zip").write_bytes(zip_bytes([
        zinfo("docs/"), ("docs/guide.md", GOOD_DOC), ("docs/notes.txt", b"the tapir note"),
        ("docs/image.png", b"\x89PNG"), ("docs/.hidden.md", b"hidden gibbon"),
        ("inner.zip", zip_bytes([("x.md", b"nested lemur")]))]))
    (root / "more.tgz").write_bytes(tgz_bytes([(tinfo("./pkg/readme.md"), b"# Pkg\n\nthe quoll\n"),
                                               (tinfo("pkg", tarfile.DIRTYPE), None)]))
    with Corpus(home) as c:
        c.add_root(root)
        rep = c.sync()
        assert rep["archives"] == {"indexed": 2, "refused": 0} and rep["indexed"] == 3
        (hit,) = c.search_hits("okapi forest", limit=5)[0]
        assert hit.source_id == "/kb/bundle.zip/docs/guide.md"
        assert hit.root_prefix == "kb" and hit.rel_path == "bundle.zip/docs/guide.md"
        assert hit.location["headingPath"] == ["Guide"]
        assert [h.source_id for h in c.search_hits("quoll", limit=5)[0]] == ["/kb/more.tgz/pkg/readme.md"]
        for q in ("gibbon", "lemur"):  # hidden members and nested archives are not opened
            assert c.search_hits(q, limit=5)[0] == []
        st = c.status_report()
        assert st["chunks"] == 3 and st["failedDocuments"] == []
        assert c.sync()["skippedReasons"]["unchanged"] == 2  # unchanged archives: no work


def test_changed_archive_replaces_members_and_removed_archive_removes_them(home: Path,
                                                                          tmp_path: Path) -> None:
    root = tmp_path / "kb"
    root.mkdir()
    arch = root / "b.zip"
    arch.write_bytes(zip_bytes([("keep.md", b"the stable dingo"), ("edit.md", b"old wombat"),
                                ("drop.md", b"doomed numbat")]))
    with Corpus(home) as c:
        c.add_root(root)
        c.sync()
        arch.write_bytes(zip_bytes([("keep.md", b"the stable dingo"), ("edit.md", b"new bilby"),
                                    ("add.md", b"fresh quokka")]))
        os.utime(arch, ns=(7, 7))
        # the archive changed on disk: its members are withheld until the next sync
        hits, ctl = c.search_hits("dingo", limit=5)
        assert hits == [] and ctl["withheldStale"] == 1
        rep = c.sync()
        assert (rep["indexed"], rep["updated"], rep["removed"]) == (1, 1, 1)
        assert rep["skippedReasons"]["unchanged"] == 1  # keep.md: same bytes, no work
        src = lambda q: [h.source_id for h in c.search_hits(q, limit=5)[0]]  # noqa: E731
        assert src("dingo") == ["/kb/b.zip/keep.md"] and src("bilby") == ["/kb/b.zip/edit.md"]
        assert src("quokka") == ["/kb/b.zip/add.md"] and src("numbat wombat") == []
        arch.write_bytes(zip_bytes([("keep.md", b"x"), ("../escape.md", b"y")]))
        os.utime(arch, ns=(8, 8))
        rep = c.sync()  # now malicious: everything from it goes
        assert rep["archives"]["refused"] == 1 and src("dingo bilby quokka") == []
        arch.unlink()
        rep = c.sync()
        assert rep["removed"] == 1 and c.status_report()["documents"] == 0
