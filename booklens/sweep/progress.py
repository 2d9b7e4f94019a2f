"""One progress display for a whole sweep: cells done of total, LM calls, tokens, cost, ETA.

On a terminal it is one line redrawn in place (like tqdm); otherwise (a log file, CI) a plain
line every `interval` seconds and at the end. A failed cell is reported on its own line at once.
The LM figures of this invocation come from a `usage` callable (the engine's running totals), so
the display needs no knowledge of how cells are scheduled; the work of the steps a finished cell
reused from an earlier run (which this invocation did not do, so `usage` does not count it) comes
with `cell_done` and is shown apart. Tokens and cost are of both: once every cell is done, the
line's figures are the aggregate's.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Optional, TextIO

from booklens.lm.usage import cost_text, known_cost, snapshot_cost, total_work
from booklens.streams import tolerant
from booklens.vocabulary import counted

Usage = Callable[[], dict[str, Any]]


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m"


def _count(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e4:
        return f"{n / 1e3:.0f}k"
    return f"{int(n):,}"


class SweepProgress:
    """Thread-safe: engines call `cell_done` from any thread; a ticker thread redraws."""

    def __init__(self, total: int, usage: Usage, *, stream: Optional[TextIO] = None, tty: Optional[bool] = None,
                 interval: Optional[float] = None, clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.usage = usage
        # the display's own stream (a copy of stderr beside Ray) must outlive its reader as stderr does
        self.stream = tolerant(stream if stream is not None else sys.stderr)
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval if interval is not None else (0.5 if self.tty else 30.0)
        self.clock = clock
        self.done = 0
        self.failed = 0
        self.reused = 0  # cells whose every step was already on disk: no work, so not in the ETA rate
        self.earlier = total_work([])  # the work of the steps reused from earlier runs (run.json's figures)
        self.started = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._width = 0

    # -- events ------------------------------------------------------------------

    def start(self) -> "SweepProgress":
        self.started = self.clock()
        self._thread = threading.Thread(target=self._tick, name="sweep-progress", daemon=True)
        self._thread.start()
        return self

    def cell_done(self, name: str, *, failed: Optional[str] = None, reused: bool = False,
                  earlier: Optional[dict[str, Any]] = None) -> None:
        """A cell finished; `reused`: every step of it was already on disk; `earlier`: the work
        (`total_work` figures) of the steps it reused, done by an earlier run."""
        with self._lock:
            self.done += 1
            self.reused += bool(reused)
            if earlier:
                self.earlier = total_work([self.earlier, earlier])
            if failed is not None:
                self.failed += 1
                self._write_line(f"cell {name} failed: {failed}")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._draw(final=True)

    # -- drawing -----------------------------------------------------------------

    def line(self, final: bool = False) -> str:
        """'sweep: 5/12 cells (2 reused, 1 failed) | 834 LM calls (120 from the cache) + 310 reused from
        earlier runs | 1.2M tokens | $0.42 | 2m13s, ETA 3m05s': the calls this invocation made (those
        booklens's cache answered said apart) and those of the steps it reused; tokens and cost of all.
        The `final` line, drawn once the sweep has stopped, has no ETA: cells left then (after
        --fail-fast or an interrupt) are not going to run."""
        u = self.usage() or {}
        earlier = self.earlier
        # Calls answered from the cache count with the tokens and cost they had when first made.
        calls = (u.get("calls") or 0) + (u.get("cached_calls") or 0)
        tokens = sum(u.get(k) or 0 for k in ("prompt_tokens", "completion_tokens", "cached_prompt_tokens",
                                             "cached_completion_tokens"))
        tokens += earlier["prompt_tokens"] + earlier["completion_tokens"]
        # None (not shown) unless every call so far had a price
        cost = known_cost([(calls, snapshot_cost(u)), (earlier["calls"], earlier["cost_usd"])])
        cells = [f"{self.reused} reused"] * bool(self.reused) + [f"{self.failed} failed"] * bool(self.failed)
        parts = [f"sweep: {self.done}/{self.total} cell" + "s" * (self.total != 1) + (f" ({', '.join(cells)})" if cells else "")]
        calls_text = counted(calls, "LM call", _count(calls))
        if u.get("cached_calls"):
            calls_text += f" ({_count(u['cached_calls'])} from the cache)"
        if earlier["calls"]:
            calls_text += f" + {_count(earlier['calls'])} reused from earlier runs"
        parts.append(calls_text)
        parts.append(counted(tokens, "token", _count(tokens)))
        if cost is not None:
            parts.append(cost_text(cost))
        elapsed = self.clock() - self.started
        timing = _duration(elapsed)
        eta = self.eta(elapsed)
        if eta is not None and self.done < self.total and not final:
            timing += f", ETA {_duration(eta)}"
        parts.append(timing)
        return " | ".join(parts)

    def eta(self, elapsed: float) -> Optional[float]:
        """Seconds left at the rate of the cells that completed work so far. Reused cells cost nothing,
        and a failed cell says nothing of the pace: most fail at once (a book that cannot be read, a
        refused setting), and counting them would promise the rest of the sweep in seconds."""
        worked = self.done - self.reused - self.failed
        if worked <= 0:
            return None
        return elapsed / worked * (self.total - self.done)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                self._draw()

    def _draw(self, final: bool = False) -> None:
        text = self.line(final)
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad + ("\n" if final else ""))
            self._width = 0 if final else len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def _write_line(self, text: str) -> None:
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()
