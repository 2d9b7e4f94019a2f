"""The compilable tasks: for each, how to build its program, load its annotated examples split
by book, and score a prediction against an example (the metric evaluation also reports).

| task            | program (what artifacts load into)       | examples (`--data`)                          | metric |
|-----------------|------------------------------------------|----------------------------------------------|--------|
| `coherence`     | `CoherenceScorer` (`booklens score`)     | BooookScore human annotations, one per sentence | `confusion_match`: the human verdict (and error types) |
| `verification`  | `ClaimVerifier` (`booklens verify`/`check`) | FABLES claims with the annotators' evidence quotes | the human label (faithful/unfaithful) |
| `decomposition` | `ClaimDecomposer` (`booklens claims`)    | FABLES summaries and their claims            | claim-match F1 |
| `summarize`     | `HierarchicalSummarizer` (`booklens summarize`) | a folder of books (.txt, .epub)      | BooookScore of the summary by the confusion detector |

Splits are by book with `booklens.data.splits.split_by_book` (40/20/40 % of the books, seed 0
unless told), so no book is in two splits. Each split is then cut to a small subset with the same
seed (balanced over the labels where the labels are skewed) so that compiling and evaluating with
the embedded model take minutes; the sizes are options and are recorded in the artifact.
Default subsets (train / dev / test):

- coherence: 8 / 6 / 24 sentences, at most six from each summary, half of them confusing
  (every prompt holds the whole summary, so few summaries with several sentences each is what
  a slow local model can afford);
- verification: 24 / 12 / 24 claims, half faithful and half unfaithful;
- decomposition: 8 / 4 / 8 summaries; summarize: 2 / 1 / 2 books.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import dspy

from booklens.data.splits import SPLITS
from booklens.errors import BooklensError
from booklens.vocabulary import DEFAULT_CHUNK_SIZE, DEFAULT_CONTEXT_WINDOW, DEFAULT_SUMMARY_TOKENS

# The settings of the summarizer a summarize program is built on and recorded with, and their
# defaults (booklens's, as `summarize` has them): `get_task("summarize", **settings)` takes others.
SUMMARIZER_DEFAULTS = {"chunk_size": DEFAULT_CHUNK_SIZE, "context_window": DEFAULT_CONTEXT_WINDOW,
                       "max_summary_tokens": DEFAULT_SUMMARY_TOKENS}


@dataclass
class Task:
    name: str
    description: str
    metric_name: str
    build_program: Callable[[], dspy.Module]
    # data path, seed -> {"train": [...], "dev": [...], "test": [...]} of dspy.Examples, split by book
    load_splits: Callable[[Path, int], dict[str, list[dspy.Example]]]
    metric: Callable[..., Any]
    sizes: dict[str, int] = field(default_factory=lambda: {"train": 24, "dev": 12, "test": 24})
    stratify: str | None = None  # example field to balance subsets over
    group: str = "book"
    per_group: int | None = None  # subsets: at most this many examples per `subset_group`
    subset_group: str | None = None  # the field examples sharing a long context have in common
    # Example fields that name the unit intervals resample (the summary: its sentences, or its
    # claims, are not independent), and the unit's name in plural; () for one unit per example.
    interval_unit: tuple[str, ...] = ()
    interval_unit_name: str = "examples"
    feedback: Callable[..., str] | None = None  # for GEPA: why a prediction scored as it did
    # Why the program gave no answer on an example, else None: the judges and the decomposer
    # return their error in the prediction instead of raising (`evaluate_program` counts it).
    failure: Callable[[Any], str | None] | None = None
    # What a run said of the examples beside its answers, one line each (`evaluate_program(notes=...)`):
    # the confusion detector's demos left out to fit a summary in the context window.
    notes: Callable[[Sequence[dspy.Example], Sequence[Any]], list[str]] | None = None
    bootstrap_threshold: float | None = None  # bootstrap keeps a run as a demo when metric >= this
    data_help: str = ""
    # The files `load_splits` reads from a data path (the dataset an artifact records is their
    # digest, so that a folder's other files or another name for the same files change nothing);
    # None: the path's own digest.
    data_files: Callable[[Path], list[Path]] | None = None
    program_config: dict[str, Any] = field(default_factory=dict)
    # Budget defaults of this task where they differ from `Budget`'s (a task with long prompts
    # needs a smaller one to compile in minutes on the embedded model).
    budget: dict[str, int] = field(default_factory=dict)
    # The long texts the examples' prompts carry, one (name as a refusal shows it, text) pair per
    # text, which `refuse_misfits` checks against the model's window; None: nothing to check.
    contexts: Callable[[Sequence[dspy.Example]], list[tuple[str, str]]] | None = None
    # What a program must fit whatever the examples, checked with the model's window (None: unknown)
    # before the first call: the summarizer's window and budgets, as `summarize` checks them.
    fits: Callable[[dspy.Module, int | None], None] | None = None

    def refuse_misfits(self, program: dspy.Module, examples: Sequence[dspy.Example], window: int | None,
                       **setting: Any) -> None:
        """Refuse, before the first call, a program whose settings do not fit a `window`-token
        context (`fits`), and a text of `examples` that `program` cannot judge in it even with no
        demo, as `score` does (`booklens.programs.coherence.refuse_misfits`): not after judging the
        ones before it. `setting`: the option that set the window (`booklens.lm.base.window_setting`)."""
        if self.fits is not None:
            self.fits(program, window)
        if self.contexts is None:
            return
        from booklens.programs.coherence import refuse_misfits

        refuse_misfits(program, self.contexts(examples), window, **setting)

    def units(self, examples: Sequence[dspy.Example]) -> list[str] | None:
        """The interval unit of each example (`evaluate_program(units=...)`), or None."""
        if not self.interval_unit:
            return None
        import json

        return [json.dumps([e.get(f) for f in self.interval_unit], default=str) for e in examples]

    def default_budget(self, **overrides: Optional[int]):
        """The task's default budget with the given (non-None) values on top."""
        from booklens.optimizers.compile import Budget

        values = {**self.budget, **{k: v for k, v in overrides.items() if v is not None}}
        return Budget(**values)


