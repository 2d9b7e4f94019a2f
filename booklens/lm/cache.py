"""The disk cache of completed LM calls: a killed run resumes without repeating a finished call.

It also runs identical concurrent calls once (single-flight): threads that miss the cache on a key
another thread is already computing wait for that answer instead of calling the backend again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable

from booklens.errors import BooklensError, CacheError


CACHE_FILE = "calls.sqlite"  # in the cache directory


def default_cache_dir() -> Path:
    env = os.environ.get("BOOKLENS_CACHE_DIR")
    if env:
        return Path(env)
    # The XDG spec: an empty or relative XDG_CACHE_HOME is ignored (a relative one would put the
    # cache wherever the command happens to run, and a rerun elsewhere would not resume).
    xdg = os.environ.get("XDG_CACHE_HOME") or ""
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "booklens"


class _Flight:
    """One backend call in progress; threads asking for the same key wait on it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.waiters = 0


class CallCache:
    """Completed LM calls keyed by a hash of the request. Each call is committed as it finishes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in the way, no permission, a path that cannot exist
            raise BooklensError(f"cannot use {self.path.parent} as the LM cache directory: "
                                f"{exc.strerror or exc}") from None
        self._lock = threading.Lock()
        self._flights: dict[str, _Flight] = {}
        self._flights_lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._db.commit()
        except sqlite3.Error as exc:
            raise BooklensError(f"cannot open the LM cache at {self.path}: {exc}") from None

    @staticmethod
    def key_for(request: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            with self._lock:
                row = self._db.execute("SELECT value FROM calls WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise CacheError(f"cannot read the LM cache at {self.path}: {exc}") from None
        return json.loads(row[0]) if row else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        try:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO calls (key, value) VALUES (?, ?)", (key, json.dumps(value)))
                self._db.commit()
        except sqlite3.Error as exc:
            with self._lock, contextlib.suppress(sqlite3.Error):
                self._db.rollback()  # an insert whose commit failed must not ride on the next commit
            raise CacheError(f"cannot write the LM cache at {self.path}: {exc}") from None

    def forget(self, keys: list[str]) -> None:
        """Drop these calls: answers a program rejected in every try, which a rerun must ask again."""
        if not keys:
            return
        try:
            with self._lock:
                self._db.executemany("DELETE FROM calls WHERE key = ?", [(k,) for k in keys])
                self._db.commit()
        except sqlite3.Error as exc:
            with self._lock, contextlib.suppress(sqlite3.Error):
                self._db.rollback()
            raise CacheError(f"cannot write the LM cache at {self.path}: {exc}") from None

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]

    def fetch(self, key: str, compute: Callable[[], dict[str, Any]],
              keep: Callable[[dict[str, Any]], bool] | None = None) -> tuple[dict[str, Any], bool]:
        """The cached value of `key`, or `compute()` stored under it (unless `keep` says it is not
        worth keeping); `(value, reused)`.

        One call per key at a time: a thread that finds another computing the same key waits for
        its answer (reused=True) instead of calling the backend again. When that call fails, the
        waiters get the same error."""
        value = self.get(key)
        if value is not None:
            return value, True
        with self._flights_lock:
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                flight = self._flights[key] = _Flight()
            else:
                flight.waiters += 1
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return dict(flight.value or {}), True
        try:
            # Another thread may have finished this key between the lookup above and now.
            value = self.get(key)
            reused = value is not None
            if value is None:
                value = compute()
                if keep is None or keep(value):
                    self.put(key, value)
            flight.value = value
            return value, reused
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._flights_lock:
                del self._flights[key]
            flight.done.set()

    def waiting(self) -> int:
        """Threads now waiting for another thread's call to the same key."""
        with self._flights_lock:
            return sum(f.waiters for f in self._flights.values())
