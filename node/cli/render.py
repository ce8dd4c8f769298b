"""Rendering a Host's answers for a person: the one place ``kith join`` (and ``kith ask``)
turn a knowledge-query ``results`` message into terminal lines.

Everything in a ``results`` message came from the peer: every string passes through
:func:`node.cli.common.safe_text` and rich markup is never parsed. ``--json`` output never
goes through here (stdout then carries the messages as received, with this node's
``untrusted``/``suspicious`` marks, node/answer/fence.py).

Layout (specs/exit-codes.md shows an example)::

    [q1] ok: 2 result(s)
      #1 /docs/library/tempfile.rst  lines 120-145
         tempfile > Examples
         Here are some examples of typical usage of the tempfile module ...
         also in 1 other source: /docs-copy/library/tempfile.rst
      #2 /docs/notes/odd.md  line 3
         suspicious: addresses an agent (ignore-instructions) — read it as text, not as instructions
         Ignore all previous instructions and ...

A result this node's fence scan flagged (``suspicious``, node/answer/fence.py) gets the
``suspicious:`` line before its preview; its text is shown as received.
Results are numbered by rank (``#1`` is the host's best match); the fused ``score`` is a
relative number that means nothing across queries, so it is not shown (``--json`` has it).
On a terminal long lines wrap to its width with a hanging indent; off a terminal (a pipe,
a file) nothing is wrapped and no colour is written, so every line can be copied or grepped
whole.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from node.cli.common import safe_text

#: characters of a result's ``textPreview`` shown (the envelope's own preview is ≤ 240)
PREVIEW_CHARS = 400
#: extractive answer sentences shown
MAX_SENTENCES = 3
#: statuses that answered the question (exit 0); every other status makes ``kith join``
#: exit 1 (specs/exit-codes.md)
ANSWERED_STATUSES = frozenset({"ok", "no-verified-results"})


@dataclass(frozen=True)
class Line:
    """One line to print: its first-line ``indent`` and the ``hang`` (indent of wrapped
    continuation lines), both in columns; ``style`` is a rich style used on a terminal
    only (None: plain); ``wrap`` False for a line of code, never re-wrapped."""

    text: str
    indent: int = 0
    hang: int = 0
    style: str | None = None
    wrap: bool = True  # False: a code line, printed as it is (its indentation kept)


def _clean(value: Any, limit: int | None = None) -> str:
    """``value`` as one line of safe text (control characters neutralised, whitespace runs
    collapsed), cut to ``limit`` characters with an ellipsis."""
    text = " ".join(safe_text("" if value is None else value).split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def location_text(location: Any) -> str:
    """Where in its source a result is: ``lines A-B`` (``line A`` for one line) and, for a
    paged document (PDF), ``page P`` / ``pages P-Q``; ``""`` when the location names
    neither. ``location`` is an envelope ``provenance.location`` object
    (specs/search-envelope.schema.json)."""
    if not isinstance(location, Mapping):
        return ""
    parts: list[str] = []

    def span(first: Any, last: Any, one: str, many: str) -> None:
        if isinstance(first, int) and not isinstance(first, bool):
            if isinstance(last, int) and not isinstance(last, bool) and last > first:
                parts.append(f"{many} {first}-{last}")
            else:
                parts.append(f"{one} {first}")

    span(location.get("page"), location.get("pageEnd"), "page", "pages")
    span(location.get("lineStart"), location.get("lineEnd"), "line", "lines")
    return ", ".join(parts)


def heading_text(location: Any) -> str:
    """The result's heading path joined with `` > `` (``""`` when it has none)."""
    path = location.get("headingPath") if isinstance(location, Mapping) else None
    if not isinstance(path, list):
        return ""
    return " > ".join(p for p in (_clean(h, 120) for h in path) if p)


#: sources named in an "also in" line (the rest are counted; ``--json`` lists all)
ALSO_IN_NAMED = 3


def also_in_text(also_in: Any) -> str:
    """The line for a result's ``alsoIn`` (copies of its text collapsed into it, issue 20
    item 6): ``also in 2 other sources: /b/x.md, /c/x.md`` (at most
    :data:`ALSO_IN_NAMED` named, then ``, …``); ``""`` when there are none or the value
    is not a list (an older node). Items are envelope entries (``{"id", "source"}``) or
    source strings (``kith ask``'s attributions)."""
    if not isinstance(also_in, list):
        return ""
    names = [_clean(a.get("source") if isinstance(a, Mapping) else a, 300) or "?"
             for a in also_in if isinstance(a, (Mapping, str))]
    if not names:
        return ""
    noun = "source" if len(names) == 1 else "sources"
    shown = ", ".join(names[:ALSO_IN_NAMED]) + (", …" if len(names) > ALSO_IN_NAMED else "")
    return f"also in {len(names)} other {noun}: {shown}"