@dataclass
class Splits:
    train: list[dspy.Example]
    dev: list[dspy.Example]
    test: list[dspy.Example]
    info: dict[str, Any]

    def get(self, name: str) -> list[dspy.Example]:
        if name not in SPLITS:
            raise BooklensError(f"unknown split '{name}': choose one of {', '.join(SPLITS)}")
        return getattr(self, name)

    def dropping(self, name: str) -> "Splits":
        """The same splits with `name` left empty, and the record saying so: a split nothing
        runs on (compile --no-test) is not recorded with the size it would have had."""
        info = {**self.info, **{key: {**self.info[key], name: 0} for key in ("sizes", "groups")}}
        parts = {split: ([] if split == name else self.get(split)) for split in SPLITS}
        return Splits(parts["train"], parts["dev"], parts["test"], info)


# ---------------------------------------------------------------------------
# Subsets


def subsample(examples: Sequence[dspy.Example], size: int | None, *, seed: int, stratify: str | None = None,
              group: str | None = None, per_group: int | None = None) -> list[dspy.Example]:
    """`size` examples picked with `seed` (all when size is None or 0 or larger than the split),
    spread evenly over the values of `stratify` when given, returned in their original order
    (so examples of the same summary stay next to each other and share a prompt prefix).

    With `group` and `per_group`, whole groups (e.g. summaries) are drawn in a seeded order and
    up to `per_group` examples taken from each: fewer distinct long contexts to read, which is
    what an evaluation with a slow local model pays for most."""
    examples = list(examples)
    if not size or size >= len(examples):
        return examples
    rng = random.Random(seed)
    indices = list(range(len(examples)))
    if group and per_group:
        groups: dict[Any, list[int]] = {}
        for i in indices:
            groups.setdefault(_hashable(examples[i].get(group)), []).append(i)
        keys = sorted(groups, key=str)
        rng.shuffle(keys)
        if stratify:  # groups that can give an even share of every label first (a stable sort)
            labels = sorted({_hashable(e.get(stratify)) for e in examples}, key=str)
            share = max(1, per_group // len(labels))

            def uneven(key: Any) -> bool:
                values = [_hashable(examples[i].get(stratify)) for i in groups[key]]
                return any(values.count(label) < share for label in labels)

            keys.sort(key=uneven)
        chosen: list[int] = []
        for key in keys:
            if len(chosen) >= size:
                break
            take = min(per_group, size - len(chosen))
            chosen += _balanced([examples[i] for i in groups[key]], groups[key], take, rng, stratify)
    else:
        chosen = _balanced(examples, indices, size, rng, stratify)
    return [examples[i] for i in sorted(chosen)]


def _balanced(items: Sequence[dspy.Example], indices: Sequence[int], size: int, rng: random.Random,
              stratify: str | None) -> list[int]:
    """`size` of `indices` drawn with `rng`, round-robin over the values of `stratify`."""
    if stratify is None:
        return rng.sample(list(indices), min(size, len(indices)))
    strata: dict[Any, list[int]] = {}
    for item, i in zip(items, indices):
        strata.setdefault(_hashable(item.get(stratify)), []).append(i)
    pools = [rng.sample(v, len(v)) for _, v in sorted(strata.items(), key=lambda kv: str(kv[0]))]
    chosen: list[int] = []
    while len(chosen) < size and any(pools):
        for pool in pools:  # as balanced as the strata's sizes allow
            if pool and len(chosen) < size:
                chosen.append(pool.pop())
    return chosen


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def load_task_splits(task: Task, data: str | Path, *, seed: int = 0, sizes: dict[str, int | None] | None = None
                     ) -> Splits:
    """The task's examples split by book, each split cut to its subset size."""
    from booklens.records import present

    path = Path(data)
    if not present(path):
        raise BooklensError(f"data not found: {path}" + (f" ({task.data_help})" if task.data_help else ""))
    full = task.load_splits(path, seed)
    wanted = {**task.sizes, **{k: v for k, v in (sizes or {}).items() if v is not None}}
    picked = {name: subsample(full.get(name, []), wanted.get(name), seed=seed, stratify=task.stratify,
                              group=task.subset_group, per_group=task.per_group)
              for name in SPLITS}
    info = {
        "seed": seed,
        "by": task.group,
        "fractions": _fractions(),
        "stratify": task.stratify,
        "per_group": task.per_group,
        "sizes": {name: len(picked[name]) for name in SPLITS},
        "available": {name: len(full.get(name, [])) for name in SPLITS},
        "groups": {name: len({_hashable(e.get(task.group)) for e in picked[name]}) for name in SPLITS},
    }
    info["dataset"] = {"path": str(path), "sha256": data_digest(task, path)}
    return Splits(picked["train"], picked["dev"], picked["test"], info)


def check_asked_sizes(task: Task, splits: Splits, asked: dict[str, tuple[str, int | None]], data: str | Path) -> None:
    """Refuse a size the user gave (`asked`: split -> (option, value)) above the examples its split
    holds, or above what its subset takes at `task.per_group` a group, before any call: it would run
    on fewer than asked. 0 (all) and the defaults pass."""
    available, picked = splits.info.get("available") or {}, splits.info.get("sizes") or {}
    seed = f"split by book with seed {splits.info.get('seed')}"
    for name, (option, value) in asked.items():
        held, got = available.get(name), picked.get(name)
        what = "training" if name == "train" else name
        if value and isinstance(held, int) and value > held:
            raise BooklensError(f"{option} {value} asks for more examples than the {held} of the {what} split of "
                                f"{data} ({seed}): give at most {held}, or 0 for all of them")
        if value and isinstance(got, int) and got < value:  # a subset capped per summary (`per_group`)
            raise BooklensError(f"{option} {value} asks for more examples than the {got} the {what} split of {data} "
                                f"gives at {task.per_group} per {task.subset_group} ({seed}): give at most {got}, "
                                f"or 0 for all {held} of them")


def learned_groups(task: Task, data: str | Path, block: dict[str, Any], dev_too: bool) -> set[Any] | None:
    """The groups (`task.group`: books) of the examples an artifact learned from, drawn again as
    compile drew them from this data: its train split (and dev, where its optimizer chose on it),
    with its recorded seed and sizes. None when the artifact records no seed."""
    seed = block.get("seed")
    if not isinstance(seed, int):
        return None
    recorded = (block.get("split") or {}).get("sizes") if isinstance(block.get("split"), dict) else None
    sizes = {name: n for name, n in (recorded or {}).items() if name in SPLITS and isinstance(n, int) and n > 0}
    splits = load_task_splits(task, data, seed=seed, sizes=sizes)
    learned = list(splits.train) + (list(splits.dev) if dev_too else [])
    return {_hashable(e.get(task.group)) for e in learned}


def split_groups(task: Task, examples: list[Any], among: set[Any]) -> tuple[int, int]:
    """(examples, distinct groups) of `examples` whose group is in `among`."""
    hits = [group for group in (_hashable(e.get(task.group)) for e in examples) if group in among]
    return len(hits), len(set(hits))


def data_files(task: Task, data: str | Path) -> list[Path]:
    """The files the task reads from a data path (FABLES.json, whether named itself or by its folder)."""
    path = Path(data)
    return task.data_files(path) if task.data_files is not None else [path]


def data_digest(task: Task, data: str | Path) -> str:
    """sha256 of the data the task reads from `data`: of the file when it reads one (wherever it was
    named from: FABLES.json or its folder), of the files' names and digests when it reads several."""
    import hashlib

    from booklens.optimizers.artifacts import sha256_of

    files = data_files(task, data)
    if len(files) == 1:
        return sha256_of(files[0])
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda f: f.name):
        digest.update(file.name.encode("utf-8") + b"\0" + sha256_of(file).encode("ascii"))
    return digest.hexdigest()


