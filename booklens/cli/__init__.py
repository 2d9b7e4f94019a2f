"""The `booklens` command. Each command family registers itself on `app`."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading

import typer

from booklens.cli.common import command_group
from booklens.errors import BooklensError

app = command_group(
    name="booklens",
    help="Summarize book-length text with LLMs and judge the summaries: coherence, faithfulness, QA.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        from booklens import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the booklens version and exit."),
) -> None:
    """Summarize book-length text with LLMs and judge the summaries: coherence, faithfulness, QA."""
    from booklens.errors import command_line

    # While the command runs, errors name its settings as its options (`setting_name`); as it ends,
    # as they were (a test's in-process command, then a library call).
    named_as_options = command_line.set(True)
    ctx.call_on_close(lambda: command_line.reset(named_as_options))


# Command modules register their commands on `app` when imported.
from booklens.cli import summarize as _summarize  # noqa: E402,F401
from booklens.cli import coherence as _coherence  # noqa: E402,F401
from booklens.cli import qa as _qa  # noqa: E402,F401
from booklens.cli import faithfulness as _faithfulness  # noqa: E402,F401
from booklens.cli import compile as _compile  # noqa: E402,F401
from booklens.cli import run as _run  # noqa: E402,F401
from booklens.cli import calibrate as _calibrate  # noqa: E402,F401
from booklens.cli import sweep as _sweep  # noqa: E402,F401
from booklens.cli import cache as _cache  # noqa: E402,F401
from booklens.cli.common import refuse_outputs_over_inputs  # noqa: E402

refuse_outputs_over_inputs(app)  # no command writes its -o over one of its inputs (`summarize BOOK -o BOOK`)


def _command_of(ctx) -> str:
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(["booklens", *reversed(names)])


def main() -> None:
    """Entry point: user errors end in one line on stderr and a non-zero exit code."""
    from booklens.collector import defer_collection, freeze_what_is_loaded
    from booklens.streams import tolerant

    # The imports of a command (DSPy, LiteLLM, torch) are most of what it allocates: see booklens.collector.
    defer_collection()
    # Progress, warnings and notes must not stop a command when nobody reads them any more: every
    # writer (typer.echo(err=True), print, tqdm) looks up sys.stderr when it writes, so this covers all.
    stderr = sys.stderr
    sys.stderr = tolerant(stderr)
    try:
        _run_command()
    finally:
        sys.stderr = stderr
        # At exit the interpreter would walk all of them once more (about 1 s on 2 cores) only to
        # free memory the OS reclaims anyway. Calls are committed to the cache as they finish and
        # outputs are written before this point.
        freeze_what_is_loaded()


def _run_command() -> None:
    from typer import Abort, Exit

    try:  # typer >= 0.20 ships its own copy of click
        from typer._click import exceptions as click_exceptions
    except ImportError:  # pragma: no cover - older typer
        from click import exceptions as click_exceptions
    ClickException, UsageError = click_exceptions.ClickException, click_exceptions.UsageError
    # click >= 8.2: a group named without its command raises its help screen as a usage error
    HelpShown = getattr(click_exceptions, "NoArgsIsHelpError", ())

    try:
        code = _command()(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except HelpShown as exc:
        print(exc.format_message(), file=sys.stderr)  # the help as it is, as click shows it
        sys.exit(2)
    except UsageError as exc:
        # typer validates a choice through pydantic, whose "Value error, " would open the reason
        message = exc.format_message().strip().replace(": Value error, ", ": ", 1)
        if message:  # an empty message follows a help screen already shown
            print(f"error: {message} (see {_command_of(exc.ctx)} --help)", file=sys.stderr)
        sys.exit(2)
    except Exit as exc:
        sys.exit(exc.exit_code)
    except Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(1)
    except ClickException as exc:
        print(f"error: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code or 1)
    except BooklensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"error: {INTERRUPTED}", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    except _Interrupted as exc:
        print(f"error: {INTERRUPTED}", file=sys.stderr)
        sys.exit(128 + exc.signum)  # 130 after Ctrl-C, 143 after SIGTERM, as the shell reports them
    except BrokenPipeError:
        sys.exit(1)
    except Exception as exc:  # a bug, not a user error: still one line unless asked for more
        if os.environ.get("BOOKLENS_DEBUG"):
            raise
        refused = _path_refused(exc)
        if refused:
            print(f"error: {refused}", file=sys.stderr)
            sys.exit(2)
        from booklens.errors import internal_error

        print(f"error: {internal_error(exc)} (BOOKLENS_DEBUG=1 shows the traceback)", file=sys.stderr)
        sys.exit(1)


INTERRUPTED = "interrupted (completed LM calls are cached; rerun to resume)"

# What the system says of a path itself, whatever the command does with it: a name it refuses, or
# one it may not reach. Raised by the first look at a path a user gave (Path.exists() lets only
# "not found" pass), wherever that look is.
_PATH_ERRNOS = {errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.ELOOP}


def _path_refused(exc: BaseException) -> str:
    """The one-line error for an OSError about a path the system refuses (`_PATH_ERRNOS`), else ''."""
    if isinstance(exc, OSError) and exc.errno in _PATH_ERRNOS and exc.filename is not None:
        from booklens.records import path_refused

        return str(path_refused(exc.filename, exc))
    return ""


class _Interrupted(Exception):
    """Ctrl-C (or SIGTERM) inside a command. typer would turn the KeyboardInterrupt into a bare exit
    code 130 (it returns the code without standalone mode), leaving nothing to print the message on."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = int(signum)


