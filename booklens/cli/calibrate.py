"""Judges and their agreement with human annotators:

    booklens calibrate [--lm X] [--program P | --zero-shot] [--judge coherence|verification|binary]
    booklens judges [--lm X] [--batch-size N] the default judges and what is known about them
    booklens judges build [-o DIR]            regenerate the default programs from the annotations

`calibrate` runs a judge on the human-annotated test splits (see `booklens.calibration`) and stores
its agreement, keyed by LM and program, in the user's cache (`<cache>/calibration.json`; `-o` names
another store, such as the one booklens ships), unless that store, or the one booklens ships, holds
one measured on a larger sample (`--replace` stores it anyway).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from booklens.calibration import COHERENCE_BOOKS, VERIFICATION_BOOKS
from booklens.cli import app
from booklens.cli.common import (
    JUDGE_WINDOW_OPTION,
    ApiBaseOption,
    CacheDirOption,
    JudgeWindowOption,
    LMOption,
    ProgramOption,
    RpmOption,
    StructuredOption,
    TpmOption,
    check_lm_options,
    check_not_an_input,
    command_group,
    named_path,
    output_file,
    output_folder,
    output_path,
    seed_option,
    setup_lm,
)
from booklens.errors import BooklensError

judges_app = command_group(help="The default judges: show them, or rebuild them from the human annotations.",
                          no_args_is_help=False, invoke_without_command=True)
app.add_typer(judges_app, name="judges")

CoherenceDataOption = Annotated[Optional[Path], typer.Option(
    "--coherence-data", parser=named_path("--coherence-data", "folder of BooookScore annotations to read"),
    metavar="<path>", help="BooookScore human annotations: the folder with summary-gpt4-4096-{inc,hier}.json "
                           "(default: ../shared/data/booookscore/human or $BOOKLENS_BOOOOKSCORE_DIR/human).")]
FablesDataOption = Annotated[Optional[Path], typer.Option(
    "--fables-data", parser=named_path("--fables-data", "FABLES file or folder to read"), metavar="<path>",
    help="FABLES.json or its folder (default: ../shared/data/fables/FABLES.json if present, else "
         "the public release, downloaded once).")]
ZeroShotOption = Annotated[bool, typer.Option("--zero-shot", help="The zero-shot program instead of the default "
                                                                  "few-shot one.")]


def _human_dir(path: Optional[Path]) -> Path:
    from booklens.data.booookscore import default_data_dir

    return path if path is not None else default_data_dir() / "human"


def _fables_path(path: Optional[Path]) -> Path:
    """The FABLES file a judge reads: as `compile --data` takes it, the file or the FABLES.json in a folder."""
    if path is not None:
        from booklens.optimizers.tasks import data_files, get_task

        return data_files(get_task("verification"), path)[0]
    from booklens.data.fables import default_fables_path

    return default_fables_path()


def _judge_of_artifact(path: Path) -> str:
    from booklens.optimizers.artifacts import artifact_metadata, canonical_task

    block = artifact_metadata(path)
    task = canonical_task(block["task"])
    if task == "coherence":
        return "coherence"
    if task == "verification":
        return "binary" if (block.get("program_config") or {}).get("label_set") == "binary" else "verification"
    raise BooklensError(f"{path} is a compiled '{task}' program; only coherence and verification programs are "
                        "judges")


@app.command("calibrate")
def calibrate_command(
    judge: Annotated[Optional[list[str]], typer.Option(
        "--judge", help="coherence, verification (four-way) or binary (the Table 5 rater); repeatable. "
                        "Default: coherence and verification, or the judge of --program.")] = None,
    program: ProgramOption = None,
    zero_shot: ZeroShotOption = False,
    coherence_data: CoherenceDataOption = None,
    fables_data: FablesDataOption = None,
    books: Annotated[Optional[int], typer.Option(
        "--books", min=1, help=f"Test-split books to sample (default: {COHERENCE_BOOKS} for coherence, "
                               f"{VERIFICATION_BOOKS} for verification; "
                               "the binary rater always uses Table 5's seven books).")] = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Coherence: sentences per LM call, as `score` and `run` judge them with "
                                    "--batch-size (a batched judge is calibrated apart from the per-sentence "
                                    "one).")] = 1,
    seed: Annotated[int, seed_option("Seed of the sample of test-split books. The split is the one the program "
                                     "was compiled on (seed 0 for the default and zero-shot judges), so "
                                     "no book it learned from is measured.")] = 0,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: Annotated[Optional[int], typer.Option(
        "--concurrency", min=1, help="LM calls at once (default 1 for the embedded model, whose calls queue "
                                     "anyway and then come out the same on every run; 4 otherwise).")] = None,
    context_window: JudgeWindowOption = None,
    cache_dir: CacheDirOption = None,
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", parser=output_path, callback=output_file,
        help="The calibration store to add to (default: <cache>/calibration.json).")] = None,
    replace: Annotated[bool, typer.Option(
        "--replace", help="Store the calibration even when the store, or the one booklens ships, holds one of "
                          "the same judge, LM and program measured on more sentences or claims (kept "
                          "otherwise).")] = False,
) -> None:
    """Measure how well a judge agrees with human annotators on the test splits; store the figures."""
    from booklens.judges import JUDGES, judge_line, judge_info, read_store, store_calibration, user_store_path

    if program is not None and zero_shot:
        raise BooklensError("give either --program or --zero-shot, not both")
    from booklens.records import present

    # before DSPy loads, in the words `read_artifact` (which loads it) has for these
    if program is not None and not present(program):
        raise BooklensError(f"program artifact not found: {program}")
    if program is not None and program.is_dir():
        raise BooklensError(f"program artifact is a directory, not a file: {program}")
    if program is not None:
        judges = [_judge_of_artifact(program)]
        if judge and judges != list(dict.fromkeys(judge)):
            raise BooklensError(f"{program} is a {judges[0]} program; --judge {', '.join(judge)} does not match")
    else:
        judges = list(dict.fromkeys(judge or ["coherence", "verification"]))
    unknown = [j for j in judges if j not in JUDGES]
    if unknown:
        raise BooklensError(f"unknown judge '{unknown[0]}' (use one of {', '.join(JUDGES)})")
    # Options no chosen judge uses would be ignored without a word.
    if coherence_data is not None and "coherence" not in judges:
        raise BooklensError("--coherence-data is for the coherence judge")
    if fables_data is not None and all(j == "coherence" for j in judges):
        raise BooklensError("--fables-data is for the verification and binary judges")
    if books is not None and judges == ["binary"]:
        raise BooklensError("the binary rater is always measured on FABLES Table 5's seven books: --books does not "
                            "apply")
    if seed != 0 and judges == ["binary"]:  # it would only move the bootstrap intervals of the same sample
        raise BooklensError("the binary rater is always measured on FABLES Table 5's seven books: --seed draws no "
                            "sample for it")
    human_dir = _human_dir(coherence_data) if "coherence" in judges else None
    fables = _fables_path(fables_data) if any(j != "coherence" for j in judges) else None
    store = output if output is not None else user_store_path(cache_dir)
    read_store(store)  # a file that is not a calibration store fails now, not after every judgment
    from booklens.judges import load_judge

    if batch_size > 1 and "coherence" not in judges:
        raise BooklensError("--batch-size is for the coherence judge")
    # bad artifacts fail first
    programs = {j: load_judge(j, program, zero_shot=zero_shot, **({"batch_size": batch_size} if j == "coherence"
                                                                  else {})) for j in judges}
    from booklens.calibration import check_sample
    from booklens.lm import LOCAL_LM, resolve_lm_name, served_context_window
    from booklens.lm.base import refuse_larger_window, set_window

    check_lm_options(lm, api_base, structured=structured, rpm=rpm, tpm=tpm)
    # Every judge's data is read now: a second judge's bad data fails before the first judge's calls.
    # The window is the one the judges' LM will have (a self-hosted server's own), without loading a model.
    window = served_context_window(lm, api_base)
    setting = None
    if context_window is not None:  # what the judges plan for; first, so no summary is refused for a
        refuse_larger_window(context_window, window, JUDGE_WINDOW_OPTION)  # window the model lacks
        setting = set_window(JUDGE_WINDOW_OPTION, window)
        window = context_window
    for name, prog in programs.items():
        check_sample(name, prog, human_dir=human_dir, fables_path=fables, books=books, seed=seed, window=window,
                     setting=setting)

    calls_at_once = concurrency or (1 if resolve_lm_name(lm) == LOCAL_LM else 4)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm, context_window=context_window)
    from booklens.calibration import JudgedNothing, calibrate
    from booklens.lm.usage import describe_calls, usage_scope
    from booklens.steps import judge_window_advice

    failures: list[str] = []
    for name, prog in programs.items():
        if hasattr(prog, "concurrency"):
            prog.concurrency = calls_at_once
        started = time.perf_counter()
        # The stored entry counts calls without telling cached ones apart, so that an unchanged
        # calibration rewrites the same bytes; the line printed here tells them apart.
        with usage_scope() as tracker, judge_window_advice(model, JUDGE_WINDOW_OPTION):
            try:
                entry = calibrate(name, prog, model, human_dir=human_dir, fables_path=fables, books=books, seed=seed,
                                  concurrency=calls_at_once, progress=lambda text: typer.echo(text, err=True))
            except JudgedNothing as exc:  # the other judges still get measured; the command fails at the end
                failures.append(str(exc))
                continue
        seconds = time.perf_counter() - started
        kept = store_calibration(entry, store, replace=replace)
        typer.echo(f"{name}: {describe_calls(tracker.work(), tokens=False)}, {seconds:.0f} s; "
                   + (f"not stored: {kept}" if kept else f"stored in {store}"), err=True)
        typer.echo(judge_line(judge_info(name, prog, model, store={entry["key"]: entry})))
        for note in entry.get("notes") or []:  # the judge line names the program as shipped
            typer.echo(f"note: {note}", err=True)
        if name == "binary":
            typer.echo(_table5_lines(entry))
    if failures:
        raise BooklensError("; ".join(failures))


def _table5_lines(entry: dict) -> str:
    from booklens.metrics.fables import SEED_TABLE5_HUMAN_EVIDENCE

    def fmt(x) -> str:
        return "  -  " if x is None else f"{x:.3f}"

    t = entry["table5"]
    head = f"{'summarizer':<16}{'claims':>7}{'F1 faithful':>13}{'F1 unfaithful':>15}{'accuracy':>10}" \
           f"{'seed GPT-4-Turbo F1 faithful / unfaithful':>44}"
    lines = [head]
    for name, row in list(t["by_summarizer"].items()) + [("Overall", t)]:
        ref = SEED_TABLE5_HUMAN_EVIDENCE.get(name)
        lines.append(f"{name:<16}{row['n']:>7}{fmt(row['f1_faithful']):>13}{fmt(row['f1_unfaithful']):>15}"
                     f"{fmt(row['accuracy']):>10}{(fmt(ref[0]) + ' / ' + fmt(ref[1])) if ref else '-':>44}")
    return "\n".join(lines)


@judges_app.callback()
def judges_command(
    ctx: typer.Context,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    cache_dir: CacheDirOption = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="The coherence judge at this many sentences per LM call, as `score`, `run` "
                                    "and `calibrate` use it with --batch-size (calibrated apart from the "
                                    "per-sentence one).")] = 1,
) -> None:
    """The default judges: their programs, demos and stored agreement with humans for an LM."""
    if ctx.invoked_subcommand is not None:
        # These options choose which judges to show; `build` reads annotations with no LM: they would do nothing.
        given = [name for name, value, default in (("--lm", lm, None), ("--api-base", api_base, None),
                                                   ("--cache-dir", cache_dir, None), ("--batch-size", batch_size, 1))
                 if value != default]
        if given:
            raise BooklensError(f"{', '.join(given)} {'chooses' if len(given) == 1 else 'choose'} the judges "
                                f"`booklens judges` shows, and `judges {ctx.invoked_subcommand}` shows none: leave "
                                f"{'it' if len(given) == 1 else 'them'} out")
        return
    from booklens.judges import JUDGES, judge_info, judge_line, load_judge, load_store
    from booklens.lm import LOCAL_LM, lm_name_label, refuse_server_options_for_embedded, resolve_lm_name
    from booklens.lm.remote import resolve_server

    refuse_server_options_for_embedded(lm, api_base)
    if resolve_lm_name(lm) != LOCAL_LM:  # a model string `score` or `calibrate` would refuse (no key needed here)
        from booklens.lm import make_backend

        make_backend(lm, api_base=api_base, check_keys=False)
    server = None if resolve_lm_name(lm) == LOCAL_LM else resolve_server(resolve_lm_name(lm), api_base)
    label = lm_name_label(lm)
    store = load_store(cache_dir)
    for judge in JUDGES:
        program = load_judge(judge, batch_size=batch_size) if judge == "coherence" else load_judge(judge)
        typer.echo(judge_line(judge_info(judge, program, label, store=store, server=server), cache_dir))


@judges_app.command("build")
def judges_build_command(
    coherence_data: CoherenceDataOption = None,
    fables_data: FablesDataOption = None,
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", parser=output_folder, metavar="<path>",
        help="Folder to write coherence.json, verification.json and verification-binary.json (default: "
             "booklens/defaults, the shipped programs, rewritten only when they come out the same).")] = None,
) -> None:
    """Rebuild the default few-shot programs from the human annotations (no LM; the same files every time)."""
    from booklens.judges import DEFAULT_FILES, DEFAULTS_DIR, build_defaults, check_judges_folder

    folder = output or DEFAULTS_DIR
    check_judges_folder(folder)  # before the data paths are looked up
    human, fables = _human_dir(coherence_data), _fables_path(fables_data)
    # The folder may hold the annotations under a judge's file name (FABLES kept as verification.json):
    # the judge built from them would replace them.
    for name in DEFAULT_FILES.values():
        check_not_an_input(folder / name, [human, fables], shown=f"{folder} (its {name})")
    # Without -o the shipped judges are only rewritten as they are: other annotations are refused.
    written = build_defaults(human, fables, folder, unchanged_only=output is None)
    for judge, path in written.items():
        typer.echo(f"wrote {path}", err=True)
