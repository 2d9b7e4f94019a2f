"""A whole sweep: check the manifest, run every cell with an engine, write the aggregate.

    DIR/sweep.json      the resolved plan: books (key -> file), systems, judge, default LM, the
                        server of each LM, digests of the books, given summaries and programs
    DIR/cells/<system>/<book>/   each cell's run directory (the files `booklens run` writes)
    DIR/cells.jsonl     one flat line per cell: status, error, scores, LM work
    DIR/results.json    per system and per pair of systems, with bootstrap intervals over books
    DIR/report.html     the sweep's page, linking to each cell's report.html

A sweep holds a lock on DIR while it writes it: a second one into DIR at once is refused.

Everything a user can get wrong is checked before anything is written or any model loads. A
rerun resumes: each cell's pipeline reuses the steps whose inputs are unchanged (their digests in
the cell's run.json cover the configuration, the LM and its server, the book's text and a given
summary) and the disk cache answers every LM call already made, so a finished sweep reruns
without an LM call and a cell whose configuration, server or book changed is recomputed.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Optional, TextIO

from booklens.errors import BooklensError, check_flag, kind_of, setting_name
from booklens.sweep import ENGINES, PLAN_FILE
from booklens.sweep.aggregate import CELLS_DIR, CellOutcome, cell_dir, cell_row, rerun_advice, write_aggregate
from booklens.sweep.engines import CellTask, LocalEngine, PoolSettings, RayEngine, check_ray_installed, temporary_log
from booklens.sweep.manifest import JUDGE_KEYS, Sweep, judge_key, load_manifest


@dataclass
class SweepOutcome:
    output: Path
    results: dict[str, Any]
    outcomes: list[CellOutcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # `artifact_notes`
    judge_steps: list[str] = field(default_factory=lambda: ["coherence", "faithfulness"])  # the manifest's judge.steps

    @property
    def failed(self) -> list[CellOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def first_failure(self) -> Optional[CellOutcome]:
        """The failed cell to name beside `rerun_advice()`, whose failure the advice reads: the first a
        rerun retries, else the first."""
        retriable = [o for o in self.failed if not o.unreadable]
        return (retriable or self.failed or [None])[0]

    def rerun_advice(self) -> str:
        """What to do about the failed cells, said after `first_failure` (`rerun_advice`)."""
        return rerun_advice([cell_row(o) for o in self.failed])

    @property
    def not_run(self) -> list[CellOutcome]:
        return [o for o in self.outcomes if o.status == "not run"]


def check_output(output: Path) -> None:
    """A new or empty directory, or one a sweep wrote (it is resumed)."""
    from booklens.pipeline import owned_output_dir

    owned_output_dir(output, PLAN_FILE, "sweep")


def plan_tasks(sweep: Sweep, output: Path, concurrency: int = 4) -> list[CellTask]:
    """One task per cell, its configuration checked by the pipeline's own rules."""
    from booklens.pipeline import check_configs

    # Cannot fail: `load_manifest` checked each judge value against the pipeline's fields (null too).
    judge_config = sweep.judge_config()
    # only what the manifest gives: the cell's run tells a setting given from one left to its default
    judge = judge_config.model_dump(mode="json", exclude_unset=True)
    tasks = []
    for cell in sweep.cells:
        book = sweep.book(cell.book)
        config = sweep.system_config(cell.system, cell.book)
        try:
            check_configs(config, judge_config, as_keys=JUDGE_KEYS)
        except BooklensError as exc:
            raise BooklensError(f"{sweep.manifest}: {exc}") from None
        tasks.append(CellTask(system=cell.system, book=cell.book, book_path=str(book.path), sweep_dir=str(output),
                              output=str(cell_dir(output, cell.system, cell.book)),
                              system_config=config.model_dump(mode="json"), judge_config=judge,
                              concurrency=concurrency, book_sha256=sweep.book_read(cell.book, config.drop_matter)[0]))
    return tasks


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def sweep_lms(sweep: Sweep) -> set[tuple[Optional[str], Optional[str]]]:
    """The (lm, api_base) pairs the sweep calls: its judge's and each summarizing system's."""
    names = {(sweep.judge.lm or sweep.lm, sweep.judge.api_base or sweep.api_base)}
    for spec in sweep.systems:
        if spec.summaries is None:
            names.add((spec.lm or sweep.lm, spec.api_base or sweep.api_base))
    return names


def check_server_option(sweep: Sweep, api_base: Optional[str], **options: Any) -> None:
    """`--api-base`, `--structured`, `--rpm` or `--tpm` when every LM of the sweep is the embedded
    model would be ignored: one line."""
    from booklens.lm.embedded import LOCAL_LM, refuse_server_options_for_embedded, resolve_lm_name

    if all(resolve_lm_name(lm) == LOCAL_LM for lm, _ in sweep_lms(sweep)):
        refuse_server_options_for_embedded(LOCAL_LM, api_base, **options)


