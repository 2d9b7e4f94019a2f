"""Engines that run a sweep's cells: `local` (threads in this process) and `ray` (Ray Data).

Both call the same `run_cell`, which calls the library pipeline (`booklens.pipeline.run_book`)
for one (system, book) cell with an `LMPool`: one disk cache and one limit of LM calls in flight
for everything the pool's process runs. A cell never raises: whatever goes wrong becomes a
failed `CellOutcome` with a one-line reason, so the other cells go on.

- `local`: up to `concurrency` cells run at once on worker threads; every LM call of every cell
  queues behind the one pool, so `--concurrency` bounds the calls in flight of the whole sweep.
- `ray`: a dataset with one row (one block) per cell, `map_batches` with `CellWorker`, a callable
  class Ray keeps alive per worker: it sets up DSPy and its `LMPool` once (so the embedded model
  loads once per worker) and runs several cells at once on threads. `--concurrency` bounds the
  calls in flight of the whole cluster: a `SweepBoard` actor holds the slots and every call of
  every worker takes one, so a worker whose cells are done leaves its share to the others; the
  board also counts `--rpm`/`--tpm` for all the workers (one limiter per server, whatever the number
  of workers or of models asked there); after a failure under `--fail-fast` the board
  tells the workers to start no new cell, and after Ctrl-C no new cell or LM call (the calls in
  flight end and are cached before Ray stops). Workers write each cell's run directory
  themselves, so the sweep directory must be on a path every node sees (the call cache stays on
  each node's own disk: SQLite's WAL mode does not work on network file systems); the
  cell's run record comes back to the driver in the dataset's rows, and the driver writes the
  aggregate. A worker that dies (out of memory, a crash) is replaced by Ray, which runs its cells
  again: the board takes back its call slots once it has been silent for `SLOT_LEASE_SECONDS`, and
  fails a cell started more than `CELL_RETRIES` + 1 times (both the driver's values: the board takes
  them when the sweep starts).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import sys
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from booklens.errors import BooklensError, first_line, internal_error
from booklens.parallel import Stopped, stoppable
from booklens.sweep.aggregate import CellOutcome, outcome_of_run

Done = Callable[[CellOutcome], None]

# Seconds a Ray worker holding call slots may go without a sign of life (it reports its usage every
# second) before the board takes its slots back: a worker that died mid-call (out of memory, a
# crash) never releases them, and Ray runs its cells again on a new worker, which would wait for them.
SLOT_LEASE_SECONDS = 60.0
# Times the Ray engine runs a cell again after its worker died running it (Ray Data would without end).
CELL_RETRIES = 2
# Backend settings read from the environment: a Ray worker takes the driver's values (set or not), as
# it takes the driver's options; its own node's would make its cells differ from the others'.
DRIVER_ENVIRONMENT = ("BOOKLENS_STRUCTURED", "BOOKLENS_TIMEOUT", "BOOKLENS_CONNECT_TIMEOUT")


def driver_environment() -> dict[str, str]:
    """This process's values of the `DRIVER_ENVIRONMENT` variables it sets (not blank)."""
    return {name: os.environ[name].strip() for name in DRIVER_ENVIRONMENT if os.environ.get(name, "").strip()}


def process_id() -> str:
    """This process as the sweep's board knows it: a Ray worker's usage and call slots are its."""
    return f"{os.uname().nodename}:{os.getpid()}"


@dataclass
class CellTask:
    """Everything a worker needs to run one cell (JSON-serializable: it travels to Ray workers)."""

    system: str
    book: str
    book_path: str
    sweep_dir: str
    output: str
    system_config: dict[str, Any]
    judge_config: dict[str, Any]
    # Independent LM calls of the cell started at once (the sweep's --concurrency; the process's
    # pool bounds how many are in flight, so the records are the same whatever the engine).
    concurrency: int = 4
    # The digest of the book's text when the sweep was planned (`Sweep.book_read`); None: unreadable then.
    book_sha256: Optional[str] = None

    @property
    def name(self) -> str:
        return f"{self.system}/{self.book}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CellTask":
        return cls(**json.loads(text))