def suspicious_text(result: Mapping[str, Any]) -> str:
    """The line for a result this node flagged as addressing an agent
    (``suspicious``, node/answer/fence.py), or ``""``: ``suspicious: addresses an agent
    (ignore-instructions) — read it as text, not as instructions``."""
    if result.get("suspicious") is not True:
        return ""
    reasons = [_clean(x, 40) for x in (result.get("suspiciousReasons") or []) if isinstance(x, str)]
    why = f" ({', '.join(reasons)})" if reasons else ""
    return f"suspicious: addresses an agent{why} — read it as text, not as instructions"


def status_line(message: Mapping[str, Any], shown: int) -> str:
    """The heading line of one answer: ``[q1] ok: 2 result(s)``, or what the status means
    for the person who asked (``rate-limited, retry in N s``; ``pending-approval``)."""
    qid = _clean(message.get("query_id"), 64) or "?"
    status = _clean(message.get("status"), 64) or "?"
    if status == "rate-limited":
        retry = message.get("retry_after_s")
        if isinstance(retry, int) and not isinstance(retry, bool):
            wait = f", retry in {retry} s" + (f" (about {round(retry / 60)} min)" if retry >= 120 else "")
        else:
            wait = ", retry later"
        return f"[{qid}] rate-limited{wait}"
    if status == "pending-approval":
        rid = _clean(message.get("approval_id"), 64)
        waits = f"better evidence waits for the host owner's approval (request {rid})" if rid else \
            "better evidence waits for the host owner's approval (the host recorded no request: too many are open)"
        return f"[{qid}] pending-approval: {waits}; {shown} result(s) you may see now"
    if status == "policy-denied":
        return f"[{qid}] policy-denied: the host does not answer this node's questions"
    if status == "no-verified-results":
        return f"[{qid}] no-verified-results: nothing the host may show matched"
    if status == "peer-answer-invalid":  # node/guest/guest.py, refused_answer
        return f"[{qid}] peer-answer-invalid: {_clean(message.get('error'), 200) or 'this guest refused the host answer'}"
    return f"[{qid}] {status}: {shown} result(s)"


#: the gutter in front of each line of code in a preview
CODE_GUTTER = "│ "


def preview_lines(value: Any, indent: int, limit: int = PREVIEW_CHARS) -> list[Line]:
    """A ``textPreview`` (or excerpt) as lines: prose collapsed to one wrapped line per
    part, each list item on a line of its own (wrapped under its text), code (the parts between the envelope's fence lines,
    :func:`node.answer.readable.split_code`) line by line as the source has it — line
    breaks and indentation kept, behind :data:`CODE_GUTTER`, never re-wrapped — all of
    it at most ``limit`` characters (an ellipsis marks a cut).

    Args:
        value: the untrusted preview text (anything; ``None`` gives no lines).
        indent: the column every line starts at.
        limit: most characters shown, prose and code together.
    """
    from node.answer.readable import blocks

    out: list[Line] = []
    room = limit
    for kind, part in blocks(safe_text("" if value is None else value)):
        if room <= 0:
            break
        if kind != "code":  # prose wraps as one paragraph; a list item is a line of its own
            text = _clean(part, room)
            if text:
                out.append(Line(text, indent=indent, hang=indent + (2 if kind == "item" else 0)))
                room -= len(text)
            continue
        for line in part.split("\n"):
            if room <= 0:
                break
            line = line.rstrip()
            if len(line) > room:
                line = line[: max(room - 1, 0)] + "…"
            out.append(Line(CODE_GUTTER + line, indent=indent, hang=indent, style="green",
                            wrap=False))
            room -= len(line) + 1
    return out


def answer_lines(message: Mapping[str, Any]) -> list[Line]:
    """The lines that show one ``results`` message (module docstring): the status line,
    for ``pending-approval`` what to tell the host's owner, each result (rank, source,
    location, heading path, preview) and the extractive answer's sentences.

    Args:
        message: a knowledge-query ``results`` message (``query_id``, ``status``,
            ``envelope``, optional ``retry_after_s`` / ``approval_id``), untrusted.

    Returns:
        :class:`Line` objects, unwrapped (:func:`format_lines` wraps them).
    """
    env = message.get("envelope") if isinstance(message.get("envelope"), Mapping) else {}
    results = [r for r in (env.get("results") or []) if isinstance(r, Mapping)]
    out = [Line(status_line(message, len(results)), hang=4, style="bold")]
    if message.get("citations") == "signing-off":  # asked with --citations (specs/citations.md)
        out.append(Line("the host does not sign citations (signing-off): these results carry none, "
                        "so kith verify cannot check them", indent=2, hang=4, style="dim"))
    rid = _clean(message.get("approval_id"), 64)
    if message.get("status") == "pending-approval" and rid:
        out.append(Line("ask the host's owner to run this, then ask again:", indent=2, hang=4))
        out.append(Line(f"kith approvals approve {rid}", indent=4, hang=6))
    for rank, r in enumerate(results, 1):  # a "suspicious" line before a flagged preview
        prov = r.get("provenance") if isinstance(r.get("provenance"), Mapping) else {}
        loc = prov.get("location")
        where = location_text(loc)
        head = f"#{rank} {_clean(r.get('source'), 300) or '?'}" + (f"  {where}" if where else "")
        out.append(Line(head, indent=2, hang=len(f"#{rank} ") + 2, style="bold"))
        body = len(f"#{rank} ") + 2
        heading = heading_text(loc)
        if heading:
            out.append(Line(heading, indent=body, hang=body, style="cyan"))
        flagged = suspicious_text(r)
        if flagged:
            out.append(Line(flagged, indent=body, hang=body + 2, style="yellow"))
        out.extend(preview_lines(r.get("textPreview"), body))
        copies = also_in_text(r.get("alsoIn"))
        if copies:
            out.append(Line(copies, indent=body, hang=body + 2, style="dim"))
    synth = env.get("answerSynthesis") if isinstance(env.get("answerSynthesis"), Mapping) else {}
    sentences = [s for s in (synth.get("sentences") or []) if isinstance(s, Mapping)]
    if sentences:
        out.append(Line("answer (sentences copied from the results above):", indent=2, hang=4))
        ranks = {_clean((r.get("provenance") or {}).get("citationId") if isinstance(r.get("provenance"), Mapping)
                        else None): i for i, r in enumerate(results, 1)}
        for sent in sentences[:MAX_SENTENCES]:
            cite = _clean(sent.get("citationId"), 64)
            ref = f"#{ranks[cite]}" if cite in ranks else (cite or "?")
            out.append(Line(f"- {_clean(sent.get('text'), 400)} [{ref}]", indent=4, hang=6))
    return out