def check_defaults_taken(sweep: Sweep, lm: Optional[str], api_base: Optional[str]) -> None:
    """`--lm` and `--api-base` are the defaults of the steps (the judge, each summarizing system) that
    name no LM or server of their own: when no step takes one, it would be recorded and change nothing,
    so it is one line. (`check_server_option` has refused `--api-base` when every LM is the embedded
    model.)"""
    from booklens.lm.embedded import LOCAL_LM, resolve_lm_name

    steps = [sweep.judge, *(spec for spec in sweep.systems if spec.summaries is None)]
    where = f"in {sweep.manifest} the judge and every system that summarizes name their own"
    if lm and all(step.lm for step in steps):  # (an empty lm is refused with the manifest)
        raise BooklensError(f"{setting_name('--lm')} {lm.strip()} would not apply: {where} lm")
    if api_base and api_base.strip() and not any(
            step.api_base is None and resolve_lm_name(step.lm or sweep.lm) != LOCAL_LM for step in steps):
        from booklens.lm.remote import shown_url

        raise BooklensError(f"{setting_name('--api-base')} {shown_url(api_base.strip())} would not apply: {where} "
                            "api_base or run on the embedded model")


def check_models(sweep: Sweep, *, keys: bool = True, **server_options: Any) -> None:
    """Every LM the sweep names is a model LiteLLM knows, with its key in the environment (no call).
    Without `keys` (the dry run, which calls none): the names only, and the embedded model is not
    looked for, though the settings its run would read (`server_options`: structured, rpm, tpm, else
    the environment's) are checked."""
    from booklens.lm import LOCAL_LM, make_backend, resolve_lm_name
    from booklens.lm.model import backend_settings

    names = sweep_lms(sweep)
    for lm, api_base in sorted(names, key=lambda x: (str(x[0]), str(x[1]))):
        if keys or resolve_lm_name(lm) != LOCAL_LM:
            make_backend(lm, api_base=api_base, check_keys=keys, **server_options)
        else:
            backend_settings(lm, api_base=api_base, **server_options)


def check_summarizers(sweep: Sweep) -> None:
    """The summarizer settings of each system fit its context window (what the summarizer checks first),
    and that window fits the system's model where its window is known (`served_context_window`: a
    self-hosted server's own, as each cell's LM will have it)."""
    import dspy

    from booklens.lm import BooklensAdapter, served_context_window
    from booklens.pipeline import build_summarizer
    from booklens.steps import check_context_window

    with dspy.context(adapter=BooklensAdapter()):
        for spec in sweep.systems:
            if spec.summaries is not None:
                continue
            system = sweep.system_config(spec.name, sweep.books[0].key)
            try:
                check_context_window(system.context_window,
                                     served_context_window(spec.lm or sweep.lm, spec.api_base or sweep.api_base))
                build_summarizer(system).check_budgets()
            except BooklensError as exc:
                raise BooklensError(f"{sweep.manifest}: system {spec.name!r}: {manifest_terms(str(exc))}") from None


def judge_window(sweep: Sweep) -> Optional[int]:
    """The window the judges plan for, as each cell's will (`run_book`): the manifest's
    judge.context_window, within the judge model's own (a one-line error when larger), else the
    model's (`served_context_window`: a self-hosted server's own); None when unknown."""
    from booklens.lm import served_context_window
    from booklens.lm.base import refuse_larger_window

    window = served_context_window(sweep.judge.lm or sweep.lm, sweep.judge.api_base or sweep.api_base)
    planned = sweep.judge_config().context_window
    if planned is None:
        return window
    try:
        refuse_larger_window(planned, window, judge_key("context_window"))
    except BooklensError as exc:
        raise BooklensError(f"{sweep.manifest}: {exc}") from None
    return planned


def summary_budget_warnings(sweep: Sweep, tasks: list[CellTask], programs: dict[str, Any]) -> list[str]:
    """A warning for each system whose summary budget allows a summary longer than the coherence judge's
    window holds (`booklens.pipeline.summary_budget_warning`): its cells would fail the coherence step
    once their summaries are written, unless those end within the window."""
    from booklens.pipeline import SystemConfig, summary_budget_warning

    window = judge_window(sweep) if "coherence" in programs else None
    if not window:
        return []
    cells = {t.system: t for t in tasks}  # one cell per system: its cells share its config
    warnings = []
    for spec in sweep.systems:
        task = cells.get(spec.name)
        warning = task and summary_budget_warning(programs["coherence"], window,
                                                  SystemConfig.model_validate(task.system_config))
        if warning:
            warnings.append(f"warning: system {spec.name!r}: {warning}")
    return warnings


def check_judge_evidence(sweep: Sweep) -> None:
    """The judge's evidence for one claim (`k` passages of up to `passage_tokens` tokens, or the
    `book` mode's `budget_tokens`) fits one verification prompt in its model's window, as each cell
    checks before it summarizes: refused here, every such cell would fail alike. A book shorter
    than that much evidence fits whatever the settings ask, so the books are read only when the
    settings alone do not fit, and only until one is too long. The window is the judge model's as its
    cells' LM will have it (`served_context_window`: a self-hosted server's own). The coherence judge's
    prompt is checked too: a window its instructions and answer fill holds no summary."""
    from booklens.retrieval import SEARCH_MODES

    judge = sweep.judge_config()
    window = judge_window(sweep)
    from booklens.pipeline import load_judge_programs

    programs = None
    if "coherence" in judge.steps and window:
        from booklens.programs.coherence import check_window_holds_a_summary

        programs = load_judge_programs(judge)
        try:
            check_window_holds_a_summary(programs["coherence"], window)
        except BooklensError as exc:
            raise BooklensError(f"{sweep.manifest}: {exc}") from None
    if "faithfulness" not in judge.steps or judge.evidence not in (*SEARCH_MODES, "book"):
        return
    if not window:
        return
    from booklens.programs.faithfulness import fit_demos_to_evidence
    from booklens.text import read_book

    verifier = (programs or load_judge_programs(judge))["verification"]

    def check(text: Optional[str]) -> None:
        # Settings that fit beside fewer demos are no error: each cell's run fits them to its book by
        # the same rule (`run_book`) and records how many its judge showed.
        fit_demos_to_evidence(verifier, window, mode=judge.evidence, k=judge.k, passage_tokens=judge.passage_tokens,
                              budget_tokens=judge.budget_tokens, book_text=text, as_keys=JUDGE_KEYS)

    try:
        check(None)
        return
    except BooklensError:
        pass
    for book in sweep.books:
        try:
            text = read_book(Path(book.path))
        except BooklensError:
            continue  # its cells record the read error
        try:
            check(text)
        except BooklensError as exc:
            raise BooklensError(f"{sweep.manifest}: {exc} (the book {book.key!r} and any as long)") from None


