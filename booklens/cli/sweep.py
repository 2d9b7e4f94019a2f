"""`booklens sweep MANIFEST -o DIR`: every system of a manifest on every book, judged the same way,
with one aggregate table (see `booklens.sweep`)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Optional

import typer

from booklens.cli import app
from booklens.cli.common import (
    ApiBaseOption,
    CacheDirOption,
    LMOption,
    RpmOption,
    StructuredOption,
    TpmOption,
    choices,
    lm_options,
    output_folder,
)
from booklens.errors import BooklensError
from booklens.sweep import ENGINES

Engine = choices("Engine", ENGINES)


@app.command("sweep")
def sweep_command(
    manifest: Annotated[Path, typer.Argument(help="The sweep manifest (YAML): books, systems, judge.")],
    output: Annotated[Path, typer.Option("-o", "--output", parser=output_folder, metavar="<path>",
                                         help="The sweep directory to write (or resume).")],
    engine: Annotated[Engine, typer.Option("--engine", help="local: cells on threads of this process; ray: cells "
                                                            "on Ray workers (needs booklens' ray extra).")]
    = Engine.local,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", help="Join this Ray cluster (e.g. ray://head:10001 or auto); without it, the one "
                              "RAY_ADDRESS names, else the one `ray start` ran for on this machine, "
                              "else a local Ray starts (as with `local`).")] = None,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="LM calls in flight for the whole sweep; "
                                                                      "with --engine ray every worker takes its "
                                                                      "calls from this one limit.")] = 4,
    cache_dir: CacheDirOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the cells and the estimated LM calls, tokens "
                                                            "and cost per system; call no LM.")] = False,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="Start no new cell after the first one "
                                                                "fails.")] = False,
) -> None:
    """Compare systems across a corpus: one run directory per (system, book), results.json, report.html."""
    if dry_run:
        # The dry run reads the manifest, the books and -o, prices the LMs --lm names and checks the
        # server --api-base names as the run would; the options of running the cells (how, how fast,
        # with which cache) would do nothing. --structured decides which judge steps on disk are reused.
        run_settings = {"engine": engine, "ray_address": ray_address, "rpm": rpm,
                        "tpm": tpm, "concurrency": concurrency, "cache_dir": cache_dir, "fail_fast": fail_fast}
        defaults = inspect.signature(sweep_command).parameters
        given = ["--" + name.replace("_", "-") for name, value in run_settings.items()
                 if value != defaults[name].default]
        if given:
            raise BooklensError(f"--dry-run runs no cell and calls no LM: {', '.join(given)} would not apply")
    from booklens.sweep.report import books_left_out_line, different_books_line, system_line
    from booklens.sweep.tables import pair_line
    from booklens.sweep.run import dry_run as plan_text, run_sweep

    if dry_run:
        typer.echo(plan_text(manifest, output, lm=lm, api_base=api_base,
                             structured=lm_options(structured)["structured"]))
        return
    outcome = run_sweep(manifest, output, engine=engine.value, ray_address=ray_address, lm=lm, api_base=api_base,
                        concurrency=concurrency, cache_dir=cache_dir, fail_fast=fail_fast,
                        **lm_options(structured, rpm, tpm))
    for name, s in outcome.results["systems"].items():
        typer.echo(system_line(name, s, outcome.judge_steps), err=True)
    for pair in outcome.results.get("pairs") or []:
        typer.echo(pair_line(pair), err=True)
    for note in (different_books_line(outcome.results["systems"]), books_left_out_line(outcome.results)):
        if note:
            typer.echo(f"note: {note}", err=True)
    if outcome.results.get("judges"):
        from booklens.judges import judge_line
        from booklens.records import JudgeInfo

        for info in outcome.results["judges"].values():
            typer.echo(judge_line(JudgeInfo.model_validate(info), cache_dir), err=True)
    for note in outcome.notes:
        typer.echo(f"note: {note}", err=True)
    typer.echo(f"wrote {output / 'results.json'}, {output / 'cells.jsonl'} and {output / 'report.html'}", err=True)
    failed, skipped, first = outcome.failed, outcome.not_run, outcome.first_failure
    if first is not None:
        more = f"; {len(skipped)} not run (--fail-fast)" if skipped else ""
        typer.echo(f"error: {len(failed)} of {len(outcome.outcomes)} cells failed (first: "
                   f"{first.system}/{first.book}: {first.error}){more}; {outcome.rerun_advice()}", err=True)
        raise typer.Exit(1)