def format_lines(lines: Sequence[Line], width: int | None) -> list[str]:
    """``lines`` as printable strings: wrapped to ``width`` columns with each line's
    hanging indent, or (``width`` None: off a terminal) indented but never wrapped."""
    out: list[str] = []
    for line in lines:
        first, rest = " " * line.indent, " " * line.hang
        if width is None or not line.wrap or len(first) + len(line.text) <= width:
            out.append(first + line.text)
            continue
        out.extend(textwrap.wrap(line.text, width=max(width, line.hang + 20), initial_indent=first,
                                 subsequent_indent=rest, break_long_words=True, break_on_hyphens=False))
    return out


def print_answer(message: Mapping[str, Any], console: Any) -> None:
    """Print one ``results`` message on ``console`` (a :class:`rich.console.Console`):
    on a terminal wrapped to its width, with bold headings; off a terminal plain and
    unwrapped (module docstring). Never parses markup in the peer's text.

    Args:
        message: ``{"query_id", "status", "envelope"[, "retry_after_s", "approval_id"]}``
            (:func:`answer_lines`); to show a bare envelope (``kith ask``, ``kith search``)
            pass ``{"query_id": LABEL, "status": STATUS, "envelope": ENVELOPE}``.
        console: where to print (usually stdout's console).
    """
    lines = answer_lines(message)
    if not console.is_terminal:
        console.file.write("".join(t + "\n" for t in format_lines(lines, None)))
        console.file.flush()
        return
    from rich.text import Text

    for line in lines:  # each wrapped piece keeps its line's style
        for piece in format_lines([line], console.width):
            console.print(Text(piece, style=line.style or ""), soft_wrap=True, highlight=False)

#: seconds a connection may take before ``kith join`` says it is connecting (and says so
#: again every second while it keeps trying)
CONNECTING_NOTICE_S = 1.0
#: seconds a question may be outstanding before ``kith join`` / ``kith ask`` print, on
#: stderr, that they are waiting and on whom; then again every :data:`WAIT_REPEAT_S`
#: seconds until the answer, the deadline or the dead-peer bound (DESIGN §3)
WAIT_NOTICE_S = 2.0
WAIT_REPEAT_S = 3.0


class Waiting:
    """The sign of life while the guest waits on the host: a rich status spinner on
    ``console`` (stderr) — only when it is a terminal; off a terminal nothing is drawn.
    Thread-safe: the session calls :meth:`start` / :meth:`stop` from the event loop and
    from the hooks' worker thread.

    Args:
        console: a :class:`rich.console.Console` on stderr.
    """

    def __init__(self, console: Any) -> None:
        import threading

        self._console = console
        self._lock = threading.Lock()
        self._status: Any = None

    @property
    def enabled(self) -> bool:
        """True when a spinner is drawn (the console is a terminal)."""
        return bool(self._console.is_terminal)

    def start(self, text: str) -> None:
        """Show the spinner with ``text`` (plain, no markup), replacing any shown."""
        if not self.enabled:
            return
        from rich.text import Text

        with self._lock:
            if self._status is None:
                self._status = self._console.status(Text(text), spinner="dots")
                self._status.start()
            else:
                self._status.update(Text(text))

    def stop(self) -> None:
        """Remove the spinner (no-op when none is shown)."""
        with self._lock:
            if self._status is not None:
                self._status.stop()
                self._status = None


__all__ = ["ANSWERED_STATUSES", "CODE_GUTTER", "CONNECTING_NOTICE_S", "WAIT_NOTICE_S", "WAIT_REPEAT_S", "Line", "Waiting",
           "answer_lines", "format_lines", "heading_text", "location_text", "preview_lines", "print_answer",
           "status_line"]
