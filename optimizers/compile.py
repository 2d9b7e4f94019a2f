"""One entry point that compiles a program against annotations with a DSPy optimizer chosen by name.

| name            | DSPy optimizer                     | what it searches                                   |
|-----------------|------------------------------------|----------------------------------------------------|
| `labeled`       | LabeledFewShot                     | nothing: `demos` annotated examples per predictor  |
| `bootstrap`     | BootstrapFewShot                   | demos from the program's own runs the metric accepts |
| `random-search` | BootstrapFewShotWithRandomSearch   | `candidates` shuffled bootstrapped demo sets, best on dev |
| `mipro`         | MIPROv2                            | `candidates` instructions x demo sets, `trials` Bayesian trials on dev |
| `gepa`          | GEPA                               | instructions rewritten by reflection, about `trials` proposals |

(`random-search` also tries, whatever `candidates` is, the zero-shot program, the labeled demos and
the unshuffled bootstrap: `--candidates 0` still chooses among those three.)

Budgets default to what finishes in minutes on a 2-core machine with the embedded model.
Seeds are fixed (the training order, DSPy's samplers, Optuna's sampler, GEPA's RNG), and every
LM call is cached on disk, so two runs with the same cache produce the same program.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import random
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import dspy
from dspy.utils.callback import ACTIVE_CALL_ID, BaseCallback

from booklens.errors import BooklensError, LMError, first_line, setting_name
from booklens.lm.base import ContextWindowExceeded
from booklens.lm.usage import UsageTracker
from booklens.optimizers.evaluate import BackendFailed, NoScore, metered, score_of

OPTIMIZERS: dict[str, str] = {
    "labeled": "LabeledFewShot: annotated examples as demos",
    "bootstrap": "BootstrapFewShot: demos from runs the metric accepts",
    "random-search": "BootstrapFewShotWithRandomSearch: best of several demo sets on dev",
    "mipro": "MIPROv2: instructions and demo sets searched with Bayesian optimization on dev",
    "gepa": "GEPA: instructions evolved by reflecting on failures",
}


# The `Budget` fields each optimizer spends (`_run`): the one table of it. --threads also runs the
# evaluations, so every optimizer takes it; max_errors (no option) bounds the failed runs of the
# optimizers that count them. An option the chosen optimizer does not spend is refused
# (`check_budget_options`) and an artifact records only what it spends (`Budget.spent_by`).
OPTIMIZER_BUDGET: dict[str, tuple[str, ...]] = {
    "labeled": ("demos", "threads"),
    "bootstrap": ("demos", "max_rounds", "threads", "max_errors"),
    "random-search": ("demos", "max_rounds", "candidates", "threads", "max_errors"),
    "mipro": ("demos", "candidates", "trials", "minibatch_size", "threads", "max_errors"),
    "gepa": ("trials", "threads"),
}


def check_budget_options(optimizer: str, given: dict[str, Optional[int]]) -> None:
    """Budget options given (not None) that `optimizer` does not spend: a one-line error. `given`
    holds every budget option the command has but --threads, given or not."""
    spent = [name for name in OPTIMIZER_BUDGET[optimizer] if name in given]
    unused = [f"--{name.replace('_', '-')}" for name, value in given.items() if value is not None and name not in spent]
    if unused:
        raise BooklensError(f"the {optimizer} optimizer does not use {', '.join(unused)}; it spends "
                            f"{', '.join('--' + name.replace('_', '-') for name in spent)}")


# Optimizers whose only choice is the demos: with none to pick, what they return is the zero-shot program.
DEMO_PICKERS = ("labeled", "bootstrap", "random-search")


@dataclass(frozen=True)
class Budget:
    """How much an optimizer may spend. The defaults finish in minutes with the embedded model."""

    demos: int = 3  # demos per predictor (bootstrapped first, then annotated ones)
    candidates: int = 3  # random-search: shuffled demo sets (and 3 fixed ones); mipro: instruction/demo sets
    trials: int = 4  # mipro: search trials; gepa: reflective proposals
    threads: int = 2  # examples evaluated at once
    max_rounds: int = 1  # bootstrap attempts per training example
    minibatch_size: int = 0  # mipro: score trials on this many dev examples (0: the whole dev set)
    max_errors: int = 0  # failed runs tolerated before an optimizer stops (0: as many as there are examples)

    def validate(self) -> None:
        for least, names in ((0, ("demos", "candidates", "trials", "minibatch_size", "max_errors")),
                             (1, ("threads", "max_rounds"))):
            for name in names:
                value = getattr(self, name)
                if value < least:  # named as the command's option (`--max-rounds`) or this field
                    bound = "0 or more" if least == 0 else f"at least {least}"
                    raise BooklensError(f"{setting_name('--' + name.replace('_', '-'))} must be {bound} (got {value})")

    def check_for(self, optimizer: str) -> None:
        """`validate`, and a budget the optimizer can spend: the ones that only pick demos are given
        some, and MIPROv2 a candidate and a trial. Checked before any LM call."""
        self.validate()
        if optimizer in DEMO_PICKERS and self.demos == 0:
            raise BooklensError(f"{setting_name('--demos')} 0 leaves the {optimizer} optimizer nothing to choose (it "
                                "picks demos and nothing else): the artifact would be the zero-shot program, which "
                                "evaluate runs as it is")
        if optimizer == "mipro" and (self.candidates < 1 or self.trials < 1):
            raise BooklensError(f"mipro needs {setting_name('--candidates')} and {setting_name('--trials')} of at "
                                "least 1")
        if optimizer == "gepa" and self.trials == 0:
            raise BooklensError(f"{setting_name('--trials')} 0 leaves the gepa optimizer nothing to do (its trials are "
                                "its reflective proposals): the artifact would be the zero-shot program, which "
                                "evaluate runs as it is")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def with_error_limit(self, examples: int) -> "Budget":
        """This budget with the failed-run limit it applies over `examples` (train and dev) spelled
        out: 0 stands for one more than every run the optimizer may make, and a record would show 0."""
        import dataclasses

        if self.max_errors:
            return self
        return dataclasses.replace(self, max_errors=(examples + 1) * max(1, self.max_rounds))

    def spent_by(self, optimizer: str) -> dict[str, int]:
        """The fields `optimizer` spends (`OPTIMIZER_BUDGET`), in this class's order: what an
        artifact records, since the others did nothing."""
        spent = OPTIMIZER_BUDGET[optimizer]
        return {name: value for name, value in self.as_dict().items() if name in spent}


def gepa_available() -> bool:
    try:
        from dspy.teleprompt import GEPA  # noqa: F401
    except Exception:
        return False
    return True


def check_optimizer(name: str) -> str:
    name = (name or "").strip().lower()
    if name not in OPTIMIZERS:
        raise BooklensError(f"unknown optimizer '{name}': choose one of {', '.join(OPTIMIZERS)}")
    if name == "gepa" and not gepa_available():
        raise BooklensError("optimizer 'gepa' needs a DSPy release with GEPA and the gepa package installed")
    return name


class Scoring:
    """What the optimizer's metric calls came to: how many had a score, and why the others had
    none (`NoScore`). Optimizers call the metric from threads of their own."""

    def __init__(self) -> None:
        self.scored = 0
        self.unscored: list[str] = []
        self._lock = threading.Lock()

    def score(self, metric: Callable[..., Any], *args: Any) -> tuple[float | None, str | None]:
        """The metric's score, or None and why (counted) when it has none."""
        try:
            value = score_of(metric(*args))
        except NoScore as exc:
            reason = first_line(exc)
            with self._lock:
                self.unscored.append(reason)
            return None, reason
        with self._lock:
            self.scored += 1
        return value, None

    def check(self, optimizer: str) -> None:
        """An optimizer that got no score on any run has chosen on nothing: a one-line error, as
        an evaluation that failed on every example is (`evaluate_program`)."""
        if self.unscored and not self.scored:
            raise BooklensError(f"compiling with {optimizer} failed on every example it scored; the first failure: "
                                f"no score: {self.unscored[0]}")