@dataclass
class PoolSettings:
    """How a process builds its `LMPool`."""

    lm: Optional[str]
    api_base: Optional[str]
    cache_dir: Optional[str]
    concurrency: int
    structured: Optional[str] = None  # --structured, --rpm, --tpm
    rpm: Optional[int] = None
    tpm: Optional[int] = None
    # The named Ray actor that holds the sweep's call slots (`SweepBoard`); None: the pool's own limit.
    slots_actor: Optional[str] = None
    # Whether that actor also counts the rate limits (then rpm and tpm are its, not the pool's).
    shared_rate_limits: bool = False
    # A Ray worker's: the driver's `DRIVER_ENVIRONMENT` values, which replace the worker's own.
    environment: Optional[dict[str, str]] = None

    def make_pool(self):
        from booklens.lm.pool import LMPool

        if self.environment is not None:  # a Ray worker, a process of the sweep's own
            for name in DRIVER_ENVIRONMENT:
                if name in self.environment:
                    os.environ[name] = self.environment[name]
                else:
                    os.environ.pop(name, None)
        call_limit = SharedSlots(self.slots_actor) if self.slots_actor else None
        limiter_for = None
        if self.slots_actor and self.shared_rate_limits:
            actor = self.slots_actor

            def limiter_for(key: str) -> "SharedRateLimit":
                return SharedRateLimit(actor, key)
        elif self.slots_actor:
            # A Ray worker of a sweep the driver set no limits for: none either from the worker's
            # own environment (its BOOKLENS_RPM would pace each worker apart, not the cluster).
            def limiter_for(key: str) -> Any:
                from booklens.lm.ratelimit import RateLimiter

                return RateLimiter()

        return LMPool(self.lm, self.api_base, cache_dir=self.cache_dir, concurrency=self.concurrency,
                      structured=self.structured, rpm=self.rpm, tpm=self.tpm, call_limit=call_limit,
                      limiter_for=limiter_for)


def run_cell(task: CellTask, pool: Any) -> CellOutcome:
    """Run (or resume) one cell with the library pipeline; never raises."""
    try:
        from booklens.pipeline import JudgeConfig, SystemConfig, run_book
        from booklens.sweep.manifest import JUDGE_KEYS, judge_key

        run = run_book(Path(task.book_path), Path(task.output), SystemConfig.model_validate(task.system_config),
                       JudgeConfig.model_validate(task.judge_config), lms=pool, concurrency=task.concurrency,
                       notify=_quiet, window_option=judge_key("context_window"), as_keys=JUDGE_KEYS)
        record = run.model_dump(mode="json")
        if task.book_sha256 and run.book_sha256 and run.book_sha256 != task.book_sha256:
            # Edited while the sweep ran (or another copy on a Ray worker's node): the systems would be
            # compared over two versions of one book. The run directory stays, for the rerun to reuse.
            return CellOutcome(task.system, task.book, "failed", f"the book {task.book_path} is not the text the "
                               "sweep started with (edited while it ran, or another copy where this cell ran): "
                               "rerun to redo its cells on the text it has now", record)  # its LM work counts
        return outcome_of_run(task.system, task.book, record)
    except BooklensError as exc:
        return CellOutcome(task.system, task.book, "failed", first_line(exc))
    except Exception as exc:  # a bug must not take the other cells down with it; it is recorded
        return CellOutcome(task.system, task.book, "failed", internal_error(exc))


def _quiet(message: str) -> None:
    """Per-step messages of a cell: the sweep's own display replaces them (failures are in run.json)."""


def not_run(task: CellTask) -> CellOutcome:
    return CellOutcome(task.system, task.book, "not run", None)


# ---------------------------------------------------------------------------
# local


class LocalEngine:
    """Cells on threads of this process, all sharing one `LMPool`."""

    name = "local"

    def __init__(self, settings: PoolSettings):
        self.settings = settings
        self.pool = settings.make_pool()

    def usage(self) -> dict[str, Any]:
        return self.pool.usage.snapshot()

    def run(self, tasks: list[CellTask], on_done: Done, *, fail_fast: bool = False) -> list[CellOutcome]:
        todo: "queue.Queue[tuple[int, CellTask]]" = queue.Queue()
        for item in enumerate(tasks):
            todo.put(item)
        outcomes: list[Optional[CellOutcome]] = [None] * len(tasks)
        stop = threading.Event()  # no new cell starts (--fail-fast)
        interrupted = threading.Event()  # running cells end at their next LM call, saving nothing
        lock = threading.Lock()

        def worker(finished: threading.Event) -> None:
            try:
                work()
            finally:
                finished.set()

        def work() -> None:
            while True:
                try:
                    i, task = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    with stoppable(interrupted):
                        outcome = not_run(task) if stop.is_set() else run_cell(task, self.pool)
                except KeyboardInterrupt:  # `Stopped`: the sweep was interrupted
                    return
                with lock:
                    outcomes[i] = outcome
                if outcome.status != "not run":
                    on_done(outcome)
                if outcome.status == "failed" and fail_fast:
                    stop.set()

        # Ctrl-C: no cell starts, a running cell stops at its next LM call and records nothing, and
        # the calls in flight end and are cached before the command exits (a second Ctrl-C quits at
        # once). Events, not Thread.join: a join that Ctrl-C interrupts marks a running thread ended.
        finished = [threading.Event() for _ in range(max(1, min(len(tasks), self.settings.concurrency)))]
        threads = [threading.Thread(target=worker, args=(done,), name=f"sweep-cell-{n}", daemon=True)
                   for n, done in enumerate(finished)]
        for t in threads:
            t.start()
        from booklens.parallel import wait_on_main_thread

        try:
            for done in finished:
                wait_on_main_thread(done)
        except BaseException:
            stop.set()
            interrupted.set()
            for done in finished:
                wait_on_main_thread(done)
            raise
        return [o if o is not None else not_run(t) for o, t in zip(outcomes, tasks)]


