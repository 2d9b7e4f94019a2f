"""`booklens compile` and `booklens evaluate` as library calls.

Each runs in two parts, so that everything a user can get wrong is refused before an LM is made:
`plan_compile` / `plan_evaluation` check the options and read the data (no LM, no call), and
`compile_planned` / `evaluate_planned` run the plan with a booklens LM (`booklens.lm.make_lm`,
configured as DSPy's LM). `compile_task` and `evaluate_task` do both with the configured LM.

    from booklens.lm import configure, make_lm
    from booklens.optimizers.workflow import compile_task

    configure(make_lm("openai/gpt-4o-mini"))
    done = compile_task("verification", "FABLES.json", "verify.json", optimizer="labeled", demos=4)
    print(done.summary())
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from booklens.data.splits import DEFAULT_FRACTIONS
from booklens.errors import BooklensError, LMError, check_flag, kind_of, setting_name
from booklens.vocabulary import JUDGE_WINDOW_OPTION

Notify = Callable[[str], None]


def _quiet(line: str) -> None:
    pass


def whole_number(option: str, value: Any, least: int = 0, *, zero: str = "0") -> None:
    """A count a library caller handed over (None: not given): a whole number from `least` up, or one
    line naming it as the command would refuse its `option` (`setting_name`; `zero`: what 0 means there)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
        bound = f"{zero} or more" if least == 0 else f"at least {least}"
        raise BooklensError(f"{setting_name(option)} must be {bound} (got {value!r})")


def _name(what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise BooklensError(f"{what} must be a name, not {kind_of(value)}")
    return value


def split_shares() -> str:
    """'40/20/40': the shares of books in train, dev and test, as the lines about empty splits say."""
    return "/".join(f"{100 * f:g}" for f in DEFAULT_FRACTIONS.values())


def task_for(task: str, context_window: int | None = None, chunk_size: int | None = None,
             max_summary_tokens: int | None = None) -> tuple[Any, str | None, str]:
    """The task named, its summarizer (summarize) built with the options, and the option a context
    overflow names with what planned for the window (`booklens.steps.judge_window_advice`): the
    coherence judge fits its demos to the window it plans for, and the summarize task's summarizer
    and judge plan for it. The other tasks' prompts are not sized by a window, nor do they run a
    summarizer: those options are refused there, not ignored."""
    from booklens.optimizers.tasks import get_task, task_settings

    spec = get_task(task)
    given = [setting_name(option) for option, value in (("--chunk-size", chunk_size),
                                                        ("--max-summary-tokens", max_summary_tokens))
             if value is not None]
    if task_settings(spec.name):
        settings = {"chunk_size": chunk_size, "context_window": context_window,
                    "max_summary_tokens": max_summary_tokens}
        spec = get_task(spec.name, **{name: value for name, value in settings.items() if value is not None})
        return spec, JUDGE_WINDOW_OPTION, "the summarize task"
    if given:
        raise BooklensError(f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} the summarize task's "
                            f"summarizer; the {spec.name} task runs none: leave {'them' if len(given) > 1 else 'it'} "
                            "out")
    if spec.name == "coherence":
        return spec, JUDGE_WINDOW_OPTION, "the judge"
    if context_window is not None:
        raise BooklensError(f"{setting_name(JUDGE_WINDOW_OPTION)} is the window the coherence judge's and the "
                            f"summarize task's prompts are planned for; the {spec.name} task's prompts are not sized "
                            "by a window: leave it out")
    return spec, None, "the judge"


def metric_block(result: Any) -> dict[str, Any]:
    """What an artifact records of its program's score on a split."""
    d = result.as_dict()
    return {"value": d["metric"], "ci95": d["ci95"], "n": d["n"], "scored": d["scored"], "failures": d["failures"]}


def _refuse_misfits(spec: Any, program: Any, examples: Sequence[Any], model: Any, window_option: str | None) -> None:
    from booklens.lm.base import window_setting

    spec.refuse_misfits(program, examples, getattr(model, "context_window", None),
                        **window_setting(model, window_option))


# ---------------------------------------------------------------------------
# compile


@dataclass
class CompilePlan:
    """A checked compile: the task, its splits and the optimizer's budget; no LM made yet."""

    spec: Any
    window_option: str | None
    planner: str
    data: Path
    output: Path
    optimizer: str
    budget: Any
    seed: int
    splits: Any
    evaluate_test: bool
    threads: int
    verbose: bool
    notes: list[str] = field(default_factory=list)  # to say before the LM starts


