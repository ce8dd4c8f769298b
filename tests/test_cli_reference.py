"""specs/cli.md is the full `kith` reference, generated from the CLI (node.cli.reference):
it must be what the code's `--help` says today, and every command must be in it."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from typer.testing import CliRunner

from node.cli import reference

REPO = Path(__file__).resolve().parents[1]
CLI_MD = REPO / "specs" / "cli.md"


def test_cli_reference_is_current() -> None:
    want = reference.render()
    have = CLI_MD.read_text("utf-8") if CLI_MD.is_file() else ""
    if have != want:
        diff = "".join(list(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                 "specs/cli.md", "generated", n=1))[:60])
        raise AssertionError("specs/cli.md is stale: run scripts/cli_reference\n" + diff)


def test_every_command_and_option_of_help_is_in_the_reference() -> None:
    """Independent of the renderer: each command's `--help` option names appear in its
    section, so the generator cannot silently drop an option or a command added later."""
    from node.cli.main import app

    text = CLI_MD.read_text("utf-8")
    runner = CliRunner()
    commands = reference.commands()
    assert len(commands) > 40
    for path, cmd, _ctx in commands:
        title = "## kith " + " ".join(path) if path else "## kith (global options)"
        assert title + "\n" in text, f"{title} missing from specs/cli.md"
        section = text.split(title + "\n", 1)[1].split("\n## ", 1)[0]
        result = runner.invoke(app, [*path, "--help"], prog_name="kith")
        assert result.exit_code == 0, result.output
        for param in cmd.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-") and opt in result.output:
                    assert f"{opt}" in section, f"{opt} of kith {' '.join(path)} not in specs/cli.md"


def test_the_readme_links_the_reference_and_cites_only_shipped_documents() -> None:
    readme = (REPO / "README.md").read_text("utf-8")
    assert "(specs/cli.md)" in readme
    assert "DESIGN" not in readme and "design document" not in readme
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        if not target.startswith("http"):
            assert (REPO / target).exists(), f"README links {target}, which is not in the repo"


def test_the_readme_quick_start_runs_top_to_bottom() -> None:
    """Issue 12 problem 2: install to PATH, init, index, policy, the server BEFORE the host,
    then join (with its own init), each with output shown."""
    readme = (REPO / "README.md").read_text("utf-8")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    steps = ["scripts/setup", ".venv/bin", "pipx install .", "kith --home ~/kith-host init",
             "kith --home ~/kith-host index add", "kith --home ~/kith-host index sync",
             "kith --home ~/kith-host policy set", "community serve --port 8787",
             "kith --home ~/kith-host host --server", "kith --home ~/kith-guest init",
             "kith --home ~/kith-guest join"]
    at = [quick.find(step) for step in steps]
    assert -1 not in at, [s for s, i in zip(steps, at) if i < 0]
    assert at == sorted(at), "quick start steps out of order"
    assert "Created identity in" in quick and "post_id:" in quick and "[q1] ok" in quick
    assert "join with: kith join" in quick
    after = readme.split("## Quick start", 1)[1]
    assert after.index("## Two commands") < after.index("## CLI reference")



#: reST a reader of `--help` would see raw (``x``, :func:`x`)
REST = re.compile(r"``|:(?:func|meth|class|mod|attr|data|ref):`")


def test_help_text_is_plain() -> None:
    """No command's `--help` (specs/cli.md is generated from them) shows raw reST."""
    text = "\n".join(ln for ln in CLI_MD.read_text("utf-8").splitlines() if not ln.startswith("```"))
    assert not REST.search(text), REST.search(text)


def _options(help_text: str) -> dict[str, str]:
    """argparse `--help` → {option or positional: its help text} (argparse puts the help
    after the name on the same line, or on the next, more indented lines)."""
    out: dict[str, str] = {}
    name = None
    section = False
    for line in help_text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            section, name = line in ("options:", "positional arguments:"), None
            continue
        if not section or not line.strip():
            continue
        m = re.match(r"^  (\S+(?: [A-Z_]+)?(?:, \S+(?: [A-Z_]+)?)*)(?:\s{2,}(.*))?$", line)
        if m and not line.startswith("   "):
            name = m.group(1).split(",")[0].split()[0]
            out[name] = m.group(2) or ""
        elif name:
            out[name] = (out[name] + " " + line.strip()).strip()
    return out


def test_benchmark_scripts_explain_every_option() -> None:
    """`scripts/bench_scale|bench_corpus.py|bench_dense --help`: plain text, every option
    explained, defaults and preconditions stated; every script's description is plain."""
    import subprocess
    import sys

    def helptext(script: str) -> str:
        r = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--help"],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
        assert r.returncode == 0, r.stderr
        assert not REST.search(r.stdout), (script, r.stdout)
        return r.stdout

    for script in ("bench", "bench_engine", "bench_fanout", "bench_search", "eval", "load",
                   "load_community"):
        helptext(script)
    scale = helptext("bench_scale")
    opts = _options(scale)
    assert set(opts) >= {"--corpus", "--chunks", "--rounds", "--top-k", "--workdir", "--keep",
                         "--reuse", "--json"}
    assert all(opts.values()), opts
    assert "1,000,000" in opts["--chunks"] and "default: 3" in opts["--rounds"]
    assert "never removed" in opts["--workdir"] and "always kept" in opts["--keep"]
    corpus = helptext("bench_corpus.py")
    opts = _options(corpus)
    assert set(opts) >= {"--corpus", "--sizes", "--repeat", "--synthetic-chunks", "--breakdown"}
    assert all(opts.values()), opts
    assert "per stage" in opts["--breakdown"] and "issue-3" not in corpus
    assert "SIZE:OVERLAP" in opts["--sizes"]
    dense = _options(helptext("bench_dense"))
    assert "index embed" in dense["home"] and "default: 100,000" in dense["--chunks"]