# ---------------------------------------------------------------------------
# ray


class CellWorker:
    """The per-worker state of the Ray engine: DSPy and one `LMPool`, set up on the first cell.

    Each row carries the pool settings, so the class needs no constructor arguments. Ray runs
    up to `max_concurrent_calls_per_actor` calls at once on threads of the worker; they share the
    pool. Each row's result is the cell's outcome as JSON; a thread sends the worker's running LM
    usage to the sweep's `SweepBoard` every second, for the progress display.
    """

    def __init__(self):
        self.pool = None
        self.settings: Optional[PoolSettings] = None
        self.lock = threading.Lock()
        self.worker_id = process_id()

    def _setup(self, settings: PoolSettings, board: str) -> None:
        with self.lock:
            if self.pool is None:
                import booklens  # noqa: F401 - offline defaults before dspy and litellm load
                from booklens.collector import defer_collection, freeze_what_is_loaded

                defer_collection()  # as a command does: the worker is about to import DSPy and LiteLLM
                # The LM layer (DSPy, LiteLLM) now, so the freeze below covers it: the pool imports
                # it only at its first LM, in the first cell, after the freeze.
                import booklens.lm.model  # noqa: F401

                self.settings = settings
                self.pool = settings.make_pool()
                freeze_what_is_loaded()
                if board:
                    threading.Thread(target=self._report_usage, args=(board,), name="sweep-usage",
                                     daemon=True).start()

    def _report_usage(self, board: str, every: float = 1.0) -> None:
        """Send the pool's running usage to the driver's board every second (best effort)."""
        import time

        while True:
            self._send_usage(board)
            time.sleep(every)

    def _send_usage(self, board: str) -> None:
        import ray

        snapshot = self.pool.usage.snapshot()
        snapshot.pop("steps", None)
        try:
            ray.get(ray.get_actor(board).report.remote(self.worker_id, snapshot), timeout=10)
        except Exception:  # the display is best effort; each cell's record comes back in its row
            pass

    def _stopped(self, board: str) -> bool:
        """Whether the sweep starts no new cell (the driver said so on its board after a failure)."""
        if not board:
            return False
        import ray

        try:
            return bool(ray.get(ray.get_actor(board).stopped.remote(), timeout=10))
        except Exception:  # no board to ask: the driver is gone or going; run as asked
            return False

    def _died_too_often(self, board: str, cell: str) -> Optional[str]:
        """Count this start of `cell` on the board; the reason to fail it when it has been started more
        often than the sweep allows. A cell starts more than once only when Ray ran its task again
        because the worker running it died (out of memory, say), which would go on without end."""
        if not board:
            return None
        import ray

        try:
            starts, most = ray.get(ray.get_actor(board).attempt.remote(cell), timeout=10)
        except Exception:  # no board to ask: run as asked
            return None
        if starts <= most:
            return None
        return (f"its Ray worker died running it, {most} times (out of memory or a crash? the workers' logs "
                "are in Ray's session folder on their node)")

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        board = str(batch["board"][0])
        cannot_start = None
        try:
            self._setup(PoolSettings(**json.loads(str(batch["settings"][0]))), board)
        except Exception as exc:  # (its node's cache folder, say) raised, it would abort the whole sweep
            reason = first_line(exc) if isinstance(exc, BooklensError) else internal_error(exc)
            cannot_start = f"worker {self.worker_id} could not start: {reason}"
        outcomes = []
        for text in batch["task"]:
            task = CellTask.from_json(str(text))
            if cannot_start:  # the next cell tries the setup again
                outcome = CellOutcome(task.system, task.book, "failed", cannot_start)
            elif self._stopped(board):  # --fail-fast: another cell failed, start no new one
                outcome = not_run(task)
            elif died := self._died_too_often(board, task.name):
                outcome = CellOutcome(task.system, task.book, "failed", died)
            elif not Path(task.sweep_dir).is_dir():
                outcome = CellOutcome(task.system, task.book, "failed",
                                      f"the sweep directory {task.sweep_dir} is not visible on worker "
                                      f"{self.worker_id}: the ray engine needs it on a path every node shares")
            else:
                try:
                    outcome = run_cell(task, self.pool)
                except Stopped:  # the driver was interrupted (or its board is gone): nothing saved
                    outcome = not_run(task)
            outcomes.append(json.dumps(asdict(outcome)))
        if board and self.pool is not None:  # before the row reaches the driver: its display's last line is exact
            self._send_usage(board)
        return {"outcome": outcomes}


