"""Where built model directories live (``$XDG_CACHE_HOME/timely_llm``), and how a build lands there safely."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "timely_llm"


def build_atomically(target: Path, write: Callable[[Path], None]) -> None:
    """Run ``write`` into a fresh directory beside ``target`` and rename it into place.

    Concurrent builders of the same cache entry are safe: the first rename wins, the others
    find the finished entry and drop their copy.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".build-"))
    try:
        write(tmp)
        tmp.rename(target)
    except OSError:
        if not (target / "config.json").exists():  # else another process finished first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
