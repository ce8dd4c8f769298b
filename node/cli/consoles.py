"""The rich consoles behind ``kith``'s output (node/cli/common.py builds them on first use:
importing rich costs about 20 ms, which a guest printing plain lines never pays; issue 44).

:class:`_KithConsole` prints text as written off a terminal (no colour, no wrapping, no
80-column layout; issue 12); :class:`_UntrustedConsole` also makes every string safe
(:func:`node.cli.safe.safe_text`) and never parses markup or emoji codes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.segment import Segment
from rich.text import Text

from node.cli.safe import safe_text

#: Width a console lays out to when its stream is not a terminal: long lines (a `kith
#: join ...` command to copy, a table row) must not be cut at 80 columns in a pipe or file.
PIPE_WIDTH = 4096


class _KithConsole(Console):
    """A console that never decorates what it prints: no highlighter (rich's colours
    random digits and ids), and off a terminal no colour (rich's own rule, also for
    ``TERM=dumb``), no soft wrapping and no 80-column layout — what lands in a pipe or a
    file is the text as written (issue 12). On a terminal lines wrap as usual."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("highlight", False)
        self._wrap_on_tty = kwargs.pop("soft_wrap", False)
        super().__init__(*args, soft_wrap=self._wrap_on_tty, **kwargs)

    @property  # type: ignore[override]
    def soft_wrap(self) -> bool:
        return self._wrap_on_tty or not self.is_terminal

    @soft_wrap.setter
    def soft_wrap(self, value: bool) -> None:
        self._wrap_on_tty = value

    @property
    def width(self) -> int:  # type: ignore[override]
        if self._width is None and not self.is_terminal:
            return PIPE_WIDTH
        return super().width

    @width.setter
    def width(self, value: int) -> None:
        self._width = value

    @property  # type: ignore[override]
    def size(self) -> ConsoleDimensions:
        # rich lays out renderables (tables) to ``options.max_width``, which it takes from
        # ``size``, not ``width``: without this a table in a pipe still wraps at 80 columns
        dims = super().size
        if self._width is None and not self.is_terminal:
            return ConsoleDimensions(PIPE_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


class _UntrustedConsole(_KithConsole):
    """A console for text that came from a peer, a server or a file: every string is
    passed through :func:`safe_text` and rich markup and emoji codes are never parsed —
    also the strings inside renderables (table cells, headers, titles), which rich turns
    into text through :meth:`render_str`, and :class:`rich.text.Text` objects printed
    directly."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("markup", False)
        kwargs.setdefault("emoji", False)
        kwargs.setdefault("highlight", False)
        super().__init__(*args, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:  # type: ignore[override]
        kwargs["markup"] = False
        kwargs["emoji"] = False
        return super().render_str(safe_text(text), **kwargs)

    def render(self, renderable: Any, options: Any = None) -> Iterable[Segment]:  # type: ignore[override]
        # every piece of text of every renderable (incl. Text objects in table cells) is
        # sanitized at the segment level; rich's own control segments are kept
        for seg in super().render(renderable, options):
            yield seg if seg.control else Segment(safe_text(seg.text), seg.style, seg.control)

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        kwargs["markup"] = False
        kwargs["emoji"] = False
        kwargs.setdefault("highlight", False)
        super().print(*(safe_text(o) if isinstance(o, str) else o for o in objects), **kwargs)
