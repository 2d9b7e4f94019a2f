"""Options and helpers shared by every command. Light to import: `booklens --help` and argument
errors load no model, no dspy, no litellm."""

from __future__ import annotations

import functools
import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Optional

import typer

from booklens.data.splits import SEED_RANGE, SPLITS
from booklens.errors import BooklensError
from booklens.lm.remote import STRUCTURED_MODES
from booklens.vocabulary import DEFAULT_CONTEXT_WINDOW, JUDGE_WINDOW_OPTION, MIN_CONTEXT_WINDOW


def command_group(**settings: Any) -> typer.Typer:
    """A typer app for a family of commands. Help uses click's plain layout, which wraps to any
    width: typer's rich panels cut long option names and squeeze the help text into a narrow column
    on an 80-column terminal."""
    return typer.Typer(rich_markup_mode=None, **settings)


def _check_seed(value: Optional[int]) -> Optional[int]:
    if value is not None and not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise typer.BadParameter(f"must be from {SEED_RANGE[0]} to {SEED_RANGE[1]} (got {value})")
    return value


def seed_option(help: str) -> Any:
    """The --seed option of every command that takes one: out of range is a usage error at once."""
    return typer.Option("--seed", callback=_check_seed, help=help)


def named_lm(value: Optional[str]) -> Optional[str]:
    """The typer callback of --lm: an empty value is a mistake (an unset shell variable, say), not a
    request for the embedded model."""
    if value is not None and not value.strip():
        raise BooklensError("--lm is empty: name a model ('local', 'openai/gpt-4o-mini', ...) or leave the option out")
    return value


# Every format `booklens.text.read_book` reads; README's Summarize section says how each is read.
BookArgument = Annotated[Path, typer.Argument(
    help="The book: .txt (UTF-8, UTF-16/32 with a BOM, or the 8-bit encoding a Project Gutenberg header "
         "declares), .epub, or an HTML page (.html, .htm, .xhtml).")]
LMOption = Annotated[
    Optional[str],
    typer.Option("--lm", callback=named_lm,
                 help="'local' (embedded SmolLM2, the default) or any LiteLLM model string; also BOOKLENS_LM."),
]
ApiBaseOption = Annotated[
    Optional[str], typer.Option("--api-base", help="Base URL of an OpenAI-compatible server (vLLM, llama.cpp, Ollama).")
]
ConcurrencyOption = Annotated[int, typer.Option("--concurrency", min=1, help="Independent LM calls run at once.")]
MaxClaimsOption = Annotated[Optional[int], typer.Option(
    "--max-claims", min=1, help="Verify only the first N claims (a quick, cheap run).")]
JudgeWindowOption = Annotated[Optional[int], typer.Option(
    JUDGE_WINDOW_OPTION, min=MIN_CONTEXT_WINDOW,
    help=f"Tokens the model reads at once, which the judge's prompts are sized for (default: what LiteLLM or "
         f"the --api-base server states, else {DEFAULT_CONTEXT_WINDOW}; llama-cpp-python's server states none).")]


def cache_dir_option(value: str) -> Path:
    """The parser of --cache-dir: `~` expanded (`--cache-dir=~/x` reaches booklens unexpanded), and
    an empty value refused, not taken for the current folder (an unset shell variable, say)."""
    if not value.strip():
        raise BooklensError("--cache-dir is empty: name the folder of the LM cache, or leave the option out "
                            "(BOOKLENS_CACHE_DIR, else ~/.cache/booklens)")
    from booklens.lm.cache import cache_folder

    return cache_folder(value)


CacheDirOption = Annotated[
    Optional[Path], typer.Option("--cache-dir", parser=cache_dir_option, metavar="<path>",
                                 help="Where completed LM calls are cached (BOOKLENS_CACHE_DIR).")
]


