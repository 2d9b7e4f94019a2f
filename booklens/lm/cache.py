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
import time
from pathlib import Path
from typing import Any, Callable

from booklens.errors import BooklensError, CacheError, setting_name
from booklens.lm.base import stored_completion


CACHE_FILE = "calls.sqlite"  # in the cache directory


def default_cache_dir() -> Path:
    env = os.environ.get("BOOKLENS_CACHE_DIR") or ""
    if env.strip():  # a blank value is an unset one, as for XDG_CACHE_HOME
        return Path(env).expanduser()  # '~' too: a quoted value, a unit file or a .env gets no shell to expand it
    # The XDG spec: an empty or relative XDG_CACHE_HOME is ignored (a relative one would put the
    # cache wherever the command happens to run, and a rerun elsewhere would not resume).
    xdg = os.environ.get("XDG_CACHE_HOME") or ""
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "booklens"


def cache_folder(cache_dir: str | Path | None = None) -> Path:
    """The cache directory a `--cache-dir` value (or a library caller's `cache_dir`) names, `~`
    expanded, else `default_cache_dir()`. Every command and library entry point resolves it here,
    so the calls, indexes and calibrations of one run all land in one folder."""
    if cache_dir is None or (isinstance(cache_dir, str) and not cache_dir.strip()):
        return default_cache_dir()
    from booklens.inputs import as_path

    return as_path(cache_dir, "cache_dir").expanduser()


# How long opening the cache waits for another process that holds it (its busy timeout).
BUSY_SECONDS = 30.0


def _advice(exc: sqlite3.Error, setting: str | None = None) -> str:
    """What to do about a cache error, after its message: ' (...)' or ''. `setting`: how the line names
    the cache folder's setting (by default as `setting_name` does in this thread)."""
    name = getattr(exc, "sqlite_errorname", "")  # Python 3.11+
    text = str(exc).lower()
    other = f"or use another {setting or setting_name('--cache-dir')}"
    if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or "not a database" in text or "malformed" in text:
        return (f" (the file is damaged: move it aside, {other}; it only keeps finished LM "
                "calls, which are then asked again)")
    if name.startswith("SQLITE_READONLY") or "readonly" in text:
        return f" (make it and its folder writable, {other})"
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return f" (another process holds it: let it finish, {other})"
    if name.startswith("SQLITE_FULL") or "disk is full" in text:
        return f" (the disk is full: free some space, {other})"
    if name.startswith("SQLITE_CANTOPEN") or "unable to open" in text:
        return f" (it must be a file in a folder you can write: fix that, {other})"
    return ""


def _busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc).lower()


class _Flight:
    """One backend call in progress; threads asking for the same key wait on it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.waiters = 0


def stored_calls(path: Path) -> int:
    """How many answers the calls file `path` holds, read without writing (another run may be using
    it); a one-line error when it is no calls file booklens can read."""
    try:
        db = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro", uri=True, timeout=BUSY_SECONDS)
        try:
            return db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise BooklensError(f"cannot read the LM cache at {path}: {exc}{_advice(exc)}") from None


class CallCache:
    """Completed LM calls keyed by a hash of the request. Each call is committed as it finishes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in the way, no permission, a path that cannot exist
            raise BooklensError(f"cannot use {self.path.parent} as the LM cache directory: "
                                f"{exc.strerror or exc}") from None
        # The setting the failure lines name, as where the cache was opened: its reads and writes may run
        # on threads that a command's mark does not reach (DSPy's evaluation threads).
        self._setting = setting_name("--cache-dir")
        self._lock = threading.Lock()
        self._flights: dict[str, _Flight] = {}
        self._flights_lock = threading.Lock()
        deadline = time.monotonic() + BUSY_SECONDS
        while True:
            try:
                self._db = self._open()
                break
            except sqlite3.Error as exc:
                # Switching a new file to WAL takes the whole file, and SQLite answers 'locked' at once,
                # without waiting, when another process is opening it at the same moment (commands
                # started side by side on an empty cache): wait for that one, as the busy timeout would.
                if _busy(exc) and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise BooklensError(f"cannot open the LM cache at {self.path}: "
                                    f"{exc}{_advice(exc, self._setting)}") from None

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=BUSY_SECONDS)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.commit()
            # A cache it can read but not write (a file left by another user, by sudo) would fail
            # only at the first answer, one paid call late: try a write now, and take it back.
            db.execute("INSERT OR REPLACE INTO calls (key, value) VALUES ('', '')")
            db.rollback()
        except BaseException:
            db.close()
            raise
        return db

    @staticmethod
    def key_for(request: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored answer of `key`; None when there is none, or when its entry cannot be read (not
        UTF-8, not JSON, not a completion: edited by hand, say), which `fetch` then asks again and replaces."""
        try:
            with self._lock:
                # As bytes: SQLite would refuse a value that is not UTF-8 with the whole value in its message.
                row = self._db.execute("SELECT CAST(value AS BLOB) FROM calls WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise CacheError(f"cannot read the LM cache at {self.path}: "
                             f"{exc}{_advice(exc, self._setting)}") from None
        if row is None:
            return None
        try:
            value = json.loads(bytes(row[0]).decode("utf-8"))
        except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return None
        return value if stored_completion(value) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        try:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO calls (key, value) VALUES (?, ?)", (key, json.dumps(value)))
                self._db.commit()
        except sqlite3.Error as exc:
            with self._lock, contextlib.suppress(sqlite3.Error):
                self._db.rollback()  # an insert whose commit failed must not ride on the next commit
            raise CacheError(f"cannot write the LM cache at {self.path}: "
                             f"{exc}{_advice(exc, self._setting)}") from None

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
            raise CacheError(f"cannot write the LM cache at {self.path}: "
                             f"{exc}{_advice(exc, self._setting)}") from None

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