def _calls_counted(snapshot: dict[str, Any]) -> int:
    """The calls a usage snapshot counts, fresh and cached: they only grow, and every other figure
    grows with them (a call's counts are added at once), so the snapshot with more is the later."""
    return int(snapshot.get("calls") or 0) + int(snapshot.get("cached_calls") or 0)


def _sweep_board_class():
    import ray

    @ray.remote(num_cpus=0, max_concurrency=10_000)  # waiting acquires are cheap coroutines
    class SweepBoard:
        """What the workers of a Ray sweep share: the sweep's `--concurrency` slots for LM calls,
        its rate limits (one `RateLimiter` per LM, counting the requests of every worker), and
        each worker's latest LM usage for the driver's progress display. One actor, because each
        actor is a Python process of its own, started while the workers start."""

        def __init__(self, slots: int, rate_limits: Optional[dict[str, int]] = None,
                     lease: float = SLOT_LEASE_SECONDS, retries: int = CELL_RETRIES):
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            self.slots = asyncio.Semaphore(slots)
            self.held: dict[str, int] = {}  # call slots each worker holds
            self.seen: dict[str, float] = {}  # when each worker last gave a sign of life
            self.lease = lease
            self.reaper = None
            self.attempts: dict[str, int] = {}  # starts of each cell (more than one: its worker died)
            self.retries = retries
            self.latest: dict[str, dict[str, Any]] = {}
            self.stop = False  # --fail-fast after a failure: workers start no new cell
            self.interrupted = False  # Ctrl-C: no new call either; the calls in flight end
            self.rate_limits = dict(rate_limits or {})
            self.limiters: dict[str, Any] = {}
            self.paced_requests: dict[str, int] = {}
            # A limiter's wait blocks; it runs on these threads, not on the actor's event loop.
            # Calls wait for their rate inside a call slot, so `slots` threads are enough.
            self.pacers = ThreadPoolExecutor(max_workers=max(1, slots), thread_name_prefix="sweep-rate")

        async def halt(self) -> None:
            self.stop = True

        async def attempt(self, cell: str) -> tuple[int, int]:
            """Count a start of `cell`; the number of starts so far, and the most a cell is allowed."""
            self.attempts[cell] = self.attempts.get(cell, 0) + 1
            return self.attempts[cell], self.retries + 1

        async def stopped(self) -> bool:
            return self.stop

        async def interrupt(self) -> None:
            self.stop = self.interrupted = True

        def _alive(self, worker: str) -> None:
            import time

            self.seen[worker] = time.monotonic()

        async def acquire(self, worker: str = "") -> bool:
            """Take a call slot for `worker`; False once the sweep is interrupted (the call is not made)."""
            import asyncio

            if self.interrupted:
                return False
            if self.reaper is None:
                self.reaper = asyncio.get_running_loop().create_task(self._reap())
            self._alive(worker)
            await self.slots.acquire()
            if self.interrupted:
                self.slots.release()
                return False
            self.held[worker] = self.held.get(worker, 0) + 1
            self._alive(worker)
            return True

        async def release(self, worker: str = "") -> None:
            if self.held.get(worker, 0) > 0:  # else the board took them back already
                self.held[worker] -= 1
                self.slots.release()
            self._alive(worker)

        async def _reap(self) -> None:
            """Give back the slots of each worker silent for longer than the lease (it died mid-call)."""
            import asyncio
            import time

            while True:
                await asyncio.sleep(min(5.0, self.lease / 2))
                now = time.monotonic()
                for worker, count in list(self.held.items()):
                    if count and now - self.seen.get(worker, now) > self.lease:
                        self.held[worker] = 0
                        for _ in range(count):
                            self.slots.release()

        async def pace(self, key: str, tokens: int) -> None:
            """Return when a request of `tokens` tokens to the LM `key` fits the sweep's limits."""
            import asyncio

            limiter = self.limiters.get(key)
            if limiter is None:
                from booklens.lm.ratelimit import RateLimiter

                limiter = self.limiters[key] = RateLimiter(**self.rate_limits)
            await asyncio.get_running_loop().run_in_executor(self.pacers, limiter.acquire, tokens)
            self.paced_requests[key] = self.paced_requests.get(key, 0) + 1

        async def paced(self) -> dict[str, int]:
            """Requests counted by each LM's limiter so far."""
            return dict(self.paced_requests)

        async def report(self, worker: str, snapshot: dict[str, Any]) -> None:
            """Keep `worker`'s usage `snapshot` unless the board holds a later one. A worker sends from
            several threads (its once-a-second reporter, each finished cell), and Ray keeps no order
            between them: an earlier snapshot that arrives last would lower the display's counts."""
            held = self.latest.get(worker)
            if held is None or _calls_counted(snapshot) >= _calls_counted(held):
                self.latest[worker] = snapshot
            self._alive(worker)

        async def totals(self) -> dict[str, Any]:
            total: dict[str, Any] = {}
            for snapshot in self.latest.values():
                for key, value in snapshot.items():
                    if isinstance(value, (int, float)):
                        total[key] = (total.get(key) or 0) + value
            return total

    return SweepBoard


