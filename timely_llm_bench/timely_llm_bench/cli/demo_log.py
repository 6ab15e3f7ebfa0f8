"""The demo's terminal shows the demo's own lines; everything else (vLLM's and Python's warnings, progress bars,
the node's ROS log lines) goes to a log file, with the demo's lines too, so the file reads as the whole story."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

ROS_LOG_FORMAT = "[{severity}] [{date_time_with_ms}] [{name}]: {message}"
"""The node's log lines with a readable time (rcutils' ``date_time_with_ms``, Iron and later; Humble prints it as
it is, so there a user's own RCUTILS_CONSOLE_OUTPUT_FORMAT is the way)."""
TAIL_LINES = 30


class _Tee:
    """Writes to the terminal and the log alike."""

    def __init__(self, terminal: TextIO, log: TextIO) -> None:
        self._terminal, self._log = terminal, log

    def write(self, text: str) -> int:
        self._log.write(text)
        return self._terminal.write(text)

    def flush(self) -> None:
        self._log.flush()
        self._terminal.flush()

    def isatty(self) -> bool:
        return self._terminal.isatty()


@contextlib.contextmanager
def terminal_and_log(path: Path, preload: tuple[str, ...] = ()) -> Iterator[Path]:
    """Within the block: ``print`` reaches the terminal and the log at ``path``; stderr, and whatever writes to the
    file descriptors 1 and 2 (ROS's C logging, vLLM's workers), only the log. ``preload``: modules imported once
    the descriptors point at the log, before ``sys.stdout`` does not, so what they bind at import goes there. On
    an exception the log's last lines are shown on the terminal's stderr."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RCUTILS_CONSOLE_OUTPUT_FORMAT", ROS_LOG_FORMAT)
    os.environ.setdefault("RCUTILS_COLORIZED_OUTPUT", "0")
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(1), "w", buffering=1)
    old = sys.stdout, sys.stderr
    with path.open("w", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            for module in preload:
                __import__(module)
            sys.stdout, sys.stderr = _Tee(terminal, log), log
            yield path
        except BaseException:
            sys.stdout, sys.stderr = old
            _restore(saved)
            _show_tail(path)
            raise
        finally:
            sys.stdout, sys.stderr = old
            _restore(saved)
            for fd in saved:
                os.close(fd)
            terminal.close()


def _restore(saved: tuple[int, int]) -> None:
    for fd, copy in zip((1, 2), saved, strict=True):
        with contextlib.suppress(OSError):
            os.dup2(copy, fd)


def _show_tail(path: Path) -> None:
    lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    print(f"the demo failed; the end of {path}:", *lines, sep="\n", file=sys.stderr)