def plan_compile(task: str, data: str | Path, output: str | Path, *, optimizer: str, demos: int | None = None,
                 candidates: int | None = None, trials: int | None = None, threads: int = 2,
                 max_rounds: int | None = None, minibatch_size: int | None = None, seed: int | None = None,
                 train_size: int | None = None, dev_size: int | None = None, test_size: int | None = None,
                 evaluate_test: bool = True, context_window: int | None = None, chunk_size: int | None = None,
                 max_summary_tokens: int | None = None, verbose: bool = False) -> CompilePlan:
    """Check a compile's options against its data, before any LM: a one-line `BooklensError` for
    what cannot run (an optimizer's budget it does not spend, sizes a split cannot hold, a dev split
    an optimizer needs and the data leaves empty). `notes` holds what to say before it runs."""
    from booklens.inputs import as_path
    from booklens.optimizers.compile import check_budget_options, check_dev_set, check_optimizer, fit_train_set
    from booklens.optimizers.tasks import check_asked_sizes, load_task_splits
    from booklens.parallel import check_at_least
    from booklens.vocabulary import MIN_CHUNK_SIZE, MIN_CONTEXT_WINDOW, MIN_SUMMARY_TOKENS

    _name("task", task)
    data, output = as_path(data, "data"), as_path(output, "output")
    for option, value in (("--demos", demos), ("--candidates", candidates), ("--trials", trials),
                          ("--minibatch-size", minibatch_size), ("--seed", seed)):
        whole_number(option, value)
    for option, value in (("--train-size", train_size), ("--dev-size", dev_size), ("--test-size", test_size)):
        whole_number(option, value, zero="0 (the whole split)")
    for option, value, least in (("--max-rounds", max_rounds, 1), ("--context-window", context_window,
                                                                  MIN_CONTEXT_WINDOW),
                                 ("--chunk-size", chunk_size, MIN_CHUNK_SIZE),
                                 ("--max-summary-tokens", max_summary_tokens, MIN_SUMMARY_TOKENS)):
        whole_number(option, value, least)
    check_at_least("--threads", threads)
    check_flag("evaluate_test", evaluate_test)
    check_flag("verbose", verbose)
    name = check_optimizer(_name("optimizer", optimizer))
    check_budget_options(name, {"demos": demos, "candidates": candidates, "trials": trials, "max_rounds": max_rounds,
                                "minibatch_size": minibatch_size})
    if test_size is not None and not evaluate_test:  # it would be recorded (split.sizes.test) as if it applied
        raise BooklensError(f"{setting_name('--test-size')} sizes the test split, and "
                            f"{setting_name('--no-test', keyword='evaluate_test=False')} scores nothing on it")
    spec, window_option, planner = task_for(task, context_window, chunk_size, max_summary_tokens)
    budget = spec.default_budget(demos=demos, candidates=candidates, trials=trials, threads=threads,
                                 max_rounds=max_rounds, minibatch_size=minibatch_size)
    budget.check_for(name)
    seed = 0 if seed is None else seed
    sizes = {"train": train_size, "dev": dev_size, "test": test_size}
    splits = load_task_splits(spec, data, seed=seed, sizes=sizes)
    check_asked_sizes(spec, splits, {"train": ("--train-size", train_size), "dev": ("--dev-size", dev_size),
                                     "test": ("--test-size", test_size)}, data)
    if not evaluate_test:
        splits = splits.dropping("test")
    budget = fit_train_set(name, budget, splits.train, asked=demos is not None, what=f"the training split of {data}")
    shares = split_shares()
    check_dev_set(name, splits.dev, f"the dev split of {data} is empty (the data is split by book, {shares} %: more "
                                    "books fill it)", budget=budget)
    budget = budget.with_error_limit(len(splits.train) + len(splits.dev))  # the limit applied, as recorded
    notes = []
    empty = [split for split in ("dev", "test") if not splits.get(split) and (split == "dev" or evaluate_test)]
    if empty:
        # Not an error: labeled and bootstrap need no dev split (the optimizers that choose on it
        # refuse an empty one), but nothing will measure the compiled program.
        notes.append(f"the {' and '.join(empty)} split{'s' if len(empty) > 1 else ''} of {data} "
                     f"{'are' if len(empty) > 1 else 'is'} empty: nothing will score the compiled program there "
                     f"(the data is split by book, {shares} %: more books fill them)")
    return CompilePlan(spec, window_option, planner, data, output, name, budget, seed, splits, evaluate_test,
                       threads, verbose, notes)