def same_data_digests(digest: str, data: str | Path, recorded: Sequence[Optional[str]]) -> set[str]:
    """The digests that say an artifact was compiled on `data`, whose `data_digest` is `digest`: that
    one, and the digest of the whole path when one of the `recorded` digests is neither (what
    artifacts of earlier versions recorded for a folder)."""
    from booklens.optimizers.artifacts import sha256_of

    same = {digest}
    if any(r not in (None, digest) for r in recorded):
        same.add(sha256_of(data))
    return same


def _fractions() -> dict[str, float]:
    from booklens.data.splits import DEFAULT_FRACTIONS

    return dict(DEFAULT_FRACTIONS)


# ---------------------------------------------------------------------------
# Coherence: confusion detection per sentence against BooookScore human annotations


COHERENCE_DATA = "a BooookScore human annotation file such as summary-gpt4-4096-inc.json, or a folder of them"


def _coherence() -> Task:
    from booklens.programs.coherence import build_scorer

    def build():
        return build_scorer(batch_size=1, concurrency=1)

    return Task(
        name="coherence",
        description="confusion detection per summary sentence (BooookScore human annotations)",
        metric_name="confusion match",
        build_program=build,
        load_splits=_coherence_splits,
        metric=_coherence_metric(),
        failure=_coherence_failure,
        notes=_coherence_notes,
        sizes={"train": 8, "dev": 6, "test": 24},
        stratify="verdict",
        subset_group="summary",
        per_group=6,  # six sentences of each summary read: the summary is most of every prompt
        interval_unit=("summary",),
        interval_unit_name="summaries",
        # Every demo carries a whole summary (about 1,000 tokens), so each demo and each dev run
        # costs more here than in any other task: a smaller budget keeps random search and
        # MIPROv2 within 20 minutes on the embedded model.
        budget={"demos": 2, "candidates": 2, "trials": 3},
        feedback=_coherence_feedback,
        bootstrap_threshold=0.5,  # the verdict agrees with the humans
        data_help=COHERENCE_DATA,
        data_files=_annotation_files,
        program_config={"batch_size": 1},
        contexts=_coherence_summaries,
    )