class SharedSlots:
    """A worker's call limit: each LM call holds one of the `SweepBoard` actor's slots.

    The board lives as long as the sweep: when it is gone (the driver was interrupted and is shutting
    down), a call raises `Stopped`, as an interrupted local sweep's does, so the cell saves nothing. A
    call refused that way must not be recorded as the judge's failure on a sentence or a claim: the
    rerun would reuse that step with the sentence left out."""

    def __init__(self, actor_name: str):
        import ray

        self.actor = ray.get_actor(actor_name)
        self.holder = process_id()

    def __enter__(self) -> "SharedSlots":
        import ray

        try:
            granted = ray.get(self.actor.acquire.remote(self.holder))
        except ray.exceptions.RayError:
            raise Stopped() from None
        if granted is False:  # the driver was interrupted: no new call
            raise Stopped()
        return self

    def __exit__(self, *exc: Any) -> None:
        import ray

        try:
            ray.get(self.actor.release.remote(self.holder))
        except ray.exceptions.RayError:  # the board is gone: the answer still counts (and is cached)
            pass


class SharedRateLimit:
    """A worker's rate limiter for one LM: the request is counted, and waits, on the sweep's
    `SweepBoard`, so `--rpm`/`--tpm` hold for the whole cluster however many workers call.
    Like `SharedSlots`, a board that is gone means the sweep was interrupted: `Stopped`."""

    def __init__(self, actor_name: str, key: str):
        self.actor_name = actor_name
        self.key = key
        self._actor = None  # looked up on first use: an embedded LM's limiter is never used

    def acquire(self, tokens: int = 0) -> None:
        import ray

        try:
            if self._actor is None:
                self._actor = ray.get_actor(self.actor_name)
            ray.get(self._actor.pace.remote(self.key, int(tokens)))
        except ray.exceptions.RayError:
            raise Stopped() from None
        except ValueError:  # get_actor: no such actor
            raise Stopped() from None


# What Ray's `data` extra adds to `ray`: Ray Data imports them, and the ray engine runs on Ray Data.
RAY_DATA_NEEDS = ("numpy", "pandas", "pyarrow", "fsspec")
NO_RAY = "the ray engine needs Ray: pip install 'booklens[ray]'"


def no_ray_data(reason: str) -> BooklensError:
    return BooklensError("the ray engine needs Ray Data: pip install 'booklens[ray]', which installs "
                         f"ray[data] (import ray.data: {reason})")


