"""What ``kith --version`` prints, imported by the dispatcher (node/cli/main.py) and the
command table (node/cli/app.py) alike without either importing the other."""

from __future__ import annotations

import sys


def version_text() -> str:
    """``kith <version> (Python <version>)``: the version of this code
    (``node.__version__``, the one the package is built with: pyproject.toml reads it)."""
    import node

    return f"kith {node.__version__} (Python {sys.version.split()[0]})"