def _coherence_summaries(examples: Sequence[dspy.Example]) -> list[tuple[str, str]]:
    """Each summary the examples' sentences come from, once, named by book and annotation file."""
    named: dict[str, str] = {}
    for e in examples:
        source = e.get("source")
        named.setdefault(f"{e.get('book')!r}" + (f" of {source}" if source else ""), e.get("summary"))
    return list(named.items())


def _coherence_metric() -> Callable[..., float]:
    from booklens.metrics.agreement import confusion_match

    def coherence_metric(example, prediction, trace=None) -> float:
        """`confusion_match` on the scorer's answer for the example's sentence: 1 for a matching
        "no confusion"; 0.5 + 0.5 x error-type overlap for a matching "confusion"; 0 otherwise,
        also when no valid answer came (the sentence is then never counted as agreeing)."""
        annotations = getattr(prediction, "annotations", None) or []
        if not annotations or annotations[0].confusing is None:
            return 0.0
        answer = annotations[0]
        verdict = dspy.Prediction(verdict="confusion" if answer.confusing else "no confusion",
                                  error_types=list(answer.types))
        return float(confusion_match(example, verdict, trace))

    return coherence_metric


def _coherence_failure(prediction) -> str | None:
    annotations = getattr(prediction, "annotations", None) or []
    if not annotations:
        return "no verdict on the sentence"
    if annotations[0].status != "ok" or annotations[0].confusing is None:
        return annotations[0].error or "no valid verdict on the sentence"
    return None


