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

from pathlib import Path
from typing import Annotated, Optional

import typer

from booklens.calibration import COHERENCE_BOOKS, VERIFICATION_BOOKS
from booklens.cli import app
from booklens.cli.common import (
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
    from booklens.calibration import calibrate_judges, check_calibration_samples, plan_calibration

    plan = plan_calibration(judge, program=program, zero_shot=zero_shot, coherence_data=coherence_data,
                            fables_data=fables_data, books=books, batch_size=batch_size, seed=seed, store=output,
                            cache_dir=cache_dir)
    from booklens.judges import judge_info, judge_line
    from booklens.lm import LOCAL_LM, resolve_lm_name, served_context_window
    from booklens.lm.usage import describe_calls

    check_lm_options(lm, api_base, structured=structured, rpm=rpm, tpm=tpm)
    # The window is the one the judges' LM will have (a self-hosted server's own), without loading a model.
    check_calibration_samples(plan, served_context_window(lm, api_base), context_window)
    calls_at_once = concurrency or (1 if resolve_lm_name(lm) == LOCAL_LM else 4)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm, context_window=context_window)
    for done in calibrate_judges(plan, model, concurrency=calls_at_once, replace=replace,
                                 progress=lambda text: typer.echo(text, err=True)):
        typer.echo(f"{done.judge}: {describe_calls(done.usage, tokens=False)}, {done.seconds:.0f} s; "
                   + (f"not stored: {done.not_stored}" if done.not_stored else f"stored in {plan.store}"), err=True)
        typer.echo(judge_line(judge_info(done.judge, done.program, model, store={done.entry["key"]: done.entry})))
        for note in done.entry.get("notes") or []:  # the judge line names the program as shipped
            typer.echo(f"note: {note}", err=True)
        if done.judge == "binary":
            typer.echo(_table5_lines(done.entry))


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
    from booklens.calibration import fables_file, human_annotations_dir

    human, fables = human_annotations_dir(coherence_data), fables_file(fables_data)
    # The folder may hold the annotations under a judge's file name (FABLES kept as verification.json):
    # the judge built from them would replace them.
    for name in DEFAULT_FILES.values():
        check_not_an_input(folder / name, [human, fables], shown=f"{folder} (its {name})")
    # Without -o the shipped judges are only rewritten as they are: other annotations are refused.
    written = build_defaults(human, fables, folder, unchanged_only=output is None)
    for judge, path in written.items():
        typer.echo(f"wrote {path}", err=True)