def check_judge_index(sweep: Sweep, cache_dir: Optional[str]) -> None:
    """What every cell's judge needs to build its book's evidence index, before any cell: the index
    folder of the cache takes files, and dense or hybrid evidence has its embedding model. Each cell
    checks this before its first call too, but would fail alike."""
    from booklens.retrieval import BOOK_MODES

    judge = sweep.judge_config()
    if "faithfulness" not in judge.steps or judge.evidence not in BOOK_MODES:
        return
    from booklens.retrieval import index_dir
    from booklens.retrieval.index import check_writable, embedding_model_path

    check_writable(index_dir(cache_dir))
    if judge.evidence in ("dense", "hybrid"):  # `book` reads embeddings only for a book that does not fit
        embedding_model_path()


def manifest_terms(message: str) -> str:
    """A summarizer's message in a manifest's words: the options it names (`--chunk-size`) become
    the system keys that set them (`chunk_size`). The summarizer speaks the commands' language."""
    import re

    from booklens.pipeline import summarizer_option
    from booklens.sweep.manifest import SystemSpec

    keys = {"--" + name.replace("_", "-"): name for name in SystemSpec.model_fields}
    # An option given once per level sets a list: "every --level-budget" is "each of level_budgets".
    lists = {summarizer_option(name): name for name in ("level_budgets",)}
    keys.update(lists)

    def key(match: re.Match) -> str:
        lead, option = match.group(1) or "", match.group(2)
        if option not in keys:
            return match.group(0)
        if option in lists:
            lead = {"every ": "each of ", "the last ": "the last of "}.get(lead, lead)
        return lead + keys[option]

    return re.sub(r"(every |the last )?(--[a-z][a-z-]*)", key, message)


def sweep_paths(manifest: Any, output: Any) -> tuple[Path, Path]:
    """The manifest and sweep directory a library caller handed over, as paths (a one-line error else)."""
    from booklens.inputs import as_path

    return as_path(manifest, "the manifest"), as_path(output, "the sweep directory")


def prepare(manifest: Path, output: Path, *, lm: Optional[str] = None, api_base: Optional[str] = None,
            concurrency: int = 4, check_keys: bool = True,
            server_options: Optional[dict[str, Any]] = None) -> tuple[Sweep, list[CellTask]]:
    """The checked sweep and its cells; raises a one-line `BooklensError` before anything is written.
    `server_options`: the backend options given (structured, rpm, tpm); without `check_keys` (the dry
    run) the LMs' names are checked, not their keys."""
    from booklens.lm.embedded import check_lm_strings

    check_lm_strings(lm, api_base)
    sweep = load_manifest(manifest, lm=lm, api_base=api_base)
    check_server_option(sweep, api_base, **(server_options or {}))
    check_defaults_taken(sweep, lm, api_base)
    check_output(output)
    tasks = plan_tasks(sweep, output, concurrency)  # the pipeline's own config models validate every value
    check_summarizers(sweep)
    check_judge_evidence(sweep)
    check_models(sweep, keys=check_keys, **(server_options or {}))
    return sweep, tasks


def artifact_notes(sweep: Sweep) -> list[str]:
    """A note for each compiled summarizer or decomposition artifact that runs on an LM other than
    the one it was compiled with. The judges' programs carry theirs on their judge lines."""
    from booklens.judges import artifact_note
    from booklens.lm import lm_name_label

    notes = []
    for spec in sweep.systems:
        if spec.program is not None and spec.summaries is None:
            note = artifact_note(Path(spec.program), lm_name_label(spec.lm or sweep.lm))
            notes.append(note and f"system {spec.name!r}: {note}")
    decomposition = (sweep.judge.programs or {}).get("decomposition")
    if decomposition is not None and "claims" in sweep.judge_config().run_steps():
        note = artifact_note(Path(decomposition), lm_name_label(sweep.judge.lm or sweep.lm))
        notes.append(note and f"judge: {note}")
    return [n for n in notes if n]


@contextmanager
def sweep_lock(output: Path) -> Iterator[None]:
    """Held while a sweep writes `output` (`booklens.records.directory_lock`). Two sweeps into one
    directory at once (the same command started twice) would each make every LM call (each call still
    in flight for the other, so the cache answers neither) and write the same cells: the second is a
    one-line error."""
    from booklens.records import directory_lock

    with directory_lock(output, f"another booklens sweep is writing {output}: wait for it to end (or stop it), "
                                "then rerun to resume"):
        yield