@dataclass
class CompileOutcome:
    """A compiled program, the artifact written for it, and its scores on dev and test."""

    plan: CompilePlan
    program: Any
    artifact: dict[str, Any]  # the booklens metadata written with it
    results: list[Any]  # EvalResult per split scored
    usage: dict[str, Any]  # the compile's own calls (not the scoring's)
    compile_seconds: float
    total_seconds: float

    def summary(self) -> str:
        """What `booklens compile` prints: time, calls, demos per predictor, the scores' table."""
        from booklens.optimizers.evaluate import format_table

        plan, usage = self.plan, self.usage
        demos = {n: len(p.demos) for n, p in self.program.named_predictors()}
        lines = [
            f"{plan.spec.name} compiled with {plan.optimizer} (seed {plan.seed}) in {self.compile_seconds:.0f} s "
            f"({self.total_seconds:.0f} s with evaluation); LM calls while compiling: {usage['calls']} "
            f"({usage['cached_calls']} from cache), {usage['prompt_tokens']} prompt + "
            f"{usage['completion_tokens']} completion tokens",
            f"demos per predictor: {demos}",
        ]
        if self.results:
            lines += ["", format_table(self.results, title=f"{plan.spec.name} ({self.artifact['lm']})",
                                       metric_name=plan.spec.metric_name)]
        return "\n".join(lines)

    def notes(self) -> list[str]:
        """What the scoring has to say beside its figures (a judge shown fewer demos, ...)."""
        return [f"{r.label}: {note}" for r in self.results for note in r.notes]


