"""Compile programs against annotations and evaluate them:

    booklens compile TASK --data PATH --optimizer NAME [--demos N --candidates N --trials N ...] -o ARTIFACT.json
    booklens evaluate TASK --data PATH [--program ARTIFACT.json ...] [--split test]

TASK is coherence, verification, decomposition or summarize. The artifact runs with
`--program` on the task's command (score, verify/check, claims, summarize).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from booklens.cli import app
from booklens.cli.common import (
    JUDGE_WINDOW_OPTION,
    ApiBaseOption,
    CacheDirOption,
    LMOption,
    RpmOption,
    SplitName,
    StructuredOption,
    TpmOption,
    data_path,
    output_file,
    output_path,
    program_path,
    seed_option,
    setup_lm,
    write_output,
)
from booklens.errors import BooklensError
from booklens.vocabulary import (DEFAULT_CHUNK_SIZE, DEFAULT_CONTEXT_WINDOW, DEFAULT_SUMMARY_TOKENS, MIN_CHUNK_SIZE,
                                 MIN_CONTEXT_WINDOW, MIN_SUMMARY_TOKENS)

TaskArgument = Annotated[str, typer.Argument(
    help="coherence (confusion detection), verification, decomposition (claims) or summarize.")]
DataOption = Annotated[Path, typer.Option(
    "--data", parser=data_path, metavar="<path>",
    help="Annotations: BooookScore human annotation file or folder (coherence), FABLES.json (verification, "
         "decomposition), a folder of books (summarize).")]


SeedOption = Annotated[Optional[int], seed_option("Seed of the book split, the subsets and the optimizer "
                                                  "(default 0).")]
ThreadsOption = Annotated[int, typer.Option("--threads", min=1, help="Examples evaluated at once.")]
TaskWindowOption = Annotated[Optional[int], typer.Option(
    JUDGE_WINDOW_OPTION, min=MIN_CONTEXT_WINDOW,
    help=f"coherence: tokens the model reads at once, which the judge's prompts are sized for (default: what "
         f"LiteLLM or the --api-base server states, else {DEFAULT_CONTEXT_WINDOW}); summarize: the window the "
         f"summarizer plans for (default {DEFAULT_CONTEXT_WINDOW}) and its judge too.")]
# The summarize task's summarizer, as `summarize` sets it; None until given, so that the other tasks
# refuse one given even at its default value.
TaskChunkSizeOption = Annotated[Optional[int], typer.Option(
    "--chunk-size", min=MIN_CHUNK_SIZE,
    help=f"summarize: maximum tokens per chunk (cl100k_base; default {DEFAULT_CHUNK_SIZE}).")]
TaskSummaryTokensOption = Annotated[Optional[int], typer.Option(
    "--max-summary-tokens", min=MIN_SUMMARY_TOKENS,
    help=f"summarize: G_n, tokens of a summary (default {DEFAULT_SUMMARY_TOKENS}).")]


@app.command("compile")
def compile_command(
    task: TaskArgument,
    data: DataOption,
    optimizer: Annotated[str, typer.Option(
        "--optimizer", help="labeled, bootstrap, random-search, mipro or gepa.")],
    output: Annotated[Path, typer.Option("-o", "--output", parser=output_path, callback=output_file,
                                         help="Where to write the artifact (JSON).")],
    demos: Annotated[Optional[int], typer.Option(
        "--demos", help="Demos per predictor (default 3; coherence 2).")] = None,
    candidates: Annotated[Optional[int], typer.Option(
        "--candidates", help="random-search: shuffled demo sets tried, beside the zero-shot, labeled and "
                             "unshuffled bootstrap programs it always tries; mipro: instruction and demo-set "
                             "candidates (default 3; coherence 2).")] = None,
    trials: Annotated[Optional[int], typer.Option(
        "--trials", help="mipro: search trials; gepa: reflective proposals (default 4; coherence 3).")] = None,
    threads: ThreadsOption = 2,
    max_rounds: Annotated[Optional[int], typer.Option(
        "--max-rounds", help="bootstrap, random-search: attempts per training example (default 1).")] = None,
    minibatch_size: Annotated[Optional[int], typer.Option(
        "--minibatch-size", help="mipro: score trials on this many dev examples (default 0: all).")] = None,
    seed: SeedOption = None,
    train_size: Annotated[Optional[int], typer.Option("--train-size", help="Training examples (0: all).")] = None,
    dev_size: Annotated[Optional[int], typer.Option("--dev-size", help="Dev examples (0: all).")] = None,
    test_size: Annotated[Optional[int], typer.Option("--test-size", help="Test examples (0: all).")] = None,
    evaluate_test: Annotated[bool, typer.Option(
        "--test/--no-test", help="Also score the compiled program on the test split (recorded in the artifact).")]
    = True,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    context_window: TaskWindowOption = None,
    chunk_size: TaskChunkSizeOption = None,
    max_summary_tokens: TaskSummaryTokensOption = None,
    cache_dir: CacheDirOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show the optimizer's own progress output.")] = False,
) -> None:
    """Compile a task's program on the training split with a DSPy optimizer; write the artifact."""
    from booklens.optimizers.workflow import compile_planned, plan_compile

    plan = plan_compile(task, data, output, optimizer=optimizer, demos=demos, candidates=candidates, trials=trials,
                        threads=threads, max_rounds=max_rounds, minibatch_size=minibatch_size, seed=seed,
                        train_size=train_size, dev_size=dev_size, test_size=test_size, evaluate_test=evaluate_test,
                        context_window=context_window, chunk_size=chunk_size, max_summary_tokens=max_summary_tokens,
                        verbose=verbose)
    for note in plan.notes:
        typer.echo(f"note: {note}", err=True)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm, context_window=context_window)
    done = compile_planned(plan, model, notify=lambda line: typer.echo(line, err=True))
    typer.echo(done.summary())
    for note in done.notes():
        typer.echo(f"note: {note}", err=True)