def remove_sweep_partial_writes(output: Path) -> int:
    """Delete the temporary files that a killed sweep's atomic writes of its own files left."""
    from booklens.records import remove_partial_writes
    from booklens.sweep.aggregate import CELLS_FILE, RESULTS_FILE
    from booklens.sweep.report import REPORT_FILE

    return remove_partial_writes(output, [PLAN_FILE, RESULTS_FILE, CELLS_FILE, REPORT_FILE])


def check_cache(settings: PoolSettings) -> None:
    """A one-line error unless the LM cache of `settings` opens (its folder is made if missing)."""
    from booklens.lm.cache import CACHE_FILE, CallCache, cache_folder

    CallCache(cache_folder(settings.cache_dir) / CACHE_FILE)


def plan_servers(sweep: Sweep) -> list[dict[str, Optional[str]]]:
    """Each LM the sweep calls with the server its backend reaches (`named_server`: the manifest's or
    --api-base's, else the one the environment names), credentials left out."""
    from booklens.lm.embedded import resolve_lm_name
    from booklens.lm.pool import named_server
    from booklens.pipeline import public_api_base

    pairs = {(resolve_lm_name(lm), public_api_base(named_server(resolve_lm_name(lm), api_base)))
             for lm, api_base in sweep_lms(sweep)}
    return [{"lm": lm, "server": server} for lm, server in sorted(pairs, key=lambda p: (p[0], p[1] or ""))]


def plan_content(sweep: Sweep) -> dict[str, Any]:
    """Digests of what the cells read besides the manifest: each book file, each system's given
    summaries, each compiled program (None for a file that cannot be read: its cells fail)."""
    from booklens.pipeline import digest, sha256_file

    def file_sha(path: Path) -> Optional[str]:
        try:
            return sha256_file(path)
        except OSError:
            return None

    programs = [s.program for s in sweep.systems if s.program] + list((sweep.judge.programs or {}).values())
    return {"books": {b.key: file_sha(b.path) for b in sweep.books},
            "summaries": {name: digest(texts) for name, texts in sweep.summaries.items()},
            "programs": {str(p): file_sha(Path(p)) for p in sorted(set(programs))}}


def plan_record(sweep: Sweep) -> dict[str, Any]:
    """What sweep.json records of a sweep's plan."""
    return {
        "kind": "booklens.sweep.plan",
        "format_version": 1,
        "manifest": manifest_name(sweep),
        "lm": sweep.lm,
        "servers": plan_servers(sweep),
        "books": {b.key: str(b.path) for b in sweep.books},
        "systems": [_without_credentials(s.model_dump(exclude_unset=True)) for s in sweep.systems],
        "judge": _without_credentials(sweep.judge.model_dump(exclude_unset=True)),
        "content_sha256": plan_content(sweep),
    }


def write_plan(sweep: Sweep, output: Path) -> None:
    """Write sweep.json. When it changes (another manifest, the same one edited, another server for
    one of its LMs, a book or a summaries or program file whose content changed), the results.json,
    cells.jsonl and report.html of the earlier plan are removed first: a sweep stopped before its new
    aggregate is written must not leave figures that look like this plan's. (Which cells are new is
    each cell's own run.json's to say: its steps' digests cover the same servers and contents.) Files
    are compared by their resolved paths (`comparable_plan`): the same manifest named another way is
    the same plan."""
    import json

    from booklens.records import save_json
    from booklens.sweep.aggregate import CELLS_FILE, RESULTS_FILE
    from booklens.sweep.report import REPORT_FILE

    plan = output / PLAN_FILE
    try:
        before: Any = json.loads(plan.read_bytes())
    except OSError:
        before = None
    except ValueError:  # damaged: not this plan's
        before = {}
    save_json(plan, plan_record(sweep))
    if before is not None and comparable_plan(json.loads(plan.read_bytes())) != comparable_plan(before):
        for name in (RESULTS_FILE, CELLS_FILE, REPORT_FILE):
            (output / name).unlink(missing_ok=True)


def manifest_name(sweep: Sweep) -> str:
    """The manifest as sweep.json and the sweep's page name it: its resolved path, the same however
    it was typed (and meaningful to `booklens report` run from another folder)."""
    return str(sweep.manifest.resolve())


def comparable_plan(plan: Any) -> Any:
    """A sweep.json's plan with each file path resolved (`..`, symbolic links): the same files named
    another way are the same plan. An older sweep.json kept the manifest's path as typed (relative):
    it is resolved against the working directory, as the rerun's own path is."""
    if not isinstance(plan, dict):
        return plan

    def real(path: Any) -> Any:
        return os.path.realpath(path) if isinstance(path, str) else path

    def real_values(paths: Any) -> Any:
        return {k: real(v) for k, v in paths.items()} if isinstance(paths, dict) else paths

    plan = {**plan, "manifest": real(plan.get("manifest")), "books": real_values(plan.get("books"))}
    if isinstance(plan.get("systems"), list):
        plan["systems"] = [{k: real(v) if k in ("summaries", "program") else v for k, v in system.items()}
                           if isinstance(system, dict) else system for system in plan["systems"]]
    if isinstance(plan.get("judge"), dict):
        plan["judge"] = {**plan["judge"], "programs": real_values(plan["judge"].get("programs"))}
    content = plan.get("content_sha256")
    if isinstance(content, dict) and isinstance(content.get("programs"), dict):
        plan["content_sha256"] = {**content, "programs": {real(k): v for k, v in content["programs"].items()}}
    return plan