def as_metric(metric: Callable[..., Any], scoring: Scoring | None = None) -> Callable[..., float]:
    """The task metric as DSPy optimizers call it: (example, prediction, trace=None) -> float.

    A run the metric has no score for (`NoScore`) is counted in `scoring` and gets 0: what every
    DSPy optimizer makes of a run whose metric raised (never a demo; DSPy's failure score, 0, in a
    candidate's mean), without DSPy logging the whole example (a book) as an error.
    `Scoring.check` refuses a compile that got no score at all."""
    scoring = scoring or Scoring()

    def dspy_metric(example, prediction, trace=None):
        score, _ = scoring.score(metric, example, prediction, trace)
        return 0.0 if score is None else score

    dspy_metric.__name__ = getattr(metric, "__name__", "metric")
    return dspy_metric


def as_gepa_metric(metric: Callable[..., Any], feedback: Callable[..., str] | None = None,
                   scoring: Scoring | None = None) -> Callable[..., Any]:
    """GEPA's five-argument metric; with `feedback`, the reflection step reads why a run scored as it did."""
    scoring = scoring or Scoring()

    def gepa_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        score, reason = scoring.score(metric, gold, pred, trace)
        if score is None:  # as in `as_metric`; the reflection reads why
            return 0.0 if feedback is None else dspy.Prediction(score=0.0, feedback=f"No score: {reason}")
        if feedback is None:
            return score
        return dspy.Prediction(score=score, feedback=feedback(gold, pred, score))

    return gepa_metric