def _coherence_notes(examples: Sequence[dspy.Example], predictions: Sequence[Any]) -> list[str]:
    """`score`'s note on the demos the judge left out, once per summary it left them out for (every
    sentence of a summary keeps the same demos: `judged_room`), named by book and annotation file."""
    from booklens.programs.coherence import demos_note

    notes: dict[str, str] = {}
    for example, prediction in zip(examples, predictions):
        note = demos_note(prediction) if prediction is not None else None
        if note:
            source = example.get("source")
            notes.setdefault(f"{example.get('book')!r}" + (f" ({source})" if source else ""), note)
    return [f"{name}: {note}" for name, note in notes.items()]


def _verification_failure(prediction) -> str | None:
    if getattr(prediction, "label", None) is None:
        return getattr(prediction, "error", None) or "no valid label"
    return None


def _decomposition_failure(prediction) -> str | None:
    return getattr(prediction, "error", None) or None


def _coherence_feedback(example, prediction, score) -> str:
    annotations = getattr(prediction, "annotations", None) or []
    said = "no answer" if not annotations or annotations[0].confusing is None else (
        "confusion" if annotations[0].confusing else "no confusion")
    gold = example.verdict
    text = f"Human annotators judged this sentence '{gold}'; the program answered '{said}'."
    if example.confusing:
        text += f" Their kinds of confusion: {', '.join(example.error_types) or 'unspecified'}."
        if example.questions:
            text += f" Their question: {example.questions[0]}"
    return text


def _coherence_splits(path: Path, seed: int) -> dict[str, list[dspy.Example]]:
    from booklens.cli.common import read_json_file
    from booklens.data.booookscore import SummariesNeeded, refuse_copies, results_from_json, to_examples
    from booklens.data.splits import split_by_book

    examples: list[dspy.Example] = []
    held: list[tuple[str, str, str]] = []
    for file in _annotation_files(path):
        try:
            results = results_from_json(read_json_file(file, "annotation file"), what=f"annotation file {file}")
        except SummariesNeeded as exc:  # compile and evaluate take no --summaries: say what they do take
            raise BooklensError(f"{exc}; the coherence task learns from {COHERENCE_DATA}") from None
        judges = sorted({r.annotator for r in results.values()} - {"human"})
        if judges:  # a model's verdicts (GPT-4's in the precision study, a `score` output) as gold labels
            raise BooklensError(f"{file} holds {' and '.join(map(repr, judges))} annotations, not human ones: the "
                                f"coherence task learns from {COHERENCE_DATA}")
        held.extend((file.name, book, r.summary) for book, r in results.items())
        refuse_copies(held, path)
        targets = {book: _prompt_targets(r) for book, r in results.items()}
        for e in to_examples(results):
            e["source"] = file.name  # the same book may be summarized twice (inc and hier): one split for both
            examples.append(_coherence_example(e, targets[e.book][e.index]))
    splits = split_by_book(examples, "book", seed=seed)
    return {name: list(items) for name, items in splits.items()}


def _annotation_files(path: Path) -> list[Path]:
    from booklens.data.booookscore import human_annotation_files

    return human_annotation_files(path)


def _prompt_targets(result) -> dict[int, str]:
    """Sentence index -> what `score` asks about that sentence of the annotated summary. The
    annotation lists every sentence of its summary as `score` cuts them (`split_sentences`), so
    the copies of a repeated sentence are found among the same sentences a run judges."""
    from booklens.programs.coherence import occurrence_targets

    sentences = sorted(result.sentences, key=lambda s: s.index)
    return dict(zip((s.index for s in sentences), occurrence_targets([s.sentence for s in sentences])))


def _coherence_example(example: dspy.Example, target: str) -> dspy.Example:
    """The scorer judges a list of sentences; here the list holds the one annotated sentence, and
    `targets` what a run of the whole summary asks about it (which copy, for a sentence the summary
    says more than once; the sentence itself otherwise). `sentence`, `verdict`, `questions` and
    `error_types` are the fields of the per-sentence predictor, so the example is also a complete
    labeled demo: its `sentence` is that target, the text the prompt shows, while the scorer
    records the plain sentence from `sentences`."""
    fields = dict(example.items())
    fields["sentences"] = [example.sentence]
    fields["targets"] = [target]
    fields["sentence"] = target
    return dspy.Example(**fields).with_inputs("summary", "sentences", "targets")