@app.command("evaluate")
def evaluate_command(
    task: TaskArgument,
    data: DataOption,
    program: Annotated[Optional[list[Path]], typer.Option(
        "--program", parser=program_path, metavar="<path>",
        help="A compiled artifact ('default': the few-shot program booklens ships); repeat to "
             "compare several. The zero-shot program is the first column unless --no-zero-shot.")]
    = None,
    split: Annotated[SplitName, typer.Option("--split", help="Which split of the data, by book.")] = SplitName.test,
    size: Annotated[Optional[int], typer.Option(
        "--size", help="Examples of the split to use (default: the size compile recorded for this split in "
                       "the first --program compiled on the same data and seed, else the task's subset size; "
                       "0: all).")] = None,
    zero_shot: Annotated[bool, typer.Option("--zero-shot/--no-zero-shot",
                                            help="Include the uncompiled program.")] = True,
    seed: SeedOption = None,
    threads: ThreadsOption = 2,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    context_window: TaskWindowOption = None,
    chunk_size: TaskChunkSizeOption = None,
    max_summary_tokens: TaskSummaryTokensOption = None,
    cache_dir: CacheDirOption = None,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", parser=output_path, callback=output_file,
                                                   help="Also write the results as JSON.")] = None,
) -> None:
    """Run zero-shot and compiled programs on a split, side by side: metric with a bootstrap 95% CI, LM calls, tokens."""
    from booklens.records import present

    if not present(data):  # before DSPy loads: a typo costs no start-up time
        raise BooklensError(f"data not found: {data}")
    from booklens.optimizers.workflow import evaluate_planned, plan_evaluation

    plan = plan_evaluation(task, data, programs=program or [], split=SplitName(split).value, size=size,
                           zero_shot=zero_shot, seed=seed, threads=threads, context_window=context_window,
                           chunk_size=chunk_size, max_summary_tokens=max_summary_tokens)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm, context_window=context_window)
    done = evaluate_planned(plan, model, notify=lambda line: typer.echo(line, err=True))
    typer.echo(done.table())
    for note in done.notes():  # e.g. a judge shown with fewer demos than its label says
        typer.echo(f"note: {note}", err=True)
    for line in done.failures():
        typer.echo(line, err=True)
    if output is not None:
        write_output(output, done.as_dict())
    sys.stdout.flush()
