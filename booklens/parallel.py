"""Bounded concurrency for independent LM calls, with a progress bar.

Worker threads get a copy of the caller's context variables, so DSPy's
`dspy.context(...)` overrides, booklens' usage step and a stop request follow the work.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


_quiet = 0
_quiet_lock = threading.Lock()


def check_at_least(option: str, value: int, least: int = 1) -> None:
    """The commands' bound on a count (`--concurrency`, `--batch-size`, ...), checked again where a
    library caller hands the count over: a one-line `BooklensError` below `least`, naming an option
    as the argument it is outside a command (`setting_name`)."""
    from booklens.errors import BooklensError, setting_name

    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BooklensError(f"{setting_name(option)} must be at least {least} (got {value!r})")


class Stopped(KeyboardInterrupt):
    """Work that outlives its interrupted command (a sweep's cells run on daemon threads) ends
    here, as Ctrl-C would have ended it: before another LM call, and before anything is saved."""


# The event that asks the work of this context to stop (None: nothing can ask).
_stop_request: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("booklens_stop", default=None)


@contextlib.contextmanager
def stoppable(event: threading.Event):
    """Work in this block, and on the threads it starts through `parallel_map`, stops with
    `Stopped` at its next check once `event` is set."""
    token = _stop_request.set(event)
    try:
        yield
    finally:
        _stop_request.reset(token)


def raise_if_stopped() -> None:
    """Raise `Stopped` when the work of this context was asked to stop."""
    event = _stop_request.get()
    if event is not None and event.is_set():
        raise Stopped()


def pause(seconds: float) -> None:
    """Sleep, unless the work of this context is asked to stop meanwhile: then `Stopped` at once
    (a retry's backoff or a rate limit's wait is no reason to keep a stopped command alive)."""
    event = _stop_request.get()
    if event is None:
        time.sleep(seconds)
    elif event.wait(seconds):
        raise Stopped()


# How often the main thread, waiting for work on other threads, comes back to run a signal's handler.
# A signal the kernel hands to another thread does not wake a wait without a timeout, and then a
# second Ctrl-C would not quit until the call in flight ends.
SIGNAL_CHECK_SECONDS = 0.2


def wait_on_main_thread(done: threading.Event) -> None:
    """`done.wait()`, back every `SIGNAL_CHECK_SECONDS` so that the main thread runs Ctrl-C's handler."""
    while not done.wait(SIGNAL_CHECK_SECONDS):
        pass


def survive_ctrl_c(work: Callable[[], R]) -> R:
    """`work()`, run off the main thread when called on it, so that Ctrl-C (which the main thread
    receives) lets it end as a call in a worker thread would: its answer is kept, then the
    interrupt goes on. Elsewhere it simply runs."""
    if threading.current_thread() is not threading.main_thread():
        return work()
    outcome: dict[str, Any] = {}
    context = contextvars.copy_context()
    done = threading.Event()  # not Thread.join: a join that Ctrl-C interrupts marks the thread ended

    def target() -> None:
        try:
            outcome["value"] = context.run(work)
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="booklens-call", daemon=True).start()
    try:
        wait_on_main_thread(done)
    except KeyboardInterrupt:
        wait_on_main_thread(done)  # the stop request is set: the call ends without a retry or a re-ask
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@contextlib.contextmanager
def quiet_progress():
    """No per-call progress bars in this process while the block runs (a sweep draws its own
    display; dozens of concurrent cells each drawing bars would garble the terminal)."""
    global _quiet
    with _quiet_lock:
        _quiet += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet -= 1


def progress_enabled() -> bool:
    return _quiet == 0 and sys.stderr.isatty()


def parallel_map(
    fn: Callable[[T], R],
    items: Iterable[T],
    *,
    concurrency: int = 1,
    desc: str | None = None,
) -> list[R]:
    """Apply `fn` to every item with at most `concurrency` in flight; results keep input order.

    The first exception stops new work and is re-raised once running calls end,
    so a permanent backend error is reported once, not once per item.
    """
    items = list(items)
    if not items:
        return []
    bar = _progress(len(items), desc)
    try:
        if concurrency <= 1 or len(items) == 1:
            results = []
            for item in items:
                results.append(fn(item))
                bar and bar.update(1)
            return results
        results: list = [None] * len(items)
        with ThreadPoolExecutor(max_workers=min(concurrency, len(items))) as pool:
            futures = {
                pool.submit(contextvars.copy_context().run, fn, item): i for i, item in enumerate(items)
            }
            pending = set(futures)
            try:
                while pending:  # with a timeout, for the reason of `wait_on_main_thread`
                    done, pending = wait(pending, timeout=SIGNAL_CHECK_SECONDS, return_when=FIRST_EXCEPTION)
                    for future in done:
                        exc = future.exception()
                        if exc is not None:
                            raise exc
                        results[futures[future]] = future.result()
                        bar and bar.update(1)
            except BaseException:
                # A failure or Ctrl-C: the calls in flight end (their answers are cached), the
                # queued ones never start; leaving the pool would otherwise wait for all of them.
                for other in pending:
                    other.cancel()
                raise
        return results
    finally:
        if bar:
            bar.close()


def _progress(total: int, desc: str | None):
    if not desc or not progress_enabled():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="call", file=sys.stderr, leave=False)


def chunked(seq: Sequence[T], size: int) -> list[Sequence[T]]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]