def _without_credentials(section: dict[str, Any]) -> dict[str, Any]:
    """A manifest section as sweep.json records it: its server URL without user, password or query."""
    from booklens.pipeline import public_api_base

    if section.get("api_base"):
        section = {**section, "api_base": public_api_base(section["api_base"])}
    return section


def reusable_cell_steps(sweep: Sweep, tasks: list[CellTask], programs: dict[str, Any],
                        structured: Optional[str] = None, *,
                        recorded_structured: bool = False) -> dict[tuple[str, str], set[str]]:
    """Per (system, book) cell with a run directory, the steps a run would reuse from it without an
    LM call, decided by the pipeline's own rule (`reusable_steps`, the digests its steps are matched
    by); cells that would reuse nothing are left out. `programs`: the judge programs the cells load
    (`load_judge_programs`); `structured`: the run's --structured (else BOOKLENS_STRUCTURED), or with
    `recorded_structured` the mode each cell's run.json records (a plan does not fix it)."""
    from booklens.lm.embedded import lm_name_label
    from booklens.lm.model import structured_mode
    from booklens.lm.pool import resolve_model
    from booklens.pipeline import JudgeConfig, SystemConfig, judged_with, public_api_base, reusable_steps
    from booklens.reports import RUN_FILE, read_run_record

    def model(lm: Optional[str], api_base: Optional[str]) -> dict[str, Any]:
        # As the cells' pool names it (`run_book`: its label and public server), without building it.
        name, server = resolve_model(sweep.lm, sweep.api_base, lm, api_base)
        return {"lm": lm_name_label(name), "api_base": public_api_base(server)}

    def judge_model(judge: Any, output: Path) -> dict[str, Any]:
        if recorded_structured:
            try:
                mode = read_run_record(output / RUN_FILE).config.get("structured")
            except BooklensError:
                mode = None
        else:
            mode = structured_mode(resolve_model(sweep.lm, sweep.api_base, judge.lm, judge.api_base)[0], structured)
        return judged_with(model(judge.lm, judge.api_base), mode)

    reusable: dict[tuple[str, str], set[str]] = {}
    for task in tasks:
        system = SystemConfig.model_validate(task.system_config)
        judge = JudgeConfig.model_validate(task.judge_config)
        if not (Path(task.output) / RUN_FILE).is_file():
            continue
        digest, _ = sweep.book_read(task.book, system.drop_matter)
        if digest is None:  # its cells fail (and make no call); none is complete
            continue
        reused = reusable_steps(Path(task.book_path), Path(task.output), system, judge,
                                summary_model=model(system.lm, system.api_base),
                                judge_model=judge_model(judge, Path(task.output)), programs=programs,
                                book_sha=digest)
        if reused:
            reusable[(task.system, task.book)] = set(reused)
    return reusable


def complete_cells(sweep: Sweep, tasks: list[CellTask], programs: dict[str, Any],
                   reusable: Optional[dict[tuple[str, str], set[str]]] = None,
                   **structured: Any) -> set[tuple[str, str]]:
    """The (system, book) cells whose run directory a run would reuse whole, every step as it is on
    disk without an LM call (`reusable_cell_steps`, given `structured` or `recorded_structured`, or
    `reusable` when already found)."""
    from booklens.pipeline import JudgeConfig

    if reusable is None:
        reusable = reusable_cell_steps(sweep, tasks, programs, **structured)
    return {(task.system, task.book) for task in tasks
            if reusable.get((task.system, task.book)) == set(JudgeConfig.model_validate(task.judge_config)
                                                                 .wanted_steps())}


def cells_of_plan(sweep_dir: Path, plan: dict[str, Any]) -> Optional[set[tuple[str, str]]]:
    """The cells in `sweep_dir` that the plan its sweep.json records (`plan`) would reuse whole
    (`complete_cells`, as --dry-run decides): a complete cell not among them was made by an earlier
    plan. None when the plan cannot be had again: its manifest is gone, or no longer gives that plan."""
    import json

    from booklens.pipeline import load_judge_programs
    from booklens.records import json_text

    # The command's --api-base is not recorded apart from the servers: try none, then each of them.
    servers = [None] + [s.get("server") for s in plan.get("servers") or [] if isinstance(s, dict) and s.get("server")]
    wanted = comparable_plan(plan)
    for api_base in dict.fromkeys(servers):
        try:
            sweep = load_manifest(Path(str(plan["manifest"])), lm=plan.get("lm"), api_base=api_base)
            if comparable_plan(json.loads(json_text(plan_record(sweep)))) != wanted:
                continue
            tasks = plan_tasks(sweep, sweep_dir)
            import dspy

            from booklens.lm import BooklensAdapter

            with dspy.context(adapter=BooklensAdapter()):
                programs = load_judge_programs(sweep.judge_config())
            # --structured is the command's, not the plan's: each cell is matched by its own
            return complete_cells(sweep, tasks, programs, recorded_structured=True)
        except (BooklensError, OSError, KeyError, TypeError, ValueError):
            continue
    return None