def named_path(option: str, what: str, *, blank_is_empty: bool = True) -> Callable[[str], Path]:
    """The parser of a path option: an empty value (`-o "$OUT"` with OUT unset, say) is refused as
    'OPTION is empty: name the WHAT', not read as the current folder, which would be written into or
    read as the data ('-o . is a directory', 'program artifact is a directory, not a file: .'). With
    `blank_is_empty` a value of blanks only is refused alike."""

    def parse(value: str) -> Path:
        if not (value.strip() if blank_is_empty else value):
            raise BooklensError(f"{option} is empty: name the {what}")
        return Path(value)

    return parse


program_path = named_path("--program", "compiled program artifact (JSON) to load")
data_path = named_path("--data", "data file or folder to read")
ProgramOption = Annotated[
    Optional[Path], typer.Option("--program", parser=program_path, metavar="<path>",
                                 help="A compiled program artifact (JSON) from `booklens compile`.")
]


def retry_count(option: str) -> Callable[[str], int]:
    """The parser of a retry count option (`--tries`, `--max-regenerations`): a whole number in the
    range `booklens.vocabulary.check_retries` allows, as the library checks it again."""
    from booklens.vocabulary import check_retries

    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            raise BooklensError(f"{option} must be a whole number (got {text!r})") from None
        check_retries(option, number)
        return number

    return parse