def compile_planned(plan: CompilePlan, model: Any, *, notify: Optional[Notify] = None) -> CompileOutcome:
    """Compile on the training split with `model` (DSPy's configured LM), score the program on dev
    and test, and write the artifact. `notify` gets each line to say as it goes (the start, notes,
    the file written). A program that fails on every example of a split is written all the same,
    and then a one-line `BooklensError` says so: a rerun would fail the same way."""
    from booklens.lm.base import lm_label
    from booklens.lm.usage import UsageTracker
    from booklens.optimizers.artifacts import save_program
    from booklens.optimizers.compile import compile_program
    from booklens.optimizers.evaluate import evaluate_program
    from booklens.steps import judge_window_advice

    notify = notify or _quiet
    spec, splits = plan.spec, plan.splits
    # Every split the command runs on, before the first call: not the test split after the compile.
    _refuse_misfits(spec, spec.build_program(), [*splits.train, *splits.dev, *splits.test], model, plan.window_option)
    notify(f"compiling {spec.name} with {plan.optimizer}: {len(splits.train)} train / {len(splits.dev)} dev / "
           f"{len(splits.test)} test examples, budget {plan.budget.spent_by(plan.optimizer)}")
    meter = UsageTracker()
    started = time.perf_counter()
    with judge_window_advice(model, plan.window_option, plan.planner):
        compiled = compile_program(spec, splits.train, splits.dev, optimizer=plan.optimizer, budget=plan.budget,
                                   seed=plan.seed, meter=meter, verbose=plan.verbose)
    compile_seconds = time.perf_counter() - started
    if plan.optimizer == "labeled" and not any(getattr(p, "demos", None) for _, p in compiled.named_predictors()):
        notify(f"note: the training split holds no example the {spec.name} program can show as a demo "
               "(labeled takes the annotated ones): the artifact is the zero-shot program")
    results = []
    metrics: dict[str, Any] = {}
    unscored: Optional[tuple[str, BooklensError]] = None
    for split in ("dev", "test"):
        examples = splits.get(split)
        if not examples or (split == "test" and not plan.evaluate_test):
            continue
        try:
            # mipro and gepa write instructions of their own, which may leave a summary no room: the
            # artifact is still written, only that split is not scored
            _refuse_misfits(spec, compiled, examples, model, plan.window_option)
        except BooklensError as exc:
            notify(f"note: the compiled program is not scored on {split}: with its instructions, {exc}")
            continue
        try:
            with judge_window_advice(model, plan.window_option, plan.planner):
                result = evaluate_program(compiled, examples, spec.metric, threads=plan.threads,
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
        metrics[split] = metric_block(result)
    total_seconds = time.perf_counter() - started
    artifact = save_program(
        compiled, plan.output, task=spec.name,
        program_config=spec.program_config,
        dataset=splits.info["dataset"],
        split={k: v for k, v in splits.info.items() if k != "dataset"},
        seed=plan.seed,
        optimizer=plan.optimizer,
        budget=plan.budget.spent_by(plan.optimizer),
        lm=lm_label(model),
        metric=spec.metric_name,
        metrics=metrics,
    )
    notify(f"wrote {plan.output}")
    if unscored is not None:
        split, exc = unscored
        raise BooklensError(f"{exc} ({plan.output} holds the compiled program, not scored on {split}: "
                            f"`booklens evaluate {spec.name} --data {plan.data} --program {plan.output} --split "
                            f"{split}` scores it)")
    return CompileOutcome(plan, compiled, artifact, results, meter.work(), compile_seconds, total_seconds)


def compile_task(task: str, data: str | Path, output: str | Path, *, notify: Optional[Notify] = None,
                 **options: Any) -> CompileOutcome:
    """`plan_compile` then `compile_planned` with DSPy's configured LM (`options`: `plan_compile`'s)."""
    from booklens.lm import current_lm

    plan = plan_compile(task, data, output, **options)
    for note in plan.notes:
        (notify or _quiet)(f"note: {note}")
    return compile_planned(plan, current_lm(), notify=notify)


# ---------------------------------------------------------------------------
# evaluate


def program_named(path: str | Path, task: str) -> Path:
    """`default` is the few-shot program booklens ships for the task (`booklens.judges`)."""
    path = Path(path)
    if str(path) != "default" or path.exists():
        return path
    from booklens.judges import default_path

    if task not in ("coherence", "verification"):
        raise BooklensError(f"booklens ships default programs for coherence and verification, not {task}")
    return default_path(task)


@dataclass
class EvaluationPlan:
    """A checked evaluation: the split's examples and the artifacts to run on them; no LM made yet."""

    spec: Any
    window_option: str | None
    planner: str
    data: Path
    split: str
    seed: int
    programs: list[Path]
    blocks: list[dict[str, Any]]  # each artifact's booklens metadata
    digest: str
    same_data: set[str]
    splits: Any
    examples: list[Any]
    zero_shot: bool
    threads: int


def plan_evaluation(task: str, data: str | Path, *, programs: Sequence[str | Path] = (), split: str = "test",
                    size: int | None = None, zero_shot: bool = True, seed: int | None = None, threads: int = 2,
                    context_window: int | None = None, chunk_size: int | None = None,
                    max_summary_tokens: int | None = None) -> EvaluationPlan:
    """Check an evaluation's options, artifacts and data before any LM. `size` None: the size
    compile recorded for the split in the first artifact compiled on the same data and seed."""
    from booklens.data.splits import DEFAULT_FRACTIONS
    from booklens.inputs import as_path
    from booklens.optimizers.artifacts import check_task, compiled_split_size
    from booklens.optimizers.tasks import check_asked_sizes, data_digest, load_task_splits, same_data_digests
    from booklens.parallel import check_at_least
    from booklens.records import present
    from booklens.vocabulary import MIN_CHUNK_SIZE, MIN_CONTEXT_WINDOW, MIN_SUMMARY_TOKENS

    _name("task", task)
    data = as_path(data, "data")
    if isinstance(programs, (str, Path)) or not isinstance(programs, Iterable):
        raise BooklensError(f"programs must be a list of artifact paths, not {kind_of(programs)}")
    programs = [as_path(p, "each of programs") for p in programs]
    if split not in DEFAULT_FRACTIONS:
        raise BooklensError(f"split must be one of {', '.join(DEFAULT_FRACTIONS)}, not {split!r}")
    whole_number("--size", size, zero="0 (the whole split)")
    whole_number("--seed", seed)
    for option, value, least in (("--context-window", context_window, MIN_CONTEXT_WINDOW),
                                 ("--chunk-size", chunk_size, MIN_CHUNK_SIZE),
                                 ("--max-summary-tokens", max_summary_tokens, MIN_SUMMARY_TOKENS)):
        whole_number(option, value, least)
    check_at_least("--threads", threads)
    check_flag("zero_shot", zero_shot)
    if not present(data):
        raise BooklensError(f"data not found: {data}")
    spec, window_option, planner = task_for(task, context_window, chunk_size, max_summary_tokens)
    paths = [program_named(p, spec.name) for p in programs]
    if not paths and not zero_shot:
        raise BooklensError(f"nothing to evaluate: give {setting_name('--program', keyword='programs')} or drop "
                            f"{setting_name('--no-zero-shot', keyword='zero_shot=False')}")
    states = [check_task(p, spec.name) for p in paths]  # wrong or broken artifacts fail before any work
    blocks = [s["metadata"]["booklens"] for s in states]
    if spec.name == "verification":
        from booklens.judges import check_not_binary

        for path, b in zip(paths, blocks):
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
    return EvaluationPlan(spec, window_option, planner, data, split, seed, paths, blocks, digest, same_data, splits,
                          list(examples), zero_shot, threads)


@dataclass
class EvaluationOutcome:
    """Each program's results on the split, side by side."""

    plan: EvaluationPlan
    lm: str
    results: list[Any]  # EvalResult per program, the zero-shot one first

    def table(self) -> str:
        from booklens.optimizers.evaluate import format_table

        plan = self.plan
        title = f"{plan.spec.name} / {plan.split} (n={len(plan.examples)}, seed {plan.seed})"
        return format_table(self.results, title=title, metric_name=plan.spec.metric_name)

    def notes(self) -> list[str]:
        """What each run has to say beside its figures (a judge shown fewer demos, ...)."""
        return [f"{r.label}: {note}" for r in self.results for note in r.notes]

    def failures(self) -> list[str]:
        """Each run that failed on some examples: how many, and the first failure."""
        return [f"{r.label}: {r.failures} failed example(s), e.g. {r.errors[0]}" for r in self.results if r.errors]

    def as_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {"kind": "booklens.evaluation", "task": plan.spec.name, "split": plan.split, "seed": plan.seed,
                "data": plan.splits.info, "lm": self.lm, "metric": plan.spec.metric_name,
                "programs": [str(p) for p in plan.programs], "results": [r.as_dict() for r in self.results]}


def evaluate_planned(plan: EvaluationPlan, model: Any, *, notify: Optional[Notify] = None) -> EvaluationOutcome:
    """Run the zero-shot program (unless left out) and each artifact on the split with `model`.
    `notify` gets the notes said before the first call (an artifact scored on what it learned from,
    or run on another LM than it was compiled with)."""
    from booklens.judges import DEFAULTS_DIR, compiled_with, other_lm_note
    from booklens.lm.base import lm_label
    from booklens.optimizers.artifacts import held_out_notes, load_program
    from booklens.optimizers.evaluate import evaluate_program
    from booklens.optimizers.tasks import learned_groups, split_groups
    from booklens.steps import judge_window_advice

    notify = notify or _quiet
    spec, examples = plan.spec, plan.examples
    runs: list[tuple[str, Any]] = []
    if plan.zero_shot:
        runs.append(("zero-shot", spec.build_program()))
    labels_seen: set[str] = set()
    said: list[str] = []
    for path, b in zip(plan.programs, plan.blocks):
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
            return split_groups(spec, examples, learned_groups(spec, plan.data, block, dev_too) or set())

        same = recorded in plan.same_data
        notes = held_out_notes(str(path), b, loaded, examples, digest=recorded if same else plan.digest,
                               seed=plan.seed, split=plan.split, overlap=overlap if same else None)
        said += [note for note in [*notes, other_lm_note(str(path), compiled_with(b), lm_label(model))] if note]
    for _, program in runs:  # each program's own instructions count: mipro and gepa rewrite them
        _refuse_misfits(spec, program, examples, model, plan.window_option)
    for note in said:  # after the refusals: an error is the one line a refused command prints
        notify(f"note: {note}")
    with judge_window_advice(model, plan.window_option, plan.planner):
        results = [evaluate_program(program, examples, spec.metric, threads=plan.threads, label=label,
                                    units=spec.units(examples), unit_name=spec.interval_unit_name,
                                    failure=spec.failure, notes=spec.notes)
                   for label, program in runs]
    return EvaluationOutcome(plan, lm_label(model), results)


def evaluate_task(task: str, data: str | Path, *, notify: Optional[Notify] = None, **options: Any) -> EvaluationOutcome:
    """`plan_evaluation` then `evaluate_planned` with DSPy's configured LM (`options`: `plan_evaluation`'s)."""
    from booklens.lm import current_lm

    return evaluate_planned(plan_evaluation(task, data, **options), current_lm(), notify=notify)


__all__ = ["CompileOutcome", "CompilePlan", "EvaluationOutcome", "EvaluationPlan", "compile_planned", "compile_task",
           "evaluate_planned", "evaluate_task", "metric_block", "plan_compile", "plan_evaluation", "program_named",
           "task_for"]
