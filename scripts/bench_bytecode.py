"""The one rule for the child processes of Kith's benchmarks: they run with a bytecode cache.

An installed kith runs from compiled bytecode (pip compiles an install's modules). A
checkout's modules have none when the caller's environment sets ``PYTHONDONTWRITEBYTECODE``
(as this project's machines do): every child process then compiles every module it imports
from source — about +0.11 s of a ``kith join`` here, CPU that lands inside a timed window
whenever a child starts during one (``scripts/load``'s killed ``kith join``, a worker's
first imports). :func:`child_bytecode_cache` removes that cost for every process started
inside it; ``--no-bytecode-cache`` (:func:`add_option`) keeps the caller's environment.

Used by ``scripts/bench``, ``scripts/bench_copies``, ``scripts/bench_search``,
``scripts/bench_startup`` and ``scripts/load``: each puts ``scripts/`` on ``sys.path`` and
imports this module.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

#: ``--help`` of ``--no-bytecode-cache``
OPTION_HELP = ("keep the caller's environment (PYTHONDONTWRITEBYTECODE as it is): child processes may "
               "then compile every module they import, which an installed kith never does")
#: the variables :func:`child_bytecode_cache` sets or drops (and puts back afterwards)
_VARIABLES = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")


def add_option(parser: argparse.ArgumentParser) -> None:
    """Declare ``--no-bytecode-cache`` (a flag, ``args.no_bytecode_cache``) on ``parser``."""
    parser.add_argument("--no-bytecode-cache", action="store_true", help=OPTION_HELP)


@contextmanager
def child_bytecode_cache(enabled: bool = True) -> Iterator[bool]:
    """Inside it, every child process (they inherit ``os.environ``) writes and reads its
    compiled bytecode under one temporary folder: ``PYTHONDONTWRITEBYTECODE`` is dropped and
    ``PYTHONPYCACHEPREFIX`` names the folder, so the first process that imports a module
    compiles it and every later one loads it, as an installed kith does. On exit both
    variables are as they were and the folder is removed (a benchmark run in a test's
    process leaves that process's environment alone). The current process is not changed
    (its modules are imported already).

    Args:
        enabled: False: change nothing (``--no-bytecode-cache``).

    Yields:
        ``enabled``: whether the children run with the cache (for the report).
    """
    if not enabled:
        yield False
        return
    before = {name: os.environ.get(name) for name in _VARIABLES}
    folder = tempfile.mkdtemp(prefix="kith-bench-pycache-")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = folder
    try:
        yield True
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(folder, ignore_errors=True)