def check_output_file(path: Path) -> None:
    """A one-line error unless a command can write the file `path`: not a directory, and its
    nearest existing folder is a folder it may write in (the missing ones are made). Commands
    check it while parsing their options, so a bad -o fails before any model loads, not after
    the last LM call."""
    from booklens.records import nearest_existing_folder, present

    try:
        # present: a link loop or a name too long is 'cannot write PATH: why', not a missing file
        is_dir = present(path, "write") and path.is_dir()
    except OSError as exc:
        raise BooklensError(f"cannot write {path}: {exc.strerror or exc}") from None
    if is_dir:
        raise BooklensError(f"-o {path} is a directory: give the path of the file to write")
    if not path.name.strip():  # `-o " "`: a file no listing shows, from a variable holding blanks
        raise BooklensError(f"-o {str(path)!r} has no file name, only blanks: give the path of the file to write")
    folder = nearest_existing_folder(path)
    if not folder.is_dir():
        raise BooklensError(f"cannot write {path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BooklensError(f"cannot write {path}: {folder} is not writable")
    # os.access answers yes to root for folders no one can create files in (/proc, /sys), so
    # create and remove an empty file there, as the atomic write of the output will.
    import secrets

    probe = folder / f".booklens-write-check-{secrets.token_hex(4)}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise BooklensError(f"cannot write {path}: {folder} takes no new files ({exc.strerror or exc})") from None
    try:
        os.unlink(probe)
    except OSError:  # gone already (another process cleaning the folder): nothing to remove
        pass


def output_file(path: Optional[Path]) -> Optional[Path]:
    """The typer callback of an -o FILE option (`check_output_file`)."""
    if path is not None:
        check_output_file(path)
    return path


# an -o FILE option (its callback, `output_file`, checks the path; a blank name is told apart there)
output_path = named_path("-o", "file to write", blank_is_empty=False)
# an -o FOLDER option (`run`, `sweep`, `judges build`)
output_folder = named_path("-o", "folder to write")


def _paths(value: Any) -> Iterable[Path]:
    if isinstance(value, Path):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _paths(item)


def check_not_an_input(output: Any, inputs: Iterable[Any], cache_dir: Any = None, *,
                       shown: Optional[str] = None) -> None:
    """A one-line error when the existing file `output` is one of `inputs` (paths, or lists of
    them), a file in an input folder that booklens did not write (the folder's data), or a file of
    the LM cache (`cache_dir`, else the default): the result would replace what the command reads,
    or the calls already made. Compared as files on disk, so another spelling of the path or a
    link to it counts too. `shown`: how the error names the output, when -o named a folder."""
    if not isinstance(output, Path) or not output.is_file():
        return
    named, other, outside = ((output, "another output file", "an output file outside that folder") if shown is None
                             else (shown, "another -o folder", "an -o folder outside it"))
    for path in _paths(list(inputs)):
        try:
            same = path.exists() and os.path.samefile(path, output)
            inside = not same and path.is_dir() and output.resolve().is_relative_to(path.resolve())
        except OSError:
            continue
        if same:
            raise BooklensError(f"-o {named} is also an input of this command ({path}): writing the result "
                                f"there would overwrite it; choose {other}")
        if inside:
            from booklens.records import written_by_booklens

            if not written_by_booklens(output):
                raise BooklensError(f"-o {named} is a file of the input folder {path}: writing the result there "
                                    f"would overwrite it; choose {outside}")
    from booklens.lm.cache import CACHE_FILE, cache_folder
    from booklens.retrieval import index_dir

    cache = cache_folder(cache_dir)
    kept = [cache / f"{CACHE_FILE}{suffix}" for suffix in ("", "-wal", "-shm")]
    try:
        hit = any(p.exists() and os.path.samefile(p, output) for p in kept)
        hit = hit or output.resolve().is_relative_to(index_dir(cache).resolve())
    except OSError:
        hit = False
    if hit:
        raise BooklensError(f"-o {named} is a file of the LM cache in {cache}: writing the result there would "
                            f"lose the calls and indexes it keeps; choose {other}")


def refuse_outputs_over_inputs(app: typer.Typer) -> None:
    """Make every command of `app` (and of its command groups) check, after parsing and before it
    runs, that its `output` is none of its other path parameters (`check_not_an_input`). Wrapping
    the commands covers all of them, whatever order their options were given in."""
    for info in app.registered_commands:
        info.callback = _checking_output(info.callback)
    for group in app.registered_groups:
        refuse_outputs_over_inputs(group.typer_instance)


def _checking_output(command: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(command)  # typer reads the options from the wrapped function's signature
    def checked(*args: Any, **kwargs: Any) -> Any:
        check_not_an_input(kwargs.get("output"), (v for k, v in kwargs.items() if k not in ("output", "cache_dir")),
                           kwargs.get("cache_dir"))
        return command(*args, **kwargs)

    return checked


OutputOption = Annotated[Optional[Path], typer.Option("-o", "--output", parser=output_path, callback=output_file,
                                                      help="Write the result JSON here.")]
ZeroShotOption = Annotated[bool, typer.Option(
    "--zero-shot", help="Judge with the zero-shot program instead of the few-shot one booklens ships "
                        "(for the judges no --program artifact is given for).")]


def label_shares(percentages: dict[str, float] | None, unverified: int = 0, label_set: str = "four-way") -> str:
    """The share of each claim label among the verified claims, as commands print it, and how many
    claims were left out of the shares; 'none verified' when no claim was. A binary judge's line names
    only the two labels it can give."""
    from booklens.vocabulary import labels_of

    if not percentages:
        return "none verified"
    shares = ", ".join(f"{percentages.get(label, 0.0):.1f}% {label}" for label in labels_of(label_set))
    return shares + (f" ({unverified} not verified, left out of the shares)" if unverified else "")


def claims_verified(verified: int, total: int | None) -> str:
    """How many claims a command's line says were verified: all of them, or (`total`, a report's
    `total_claims`) the first of more, which --max-claims left out."""
    from booklens.vocabulary import counted

    if total is None:
        return counted(verified, "claim")
    return f"the first {verified} of {counted(total, 'claim')} (--max-claims)"


def echo_judge(judge, cache_dir: Optional[Path] = None) -> None:
    """The judge line (who judged, its agreement with humans, any warning) under a score; `cache_dir`:
    the command's --cache-dir, which the advice of a no-calibration warning names."""
    if judge is not None:
        from booklens.judges import judge_line

        typer.echo(judge_line(judge, cache_dir), err=True)


def echo_artifact_note(path: Optional[Path], lm: str) -> None:
    """The note for a summarizer or decomposition artifact run on an LM other than its own."""
    from booklens.judges import artifact_note

    note = artifact_note(path, lm)
    if note:
        typer.echo(f"note: {note}", err=True)


def choices(name: str, values: Iterable[str]) -> Any:
    """A typer choice type whose values come from the library's one list of them."""
    return Enum(name, {v: v for v in values}, type=str)


# The train/dev/test split of a dataset, by book (`booklens.data.splits`).
SplitName = choices("SplitName", SPLITS)
Structured = choices("Structured", STRUCTURED_MODES)
StructuredOption = Annotated[
    Optional[Structured],
    typer.Option("--structured", help="How output schemas reach a LiteLLM backend: auto (json_schema, falling back to "
                                      "json_object+schema, then none, as the server refuses), schema, json, off; "
                                      "also BOOKLENS_STRUCTURED. The embedded model always decodes under the schema."),
]
RpmOption = Annotated[
    Optional[int],
    typer.Option("--rpm", min=1, help="At most this many requests per minute to one server (every model asked there), "
                                      "over all threads; also BOOKLENS_RPM."),
]
TpmOption = Annotated[
    Optional[int],
    typer.Option("--tpm", min=1, help="At most this many tokens (prompt + answer budget) per minute to one server "
                                      "(every model asked there), over all threads; also BOOKLENS_TPM."),
]


def evidence_enum(name: str, modes: tuple[str, ...]) -> type[Enum]:
    """An option type of evidence `modes` (`booklens.retrieval`'s), whose `help` is the modes'
    one-line description."""
    from booklens.retrieval import evidence_help

    enum = choices(name, modes)
    enum.help = evidence_help(modes)
    return enum


def lm_options(structured: Structured | str | None = None, rpm: int | None = None,
               tpm: int | None = None) -> dict[str, Any]:
    """The backend options of a command (`--structured`, `--rpm`, `--tpm`) as `make_lm` / `LMPool` take them."""
    return {"structured": getattr(structured, "value", structured), "rpm": rpm, "tpm": tpm}


def check_lm_options(lm: str | None, api_base: str | None = None, *, structured: Structured | str | None = None,
                     rpm: int | None = None, tpm: int | None = None) -> None:
    """The LM options' one-line errors (a malformed server URL, options the embedded model would
    ignore), before DSPy and LiteLLM load."""
    from booklens.lm.embedded import refuse_server_options_for_embedded
    from booklens.lm.remote import resolve_api_base

    resolve_api_base(api_base)
    refuse_server_options_for_embedded(lm, api_base, **lm_options(structured, rpm, tpm))


def setup_lm(lm: str | None, api_base: str | None = None, cache_dir: Path | None = None, *,
             structured: Structured | str | None = None, rpm: int | None = None, tpm: int | None = None,
             context_window: int | None = None):
    """Build the LM a command names and make it the LM of every DSPy program in this process
    (`context_window`: the judge's `--context-window`, as `make_lm` takes it)."""
    check_lm_options(lm, api_base, structured=structured, rpm=rpm, tpm=tpm)
    from booklens.lm import configure, make_lm

    return configure(make_lm(lm, api_base=api_base, cache_dir=cache_dir, context_window=context_window,
                             **lm_options(structured, rpm, tpm)))


def write_output(path: Path | None, payload: Any) -> None:
    """Write JSON atomically (a complete file or none), or print it when no path is given."""
    from booklens.records import json_text, save_json

    if path is None:
        typer.echo(json_text(payload))
        return
    save_json(path, payload)
    typer.echo(f"wrote {path}", err=True)


def read_json_file(path: Path, what: str) -> Any:
    """A JSON file a user gave, or a one-line error (see `booklens.records.read_json_file`)."""
    from booklens.records import read_json_file as read

    return read(path, what)