def check_ray_installed() -> None:
    """Ray and what Ray Data adds to it are installed, found without importing them: a plain `pip
    install ray` is then one line at once, not after a local Ray has started (some 5 s and a few
    processes) for nothing. A library that is there but does not import is found by `RayEngine.start`."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise BooklensError(NO_RAY)
    for name in RAY_DATA_NEEDS:
        if importlib.util.find_spec(name) is None:
            raise no_ray_data(f"No module named {name!r}")


def _import_ray_data(failures: list[BaseException]) -> None:
    try:
        import ray.data  # noqa: F401
    except Exception as exc:  # Ray without its Data library (`pip install ray`): `start` says so
        failures.append(exc)


def check_reachable(address: str, timeout: float = 5.0, *, name: Optional[str] = None) -> None:
    """A one-line error unless something listens at a `host:port` or `ray://host:port` address. Ray
    itself retries an address nobody answers at without end, silently (its messages go to the log).
    Other forms (`auto`, or one Ray cannot parse) are left to Ray, which refuses them at once.
    `name`: the address as the message names it (default: itself)."""
    import socket

    text = address.strip()
    if text.startswith("ray://"):
        text = text[len("ray://"):]
    elif "://" in text:
        return
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        return
    try:
        connection = socket.create_connection((host, int(port)), timeout=timeout)
    except socket.gaierror:
        reason = f"unknown host {host}"
    except socket.timeout:
        reason = f"no answer within {timeout:g} s"
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    else:
        with connection:
            if _tls_for_ray() or _speaks_grpc(connection, timeout) is not False:
                return
        # Ray would ask this service for the cluster 20 times over, half a minute each, without a word.
        raise BooklensError(f"cannot reach the Ray cluster at {name or address}: something listens there, but not "
                            "Ray (a Ray head's address is HEAD:6379, or ray://HEAD:10001 for its client server; "
                            "`ray start --head` prints it)")
    raise BooklensError(f"cannot reach the Ray cluster at {name or address}: {reason} (is Ray running there? "
                        "`ray start --head` starts it)")


# The HTTP/2 client's connection preface, then its own (empty) SETTINGS frame.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_HTTP2_SETTINGS = 4  # the type of the frame an HTTP/2 server sends first


def _speaks_grpc(connection: Any, timeout: float) -> Optional[bool]:
    """Whether the server at the other end of `connection` speaks gRPC, as Ray's GCS and its client
    server do: it answers the HTTP/2 preface with a SETTINGS frame. False when it answers anything
    else (an HTTP/1 server's page, a database's greeting) or hangs up; None when it says nothing
    within `timeout` (left to Ray, which may know better)."""
    import socket

    received = b""
    try:
        connection.settimeout(timeout)
        connection.sendall(_HTTP2_PREFACE)
        while len(received) < 9:  # a frame's header: length (3 bytes), type, flags, stream (4)
            chunk = connection.recv(9 - len(received))
            if not chunk:
                return False
            received += chunk
    except socket.timeout:
        return None if not received else False
    except OSError:
        return False
    return received[3] == _HTTP2_SETTINGS


def _tls_for_ray() -> bool:
    """Whether Ray talks to its cluster over TLS (RAY_USE_TLS): then a plain HTTP/2 preface proves nothing."""
    return os.environ.get("RAY_USE_TLS", "").strip().lower() in ("1", "true")


def cluster_started_here() -> Optional[str]:
    """The address of the cluster `ray start` last started or joined on this machine (Ray's record in
    its temporary folder), which `ray.init` joins when given no address; None without one."""
    try:
        from ray._private.utils import read_ray_address

        return (read_ray_address() or "").strip() or None
    except Exception:  # another Ray's layout: as before, ray.init finds it
        return None


def temporary_log() -> Path:
    """A file for Ray's messages while the sweep directory is not made yet (`RayEngine.move_log`)."""
    import tempfile

    handle, name = tempfile.mkstemp(prefix="booklens-ray-", suffix=".log")
    os.close(handle)
    return Path(name)