_OPTIMIZER_PACKAGES = ("dspy", "gepa", "optuna")


@contextlib.contextmanager
def _quiet(verbose: bool):
    """DSPy optimizers print progress to stdout and draw tqdm bars on stderr; keep stdout for
    results, and drop both unless verbose."""
    levels = {n: logging.getLogger(n).level for n in _OPTIMIZER_PACKAGES}
    sink = sys.stderr if verbose else io.StringIO()
    try:
        if not verbose:
            for n in _OPTIMIZER_PACKAGES:
                logging.getLogger(n).setLevel(logging.WARNING)
        with contextlib.redirect_stdout(sink), (contextlib.nullcontext() if verbose else _no_progress_bars()):
            yield
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


@contextlib.contextmanager
def _logged_briefly(halt: list):
    """DSPy logs a failed run with its whole example (a book or a summary on real data, over many
    lines): such a record says only the error, in one line, as the run goes on. Once a failure
    stops the compile (`halt`), the optimizer packages log no more, before the one-line error."""
    from booklens.errors import first_line

    class Brief(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if halt:
                return False
            failure = sys.exc_info()[1]  # logged from the handler of the run's exception
            ours = record.name.split(".")[0] in _OPTIMIZER_PACKAGES
            if failure is not None and ours and record.levelno >= logging.ERROR:
                record.msg, record.args = f"a program run failed on one example: {first_line(failure)}", ()
                record.exc_info = record.exc_text = None
            return True

    stop = Brief()
    handlers = {h for n in (*_OPTIMIZER_PACKAGES, "") for h in logging.getLogger(n).handlers}
    for handler in handlers:
        handler.addFilter(stop)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(stop)


@contextlib.contextmanager
def _no_progress_bars():
    """The optimizer packages' tqdm bars disabled while compiling. They write to stderr, which
    also carries booklens' own messages, so the bars are switched off where those packages look
    tqdm up (`import tqdm` or `from tqdm import tqdm`) rather than stderr being silenced."""
    import types

    import tqdm

    def silent(cls: type) -> type:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            cls.__init__(self, *args, **kwargs)

        return type(cls.__name__, (cls,), {"__init__": __init__})

    shim = types.ModuleType("tqdm")
    shim.__dict__.update(vars(tqdm))
    shim.tqdm = silent(tqdm.tqdm)
    replaced: list[tuple[Any, str, Any]] = []
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in _OPTIMIZER_PACKAGES:
            continue
        for attr, value in list(vars(module).items()):
            if value is tqdm:
                replaced.append((module, attr, value))
                setattr(module, attr, shim)
            elif isinstance(value, type) and issubclass(value, tqdm.tqdm):
                replaced.append((module, attr, value))
                setattr(module, attr, silent(value))
    try:
        yield
    finally:
        for module, attr, value in replaced:
            setattr(module, attr, value)


def seeded_order(examples: Sequence[dspy.Example], seed: int) -> list[dspy.Example]:
    """The training examples in a seed-determined order (optimizers take demos from the front)."""
    order = list(examples)
    random.Random(seed).shuffle(order)
    return order


def check_dev_set(optimizer: str, devset: Sequence[Any], empty: str = "the dev set is empty",
                  budget: Budget | None = None) -> None:
    """The optimizers that choose among candidates on a dev set refuse an empty one (`empty` says whose),
    and mipro a minibatch larger than it (the trials would be scored on the whole set, not as recorded)."""
    from booklens.optimizers.artifacts import DEV_CHOOSERS

    if optimizer in DEV_CHOOSERS and not devset:
        raise BooklensError(f"optimizer '{optimizer}' chooses among candidates on a dev set, and {empty}")
    if optimizer == "mipro" and budget is not None and budget.minibatch_size > len(devset):
        raise BooklensError(f"{setting_name('--minibatch-size')} {budget.minibatch_size} is more than the "
                            f"{len(devset)} examples of the dev set: give at most {len(devset)}, or 0 for all of them")


def fit_train_set(optimizer: str, budget: Budget, trainset: Sequence[Any], *, asked: bool,
                  what: str = "the training set") -> Budget:
    """The budget `optimizer` can spend on `trainset`, where every demo comes from: an empty set is
    refused (`what` says whose), and so is asking (`asked`) for more demos than it holds, which would
    be recorded and never spent; a default above its size is cut to it, so the record says what was spent."""
    import dataclasses

    if not trainset:
        raise BooklensError(f"{what} is empty")
    if "demos" not in OPTIMIZER_BUDGET[optimizer] or budget.demos <= len(trainset):
        return budget
    if asked:
        raise BooklensError(f"{setting_name('--demos')} {budget.demos} asks for more demos than the {len(trainset)} "
                            f"examples of {what} it picks them from: give at most {len(trainset)}, or a larger "
                            f"{setting_name('--train-size')}")
    return dataclasses.replace(budget, demos=len(trainset))


def compile_program(
    task: Any,
    trainset: Sequence[dspy.Example],
    devset: Sequence[dspy.Example] | None = None,
    *,
    optimizer: str = "bootstrap",
    budget: Budget | None = None,
    seed: int = 0,
    program: dspy.Module | None = None,
    metric: Callable[..., Any] | None = None,
    meter: UsageTracker | None = None,
    verbose: bool = False,
) -> dspy.Module:
    """Compile `program` (default: the task's zero-shot program) on `trainset`, choosing among
    candidates on `devset`, with the optimizer named `optimizer`. Uses the configured LM.

    `task` is a task name from `booklens.optimizers.tasks` or a `Task`. Returns a new program;
    the one passed in is not changed."""
    from booklens.lm import current_lm
    from booklens.optimizers.tasks import get_task

    spec = get_task(task) if isinstance(task, str) else task
    name = check_optimizer(optimizer)
    asked = budget is not None
    budget = budget or spec.default_budget()
    budget.check_for(name)
    trainset = seeded_order(trainset, seed)
    devset = list(devset or [])
    budget = fit_train_set(name, budget, trainset, asked=asked)
    check_dev_set(name, devset, budget=budget)
    student = program if program is not None else spec.build_program()
    base_metric = metric or spec.metric
    scoring = Scoring()
    dspy_metric = as_metric(base_metric, scoring)
    max_errors = budget.with_error_limit(len(trainset) + len(devset)).max_errors
    # DSPy's optimizers take a failed run for a bad example and go on; a backend failure (after its
    # retries) would leave a program chosen on the runs before it. It stops the compile instead, as it
    # stops an evaluation, and a rerun finds the calls made so far in the cache.
    halt: list[LMError] = []
    lm = metered(current_lm(), meter, halt=halt)

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass

    # Before the first call, as `score` does: not a summary found too long mid-compile.
    spec.refuse_misfits(student, [*trainset, *devset], getattr(lm, "context_window", None))
    callbacks = [*(dspy.settings.get("callbacks") or []), _HaltOnOversizePrompt(halt)]
    with dspy.context(lm=lm, callbacks=callbacks), _quiet(verbose), _logged_briefly(halt):
        _smoke(student, trainset[0])
        try:
            compiled = _run(name, student, trainset, devset, budget, seed, dspy_metric, base_metric, spec,
                            max_errors, lm, scoring)
        except BackendFailed:
            raise halt[0] from None
        except KeyboardInterrupt:
            raise
        except BooklensError:
            if halt:
                raise halt[0] from None
            raise
        except Exception as exc:
            if halt:
                raise halt[0] from None
            # DSPy wraps program failures (including backend errors) in its own exceptions.
            cause = _root_cause(exc)
            if isinstance(cause, BooklensError):
                raise cause from None
            raise BooklensError(f"optimizer '{name}' failed: {type(cause).__name__}: {first_line(cause)}") from None
    if halt:
        raise halt[0]
    scoring.check(name)
    return _strip(compiled)


class _HaltOnOversizePrompt(BaseCallback):
    """A prompt too large for the context window that leaves a whole program run (no step of the
    program handled it; `evaluate_program` stops on it) goes into `halt`: the run's setup, not one
    bad example for the optimizer to count as failed. The metered LM then lets no call out."""

    def __init__(self, halt: list) -> None:
        self.halt = halt

    def on_module_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        # DSPy has already restored the caller's call id: none means the outermost module ended.
        if isinstance(exception, ContextWindowExceeded) and ACTIVE_CALL_ID.get() is None and not self.halt:
            self.halt.append(exception)


def _smoke(program: dspy.Module, example: dspy.Example) -> None:
    """Run the program once before optimizing: a backend that cannot work (bad key, a prompt
    larger than the context window) stops here with its own message, not after every example
    has failed inside an optimizer that reports only that it gave up."""
    try:
        copy.deepcopy(program)(**example.inputs())
    except LMError:
        raise
    except Exception:  # a bad answer is the optimizer's business
        pass


def _run(name: str, student: dspy.Module, trainset: list, devset: list, budget: Budget, seed: int,
         dspy_metric: Callable, base_metric: Callable, spec: Any, max_errors: int, lm: Any,
         scoring: Scoring) -> dspy.Module:
    from dspy.teleprompt import BootstrapFewShot, BootstrapFewShotWithRandomSearch, LabeledFewShot, MIPROv2

    threshold = getattr(spec, "bootstrap_threshold", None)
    if name == "labeled":
        return LabeledFewShot(k=budget.demos).compile(student, trainset=trainset, sample=False)
    if name == "bootstrap":
        return BootstrapFewShot(
            metric=dspy_metric, metric_threshold=threshold, max_bootstrapped_demos=budget.demos,
            max_labeled_demos=budget.demos, max_rounds=budget.max_rounds, max_errors=max_errors,
        ).compile(student, trainset=trainset)
    if name == "random-search":
        return BootstrapFewShotWithRandomSearch(
            metric=dspy_metric, metric_threshold=threshold, max_bootstrapped_demos=budget.demos,
            max_labeled_demos=budget.demos, max_rounds=budget.max_rounds, num_candidate_programs=budget.candidates,
            num_threads=budget.threads, max_errors=max_errors,
        ).compile(student, trainset=trainset, valset=devset)
    if name == "mipro":
        minibatch = 0 < budget.minibatch_size < len(devset)
        optimizer = MIPROv2(
            metric=dspy_metric, metric_threshold=threshold, auto=None, num_candidates=budget.candidates,
            max_bootstrapped_demos=budget.demos, max_labeled_demos=budget.demos, num_threads=budget.threads,
            max_errors=max_errors, seed=seed, verbose=False, track_stats=False,
        )
        return optimizer.compile(
            student, trainset=trainset, valset=devset, num_trials=budget.trials, seed=seed,
            minibatch=minibatch, minibatch_size=budget.minibatch_size or len(devset),
            minibatch_full_eval_steps=max(1, budget.trials // 2),
            # The source code of a booklens program is long and a small model gains nothing from it.
            program_aware_proposer=False, view_data_batch_size=min(5, len(trainset)),
        )
    if name == "gepa":
        from dspy.teleprompt import GEPA

        minibatch = max(1, min(3, len(trainset)))
        # Room for the first full dev evaluation and `trials` rounds of reflection: each scores a
        # minibatch before and after the proposal and, when it improves, the whole dev set.
        max_calls = len(devset) + budget.trials * (2 * minibatch + len(devset))
        reflection = lm.copy(temperature=0.7)
        optimizer = GEPA(
            metric=as_gepa_metric(base_metric, getattr(spec, "feedback", None), scoring),
            max_metric_calls=max_calls, reflection_lm=reflection, reflection_minibatch_size=minibatch,
            num_threads=budget.threads, seed=seed, track_stats=False, use_merge=False,
            warn_on_score_mismatch=False,
        )
        return optimizer.compile(student, trainset=trainset, valset=devset)
    raise BooklensError(f"unknown optimizer '{name}'")  # pragma: no cover - check_optimizer ran


def _strip(program: dspy.Module) -> dspy.Module:
    """Drop what optimizers attach for inspection (candidate lists, logs): only the state is the result."""
    for attr in ("candidate_programs", "mb_candidate_programs", "trial_logs", "detailed_results", "score",
                 "prompt_model_total_calls", "total_calls"):
        if attr in program.__dict__:
            delattr(program, attr)
    for _, predictor in program.named_predictors():
        predictor.lm = None  # the LM is chosen when the program runs, never baked into the artifact
        predictor.demos = usable_demos(predictor)
    return program


def usable_demos(predictor: dspy.Predict) -> list[dspy.Example]:
    """The predictor's demos cut to its signature's fields. A demo with no input or no output
    field of the signature is dropped: the adapter would never show it (labeled examples of a
    whole program land on every predictor, also on those that need other fields)."""
    signature = predictor.signature
    fields = set(signature.fields)
    kept = []
    for demo in predictor.demos:
        keys = set(demo.keys()) if hasattr(demo, "keys") else set()
        if not keys & set(signature.input_fields) or not keys & set(signature.output_fields):
            continue
        kept.append(dspy.Example(**{k: demo[k] for k in demo.keys() if k in fields or k == "augmented"}))
    return kept


def _root_cause(exc: BaseException) -> BaseException:
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or exc.__context__
        if nxt is None or isinstance(exc, (BooklensError, LMError)):
            break
        exc = nxt
    return exc