# ---------------------------------------------------------------------------
# FABLES: claim verification and claim decomposition


VERIFICATION_LABELS = ("Yes", "No")  # faithful / unfaithful, the claims the seed's Table 5 scores


def _fables_file(path: Path) -> list[Path]:
    from booklens.data.fables import found_fables_file

    return [found_fables_file(path)]


def _fables_summary_splits(path: Path, seed: int) -> dict[str, list]:
    from booklens.data.fables import load_fables, split_summaries

    return split_summaries(load_fables(_fables_file(path)[0]), seed=seed)


def _verification() -> Task:
    from booklens.metrics.fables import verification_metric
    from booklens.programs.faithfulness import build_verifier

    return Task(
        name="verification",
        description="claim verification against the annotators' evidence quotes (FABLES)",
        metric_name="label accuracy",
        build_program=build_verifier,
        load_splits=_verification_splits,
        metric=verification_metric,
        failure=_verification_failure,
        sizes={"train": 24, "dev": 12, "test": 24},
        stratify="label",
        interval_unit=("book", "summarizer"),  # a claim's summary, as calibrate resamples
        interval_unit_name="summaries",
        feedback=_verification_feedback,
        bootstrap_threshold=1.0,
        data_help="the FABLES release, FABLES.json",
        data_files=_fables_file,
    )


def _verification_splits(path: Path, seed: int) -> dict[str, list[dspy.Example]]:
    from booklens.data.fables import all_claims

    return {name: [_verification_example(c) for c in all_claims(summaries) if c.label in VERIFICATION_LABELS]
            for name, summaries in _fables_summary_splits(path, seed).items()}


def _verification_example(claim: Any) -> dspy.Example:
    from booklens.data.fables import verification_demo

    return verification_demo(claim)


def _verification_feedback(example, prediction, score) -> str:
    said = getattr(prediction, "label", None) or "no valid label"
    text = f"The human annotators labeled this claim '{example.label}'; the program answered '{said}'."
    reason = getattr(prediction, "reason", "")
    if reason:
        text += f" The program's reason: {reason}"
    return text


def _decomposition() -> Task:
    from booklens.metrics.fables import decomposition_metric
    from booklens.programs.faithfulness import build_decomposer

    return Task(
        name="decomposition",
        description="splitting a summary into atomic claims (FABLES summaries and claims)",
        metric_name="claim F1",
        build_program=build_decomposer,
        load_splits=_decomposition_splits,
        metric=decomposition_metric,
        failure=_decomposition_failure,
        sizes={"train": 8, "dev": 4, "test": 8},
        bootstrap_threshold=0.5,
        data_help="the FABLES release, FABLES.json",
        data_files=_fables_file,
    )


def _decomposition_splits(path: Path, seed: int) -> dict[str, list[dspy.Example]]:
    from booklens.data.fables import decomposition_examples

    return {name: decomposition_examples(summaries)
            for name, summaries in _fables_summary_splits(path, seed).items()}


# ---------------------------------------------------------------------------
# Summarization, judged by the confusion detector


def _summarize(*, chunk_size: int = DEFAULT_CHUNK_SIZE, context_window: int | None = None,
               max_summary_tokens: int = DEFAULT_SUMMARY_TOKENS) -> Task:
    """The task with its summarizer's settings; `context_window` None is the default window, which
    a model's smaller one refuses with the line `summarize` gives."""
    from booklens.programs.summarizer import make_summarizer

    settings = {"chunk_size": chunk_size, "max_summary_tokens": max_summary_tokens,
                "context_window": DEFAULT_CONTEXT_WINDOW if context_window is None else context_window}

    def build():
        return make_summarizer("hier", **settings)

    def fits(program, model_window: int | None) -> None:
        from booklens.steps import check_context_window

        check_context_window(context_window, model_window)
        if hasattr(program, "check_budgets"):  # a program of a caller's own has budgets of its own
            program.check_budgets()

    return Task(
        name="summarize",
        description="hierarchical summarization, scored by the BooookScore the confusion detector gives the summary",
        metric_name="BooookScore",
        build_program=build,
        load_splits=_book_splits,
        # No `failure`: the summarizer raises when it gives no summary, and a summary the judge gives
        # no valid verdict on is a failure the metric reports (`NoScore`), not a BooookScore of 0.
        metric=summary_coherence,
        sizes={"train": 2, "dev": 1, "test": 2},
        bootstrap_threshold=0.9,
        data_help="a folder of books (.txt or .epub) or one book",
        data_files=_book_files,
        program_config={"method": "hier", **{key: settings[key] for key in SUMMARIZER_DEFAULTS}},
        fits=fits,
    )