class RayEngine:
    """Cells as rows of a Ray dataset, run by `CellWorker` actors (see the module docstring)."""

    name = "ray"

    def __init__(self, settings: PoolSettings, *, address: Optional[str] = None, num_cpus: Optional[int] = None,
                 log_path: Optional[Path] = None):
        self.settings = settings
        self.address = address
        self.num_cpus = num_cpus
        self.log_path = log_path
        self.board = None
        self.board_name: Optional[str] = None
        self.rate_limits: dict[str, int] = {}
        self._started_ray = False
        self._last_usage: dict[str, Any] = {}

    # Ray's own logs (and its C++ core's) go to a file: the terminal shows the sweep's progress only.
    def _quiet(self):
        return _StderrTo(self.log_path) if self.log_path is not None else _NoRedirect()

    def start(self) -> None:
        try:
            import ray
        except ModuleNotFoundError as exc:
            if exc.name != "ray":  # installed, but something it needs is missing
                raise BooklensError(f"the ray engine cannot import Ray: {first_line(exc)}") from None
            raise BooklensError(NO_RAY) from None
        except Exception as exc:  # a broken install (a library or a protobuf of another version)
            raise BooklensError(f"the ray engine cannot import Ray: {first_line(exc)}") from None
        import logging

        # Without --ray-address, RAY_ADDRESS names the cluster, as it does for Ray itself (`ray job
        # submit` sets it for the job's command); ray.init would otherwise join it and refuse num_cpus.
        address = self.address or os.environ.get("RAY_ADDRESS", "").strip() or None
        where = address if self.address or not address else f"{address} (RAY_ADDRESS)"
        if address is None and not ray.is_initialized():
            # Then the cluster `ray start` recorded on this machine (a head node's), which ray.init
            # joins too, refusing num_cpus: a local Ray starts only where there is none.
            address = cluster_started_here()
            where = address and (f"{address} (recorded by `ray start` on this machine; --ray-address local "
                                 "starts a Ray of the sweep's own)")
        if address and not ray.is_initialized():
            check_reachable(address, name=where)
        # Ray Data's import (pyarrow and friends, 1.5 s) runs while ray.init waits for the node's
        # processes to come up, which is most of its 5 s.
        import_failures: list[BaseException] = []
        data_import = threading.Thread(target=_import_ray_data, args=(import_failures,), name="import-ray-data",
                                       daemon=True)
        data_import.start()
        try:
            with self._quiet():
                if not ray.is_initialized():
                    try:
                        if address:
                            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
                        else:
                            ray.init(num_cpus=self.num_cpus or os.cpu_count() or 1, include_dashboard=False,
                                     logging_level=logging.ERROR, log_to_driver=False)
                        self._started_ray = True
                    except Exception as exc:
                        if address == "auto" and isinstance(exc, ConnectionError):
                            # Ray's own words name a `--address` flag booklens does not have
                            raise BooklensError(
                                "cannot join the Ray cluster at auto: no Ray runs on this machine (`ray start "
                                "--head` starts one; without --ray-address, or with --ray-address local, the "
                                "sweep starts a Ray of its own)") from None
                        what = f"join the Ray cluster at {where}" if address else "start a local Ray"
                        raise BooklensError(f"cannot {what}: {first_line(exc)}") from None
                self.board_name = f"booklens-sweep-{os.getpid()}-{id(self)}"
                from booklens.lm.model import rate_limits

                # The limits (from the options or BOOKLENS_RPM / BOOKLENS_TPM here) are the board's.
                self.rate_limits = rate_limits(self.settings.rpm, self.settings.tpm)
                self.board = _sweep_board_class().options(name=self.board_name).remote(
                    self.settings.concurrency, self.rate_limits, SLOT_LEASE_SECONDS, CELL_RETRIES)
        finally:
            # Also after a failure: a command exiting while the import is half done hangs at exit.
            data_import.join()
        if import_failures:
            raise no_ray_data(first_line(import_failures[0]))

    def move_log(self, path: Path) -> None:
        """From now on Ray's messages go to `path` (the sweep directory's log), after those so far."""
        old = self.log_path
        if old is None or old == path:
            self.log_path = path
            return
        with open(path, "ab") as log:
            try:
                log.write(old.read_bytes())
            except OSError:
                pass
        old.unlink(missing_ok=True)
        self.log_path = path

    def workers(self, cells: int) -> int:
        """One worker per CPU of the cluster, but no more than there are cells, nor than
        `--concurrency`: a worker beyond the calls allowed in flight would only wait for a slot,
        after loading DSPy (and, on the embedded model, a model) for nothing."""
        import ray

        cpus = int(ray.cluster_resources().get("CPU", 1))
        return max(1, min(cells, cpus, self.settings.concurrency))

    def usage(self) -> dict[str, Any]:
        import ray

        if self.board is not None:
            try:
                self._last_usage = ray.get(self.board.totals.remote(), timeout=5)
            except Exception:
                pass
        return self._last_usage

    def run(self, tasks: list[CellTask], on_done: Done, *, fail_fast: bool = False) -> list[CellOutcome]:
        import ray
        import ray.data

        if not tasks:
            return []
        workers = self.workers(len(tasks))

        # The board counts the rate limits for every worker; a worker's own would count only its calls.
        settings = replace(self.settings, rpm=None, tpm=None, slots_actor=self.board_name,
                           shared_rate_limits=bool(self.rate_limits), environment=driver_environment())
        cells_at_once = max(1, min(self.settings.concurrency, math.ceil(len(tasks) / workers)))
        rows = [{"task": t.to_json(), "settings": json.dumps(asdict(settings)), "board": self.board_name or ""}
                for t in tasks]
        outcomes: dict[tuple[str, str], CellOutcome] = {}
        interrupted = threading.Event()
        with self._quiet() as quiet, _calls_end_on_ctrl_c(interrupted, self._interrupt_board, quiet.terminal):
            context = ray.data.DataContext.get_current()
            context.enable_progress_bars = False
            context.print_on_execution_start = False
            # One block per cell, so cells are scheduled one by one over the workers.
            dataset = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
                CellWorker, batch_size=1, num_cpus=1,
                compute=ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=cells_at_once,
                                                   max_concurrent_calls_per_actor=cells_at_once,
                                                   enable_true_multi_threading=True))
            try:
                # --fail-fast: after a failure no cell starts (each worker asks the board first) and the
                # cells already running finish, as with the local engine; the rest come back "not run".
                for row in dataset.iter_rows():
                    outcome = CellOutcome(**json.loads(str(row["outcome"])))
                    outcomes[(outcome.system, outcome.book)] = outcome
                    if outcome.status != "not run":
                        on_done(outcome)
                    if outcome.status == "failed" and fail_fast:
                        if self.board is None:
                            break
                        ray.get(self.board.halt.remote())
            except Exception as exc:
                if isinstance(exc, BooklensError):
                    raise
                raise BooklensError(f"the Ray engine failed: {first_line(exc)}") from None
        if interrupted.is_set():  # every cell has ended: the calls that were in flight are cached
            raise KeyboardInterrupt
        return [outcomes.get((t.system, t.book)) or not_run(t) for t in tasks]

    def _interrupt_board(self) -> None:
        import ray

        if self.board is not None:
            try:
                ray.get(self.board.interrupt.remote(), timeout=10)
            except Exception:  # no board: the workers' next call finds it gone and stops anyway
                pass

    def close(self) -> None:
        if self.board is None and not self._started_ray:  # nothing to stop (Ray may not even import)
            return
        import ray

        with self._quiet():
            if self.board is not None:
                try:
                    ray.kill(self.board)
                except Exception:
                    pass
            self.board = None
            if self._started_ray:
                ray.shutdown()
                self._started_ray = False


