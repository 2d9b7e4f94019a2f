"""Compile programs against annotations and evaluate them:

    booklens compile TASK --data PATH --optimizer NAME [--demos N --candidates N --trials N ...] -o ARTIFACT.json
    booklens evaluate TASK --data PATH [--program ARTIFACT.json ...] [--split test]

TASK is coherence, verification, decomposition or summarize. The artifact runs with
`--program` on the task's command (score, verify/check, claims, summarize).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

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
from booklens.data.splits import DEFAULT_FRACTIONS
from booklens.errors import BooklensError, LMError
from booklens.lm.base import lm_label, window_setting
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


def _sizes(train: int | None, dev: int | None, test: int | None) -> dict[str, int | None]:
    for name, value in (("train", train), ("dev", dev), ("test", test)):
        if value is not None and value < 0:
            raise BooklensError(f"--{name}-size must be 0 (the whole split) or more (got {value})")
    return {"train": train, "dev": dev, "test": test}


def _task(task: str, context_window: int | None, chunk_size: int | None,
          max_summary_tokens: int | None) -> tuple[Any, str | None, str]:
    """The task named, its summarizer (summarize) built with the options, and the option a context
    overflow names with what planned for the window (`booklens.steps.judge_window_advice`): the
    coherence judge fits its demos to the window it plans for, and the summarize task's summarizer
    and judge plan for it. The other tasks' prompts are not sized by a window, nor do they run a
    summarizer: those options are refused there, not ignored."""
    from booklens.optimizers.tasks import get_task, task_settings

    spec = get_task(task)
    given = [option for option, value in (("--chunk-size", chunk_size), ("--max-summary-tokens", max_summary_tokens))
             if value is not None]
    if task_settings(spec.name):
        settings = {"chunk_size": chunk_size, "context_window": context_window, "max_summary_tokens": max_summary_tokens}
        spec = get_task(spec.name, **{name: value for name, value in settings.items() if value is not None})
        return spec, JUDGE_WINDOW_OPTION, "the summarize task"
    if given:
        raise BooklensError(f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} the summarize task's "
                            f"summarizer; the {spec.name} task runs none: leave {'them' if len(given) > 1 else 'it'} "
                            "out")
    if spec.name == "coherence":
        return spec, JUDGE_WINDOW_OPTION, "the judge"
    if context_window is not None:
        raise BooklensError(f"{JUDGE_WINDOW_OPTION} is the window the coherence judge's and the summarize task's "
                            f"prompts are planned for; the {spec.name} task's prompts are not sized by a window: "
                            "leave it out")
    return spec, None, "the judge"


def _metric_block(result) -> dict[str, Any]:
    d = result.as_dict()
    return {"value": d["metric"], "ci95": d["ci95"], "n": d["n"], "scored": d["scored"], "failures": d["failures"]}


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
    from booklens.optimizers.artifacts import save_program
    from booklens.optimizers.compile import (check_budget_options, check_dev_set, check_optimizer, compile_program,
                                            fit_train_set)
    from booklens.lm.usage import UsageTracker
    from booklens.optimizers.evaluate import evaluate_program, format_table
    from booklens.optimizers.tasks import check_asked_sizes, load_task_splits
    from booklens.steps import judge_window_advice

    name = check_optimizer(optimizer)
    check_budget_options(name, {"demos": demos, "candidates": candidates, "trials": trials, "max_rounds": max_rounds,
                                "minibatch_size": minibatch_size})
    if test_size is not None and not evaluate_test:  # it would be recorded (split.sizes.test) as if it applied
        raise BooklensError("--test-size sizes the test split, and --no-test scores nothing on it")
    spec, window_option, planner = _task(task, context_window, chunk_size, max_summary_tokens)
    budget = spec.default_budget(demos=demos, candidates=candidates, trials=trials, threads=threads,
                                 max_rounds=max_rounds, minibatch_size=minibatch_size)
    budget.check_for(name)
    seed = 0 if seed is None else seed
    splits = load_task_splits(spec, data, seed=seed, sizes=_sizes(train_size, dev_size, test_size))
    check_asked_sizes(spec, splits, {"train": ("--train-size", train_size), "dev": ("--dev-size", dev_size),
                               "test": ("--test-size", test_size)}, data)
    if not evaluate_test:
        splits = splits.dropping("test")
    budget = fit_train_set(name, budget, splits.train, asked=demos is not None, what=f"the training split of {data}")
    shares = "/".join(f"{100 * f:g}" for f in DEFAULT_FRACTIONS.values())
    check_dev_set(name, splits.dev, f"the dev split of {data} is empty (the data is split by book, {shares} %: more "
                                    "books fill it)", budget=budget)
    budget = budget.with_error_limit(len(splits.train) + len(splits.dev))  # the limit applied, as recorded
    empty = [name for name in ("dev", "test") if not splits.get(name) and (name == "dev" or evaluate_test)]
    if empty:
        # Not an error: labeled and bootstrap need no dev split (the optimizers that choose on it
        # refuse an empty one), but nothing will measure the compiled program.
        typer.echo(f"note: the {' and '.join(empty)} split{'s' if len(empty) > 1 else ''} of {data} "
                   f"{'are' if len(empty) > 1 else 'is'} empty: nothing will score the compiled program there "
                   f"(the data is split by book, {shares} %: more books fill them)", err=True)
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm, context_window=context_window)
    # Every split the command runs on, before the first call: not the test split after the compile.
    spec.refuse_misfits(spec.build_program(), [*splits.train, *splits.dev, *splits.test],
                        getattr(model, "context_window", None), **window_setting(model, window_option))

    typer.echo(f"compiling {spec.name} with {name}: {len(splits.train)} train / {len(splits.dev)} dev / "
               f"{len(splits.test)} test examples, budget {budget.spent_by(name)}", err=True)
    meter = UsageTracker()
    started = time.perf_counter()
    with judge_window_advice(model, window_option, planner):
        compiled = compile_program(spec, splits.train, splits.dev, optimizer=name, budget=budget, seed=seed,
                                   meter=meter, verbose=verbose)
    compile_seconds = time.perf_counter() - started
    if name == "labeled" and not any(getattr(p, "demos", None) for _, p in compiled.named_predictors()):
        typer.echo(f"note: the training split holds no example the {spec.name} program can show as a demo "
                   "(labeled takes the annotated ones): the artifact is the zero-shot program", err=True)
    results = []
    metrics: dict[str, Any] = {}
    unscored: Optional[tuple[str, BooklensError]] = None
    for split in ("dev", "test"):
        examples = splits.get(split)
        if not examples or (split == "test" and not evaluate_test):
            continue
        try:
            # mipro and gepa write instructions of their own, which may leave a summary no room: the
            # artifact is still written, only that split is not scored
            spec.refuse_misfits(compiled, examples, getattr(model, "context_window", None),
                                **window_setting(model, window_option))
        except BooklensError as exc:
            typer.echo(f"note: the compiled program is not scored on {split}: with its instructions, {exc}", err=True)
            continue
        try:
            with judge_window_advice(model, window_option, planner):
                result = evaluate_program(compiled, examples, spec.metric, threads=threads,
                                          label=f"compiled on {split}", units=spec.units(examples),
                                          unit_name=spec.interval_unit_name, failure=spec.failure, notes=spec.notes)
        except LMError:
            raise  # the server or its settings: a rerun with them fixed resumes from the cache
        except BooklensError as exc:
            # The program failed on every example: a rerun would fail the same way, so the compiled
            # program is written all the same, and the command still fails (a split it was asked to
            # score has no score).
            unscored = (split, exc)
            break
        results.append(result)
        metrics[split] = _metric_block(result)
    total_seconds = time.perf_counter() - started
    block = save_program(
        compiled, output, task=spec.name,
        program_config=spec.program_config,
        dataset=splits.info["dataset"],
        split={k: v for k, v in splits.info.items() if k != "dataset"},
        seed=seed,
        optimizer=name,
        budget=budget.spent_by(name),
        lm=lm_label(model),
        metric=spec.metric_name,
        metrics=metrics,
    )
    typer.echo(f"wrote {output}", err=True)
    if unscored is not None:
        split, exc = unscored
        raise BooklensError(f"{exc} ({output} holds the compiled program, not scored on {split}: "
                            f"`booklens evaluate {spec.name} --data {data} --program {output} --split {split}` scores it)")
    usage = meter.work()
    demos_count = {n: len(p.demos) for n, p in compiled.named_predictors()}
    lines = [
        f"{spec.name} compiled with {name} (seed {seed}) in {compile_seconds:.0f} s "
        f"({total_seconds:.0f} s with evaluation); LM calls while compiling: {usage['calls']} "
        f"({usage['cached_calls']} from cache), {usage['prompt_tokens']} prompt + "
        f"{usage['completion_tokens']} completion tokens",
        f"demos per predictor: {demos_count}",
    ]
    if results:
        lines += ["", format_table(results, title=f"{spec.name} ({block['lm']})", metric_name=spec.metric_name)]
    typer.echo("\n".join(lines))
    for r in results:
        for note in r.notes:
            typer.echo(f"note: {r.label}: {note}", err=True)


def _default_if_named(path: Path, task: str) -> Path:
    """`--program default` is the few-shot program booklens ships for the task (`booklens.judges`)."""
    if str(path) != "default" or path.exists():
        return path
    from booklens.judges import default_path

    if task not in ("coherence", "verification"):
        raise BooklensError(f"booklens ships default programs for coherence and verification, not {task}")
    return default_path(task)


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
    from booklens.optimizers.artifacts import check_task, compiled_split_size, held_out_notes, load_program
    from booklens.optimizers.evaluate import evaluate_program, format_table
    from booklens.optimizers.tasks import (check_asked_sizes, data_digest, learned_groups, load_task_splits,
                                          same_data_digests, split_groups)

    split = SplitName(split).value
    if size is not None and size < 0:
        raise BooklensError(f"--size must be 0 (the whole split) or more (got {size})")
    spec, window_option, planner = _task(task, context_window, chunk_size, max_summary_tokens)
    programs = [_default_if_named(p, spec.name) for p in program or []]
    if not programs and not zero_shot:
        raise BooklensError("nothing to evaluate: give --program or drop --no-zero-shot")
    states = [check_task(p, spec.name) for p in programs]  # wrong or broken artifacts fail before any work
    blocks = [s["metadata"]["booklens"] for s in states]
    if spec.name == "verification":
        from booklens.judges import check_not_binary

        for path, b in zip(programs, blocks):
            check_not_binary(path, b)
    if seed is None:
        seed = next((b.get("seed") for b in blocks if isinstance(b.get("seed"), int)), 0)
    digest = data_digest(spec, data)
    same_data = same_data_digests(digest, data, [(b.get("dataset") or {}).get("sha256") for b in blocks])
    asked = size
    if size is None:
        size = compiled_split_size(blocks, split, same_data, seed)
    splits = load_task_splits(spec, data, seed=seed, sizes={split: size})
    check_asked_sizes(spec, splits, {split: ("--size", asked)}, data)
    examples = splits.get(split)
    if not examples:
        raise BooklensError(f"the {split} split of {data} is empty")
    model = setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm, context_window=context_window)

    runs: list[tuple[str, Any]] = []
    if zero_shot:
        runs.append(("zero-shot", spec.build_program()))
    labels_seen: set[str] = set()
    said: list[str] = []
    from booklens.judges import DEFAULTS_DIR, compiled_with, other_lm_note

    for path, b in zip(programs, blocks):
        loaded = load_program(spec.build_program(), path, task=spec.name)
        label = path.name if path.name not in labels_seen else str(path)
        if path.resolve().parent == DEFAULTS_DIR:
            label = "default few-shot"
        labels_seen.add(label)
        runs.append((label, loaded))
        # A note, not a refusal: evaluating an artifact on what it learned from is a fair check of
        # fit, as long as the figures are not read as held out.
        recorded = (b.get("dataset") or {}).get("sha256")

        def overlap(dev_too: bool, block=b) -> tuple[int, int]:  # drawn again only when the seeds differ
            return split_groups(spec, examples, learned_groups(spec, data, block, dev_too) or set())

        notes = held_out_notes(str(path), b, loaded, examples, digest=recorded if recorded in same_data else digest,
                               seed=seed, split=split, overlap=overlap if recorded in same_data else None)
        said += [note for note in [*notes, other_lm_note(str(path), compiled_with(b), lm_label(model))] if note]
    for _, p in runs:  # each program's own instructions count: mipro and gepa rewrite them
        spec.refuse_misfits(p, examples, getattr(model, "context_window", None), **window_setting(model, window_option))
    for note in said:  # after the refusals: an error is the one line a refused command prints
        typer.echo(f"note: {note}", err=True)
    from booklens.steps import judge_window_advice

    with judge_window_advice(model, window_option, planner):
        results = [evaluate_program(p, examples, spec.metric, threads=threads, label=label,
                                    units=spec.units(examples), unit_name=spec.interval_unit_name,
                                    failure=spec.failure, notes=spec.notes)
                   for label, p in runs]
    title = f"{spec.name} / {split} (n={len(examples)}, seed {seed})"
    typer.echo(format_table(results, title=title, metric_name=spec.metric_name))
    for r in results:  # e.g. a judge shown with fewer demos than its label says
        for note in r.notes:
            typer.echo(f"note: {r.label}: {note}", err=True)
    if any(r.failures for r in results):
        for r in results:
            if r.errors:
                typer.echo(f"{r.label}: {r.failures} failed example(s), e.g. {r.errors[0]}", err=True)
    if output is not None:
        write_output(output, {
            "kind": "booklens.evaluation", "task": spec.name, "split": split, "seed": seed,
            "data": splits.info, "lm": lm_label(model), "metric": spec.metric_name,
            "programs": [str(p) for p in programs], "results": [r.as_dict() for r in results],
        })
    sys.stdout.flush()