_built: list = []  # the click command, built once per process (typer takes 0.07 s to build it)


def _command():
    """`app` as the click command `app()` runs, with Ctrl-C in a command raised as `_Interrupted`.
    Built once: a process that runs several commands (`booklens.testing.run_command`) reuses it."""
    if _built:
        return _built[0]
    from typer.main import get_command

    from booklens.parallel import stoppable

    command = get_command(app)
    invoke = command.invoke

    def invoke_keeping_ctrl_c(ctx):
        interrupted = threading.Event()
        received: list[int] = []  # the signal that stopped the command
        try:
            with stoppable(interrupted), _stopping_on_ctrl_c(interrupted, received):
                return invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted(received[0] if received else signal.SIGINT) from None

    command.invoke = invoke_keeping_ctrl_c
    _built.append(command)
    return command


@contextlib.contextmanager
def _stopping_on_ctrl_c(interrupted: threading.Event, received: list[int]):
    """Ctrl-C sets `interrupted` the moment it arrives, then interrupts as usual: while the command
    waits for the calls in flight to end, none of them asks again (a re-ask or a retry after an
    answer lost to the interrupt would be a call made after the user said stop).

    SIGTERM (`timeout`, `docker stop`, a batch scheduler's notice before it kills) is taken the same
    way when nothing else handles it: the calls in flight may still end and be cached in the grace
    period, where the default action would lose them. `received` gets the signal's number."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # Ctrl-C is ignored or handled elsewhere (a test harness, an embedding program)
        return

    def on_stop(signum, frame):
        again = "Ctrl-C again" if signum == signal.SIGINT else "send it again"
        if interrupted.is_set():
            # A second signal: the user will not wait for the calls in flight (a stalled server can
            # hold one for minutes). Finished calls are already committed to the cache.
            print(f"error: {INTERRUPTED}", file=sys.stderr)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(128 + (received[0] if received else signum))
        interrupted.set()
        received.append(signum)
        what = "" if signum == signal.SIGINT else "terminated; "
        print(f"stopping: {what}the LM calls in flight end first, and are cached ({again} to quit at once)",
              file=sys.stderr, flush=True)
        signal.default_int_handler(signum, frame)

    term_handler = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, on_stop)
    if term_handler is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if term_handler is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