def reuse_complete_cells(sweep: Sweep, tasks: list[CellTask], outcomes: list[CellOutcome], pool: Any,
                         settings: PoolSettings, on_done: Any) -> list[CellOutcome]:
    """`outcomes` (of `tasks`, in order) with each cell that --fail-fast left "not run" but whose run
    directory is complete on disk (`complete_cells`) run after all: every step is reused without an LM
    call, so results.json keeps it. `pool`: the LMs to run them with (None: one made from `settings`)."""
    from booklens.sweep.engines import run_cell

    skipped = [t for t, o in zip(tasks, outcomes) if o.status == "not run"]
    if not skipped:
        return outcomes
    from booklens.pipeline import load_judge_programs

    complete = complete_cells(sweep, skipped, load_judge_programs(sweep.judge_config()),
                              structured=settings.structured)
    if not complete:
        return outcomes
    pool = pool if pool is not None else settings.make_pool()
    outcomes = list(outcomes)
    for i, task in enumerate(tasks):
        if outcomes[i].status == "not run" and (task.system, task.book) in complete:
            outcomes[i] = run_cell(task, pool)
            on_done(outcomes[i])
    return outcomes


def steps_on_disk(output: Path, tasks: list[CellTask]) -> dict[tuple[str, str], dict[str, tuple[str, str]]]:
    """Per cell, the steps its run.json records before the sweep runs it (each by its inputs' and its
    record's digests): what a step the cell reuses must be to count as an earlier run's work."""
    import json

    found: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
    for task in tasks:
        try:
            steps = json.loads((Path(task.output) / "run.json").read_text(encoding="utf-8"))["steps"]
            found[(task.system, task.book)] = {name: (step["inputs_sha256"], step["sha256"])
                                               for name, step in steps.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def reused_work(outcome: CellOutcome, output: Path,
                before: dict[tuple[str, str], dict[str, tuple[str, str]]]) -> tuple[bool, dict[str, Any]]:
    """What of a finished cell was made by runs before this sweep (`before`: `steps_on_disk` when
    it started): whether every step was (it did no work in this invocation), and the LM work of the
    steps it reused from them (run.json's figures). The engine's usage counts everything done in this
    invocation, even by a Ray worker that died after writing a step its cell's rerun reused, so
    nothing counts twice."""
    import json

    from booklens.lm.usage import total_work

    steps = (outcome.run or {}).get("steps") or {}
    earlier = before.get((outcome.system, outcome.book), {})
    try:
        timings = json.loads((cell_dir(output, outcome.system, outcome.book) / "timings.json").read_text())["steps"]
        reused = [name for name, step in steps.items() if timings[name].get("reused")
                  and earlier.get(name) == (step.get("inputs_sha256"), step.get("sha256"))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        reused = []
    everything = bool(steps) and len(reused) == len(steps) and not (outcome.run or {}).get("failures")
    return everything, total_work(steps[name] for name in reused)


def run_sweep(manifest: str | Path, output: str | Path, *, engine: str = "local", ray_address: Optional[str] = None,
              ray_cpus: Optional[int] = None, lm: Optional[str] = None, api_base: Optional[str] = None,
              concurrency: int = 4, cache_dir: Optional[str | Path] = None, fail_fast: bool = False,
              structured: Optional[str] = None, rpm: Optional[int] = None, tpm: Optional[int] = None,
              stream: Optional[TextIO] = None, tty: Optional[bool] = None,
              progress_interval: Optional[float] = None) -> SweepOutcome:
    """Run (or resume) a sweep and write its aggregate; see the module docstring."""
    from booklens.lm.cache import cache_folder
    from booklens.sweep.progress import SweepProgress
    from booklens.sweep.report import sweep_meta, write_sweep_report

    from booklens.parallel import check_at_least

    manifest, output = sweep_paths(manifest, output)
    if engine not in ENGINES:
        raise BooklensError(f"unknown engine {engine!r}: use {' or '.join(ENGINES)}")
    check_at_least("--concurrency", concurrency)  # else every cell would fail on it (run_book checks it too)
    cache_folder(cache_dir)  # a cache_dir that is no path: named before the manifest's models are checked
    check_flag("fail_fast", fail_fast)  # "no" would read as True
    if progress_interval is not None and (isinstance(progress_interval, bool)
                                          or not isinstance(progress_interval, (int, float)) or progress_interval <= 0):
        # 0 or less redrew the progress line without a pause for the whole sweep
        raise BooklensError(f"progress_interval must be a number of seconds above 0 (got {progress_interval!r})")
    if stream is not None and not callable(getattr(stream, "write", None)):
        raise BooklensError(f"stream must be a text stream such as sys.stderr, not {kind_of(stream)}")
    if ray_cpus is not None:  # 0 would start a local Ray with every core, as None does
        check_at_least("ray_cpus", ray_cpus)
        if engine != "ray":
            raise BooklensError("ray_cpus needs engine 'ray'")
    if ray_address is not None:  # spaces around it (from a shell variable) dropped, as around --api-base
        ray_address = ray_address.strip()
    if ray_address == "":  # `--ray-address "$HEAD"` with HEAD unset, say
        raise BooklensError(f"{setting_name('--ray-address')} is empty: name the cluster (auto, ray://HEAD:10001) "
                            "or leave it out (RAY_ADDRESS, else the cluster `ray start` ran for here, else a local "
                            "Ray)")
    if ray_address and ray_address.lower().startswith(("http://", "https://")):
        # Ray refuses it only once started, in a message of several lines
        raise BooklensError(f"{setting_name('--ray-address')} {ray_address} is an http:// URL, a Ray dashboard's "
                            "(what `ray job submit --address` takes): name the cluster itself (auto, HEAD:6379 or "
                            "ray://HEAD:10001)")
    if ray_address and engine != "ray":
        raise BooklensError(f"{setting_name('--ray-address')} needs {setting_name('--engine')} ray")
    if engine == "ray":
        check_ray_installed()
    output = output.absolute()  # cells may run in other processes, on other nodes
    sweep, tasks = prepare(manifest, output, lm=lm, api_base=api_base, concurrency=concurrency,
                           server_options={"structured": structured, "rpm": rpm, "tpm": tpm})
    settings = PoolSettings(sweep.lm, sweep.api_base, str(cache_folder(cache_dir).absolute()) if cache_dir else None,
                            concurrency, structured=structured, rpm=rpm, tpm=tpm)
    schedule = sorted(tasks, key=lambda t: -_size(t.book_path))  # stable: manifest order among equals
    # The LM cache opens before anything is written: a bad --cache-dir must not leave a sweep
    # directory behind. The local engine's pool opens it; Ray workers open their own, so check here.
    runner: Any = None
    stream = stream if stream is not None else sys.stderr
    own_stream = False

    def copy_stderr() -> None:
        """File descriptor 2 is not the display's alone: Ray points it at its log, and the embedded
        model at /dev/null while it loads (llama-cpp-python silences llama.cpp so, whichever thread
        loads it: a cell that failed meanwhile lost its line). The display keeps a copy of it."""
        nonlocal stream, tty, own_stream
        if stream is sys.stderr:
            tty = stream.isatty() if tty is None else tty
            try:
                stream = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
                own_stream = True
            except (AttributeError, OSError, ValueError):  # not a real file (captured): keep it
                pass

    if engine == "ray":
        check_cache(settings)
        check_judge_index(sweep, settings.cache_dir)
        copy_stderr()
        # Ray starts (or the cluster is joined) before anything is written: an address that fails is
        # one line and no sweep directory. Its log is moved into the directory once that exists.
        runner = RayEngine(settings, address=ray_address, num_cpus=ray_cpus, log_path=temporary_log())
    else:
        runner = LocalEngine(settings)
        # after the pool opened the LM cache: a bad --cache-dir is named as one
        check_judge_index(sweep, settings.cache_dir)
        copy_stderr()
    try:
        if engine == "ray":
            runner.start()
        from booklens.pipeline import make_output_dir

        make_output_dir(output, "sweep")
        with sweep_lock(output):  # before anything of an earlier sweep is removed or rewritten
            if engine == "ray":  # held first: a refused sweep writes nothing into the running one's log
                runner.move_log(output / "ray.log")
            remove_sweep_partial_writes(output)  # a killed sweep may have left half-written files behind
            write_plan(sweep, output)  # a changed plan drops the aggregate of the previous one (see write_plan)
            # After sweep.json, which marks the directory as a sweep's: stopped before it (while the books
            # are read for their digests), the directory holds nothing a rerun refuses.
            make_output_dir(output / CELLS_DIR, "sweep")
            before = steps_on_disk(output, tasks)
            progress = SweepProgress(len(tasks), runner.usage, stream=stream, tty=tty, interval=progress_interval)
            try:
                progress.start()

                def done(outcome: CellOutcome) -> None:
                    reused, earlier = reused_work(outcome, output, before)
                    failed = outcome.error if outcome.status == "failed" else None
                    progress.cell_done(f"{outcome.system}/{outcome.book}", failed=failed, reused=reused,
                                       earlier=earlier)

                from booklens.parallel import quiet_progress

                with quiet_progress():  # one display for the sweep, not a bar per level of every cell
                    finished = runner.run(schedule, done, fail_fast=fail_fast)
                    finished = reuse_complete_cells(sweep, schedule, finished, runner.pool if engine == "local"
                                                    else None, settings, done)
            finally:
                progress.close()
            by_cell = {(o.system, o.book): o for o in finished}
            outcomes = [by_cell[(t.system, t.book)] for t in tasks]  # manifest order
            # The cells of a book that could not be read when the sweep was planned fail again on a rerun.
            outcomes = [replace(o, unreadable=True) if t.book_sha256 is None and o.status == "failed" else o
                        for o, t in zip(outcomes, tasks)]
            systems = [s.name for s in sweep.systems]
            books = [b.key for b in sweep.books]
            results = write_aggregate(output, systems, books, outcomes)
            judge = sweep.judge_config()
            meta = sweep_meta(len(systems), len(books), manifest_name(sweep), judge.steps, judge.evidence)
            # Titled by the manifest as sweep.json names it, as `booklens report` titles the page it rebuilds.
            write_sweep_report(output, results, [cell_row(o) for o in outcomes],
                               title=Path(manifest_name(sweep)).stem, meta=meta)
            return SweepOutcome(output, results, outcomes, artifact_notes(sweep), list(judge.steps))
    finally:
        if engine == "ray":
            runner.close()
            if runner.log_path.parent != output:  # stopped before the directory was made
                runner.log_path.unlink(missing_ok=True)
        if own_stream:
            stream.close()


# ---------------------------------------------------------------------------
# --dry-run


def dry_run(manifest: str | Path, output: str | Path, *, lm: Optional[str] = None,
            api_base: Optional[str] = None, structured: Optional[str] = None) -> str:
    """The text `--dry-run` prints: the cells (those complete on disk, which a run reuses without a
    call, marked: `complete_cells`) and the estimated work of the others per system. Writes nothing, calls
    no LM and opens no cache, so it takes none of the options of running cells (engine, concurrency,
    cache, --rpm, --tpm, --fail-fast). It asks a self-hosted server its window as the run's checks do
    (`served_context_window`: a GET, no completion), so it refuses what they refuse; with no server
    up the window is unknown and nothing is refused for it. `structured` is the run's --structured:
    the judge steps on disk are matched by the mode they were judged in, so it decides which the run
    would reuse."""
    from booklens.lm.usage import cost_text, known_cost
    from booklens.sweep.estimate import ASSUMPTIONS, estimate_sweep
    from booklens.vocabulary import counted

    manifest, output = sweep_paths(manifest, output)
    sweep, tasks = prepare(manifest, output, lm=lm, api_base=api_base, check_keys=False,
                           server_options={"structured": structured})
    import dspy

    from booklens.lm import BooklensAdapter
    from booklens.pipeline import STEPS, load_judge_programs

    with dspy.context(adapter=BooklensAdapter()):
        programs = load_judge_programs(sweep.judge_config())
    reusable = reusable_cell_steps(sweep, tasks, programs, structured)
    complete = complete_cells(sweep, tasks, programs, reusable)
    estimates = estimate_sweep(sweep, reused=reusable, output=output, programs=programs)
    lines = [f"{counted(len(tasks), 'cell')}: {counted(len(sweep.systems), 'system')} \u00d7 "
             f"{counted(len(sweep.books), 'book')} -> {output}"]
    partly = len(reusable) - len(complete)
    on_disk = [f"{len(complete)} complete on disk, every step reused without an LM call" if complete else "",
               f"{partly} with some steps on disk, which the run reuses without an LM call" if partly else ""]
    if complete or partly:
        lines[0] += f" ({'; '.join(bit for bit in on_disk if bit)}; the estimate counts only the steps to make)"

    def mark(cell: tuple[str, str]) -> str:
        if cell in complete:
            return " (complete, reused)"
        steps = [step for step in STEPS if step in reusable.get(cell, ())]
        return f" (reuses {', '.join(steps)})" if steps else ""

    for spec in sweep.systems:
        kind = f"summaries from {Path(spec.summaries).name}" if spec.summaries else "summarizes"
        lines.append(f"  {spec.name} ({kind}): " + ", ".join(b.key + mark((spec.name, b.key)) for b in sweep.books))
    header = ("system", "summarizer", "judge", "chunks", "LM calls", "prompt tokens", "completion tokens", "cost")
    rows = []
    for e in estimates:
        rows.append((e.name, e.summarize_lm or "-", e.judge_lm, f"{e.chunks:,}" if e.summarize_lm else "-",
                     f"{e.calls:,}", f"{e.prompt_tokens:,}", f"{e.completion_tokens:,}", cost_text(e.cost_usd)))
    cost = known_cost((e.calls, e.cost_usd) for e in estimates) if any(e.calls for e in estimates) else 0.0
    rows.append(("total", "", "", f"{sum(e.chunks for e in estimates):,}", f"{sum(e.calls for e in estimates):,}",
                 f"{sum(e.prompt_tokens for e in estimates):,}", f"{sum(e.completion_tokens for e in estimates):,}",
                 cost_text(cost)))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines.append("")
    for r in [header, *rows]:
        lines.append("  ".join(str(v).ljust(w) if i < 3 else str(v).rjust(w) for i, (v, w) in
                               enumerate(zip(r, widths))).rstrip())
    lines.append("")
    lines.append(ASSUMPTIONS)
    lines.extend(unreadable_books(sweep))
    lines.extend(unanswering_server_warnings(sweep, bool(programs)))
    lines.extend(summary_budget_warnings(sweep, tasks, programs))
    lines.extend(f"note: {note}" for note in artifact_notes(sweep))
    return "\n".join(lines)


def unanswering_server_warnings(sweep: Sweep, judged: bool) -> list[str]:
    """A warning for each server the plan names that does not answer (`unanswering_server`): a sweep run
    now would fail every call there, and what the plan knows of a self-hosted server's window it did not
    learn from the server."""
    from booklens.lm.model import unanswering_server

    named = [(spec.lm or sweep.lm, spec.api_base or sweep.api_base) for spec in sweep.systems
             if spec.summaries is None]
    if judged:
        named.append((sweep.judge.lm or sweep.lm, sweep.judge.api_base or sweep.api_base))
    found: dict[str, str] = {}
    for lm, api_base in dict.fromkeys(named):  # one connection per server and model, not per system
        silent = unanswering_server(lm, api_base)
        if silent and silent[0] not in found:
            found[silent[0]] = silent[1]
    return [f"warning: the server at {server} does not answer ({why}): a sweep run now would fail every call there"
            for server, why in found.items()]


def unreadable_books(sweep: Sweep) -> list[str]:
    """A warning for each book that cannot be read (empty, binary, not UTF-8, a broken EPUB): no manifest
    error, since the sweep's other cells run, but its cells will fail, and the estimate counts none of
    their calls."""
    warnings = []
    for book in sweep.books:
        # by drop_matter, the one setting that changes what is read
        failing = [reason for reason in (sweep.book_read(book.key, sweep.system_config(spec.name, book.key)
                                                         .drop_matter)[1] for spec in sweep.systems)
                   if reason is not None]
        if failing:
            from booklens.vocabulary import counted

            warnings.append(f"warning: book {book.key!r} cannot be read ({failing[0]}): its "
                            f"{counted(len(failing), 'cell')} will fail")
    return warnings
