"""normalize_source / resolve_source_id: the single normalization point (DESIGN §10)."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.corpus.sources import SourceNormalizer, lexical_form, normalize_source, resolve_source_id
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


def test_served_file_resolves_once_inside_its_own_root(tree, roots) -> None:
    """The serve-time resolution: the real file and its canonical id when it lies inside
    its own root; nothing for a file that escapes it, leaves it for another root, or is
    gone."""
    (tree["notes"] / "n.md").write_text("n")
    n = SourceNormalizer(roots)
    assert n.served_file("notes", "n.md")[2] == "/notes/n.md"
    real, st, canonical = n.served_file("docs", "a.md")
    assert real == os.path.realpath(tree["docs"] / "a.md") and st.st_size == 1
    assert canonical == "/docs/a.md" == n("/docs/a.md")
    assert n.served_file("docs", "sub/inner/x.md")[2] == "/inner/x.md" == n("/docs/sub/inner/x.md")
    assert n.served_file("docs", "escape/secret.txt") is None     # symlink out of every root
    assert n.served_file("docs", "to-notes/n.md") is None          # not inside its own root
    assert n.served_file("docs", "missing.md") is None
    assert n.served_file("unknown", "a.md") is None


def test_inside_compares_whole_segments() -> None:
    from node.corpus.sources import inside

    assert inside("/a/b", "/a/b") == ""
    assert inside("/a/b/c/d", "/a/b") == "c/d"
    assert inside("/a/bc", "/a/b") is None
    assert inside("/x", "/") == "x"


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


# --- issue 5: the full fixture tree (nested roots, same basenames, symlink out, NFD,
# --- case variants, datasource ids) and case-insensitive resolution ------------------------

from node.corpus.sources import SourceNormalizer, detect_case_insensitive, plan_root_prefixes  # noqa: E402

NFD_NAME = unicodedata.normalize("NFD", "Résumé.md")


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """a/docs (nested root a/docs/team), b/docs (same basename → docs-2), a symlink out,
    an NFD file name, and a folder whose name differs from a deny glob only by case."""
    base = tmp_path_factory.mktemp("full")
    a, b, team, outside = base / "a" / "docs", base / "b" / "docs", base / "a" / "docs" / "team", base / "out"
    for d in (a / "secret", b, team, outside):
        d.mkdir(parents=True)
    (a / "secret" / "plan.md").write_text("p")
    (a / "Readme.md").write_text("r")
    (a / NFD_NAME).write_text("n")
    (b / "b.md").write_text("b")
    (team / "t.md").write_text("t")
    (outside / "k.pem").write_text("k")
    (a / "out-link").symlink_to(outside)
    prefixes = plan_root_prefixes([a, b, team])
    roots = [Root(p, str(d)) for p, d in zip(prefixes, (a, b, team))]
    return {"base": base, "a": a, "b": b, "team": team, "outside": outside, "roots": roots}


def test_prefixes_basename_then_numbered_in_addition_order(full) -> None:
    assert [r.prefix for r in full["roots"]] == ["docs", "docs-2", "team"]
    # adding a root later never renames an earlier one; taken prefixes are skipped
    assert plan_root_prefixes(["/x/docs", "/y/docs"], taken=["docs", "docs-2"]) == ["docs-3", "docs-4"]
    assert plan_root_prefixes(["/"]) == ["root"]


def test_prefixes_agree_with_the_corpus_store(tmp_path: Path, full) -> None:
    from node.corpus.store import Corpus

    with Corpus(tmp_path / "home") as corpus:
        got = [corpus.add_root(full[k]).prefix for k in ("a", "b", "team")]
    assert got == [r.prefix for r in full["roots"]]


def test_full_tree_table(full) -> None:
    roots, a, b, team = full["roots"], full["a"], full["b"], full["team"]
    cases = {
        str(a / "secret" / "plan.md"): "/docs/secret/plan.md",
        str(b / "b.md"): "/docs-2/b.md",                       # same basename, second root
        "/docs-2/b.md": "/docs-2/b.md",
        str(team / "t.md"): "/team/t.md",                      # nested root: longest wins
        "/docs/team/t.md": "/team/t.md",
        str(a / "out-link" / "k.pem"): None,                   # symlink out of a root
        "/docs/out-link/k.pem": None,
        str(full["outside"] / "k.pem"): str(full["outside"] / "k.pem"),
        str(a / NFD_NAME): "/docs/R\u00e9sum\u00e9.md",         # NFD on disk → NFC id
        "/docs/" + NFD_NAME: "/docs/R\u00e9sum\u00e9.md",
        "/kakao/personal/chunks/chunk-1": "/kakao/personal/chunks/chunk-1",  # datasource id
        "/kakao/personal/chunks//chunk-1/": "/kakao/personal/chunks/chunk-1",
        "kakao:personal/chunk-1": None,
        "/docs/secret/what?#1.md": "/docs/secret/what?#1.md",
    }
    for source, expected in cases.items():
        assert normalize_source(source, roots) == expected, source


def _folding_listdir(calls: list[str]):
    def listdir(folder: str) -> list[str]:
        calls.append(folder)
        return os.listdir(folder)
    return listdir


def test_case_insensitive_fs_resolves_to_on_disk_case(full) -> None:
    """This machine's file system is case-sensitive, so a case-insensitive one is simulated:
    the normalizer is told the FS folds case and matches names through a directory listing
    with NFC+casefold comparison — exactly the lookup a case-insensitive FS does. The real
    symlink/containment checks still run on the real files."""
    calls: list[str] = []
    n = SourceNormalizer(full["roots"], case_insensitive=True, listdir=_folding_listdir(calls))
    a = full["a"]
    for spelling in ("/docs/SECRET/plan.md", "/docs/Secret/PLAN.MD", "/docs/sEcReT/plan.md",
                     str(a).upper() + "/SECRET/plan.md", str(a) + "/secret/Plan.md"):
        assert n(spelling) == "/docs/secret/plan.md", spelling
    assert calls, "the on-disk case came from directory listings"
    # a name that exists only in another case is still found; one that does not exist keeps its spelling
    assert n("/docs/readme.md") == "/docs/Readme.md"
    assert n("/docs/SECRET/new.md") == "/docs/secret/new.md"
    # the symlink out of the root is followed in any case spelling → fail closed
    assert n("/docs/OUT-LINK/k.pem") is None
    assert n(str(a) + "/Out-Link/k.pem") is None
    # the virtual prefix itself is ours, not the FS's: /DOCS is a different (datasource-like) id
    assert n("/DOCS/secret/plan.md") == "/DOCS/secret/plan.md"
    # on a case-sensitive FS (the default detection here) the spelling is kept as given
    assert SourceNormalizer(full["roots"])("/docs/SECRET/plan.md") == "/docs/SECRET/plan.md"


def test_case_insensitive_ambiguity_fails_closed(tmp_path: Path) -> None:
    # two entries differing only by case cannot exist on a real case-insensitive FS; if the
    # view is wrong, the normalizer refuses to pick one
    (tmp_path / "r" / "Dir").mkdir(parents=True)
    (tmp_path / "r" / "dir").mkdir()
    n = SourceNormalizer([Root("r", str(tmp_path / "r"))], case_insensitive=True)
    assert n("/r/DIR/x.md") is None
    assert n("/r/Dir/x.md") == "/r/Dir/x.md"  # an exact name is used as is


def test_detect_case_insensitive_on_this_machine(tmp_path: Path) -> None:
    probe = tmp_path / "Probe"
    probe.mkdir()
    expected = os.path.exists(str(probe).swapcase())
    assert detect_case_insensitive(str(probe)) is expected
    assert detect_case_insensitive("/123/456") is False  # nothing to swap


def test_properties_hold_on_a_simulated_case_insensitive_fs(tree, roots) -> None:
    n = SourceNormalizer(roots, case_insensitive=True)
    real_roots = [os.path.realpath(r.path) for r in roots] + [r.path for r in roots]
    folded = [r.casefold() for r in real_roots]

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(_sources(tree).map(lambda s: s.swapcase() if len(s) % 2 else s))
    def run(source: str) -> None:
        out = n(source)
        if out is None:
            return
        assert n(out) == out, "idempotent"
        assert not any(out.casefold() == r or out.casefold().startswith(r + "/") for r in folded), out

    run()


def test_folders_resolved_once_gives_what_realpath_gives(tmp_path: Path) -> None:
    """The visible-set scan resolves each folder once (sources.folders_resolved_once): the
    answers must be os.path.realpath's, through file and folder symlinks, relative links,
    loops, missing parts and a file used as a folder — and a symlink escaping the root
    still normalizes to nothing."""
    from node.corpus import sources

    d = tmp_path
    (d / "a" / "b" / "c").mkdir(parents=True)
    (d / "x").mkdir()
    (d / "a" / "b" / "c" / "f.txt").write_text("f")
    (d / "a" / "file").write_text("g")
    os.symlink(d / "x", d / "a" / "lnk")
    os.symlink("../b/c/f.txt", d / "a" / "b" / "rel")
    os.symlink(d / "loop2", d / "loop1")
    os.symlink(d / "loop1", d / "loop2")
    os.symlink("c", d / "a" / "b" / "cl")
    os.symlink(d / "a" / "b" / "cl" / "f.txt", d / "fl")
    paths = [f"{d}/a/b/c/f.txt", f"{d}/a/lnk/q", f"{d}/a/b/rel", f"{d}/loop1/z", f"{d}/loop1",
             f"{d}/a/file/x", f"{d}/nope/x/y", f"{d}/a/b/cl/f.txt", f"{d}/fl", "/", f"{d}/a/b/",
             f"{d}//a//b", f"{d}/a/b/c/../c/f.txt"]
    plain = [sources._realpath(p) for p in paths]
    assert plain == [os.path.realpath(p) for p in paths]
    with sources.folders_resolved_once():
        with sources.folders_resolved_once():  # nested: still one memo, still the same
            twice = [sources._realpath(p) for p in paths] + [sources._realpath(p) for p in paths]
    assert twice == plain + plain
    roots = [Root("a", str(d / "a"))]
    with sources.folders_resolved_once():
        assert normalize_source("/a/lnk/q", roots) is None  # escapes the root
        assert normalize_source("/a/b/rel", roots) == "/a/b/c/f.txt"
    assert getattr(sources._scan, "folders", None) is None  # forgotten after the block
