"""Datasource records imported from JSON Lines (DESIGN §9).

``kith index import FILE.jsonl --kind K --instance I``: one JSON object per line::

    {"id": "T-42", "text": "...", "date": "2024-03-01", "tags": ["ops"],
     "project": "kith", "workType": "incident", "lifecycle": "closed",
     "sourceSet": "tickets"}

Each record becomes one document with source id ``/<kind>/<instance>/<id>``, chunked
with the ``recursive`` chunker at the default size. The optional keys are stored as the
document's metadata under exactly those names (``date``, ``tags``, ``project``,
``workType``, ``lifecycle``, ``sourceSet``), so search filters and ``Hit.metadata`` see
them. Unknown keys are ignored (and named in the report).

Re-import is idempotent: a record whose text and metadata hash the same as on record is
skipped with no write; a changed one is replaced (insert before delete). With
``replace=True`` records of that kind/instance missing from the file are removed.

A bad line never stops the import; it is listed as ``{"line", "code", "message"}`` with
one of the codes ``line-too-long``, ``not-utf8``, ``not-json``, ``not-an-object``,
``id-invalid``, ``text-invalid``, ``metadata-invalid``, ``duplicate-id``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import unicodedata
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.corpus import chunking, ingest, parsers
from node.common.errors import CorpusError

if TYPE_CHECKING:  # pragma: no cover
    from node.corpus.store import Corpus

#: kind and instance names: lowercase letters, digits, ``.``, ``_``, ``-`` (1–64).
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_ID_CHARS = 512
MAX_TEXT_CHARS = 2_000_000
MAX_META_CHARS = 200
MAX_TAGS = 100
META_KEYS = ("date", "tags", "project", "workType", "lifecycle", "sourceSet")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")


class _Bad(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(code)
        self.code = code
        self.message = message


#: A metadata value that breaks the rules of :func:`check_metadata`.
MetadataInvalid = _Bad


def check_names(kind: str, instance: str, root_prefixes: set[str]) -> None:
    """Check ``--kind``/``--instance``.

    Raises:
        CorpusError: ``import-invalid`` when a name is not 1–64 of ``[a-z0-9._-]``
            starting with a letter or digit, or ``kind`` is a source root's prefix (the
            two id spaces would overlap).
    """
    for label, value in (("kind", kind), ("instance", instance)):
        if not isinstance(value, str) or not NAME_RE.match(value):
            raise CorpusError("import-invalid",
                              f"The {label} must be 1-64 characters of a-z, 0-9, '.', '_', '-'.")
    if kind in root_prefixes:
        raise CorpusError("import-invalid",
                          "The kind is already a source root's prefix; choose another kind.")


def _record_id(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Bad("id-invalid", "'id' must be a non-empty string or an integer")
    rid = unicodedata.normalize("NFC", str(value))
    parts = rid.split("/")
    if (not rid or len(rid) > MAX_ID_CHARS or _CONTROL.search(rid)
            or any(p in ("", ".", "..") for p in parts)):
        raise _Bad("id-invalid", "'id' must be 1-512 characters without control characters, "
                                 "backslashes or empty, '.' or '..' segments")
    return rid


def _short(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_META_CHARS \
            or _CONTROL.search(value):
        raise _Bad("metadata-invalid", f"'{key}' must be a non-empty string of at most "
                                       f"{MAX_META_CHARS} characters")
    return value.strip()


def validate_record(obj: Any) -> tuple[str, str, dict[str, Any], list[str]]:
    """Check one decoded record: ``(id, text, metadata, ignored_keys)``.

    Raises:
        _Bad: with a per-line code (see the module docstring).
    """
    if not isinstance(obj, dict):
        raise _Bad("not-an-object", "each line must be a JSON object")
    rid = _record_id(obj.get("id"))
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_TEXT_CHARS:
        raise _Bad("text-invalid", f"'text' must be a non-empty string of at most "
                                   f"{MAX_TEXT_CHARS} characters")
    meta = check_metadata(obj)
    ignored = sorted(k for k in obj if k not in META_KEYS and k not in ("id", "text"))
    return rid, text, meta, ignored


def check_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """The :data:`META_KEYS` values of ``obj``, checked (``None`` values skipped): ``date``
    an ISO 8601 date or date-time string, ``tags`` a list of at most :data:`MAX_TAGS`
    short strings (duplicates removed), the others a short string. Shared by records
    and Markdown front matter (:func:`node.corpus.parsers.front_matter`).

    Raises:
        MetadataInvalid: code ``metadata-invalid``, naming the key.
    """
    meta: dict[str, Any] = {}
    for key in META_KEYS:
        if key not in obj or obj[key] is None:
            continue
        value = obj[key]
        if key == "date":
            if not isinstance(value, str):
                raise _Bad("metadata-invalid", "'date' must be an ISO 8601 date string")
            try:
                (date.fromisoformat if len(value) == 10 else datetime.fromisoformat)(value)
            except ValueError:
                raise _Bad("metadata-invalid", "'date' must be an ISO 8601 date string") from None
            meta[key] = value
        elif key == "tags":
            if (not isinstance(value, list) or len(value) > MAX_TAGS):
                raise _Bad("metadata-invalid", f"'tags' must be a list of at most {MAX_TAGS} strings")
            meta[key] = list(dict.fromkeys(_short(t, "tags") for t in value))
        else:
            meta[key] = _short(value, key)
    return meta


def _lines(fh: Any) -> Any:
    """Yield ``(line_no, bytes | None)``; ``None`` for a line over :data:`MAX_LINE_BYTES`
    (the rest of it is skipped without holding it in memory)."""
    n = 0
    while True:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        n += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while True:
                rest = fh.readline(MAX_LINE_BYTES)
                if not rest or rest.endswith(b"\n"):
                    break
            yield n, None
            continue
        yield n, line


def import_jsonl(corpus: Corpus, path: Path, *, kind: str, instance: str,
                 replace: bool = False) -> dict[str, Any]:
    """Import records; the caller holds the writer (see ``Corpus.import_records``).

    Returns:
        ``{"kind", "instance", "records", "indexed", "updated", "skipped", "removed",
        "failed", "chunks": int, "errors": [{"line", "code", "message"}],
        "ignoredKeys": [str], "seconds": float}``.

    Raises:
        CorpusError: ``import-not-found`` (no such file / unreadable),
            ``import-invalid`` (no line of the file is a valid record).
    """
    started = time.monotonic()
    w = ingest.Writer(corpus)
    report: dict[str, Any] = {"kind": kind, "instance": instance, "records": 0}
    errors: list[dict[str, Any]] = []
    ignored: set[str] = set()
    seen: set[str] = set()
    prefix = f"/{kind}/{instance}/"
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        raise CorpusError("import-not-found", "The file to import does not exist or cannot "
                                              "be read.") from None
    with fh:
        try:
            for line_no, raw in _lines(fh):
                try:
                    if raw is None:
                        raise _Bad("line-too-long", f"the line is over {MAX_LINE_BYTES} bytes")
                    if not raw.strip():
                        continue
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        raise _Bad("not-utf8", "the line is not UTF-8") from None
                    try:
                        obj = json.loads(line)
                    except ValueError:
                        raise _Bad("not-json", "the line is not valid JSON") from None
                    rid, text, meta, extra = validate_record(obj)
                    if rid in seen:
                        raise _Bad("duplicate-id", "an earlier line has the same id")
                except _Bad as bad:
                    errors.append({"line": line_no, "code": bad.code, "message": bad.message})
                    continue
                seen.add(rid)
                ignored.update(extra)
                report["records"] += 1
                _one(w, f"{prefix}{rid}", rid, text, meta)
        except IsADirectoryError:
            raise CorpusError("import-not-found", "The file to import is a folder.") from None
    if not report["records"] and errors:
        w.maybe_commit(force=True)
        raise CorpusError("import-invalid", f"No line of the file is a valid record "
                                            f"(first problem on line {errors[0]['line']}: "
                                            f"{errors[0]['code']}).")
    if replace:
        for doc_id, source_id in w.db.execute(
                "SELECT doc_id, source_id FROM documents WHERE origin='record' "
                "AND substr(source_id, 1, ?)=?", (len(prefix), prefix)).fetchall():
            if source_id[len(prefix):] not in seen:
                w.remove(doc_id)
    w.maybe_commit(force=True)
    r = w.report
    report.update(indexed=r["indexed"], updated=r["updated"], skipped=r["skipped"],
                  removed=r["removed"], failed=r["failed"] + r["empty"], chunks=r["chunks"],
                  errors=errors + [{"line": None, **e} for e in r["errors"]],
                  ignoredKeys=sorted(ignored)[:50],
                  seconds=round(time.monotonic() - started, 3))
    return report


def _one(w: ingest.Writer, source_id: str, rid: str, text: str, meta: dict[str, Any]) -> None:
    doc = ingest.DocRef(source_id, "", rid, "record", "recursive", chunking.DEFAULT_CHUNK_SIZE,
                        chunking.DEFAULT_CHUNK_OVERLAP)
    content_hash = hashlib.sha256(json.dumps({"text": text, "metadata": meta}, sort_keys=True,
                                             ensure_ascii=False).encode("utf-8")).hexdigest()
    row = w.row(source_id)
    if (row is not None and row["status"] == "done" and row["content_hash"] == content_hash
            and row["chunker_sig"] == doc.sig):
        w.skip("unchanged")
        return
    w.index(doc, kind="record", size=len(text.encode("utf-8")), mtime_ns=None,
            content_hash=content_hash, existed=row is not None,
            parse=lambda: parsers.ParsedDocument(text=text, kind="record", encoding="utf-8"),
            metadata=meta)