BOOK_SUFFIXES = (".txt", ".epub")


def _book_files(path: Path) -> list[Path]:
    """The books a data path names: the book, or the .txt and .epub files of the folder."""
    if path.is_file() and path.suffix.lower() not in BOOK_SUFFIXES:
        raise BooklensError(f"{path} is not a book: the summarize task takes a .txt or .epub book, or a folder "
                            "of them")
    files = [path] if path.is_file() else sorted(p for p in path.iterdir()
                                                   if p.is_file() and p.suffix.lower() in BOOK_SUFFIXES)
    if not files:
        raise BooklensError(f"no books (.txt or .epub) in {path}")
    return files


def _book_splits(path: Path, seed: int) -> dict[str, list[dspy.Example]]:
    from booklens.data.splits import split_by_book
    from booklens.text import read_book

    files = _book_files(path)
    examples = [dspy.Example(book=read_book(f), name=f.stem).with_inputs("book") for f in files]
    return split_by_book(examples, "name", seed=seed)


def summary_coherence(example, prediction, trace=None) -> float:
    """The BooookScore of the produced summary by the confusion detector (0 for a summary with no
    sentence). When the detector gave no valid verdict on any sentence, the summary has no score,
    as in `score` and `run` (`booklens.steps.sentences_judged_nothing`): `NoScore`, never a
    BooookScore of 0.
    The detector's own LM calls stay out of the optimizer's trace."""
    from booklens.optimizers.evaluate import NoScore
    from booklens.programs.coherence import build_scorer
    from booklens.steps import sentences_judged_nothing

    summary = getattr(prediction, "summary", "") or ""
    if not summary.strip():
        return 0.0
    with dspy.context(trace=None):
        scored = build_scorer(batch_size=4, concurrency=1)(summary=summary)
    reason = sentences_judged_nothing(len(scored.sentences), scored.n_failed,
                                      [a.error for a in scored.annotations if a.error])
    if reason:
        raise NoScore(reason)
    return float(scored.score or 0.0)  # 0 for a summary with no sentence, as for an empty one


# ---------------------------------------------------------------------------
# Registry


BUILDERS: dict[str, Callable[[], Task]] = {
    "coherence": _coherence,
    "verification": _verification,
    "decomposition": _decomposition,
    "summarize": _summarize,
}
_EXTRA: dict[str, Task] = {}


def task_names() -> list[str]:
    return list(BUILDERS) + [n for n in _EXTRA if n not in BUILDERS]


def register_task(task: Task) -> Task:
    """Add a task (tests and extensions); it shadows nothing built in."""
    if task.name in BUILDERS:
        raise ValueError(f"task '{task.name}' is built in")
    _EXTRA[task.name] = task
    return task


def task_settings(name: str) -> tuple[str, ...]:
    """The settings `get_task` takes for the task `name` (a canonical name): the summarizer's for
    summarize, none for the others."""
    return tuple(SUMMARIZER_DEFAULTS) if name == "summarize" else ()


def get_task(name: str, **settings: Any) -> Task:
    """The task `name` (or a command's name for it), built with `settings` where it takes them
    (`task_settings`); a setting it does not take is one line."""
    from booklens.optimizers.artifacts import canonical_task

    key = canonical_task((name or "").strip().lower())
    if key not in _EXTRA and key not in BUILDERS:
        raise BooklensError(f"unknown task '{name}': choose one of {', '.join(task_names())}")
    unknown = [s for s in settings if s not in task_settings(key)]
    if unknown:
        raise BooklensError(f"the {key} task takes no {', '.join(unknown)} setting"
                            f"{'s' if len(unknown) > 1 else ''}")
    if key in _EXTRA:
        return _EXTRA[key]
    try:
        return BUILDERS[key](**settings)
    except ImportError as exc:
        raise BooklensError(f"task '{key}' is not available in this installation: {exc}") from None
