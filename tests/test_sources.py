"""normalize_source / resolve_source_id: the single normalization point (DESIGN §10)."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.corpus.sources import lexical_form, normalize_source, resolve_source_id
from node.corpus.types import Root

# --- purely textual rules (no roots, no file system) -------------------------------------

LEXICAL = [
    # input, canonical (None = rejected)
    ("/kakao/personal/chunks/chunk-1", "/kakao/personal/chunks/chunk-1"),
    ("/etc/secrets/key.pem", "/etc/secrets/key.pem"),
    ("/docs//a///b.md/", "/docs/a/b.md"),
    ("///etc//x/", "/etc/x"),
    ("/docs/What? #1.md", "/docs/What? #1.md"),
    ("/docs/a\\b.md", "/docs/a/b.md"),
    ("C:\\Users\\me\\x.txt", "/C:/Users/me/x.txt"),
    ("c:/Users//me/", "/C:/Users/me"),
    ("\\\\srv\\share\\x.txt", "//srv/share/x.txt"),
    ("//srv/share/x.txt", "//srv/share/x.txt"),
    ("/caf\u0065\u0301.md", "/caf\u00e9.md"),
    ("/docs/a:b.md", "/docs/a:b.md"),
    ("", None),
    ("/", None),
    ("//", None),
    ("\\\\", None),
    ("docs/a.md", None),
    ("a\\b.md", None),
    ("\\docs\\a.md", None),
    ("./a.md", None),
    ("/docs/../etc/passwd", None),
    ("/docs/./a.md", None),
    ("C:..\\x", None),
    ("C:x.txt", None),
    ("file:///etc/passwd", None),
    ("http://example.com/a", None),
    ("kakao:chat/sender/chunk-1", None),
    ("/docs/a\x00.md", None),
    ("/docs/a\udcff.md", None),
    ("/" + "a" * 5000, None),
]


@pytest.mark.parametrize(("source", "expected"), LEXICAL)
def test_textual_rules(source: str, expected: str | None) -> None:
    assert normalize_source(source, []) == expected
    assert lexical_form(source) == expected


@pytest.mark.parametrize("bad", [None, 42, b"/docs/a.md", ["/a"]])
def test_non_string_is_none_not_an_exception(bad: object) -> None:
    assert normalize_source(bad, []) is None  # type: ignore[arg-type]


# --- rules that need roots -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """docs/ (with nested root docs/sub/inner and symlinks), notes/, outside/."""
    base = tmp_path_factory.mktemp("roots")
    docs, inner, notes, outside = (base / "docs", base / "docs" / "sub" / "inner",
                                   base / "notes", base / "outside")
    for d in (docs, inner, notes, outside):
        d.mkdir(parents=True)
    (docs / "a.md").write_text("a")
    (inner / "x.md").write_text("x")
    (outside / "secret.txt").write_text("s")
    (docs / "escape").symlink_to(outside)          # in a root, pointing out
    (docs / "to-notes").symlink_to(notes)          # in a root, pointing into another root
    (base / "docs-link").symlink_to(docs)          # outside, pointing into a root
    return {"base": base, "docs": docs, "inner": inner, "notes": notes, "outside": outside}


@pytest.fixture(scope="module")
def roots(tree: dict[str, Path]) -> list[Root]:
    return [Root("docs", str(tree["docs"])), Root("inner", str(tree["inner"])),
            Root("notes", str(tree["notes"]))]


def test_real_path_inside_root_becomes_virtual(tree, roots) -> None:
    assert normalize_source(str(tree["docs"] / "a.md"), roots) == "/docs/a.md"
    assert normalize_source(str(tree["docs"]), roots) == "/docs"
    assert normalize_source(str(tree["docs"]) + "//a.md/", roots) == "/docs/a.md"
    assert normalize_source(str(tree["docs"] / "new #1?.md"), roots) == "/docs/new #1?.md"


def test_longest_root_wins(tree, roots) -> None:
    assert normalize_source(str(tree["inner"] / "x.md"), roots) == "/inner/x.md"
    # the same file named through the outer root's virtual namespace gets the same id
    assert normalize_source("/docs/sub/inner/x.md", roots) == "/inner/x.md"
    assert normalize_source("/docs/sub/y.md", roots) == "/docs/sub/y.md"


def test_symlinks_are_resolved_before_containment(tree, roots) -> None:
    # outside name, inside target -> virtual id
    assert normalize_source(str(tree["base"] / "docs-link" / "a.md"), roots) == "/docs/a.md"
    # inside name, target in another root -> that root's id
    assert normalize_source(str(tree["docs"] / "to-notes" / "n.md"), roots) == "/notes/n.md"
    assert normalize_source("/docs/to-notes/n.md", roots) == "/notes/n.md"
    # inside name, target outside every root -> fail closed, the real path never comes back
    assert normalize_source(str(tree["docs"] / "escape" / "secret.txt"), roots) is None
    assert normalize_source("/docs/escape/secret.txt", roots) is None


def test_virtual_and_datasource_ids_pass(tree, roots) -> None:
    assert normalize_source("/docs/a.md", roots) == "/docs/a.md"
    assert normalize_source("/docs/not/yet/there.md", roots) == "/docs/not/yet/there.md"
    assert normalize_source("/kakao/personal/chunks/chunk-1", roots) == "/kakao/personal/chunks/chunk-1"


def test_absolute_path_outside_roots_passes_as_itself(tree, roots) -> None:
    secret = str(tree["outside"] / "secret.txt")
    assert normalize_source(secret, roots) == secret
    assert normalize_source("C:\\secrets\\k.pem", roots) == "/C:/secrets/k.pem"
    assert normalize_source("\\\\srv\\share\\k.pem", roots) == "//srv/share/k.pem"


def test_nfd_real_path_maps_to_nfc_id(tree, roots) -> None:
    nfd = unicodedata.normalize("NFD", "Café.md")
    assert normalize_source(str(tree["docs"] / nfd), roots) == "/docs/Caf\u00e9.md"


def test_resolve_source_id(tree, roots) -> None:
    assert resolve_source_id("/docs/a.md", roots) == Path(os.path.realpath(tree["docs"] / "a.md"))
    assert resolve_source_id("/docs//a.md", roots) == Path(os.path.realpath(tree["docs"] / "a.md"))
    assert resolve_source_id("/inner/x.md", roots) == Path(os.path.realpath(tree["inner"] / "x.md"))
    assert resolve_source_id("/docs/escape/secret.txt", roots) is None
    assert resolve_source_id("/docs/to-notes/n.md", roots) is None  # escapes its own root
    assert resolve_source_id("/docs/../notes/n.md", roots) is None
    assert resolve_source_id("/unknown/a.md", roots) is None
    assert resolve_source_id(str(tree["docs"] / "a.md"), roots) is None  # not a virtual id
    assert resolve_source_id("", roots) is None


# --- properties ----------------------------------------------------------------------------

_SEGMENTS = st.sampled_from(
    ["a.md", "b", "..", ".", "", "escape", "to-notes", "sub", "inner", "x.md", "docs", "notes",
     "C:", "é", "e\u0301", "#?", "a\\b", "::", " ", "kakao"])


def _sources(tree: dict[str, Path]) -> st.SearchStrategy[str]:
    bases = st.sampled_from(
        ["", "/", "//", "\\\\", "\\", "C:\\", "c:/", "file:", "kakao:", "/docs", "/inner", "/notes",
         "/kakao", str(tree["docs"]), str(tree["base"]), str(tree["base"] / "docs-link"),
         str(tree["inner"]), str(tree["outside"])])
    seps = st.sampled_from(["/", "\\", "//"])
    first = st.sampled_from(["escape", "to-notes", "sub", "inner", "a.md", "..", "", "docs-link"])
    built = st.tuples(bases, seps, first, st.lists(st.tuples(seps, _SEGMENTS), max_size=5),
                      st.sampled_from(["", "/"]))
    joined = built.map(lambda t: t[0] + t[1] + t[2] + "".join(s + seg for s, seg in t[3]) + t[4])
    return st.one_of(joined, st.text(max_size=40))


def _check(source: str, roots: list[Root], real_roots: list[str]) -> None:
    out = normalize_source(source, roots)
    if out is None:
        return
    assert normalize_source(out, roots) == out, "idempotent"
    assert out.startswith("/") and "\\" not in out and "\x00" not in out
    segments = out[2:].split("/") if out.startswith("//") else out[1:].split("/")
    assert all(seg not in ("", ".", "..") for seg in segments), out
    assert unicodedata.is_normalized("NFC", out)
    # a result never names a real path inside a root
    assert not any(out == r or out.startswith(r + "/") for r in real_roots), out
    # a virtual id resolves to a file inside its own root
    prefixes = {r.prefix: r for r in roots}
    if segments[0] in prefixes and not out.startswith("//"):
        real = resolve_source_id(out, roots)
        assert real is not None, out
        root_real = os.path.realpath(prefixes[segments[0]].path)
        assert str(real) == root_real or str(real).startswith(root_real + os.sep)


def test_properties_idempotent_and_never_escaping(tree, roots) -> None:
    real_roots = [os.path.realpath(r.path) for r in roots] + [r.path for r in roots]

    @settings(max_examples=400, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(_sources(tree))
    def run(source: str) -> None:
        _check(source, roots, real_roots)

    run()