@contextlib.contextmanager
def _calls_end_on_ctrl_c(interrupted: threading.Event, interrupt: Callable[[], None],
                         terminal: Optional[int] = None) -> Iterator[None]:
    """While a Ray sweep runs, the first Ctrl-C sets `interrupted` and has `interrupt` called (the
    board then lets no cell and no LM call start) instead of raising at once: a KeyboardInterrupt
    out of the dataset's iterator would have Ray Data kill the workers, and with them the calls in
    flight, which the rerun would ask again. The cells end at their next call and their rows come
    back; the engine then raises. The signal still goes to the handler it replaces (the command's
    prints that the calls in flight end first, and quits at once on a second Ctrl-C); what it prints
    goes to `terminal` (a file descriptor), as Ray's own messages go to the log on descriptor 2."""
    import signal

    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return

    def to_terminal(signum: int, frame: Any) -> None:
        if terminal is None:
            return previous(signum, frame)
        with open(terminal, "w", closefd=False) as stream, contextlib.redirect_stderr(stream):
            previous(signum, frame)

    def on_ctrl_c(signum: int, frame: Any) -> None:
        if interrupted.is_set():
            to_terminal(signum, frame)
            return
        interrupted.set()
        # Not from the handler itself: it runs between two steps of whatever Ray was doing.
        threading.Thread(target=interrupt, name="sweep-interrupt", daemon=True).start()
        try:
            to_terminal(signum, frame)
        except KeyboardInterrupt:
            pass

    signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _NoRedirect:
    terminal: Optional[int] = None

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _StderrTo:
    """Point file descriptor 2 at a log file for a while (Ray's C++ core writes there directly)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __enter__(self):
        sys.stderr.flush()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.saved = self.terminal = os.dup(2)  # where descriptor 2 pointed (a terminal, say)
        self.log = open(self.path, "ab")
        os.dup2(self.log.fileno(), 2)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.log.close()
