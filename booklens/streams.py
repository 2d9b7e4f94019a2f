"""Diagnostic output that outlives its reader.

Progress lines, warnings and notes go to stderr while a command works. When whoever reads them
goes away (`booklens run ... 2>&1 | head -1`, a terminal closed over ssh, a log pipe whose reader
died), a write raises BrokenPipeError, which stopped a run of hours and lost what it was about to
write. `tolerant` wraps such a stream: once its reader is gone, it writes nowhere and the command goes
on to write its results. The `booklens` command wraps stderr once at its start (`booklens.cli.main`);
a display writing to a stream of its own wraps that one too (the sweep's).
"""

from __future__ import annotations

import os
from typing import Any, TextIO


class TolerantStream:
    """`stream` as it is, except that a write or flush to a reader that has gone away is dropped, as
    is all later output. The stream's file descriptor is then pointed at the null device, so that
    what else writes to it (the interpreter's last flush at exit, C libraries) does not fail either."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.reader_gone = True
        try:
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
        except (AttributeError, OSError, ValueError):  # not a real file: nothing else writes to it
            return
        try:
            os.dup2(null, fd)
            # what the stream still holds from the failed write now goes to the null device
            self._stream.flush()
        except (OSError, ValueError):
            pass
        finally:
            os.close(null)

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno, ...: the stream's own
        return getattr(self._stream, name)


def tolerant(stream: TextIO) -> TextIO:
    """`stream` wrapped in a `TolerantStream`, unless it is one already."""
    return stream if isinstance(stream, TolerantStream) else TolerantStream(stream)  # type: ignore[return-value]
