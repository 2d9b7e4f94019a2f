"""The judges: the default few-shot programs booklens ships, what every judgment records about its
judge, and the store of measured agreement with human annotators (calibrations).

Default programs (`booklens/defaults/*.json`, DSPy `program.save` JSON plus booklens metadata):

- `coherence.json`: confusion detection, BooookScore's few-shot setting (its §4.1: two whole
  summaries with sentence-level annotations as demonstrations). The demos are human annotations of
  two summaries from the training split, one written by incremental updating and one by
  hierarchical merging, each with some of its sentences labelled; see `build_coherence_default`.
- `verification.json`: four-way claim verification with FABLES claims, their human labels, reasons
  and evidence quotes as demos; `verification-binary.json`: the faithful / unfaithful rater of the
  seed's Table 5 with faithful and unfaithful demos. Demos come from training-split books that are
  not among Table 5's seven books, so both judges can be measured on those books.

`booklens judges build` makes all three from the released data, byte for byte the same files (no
LM runs: the demos are human annotations chosen by fixed rules and a fixed seed). Their metadata
records the data files' sha256 and how the demos were chosen.

A judge is a (program, LM) pair. `judge_info` describes one for the records: the program ('default',
'zero-shot' or an artifact's name), a fingerprint of its prompts and demos, the demo count, the LM,
and the calibration stored for that LM and fingerprint (`booklens calibrate`), with a warning when
there is none or when the measured agreement is below the papers' reference judge. booklens ships
the calibration of the embedded model with the default programs (`defaults/calibration.json`);
other calibrations go to the user's cache directory (`<cache>/calibration.json`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shlex
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from booklens.errors import BooklensError, kind_of, setting_name
from booklens.lm.embedded import LOCAL_CONTEXT_WINDOW
from booklens.vocabulary import CANT_VERIFY, counted

DEFAULTS_DIR = Path(__file__).resolve().parent / "defaults"
# Judge name -> shipped artifact. "binary" is the verification task with the binary label set.
DEFAULT_FILES = {"coherence": "coherence.json", "verification": "verification.json",
                 "binary": "verification-binary.json"}
JUDGES = tuple(DEFAULT_FILES)
CALIBRATION_FILE = "calibration.json"
DEFAULT_SEED = 0

# Prompt budget of the default coherence judge on the embedded model (8,192-token window), in cl100k
# tokens, counted by the rule every call fits its demos by (`programs/coherence.py`: demo_token_limit).
EMBEDDED_WINDOW = LOCAL_CONTEXT_WINDOW
JUDGED_SUMMARY_TOKENS = 1300  # room for the summary being judged: booklens summaries default to 900
TARGET_SENTENCE_TOKENS = 80
COHERENCE_DEMO_SUMMARIES = ("summary-gpt4-4096-inc.json", "summary-gpt4-4096-hier.json")  # one demo from each
COHERENCE_MIN_LABELS = 4  # a demo summary has at least this many confusing and clean sentences
COHERENCE_MAX_CONFUSING = 10  # confusing sentences labelled per demo summary, at most (as many clean ones)
COHERENCE_MAX_SUMMARY_TOKENS = 1000  # shorter demo summaries leave room for more labelled sentences

# Verification demos: per label, in the order they are shown (alternating labels).
VERIFICATION_DEMOS = ("faithful", "unfaithful", "partial support", "can't verify", "faithful", "unfaithful")
BINARY_DEMOS = ("faithful", "unfaithful", "faithful", "unfaithful", "faithful", "unfaithful")
DEMO_EVIDENCE_TOKENS = (15, 160)  # evidence quotes of a demo claim, in cl100k tokens (none for can't verify)
DEMO_REASON_TOKENS = 60
DEMO_CLAIM_WORDS = 8  # a demo claim is a whole statement, not a fragment of one

# Reference judges of the papers, the bar below which a judge's agreement counts as low:
# GPT-4's released BooookScore labels against the humans, as `booklens agree` measures them on the
# 88 incremental GPT-4 4096 summaries both annotated (kept to four decimals: a rounder bar would let
# a judge just below GPT-4 pass), and FABLES' GPT-4-Turbo rater with human evidence (Table 5's
# overall unfaithful F1, read from `SEED_TABLE5_HUMAN_EVIDENCE` by `verification_reference`).
COHERENCE_REFERENCE_KAPPA = 0.1346


# ---------------------------------------------------------------------------
# Programs


def task_of(judge: str) -> str:
    return "coherence" if judge == "coherence" else "verification"


def default_path(judge: str) -> Path:
    if judge not in DEFAULT_FILES:
        raise BooklensError(f"unknown judge '{judge}' (use one of {', '.join(JUDGES)})")
    return DEFAULTS_DIR / DEFAULT_FILES[judge]


def new_program(judge: str, **kwargs: Any) -> Any:
    """A fresh zero-shot program of a judge (what artifacts load into)."""
    if judge == "coherence":
        from booklens.programs.coherence import build_scorer

        return build_scorer(**kwargs)
    from booklens.programs.faithfulness import build_verifier

    return build_verifier(label_set="binary" if judge == "binary" else "four-way", **kwargs)


def load_judge(judge: str, program: str | Path | None = None, *, zero_shot: bool = False, **kwargs: Any) -> Any:
    """The program a command judges with: the artifact `program` when given, the zero-shot program
    with `zero_shot`, else the default few-shot program shipped with booklens. `kwargs` configure
    the program (batch size, concurrency, tries). The program remembers which it is (`judge_info`)."""
    from booklens.inputs import as_path
    from booklens.optimizers.artifacts import load_program

    check_program_or_zero_shot(program is not None, zero_shot)
    target = new_program(judge, **kwargs)
    if zero_shot:
        target._booklens_judge = "zero-shot"  # noqa: SLF001
        return target
    path = as_path(program, "program", "a compiled program artifact (JSON)") if program is not None \
        else default_path(judge)
    if program is None and not path.exists():
        raise BooklensError(f"the default {judge} program is missing from this installation ({path}); "
                            f"reinstall booklens or pass {setting_name('--zero-shot')}")
    load_program(target, path, task=task_of(judge))
    if judge == "coherence":
        _check_demos_in_use(target, path)
    # The artifact as given, so that the calibrate hint finds it from where the user is.
    target._booklens_judge = "default" if program is None else str(path)  # noqa: SLF001
    return target


def _check_demos_in_use(scorer: Any, path: Path) -> None:
    """A coherence artifact whose demos are all on the predictor of the other mode (per-sentence
    or batched), or one compiled per sentence and run batched, would judge with none of what it holds:
    refused, rather than run as zero-shot under its name."""
    batched = getattr(scorer, "batch_size", 1) > 1
    used, other = (scorer.detect_batch, scorer.detect) if batched else (scorer.detect, scorer.detect_batch)
    size = setting_name("--batch-size")
    if not used.demos and other.demos:
        made_for = f"per-sentence judging ({size} 1)" if batched else f"batched judging ({size} above 1)"
        raise BooklensError(f"{path} holds its {counted(len(other.demos), 'demo')} for {made_for} only: with "
                            f"{size} {scorer.batch_size} it would judge with none of them; "
                            f"{f'drop {size}' if batched else f'give {size} above 1'} to use them")
    # compile runs one sentence per call: what it chose (demos, or the instructions MIPROv2 and GEPA
    # write) is on the per-sentence predictor, and no run ever scored the batched one.
    block = getattr(scorer, "_booklens_artifact", None) or {}
    if batched and (block.get("program_config") or {}).get("batch_size") == 1 and not scorer.detect_batch.demos:
        raise BooklensError(f"{path} was compiled for per-sentence judging ({size} 1): with {size} "
                            f"{scorer.batch_size} its batched predictor would judge with nothing compile chose; "
                            f"drop {size} to use it")


def check_program_or_zero_shot(has_program: bool, zero_shot: bool, *, as_keys: bool | str | None = None,
                               program_key: str | None = None) -> None:
    """A program artifact (`has_program`) and zero-shot judging, both asked for the same judge: one line
    naming the two settings as the caller spelled them (`setting_name`; `program_key`: the caller's
    keyword for the artifact, where it is not `program`)."""
    if has_program and zero_shot:
        raise BooklensError(f"give either {setting_name('--program', as_keys, program_key)} or "
                            f"{setting_name('--zero-shot', as_keys)}, not both")


def check_zero_shot(artifacts: Mapping[str, Any], tasks: Sequence[str], zero_shot: bool, *,
                    as_keys: bool | str | None = None, artifacts_key: str = "programs") -> None:
    """Zero-shot judging beside an artifact for every judge among `tasks` would apply to none of them:
    refused, as `load_judge` refuses an artifact and zero-shot for one judge. `as_keys`: see
    `setting_name`; `artifacts_key`: the caller's keyword for the artifacts."""
    judged = [task for task in tasks if task in ("coherence", "verification")]
    check_program_or_zero_shot(bool(judged) and all(task in artifacts for task in judged), zero_shot,
                               as_keys=as_keys, program_key=artifacts_key)


def judge_programs(artifacts: dict[str, Path] | None = None, *, tasks: Sequence[str] = ("coherence", "verification"),
                   zero_shot: bool = False, binary: bool = False, batch_size: int = 1, concurrency: int = 4,
                   tries: int = 3, evidence: Optional[str] = None) -> dict[str, Any]:
    """The programs a command runs, by task: each judge (coherence, verification) is the artifact given
    for its task, else the zero-shot program with `zero_shot`, else the default few-shot program; the
    claim decomposer is the artifact given or the zero-shot one. `binary` asks for the faithful /
    unfaithful rater (an artifact's own label set decides when one is given). `evidence`: the mode
    the verifier will run with, for `check_closed_book`."""
    from booklens.inputs import as_path
    from booklens.optimizers.artifacts import artifact_metadata, load_program
    from booklens.pipeline import JUDGE_TASKS

    if artifacts is not None and not isinstance(artifacts, Mapping):
        raise BooklensError(f"artifacts must be a mapping of tasks to program files ({{'coherence': path}}), "
                            f"not {kind_of(artifacts)}")
    artifacts = {task: path if path is None else as_path(path, f"the {task} program")
                 for task, path in (artifacts or {}).items()}
    if isinstance(tasks, str):  # 'coherence' would be read as 'coherence' in 'coherence'
        tasks = (tasks,)
    unknown = [task for task in tasks if task not in JUDGE_TASKS]
    if unknown:
        raise BooklensError(f"unknown judge task {unknown[0]!r} in tasks: use {', '.join(JUDGE_TASKS)}")
    check_zero_shot(artifacts, tasks, zero_shot, artifacts_key="artifacts")
    programs: dict[str, Any] = {}
    if "coherence" in tasks:
        programs["coherence"] = load_judge("coherence", artifacts.get("coherence"),
                                           zero_shot=zero_shot and "coherence" not in artifacts,
                                           batch_size=batch_size, concurrency=concurrency, tries=tries)
    if "verification" in tasks:
        path = artifacts.get("verification")
        if path is not None:
            compiled_for = (artifact_metadata(path).get("program_config") or {}).get("label_set", "four-way")
            if binary and compiled_for != "binary":
                raise BooklensError(f"{path} is a {compiled_for} verification program; {setting_name('--binary')} "
                                    "needs a binary one")
            binary = compiled_for == "binary"
            check_closed_book(path, evidence)
        programs["verification"] = load_judge("binary" if binary else "verification", path,
                                              zero_shot=zero_shot and path is None, tries=tries)
    if "decomposition" in tasks:
        from booklens.programs.faithfulness import build_decomposer

        decomposer = build_decomposer()
        if "decomposition" in artifacts:
            load_program(decomposer, artifacts["decomposition"], task="decomposition")
        programs["decomposition"] = decomposer
    return programs


def check_closed_book(path: Path, evidence: Optional[str]) -> None:
    """A compiled verifier is refused for closed-book verification: compile runs and scores its
    predictor with evidence, so with evidence 'none' its other predictor, which no optimizer ran or
    scored, would judge under the artifact's name. The programs `booklens judges build` writes
    (`default` in their metadata) hold annotated demos for both and run either way."""
    from booklens.optimizers.artifacts import artifact_metadata

    if evidence == "none" and not artifact_metadata(path).get("default"):
        raise BooklensError(f"{path} was compiled with evidence; closed-book verification (evidence none) runs a "
                            "predictor it did not compile: drop the program to use the default judge, or give "
                            "the verifier evidence")


def check_not_binary(path: Path, block: Mapping[str, Any]) -> None:
    """`evaluate verification` runs the four-way verifier `compile` makes; the binary rater (shipped, or
    written by `booklens judges build`) is measured by `booklens calibrate`, on Table 5's books: a
    one-line refusal that names that command, instead of failing to load it."""
    if (block.get("program_config") or {}).get("label_set") != "binary":
        return
    how = ("--judge binary" if Path(path).resolve() == default_path("binary").resolve()
           else f"--program {shlex.quote(str(path))}")
    raise BooklensError(f"{path} is the binary (faithful / unfaithful) rater; evaluate runs the four-way verifiers "
                        f"compile makes: measure it with `booklens calibrate {how}` (FABLES Table 5's books, "
                        "against the annotators' labels)")


def judge_name(task: str, program: Any) -> str:
    """The judge a task's program is: coherence, verification or binary."""
    if task == "coherence":
        return "coherence"
    return "binary" if getattr(program, "label_set", "four-way") == "binary" else "verification"


def program_fingerprint(program: Any) -> str:
    """sha256 of what a program shows the model: each predictor's instructions, fields and demos (the
    DSPy state without metadata or LM). Equal programs have equal fingerprints wherever they are loaded."""
    from booklens.optimizers.artifacts import predictor_names, program_state

    state = program_state(program)
    content = {name: {k: v for k, v in state[name].items() if k != "lm"} for name in predictor_names(program)}
    if getattr(program, "mode", None) == "batched":
        # How many sentences share a prompt changes what the model is shown: a batched judge is
        # measured (and its calibration found) at its own batch size.
        content["batch_size"] = program.batch_size
    text = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def judge_mode(judge: str, program: Any) -> str:
    if judge == "coherence":
        return getattr(program, "mode", "per-sentence")
    return getattr(program, "label_set", "four-way")


def demo_count(judge: str, program: Any) -> int:
    """The labelled examples the program shows in its mode (sentences for per-sentence coherence)."""
    if judge == "coherence":
        from booklens.programs.coherence import labelled_sentences

        batched = getattr(program, "batch_size", 1) > 1
        return labelled_sentences((program.detect_batch if batched else program.detect).demos, batched=batched)
    return len(program.verify.demos)


# ---------------------------------------------------------------------------
# The judge object of every record


def judge_info(judge: str, program: Any, lm: Any, *, store: Optional[dict[str, Any]] = None,
               server: Optional[str] = None, evidence: Optional[str] = None) -> Any:
    """`JudgeInfo` for a (program, LM) pair, with its stored calibration and warning. The store is the
    shipped one plus the user's next to the LM's call cache, unless `store` is given. `server`: the
    LM's server URL when `lm` is only a name (an LM object says its own). `evidence`: the evidence
    mode a verifier's verdicts are made with (None where no verdicts are made)."""
    from booklens.lm.base import lm_label, lm_planned_window, lm_server
    from booklens.lm.remote import public_url
    from booklens.records import JudgeInfo

    lm_name, window = lm_label(lm), lm_planned_window(lm)
    server = public_url(server) if server else lm_server(lm)
    if store is None:
        call_cache = getattr(getattr(lm, "call_cache", None), "path", None)
        store = load_store(Path(call_cache).parent if call_cache is not None else None)
    fingerprint = program_fingerprint(program)
    mode = judge_mode(judge, program)
    entry = find_calibration(judge, mode, lm_name, fingerprint, server=server, store=store, window=window)
    info = JudgeInfo(task=task_of(judge), mode=mode, program=getattr(program, "_booklens_judge", "program"),
                     program_sha256=fingerprint, demos=demo_count(judge, program), lm=lm_name, api_base=server,
                     compiled_with=compiled_with(getattr(program, "_booklens_artifact", None)), calibration=entry,
                     evidence=evidence if judge != "coherence" else None, context_window=window)
    info.warning = judge_warning(info, batch_size=getattr(program, "batch_size", 1))
    return info


def compiled_with(block: Optional[dict[str, Any]]) -> Optional[str]:
    """The LM whose answers chose an artifact's demos or instructions; None when no LM chose them
    (annotated examples taken as they are: `labeled`, and the programs shipped with booklens)."""
    if not block or block.get("optimizer") == "labeled":
        return None
    lm = block.get("lm")
    return lm if isinstance(lm, str) and lm else None


def other_lm_note(label: str, made_with: Optional[str], lm: str) -> Optional[str]:
    """A note when an artifact runs on an LM other than the one it was compiled with (`compiled_with`)."""
    if made_with is None or made_with == lm:
        return None
    return (f"{label} was compiled with {made_with}: its demos and instructions were chosen by how that LM did "
            f"with them, and may serve {lm} less well")


def artifact_note(path: Optional[Path], lm: str) -> Optional[str]:
    """`other_lm_note` for an artifact given by its file: the summarizer and claim-decomposition
    programs, which have no judge line to carry it."""
    if path is None:
        return None
    from booklens.optimizers.artifacts import artifact_metadata

    return other_lm_note(str(path), compiled_with(artifact_metadata(path)), lm)


def verification_reference() -> float:
    """FABLES' GPT-4-Turbo unfaithful F1 over all of Table 5 (human evidence): the verifiers' bar."""
    from booklens.metrics.fables import SEED_TABLE5_HUMAN_EVIDENCE  # numpy: loaded only when a judge is shown

    return SEED_TABLE5_HUMAN_EVIDENCE["Overall"][1]


def _apart(value: float, reference: float) -> tuple[str, str]:
    """A figure and its reference with the fewest decimals (from two) that tell them apart, so that a
    judge just below the bar does not read as reaching it."""
    # Unrounded figures (a Table 5 F1 such as 36/139) can match the bar to four decimals and more:
    # add decimals until the two differ, never printing a figure below the bar as the bar itself.
    for digits in range(2, 10):
        shown, bar = f"{value:.{digits}f}", f"{reference:.{digits}f}"
        if shown != bar:
            return shown, bar
    return f"{value:.10f}", f"{reference:.10f}"


def calibrate_advice(info: Any, batch_size: int = 1, cache_dir: str | Path | None = None) -> str:
    """The `booklens calibrate` command line that measures the judge `info` describes. `batch_size`:
    a batched coherence judge's; `cache_dir`: the cache a run looked for calibrations in, named when
    it is not the default (`cache_option`)."""
    lm = "local" if info.lm.startswith("local/") else info.lm
    how = {"default": "", "zero-shot": " --zero-shot"}.get(info.program, f" --program {shlex.quote(info.program)}")
    if info.mode == "binary" and info.program in ("default", "zero-shot"):
        how += " --judge binary"
    if info.mode == "batched":
        if info.program in ("default", "zero-shot"):
            how += " --judge coherence"
        how += f" --batch-size {batch_size}"
    server = f" --api-base {shlex.quote(info.api_base)}" if info.api_base else ""
    window = f" --context-window {info.context_window}" if getattr(info, "context_window", None) else ""
    return f"booklens calibrate --lm {lm}{server}{how}{window}{cache_option(cache_dir)}"


def cache_option(cache_dir: str | Path | None) -> str:
    """' --cache-dir DIR' when `cache_dir` names a cache other than the default, '' otherwise:
    `calibrate` stores its figures in the default cache unless told, where a run with another
    --cache-dir never looks for them."""
    from booklens.lm.cache import cache_folder

    folder = cache_folder(cache_dir).absolute()
    if folder == cache_folder(None).absolute():
        return ""
    return f" --cache-dir {shlex.quote(str(folder))}"


def shown_warning(info: Any, cache_dir: str | Path | None = None) -> Optional[str]:
    """The judge's warning as a command prints it after a run with the cache `cache_dir`: a
    no-calibration warning's advice then names that cache (`cache_option`). The record keeps the
    warning without it, since a record must not depend on where the cache is."""
    warning, option = info.warning, cache_option(cache_dir)
    # The advice closes the recorded warning (`judge_warning`): the option goes at its end, as
    # `calibrate_advice` puts it.
    if option and warning and not info.calibration and warning.endswith(")") and "(booklens calibrate " in warning:
        return warning[:-1] + option + ")"
    return warning


def judge_warning(info: Any, batch_size: int = 1) -> Optional[str]:
    """A warning naming the figure when the judge has no calibration or agrees with humans less than
    the papers' reference judge does; None otherwise. `batch_size`: a batched coherence judge's, for
    the command that calibrates it."""
    calibration = info.calibration
    if not calibration:
        return (f"no calibration: this judge's agreement with human annotators was never measured for "
                f"{judge_lm(info)} with this program ({calibrate_advice(info, batch_size)})")
    figures = calibration.get("figures") or {}
    if info.task == "coherence":
        kappa = (figures.get("kappa") or {}).get("value")
        counts = calibration.get("counts") or {}
        if kappa is None or kappa < COHERENCE_REFERENCE_KAPPA:
            shown, bar = _apart(0.0 if kappa is None else kappa, COHERENCE_REFERENCE_KAPPA)
            return (f"low agreement: this judge found {counts.get('tp', 0)} of {counts.get('human_confusing', 0)} "
                    f"sentences humans marked confusing on {calibration.get('sample_name', 'BooookScore')}; "
                    f"kappa {'undefined' if kappa is None else shown}, where GPT-4's released labels reach {bar}")
        return None
    # The reference is scored on the claims humans labelled faithful or unfaithful (Table 5): a
    # four-way judge is held to its figure on those claims, not on the partly supported ones too.
    table5 = calibration.get("table5") if info.mode != "binary" else None
    if table5:
        f1 = table5.get("f1_unfaithful")
        claims = f" on the {table5.get('n')} claims humans labelled faithful or unfaithful"
    else:
        f1, claims = ((figures.get("f1") or {}).get("unfaithful") or {}).get("value"), ""
    counts = calibration.get("counts") or {}
    reference = verification_reference()
    if f1 is None or f1 < reference:
        shown, bar = _apart(0.0 if f1 is None else f1, reference)
        return (f"low agreement: this judge found {counts.get('unfaithful_found', 0)} of "
                f"{counts.get('unfaithful', 0)} unfaithful claims on {calibration.get('sample_name', 'FABLES')}; "
                f"unfaithful F1 {'undefined' if f1 is None else shown}{claims}, where FABLES' GPT-4-Turbo rater "
                f"reaches {bar}")
    return None


def _fmt_figure(name: str, block: Optional[dict[str, Any]]) -> str:
    if not block or block.get("value") is None:
        return f"{name} -"
    lo, hi = block.get("ci95") or [None, None]
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
    return f"{name} {block['value']:.2f}{ci}"


def failed_note(task: str, calibration: dict[str, Any]) -> Optional[str]:
    """How many items of the calibration sample got no valid verdict, and how the figures took them:
    coherence leaves such sentences out, verification counts such claims as wrong. None when none
    failed. The judge line and the report's judge card both show it."""
    if task == "coherence":
        n = calibration.get("n") or {}
        failed, total, what, how = n.get("failed"), n.get("sentences"), "sentence", "left out"
    else:
        counts = calibration.get("counts") or {}
        failed, total, what, how = counts.get("failed"), counts.get("claims"), "claim", "counted as wrong"
    if not failed:
        return None
    return f"{failed} of {counted(total or 0, what)} got no valid verdict: {how}"


def evidence_note(info: Any) -> Optional[str]:
    """When a verifier's verdicts had other evidence than its calibration (the annotators' quotes):
    the figures measured it in a setting other than the one it judged in. None otherwise."""
    from booklens.calibration import VERIFICATION_EVIDENCE

    if info.task != "verification" or not info.calibration or info.evidence in (None, VERIFICATION_EVIDENCE):
        return None
    # in the words of the setting, not of an option: a sweep's manifest says `evidence: bm25`
    had = "none" if info.evidence == "none" else f"{info.evidence} evidence"
    return f"measured with the annotators' evidence quotes, where the verdicts here had {had}"


def window_note(info: Any) -> Optional[str]:
    """The window a judge's prompts were planned for, when one was set (its calibration is keyed by it)."""
    window = getattr(info, "context_window", None)
    return f"planned for a {window}-token window" if window else None


def judge_lm(info: Any) -> str:
    """The LM a judge ran on, with the server it was reached at when one was given (a self-hosted
    server answers to any model name): the judge line, its warning and the report's card say it so."""
    return f"{info.lm} at {info.api_base}" if info.api_base else info.lm


def judge_line(info: Any, cache_dir: str | Path | None = None) -> str:
    """One line for the terminal: who judged and how well it agrees with humans. `cache_dir`: the
    cache the command used, which the advice of a no-calibration warning names (`shown_warning`)."""
    name = {"default": "default few-shot", "zero-shot": "zero-shot"}.get(info.program, info.program)
    noun = "demo" if info.demos == 1 else "demos"
    demos = f"{info.demos} {noun}" if info.demos_shown is None else f"{info.demos_shown} of {info.demos} {noun}"
    head = (f"judge: {name} {info.task} program ({info.mode}, {demos}, "
            f"{info.program_sha256[:12]}) on {judge_lm(info)}")
    window = window_note(info)
    head += f", {window}" if window else ""
    c = info.calibration
    if c:
        figures = c.get("figures") or {}
        if info.task == "coherence":
            parts = [_fmt_figure('"confusing" F1', figures.get("f1")), _fmt_figure("kappa", figures.get("kappa"))]
        else:
            f1 = figures.get("f1") or {}
            parts = [_fmt_figure("F1 faithful", f1.get("faithful")), _fmt_figure("F1 unfaithful", f1.get("unfaithful")),
                     _fmt_figure("accuracy", figures.get("accuracy"))]
        head += f"; agreement with humans on {c.get('sample_name', 'the test split')}: {', '.join(parts)}"
        failed = failed_note(info.task, c)
        head += f" ({failed})" if failed else ""
        setting = evidence_note(info)
        head += f"; {setting}" if setting else ""
    note = other_lm_note(f"the {info.task} program", info.compiled_with, info.lm)
    warning = shown_warning(info, cache_dir)
    notes = "".join(f"\nnote: {line}" for line in (note, info.demos_note) if line)
    return head + notes + (f"\nwarning: {warning}" if warning else "")


# ---------------------------------------------------------------------------
# Calibration store


def calibration_key(judge: str, mode: str, lm: str, fingerprint: str, server: Optional[str] = None,
                    window: Optional[int] = None) -> str:
    """One calibration per judge, mode, LM and program; an LM reached at a server of one's own is
    keyed with the URL too, as the call cache is: the model name alone does not say which model a
    self-hosted server runs. A window set for the judge (`lm_planned_window`) keys it too: the
    prompts it plans (demos that fit, evidence budgets) are another judge's."""
    return f"{judge}|{mode}|{lm}{'@' + server if server else ''}|{fingerprint}" + (
        f"|window={window}" if window else "")


def user_store_path(cache_dir: str | Path | None = None) -> Path:
    from booklens.lm.cache import cache_folder

    folder = cache_folder(cache_dir)
    if folder.exists() and not folder.is_dir():  # else read as a store that holds no calibration
        raise BooklensError(f"cannot use {folder} as the cache directory: it is a file")
    return folder / CALIBRATION_FILE


def read_store(path: Path) -> dict[str, Any]:
    """The calibrations in one store file (an empty store when the file does not exist)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BooklensError(f"calibration store {path} is unreadable: {exc}") from None
    entries = data.get("calibrations") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise BooklensError(f"calibration store {path} is not a booklens calibration file")
    for key, entry in entries.items():
        problem = _entry_problem(entry)
        if problem:  # every judge line and warning reads these figures: one line here, not a crash there
            raise BooklensError(f"calibration store {path}: the entry {key!r} is malformed ({problem}); remove it, "
                                "or measure the judge again with booklens calibrate")
    return entries


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _figure_problem(name: str, block: Any) -> Optional[str]:
    """What is wrong with one stored figure ({"value", "ci95", "n"}), or None."""
    if not isinstance(block, dict):
        return f"figure {name} is not an object"
    if block.get("value") is not None and not _is_number(block["value"]):
        return f"the value of {name} is not a number"
    ci = block.get("ci95")
    if ci is not None and not (isinstance(ci, list) and len(ci) == 2 and all(v is None or _is_number(v) for v in ci)):
        return f"the interval of {name} is not two numbers"
    return None


def _entry_problem(entry: Any) -> Optional[str]:
    """What is wrong with the shape of a stored calibration, as far as the judge lines read it, or None."""
    if not isinstance(entry, dict):
        return "not an object"
    figures = entry.get("figures")
    if not isinstance(figures, dict):
        return "no 'figures' object"
    for name, block in figures.items():
        # coherence's "f1" is one figure; verification's holds one per label
        per_label = name == "f1" and isinstance(block, dict) and "value" not in block
        for label, figure in (block.items() if per_label else [(name, block)]):
            problem = _figure_problem(f"F1 {label}" if per_label else label, figure)
            if problem:
                return problem
    for part in ("counts", "n", "table5"):
        if part in entry and not isinstance(entry[part], dict):
            return f"'{part}' is not an object"
    # The sizes `store_calibration` compares and the counts the judge lines print; counts' "predicted"
    # holds one count per label.
    for part in ("n", "counts"):
        for name, value in (entry.get(part) or {}).items():
            for label, count in (value.items() if name == "predicted" and isinstance(value, dict) else [(name, value)]):
                if count is not None and not _is_number(count):
                    return f"{part} {label!r} is not a number"
    f1 = (entry.get("table5") or {}).get("f1_unfaithful")
    if f1 is not None and not _is_number(f1):
        return "the Table 5 unfaithful F1 is not a number"
    return None


def load_store(cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Shipped calibrations, then the user's (which win on the same key)."""
    return {**read_store(DEFAULTS_DIR / CALIBRATION_FILE), **read_store(user_store_path(cache_dir))}


def find_calibration(judge: str, mode: str, lm: str, fingerprint: str, *, server: Optional[str] = None,
                     store: Optional[dict[str, Any]] = None, window: Optional[int] = None) -> Optional[dict[str, Any]]:
    entries = store if store is not None else load_store()
    entry = entries.get(calibration_key(judge, mode, lm, fingerprint, server, window))
    return dict(entry) if isinstance(entry, dict) else None


def write_store(path: Path, entries: dict[str, Any]) -> None:
    """Write a store file (keys sorted, so the same calibrations give the same bytes)."""
    from booklens.records import save_json

    save_json(path, {"kind": "booklens.calibrations", "format_version": 1,
                     "calibrations": {k: entries[k] for k in sorted(entries)}})


def sample_size(entry: dict[str, Any]) -> tuple[int, str]:
    """How many items a calibration measured the judge on, and what they are: sentences for
    coherence, claims for the verifiers (what its figures and their intervals rest on: the sentences
    compared, since those the judge gave no verdict on are left out; every claim, since a failed
    verification counts as wrong)."""
    n = entry.get("n") or {}
    if entry.get("judge") == "coherence" or "sentences" in n:
        compared = n.get("compared")
        return (compared if compared is not None else n.get("sentences") or 0), "sentence"
    return n.get("claims") or 0, "claim"


def store_calibration(entry: dict[str, Any], path: Path, *, replace: bool = False) -> Optional[str]:
    """Add one calibration to the store file at `path`, replacing the one of the same key unless that
    one, or the one booklens ships for the key, was measured on more items (a quick check after a long
    calibration would otherwise erase it unnoticed, and a user store's entry hides the shipped one at
    lookup): then nothing is written, and the reason is returned. `replace` stores it anyway.
    Two calibrations stored at once (two commands on one cache) both stay: the store is read and
    written under a lock, so the second adds its entry to what the first wrote. The lock file goes
    beside the store, whose folder is made first (two commands into a new folder lock too); where
    the folder cannot be made or takes no lock, the store is written without one."""
    from booklens.records import file_lock

    if not replace and not path.parent.exists():  # declined for the shipped entry: no folder left behind
        reason = _declined(entry, {}, path)
        if reason:
            return reason
    with contextlib.suppress(OSError):  # a folder that cannot be made fails where the store is written
        path.parent.mkdir(parents=True, exist_ok=True)
    if path.parent.is_dir():
        with file_lock(path.parent / f".{path.name}.lock"):
            return _store_calibration(entry, path, replace=replace)
    return _store_calibration(entry, path, replace=replace)


def _store_calibration(entry: dict[str, Any], path: Path, *, replace: bool) -> Optional[str]:
    entries = read_store(path)
    reason = None if replace else _declined(entry, entries, path)
    if reason:
        return reason
    entries[entry["key"]] = entry
    write_store(path, entries)
    return None


def _declined(entry: dict[str, Any], entries: dict[str, Any], path: Path) -> Optional[str]:
    """Why `entry` is not stored in the store at `path` holding `entries` (see `store_calibration`), or None."""
    shipped_path = DEFAULTS_DIR / CALIBRATION_FILE
    held = [(entries.get(entry["key"]), f"the calibration {path} holds for this judge and LM")]
    if path.resolve() != shipped_path.resolve():
        held.append((read_store(shipped_path).get(entry["key"]), f"the calibration booklens ships "
                     f"({shipped_path}) for this judge and LM, which it would hide"))
    new, what = sample_size(entry)
    sizes = [(sample_size(stored)[0], where) for stored, where in held if isinstance(stored, dict)]
    old, where = max(sizes, key=lambda size: size[0], default=(0, ""))  # the store's own first on a tie
    if new < old:
        replace = setting_name("--replace", keyword="replace=True")
        return f"its {counted(new, what)} are fewer than the {old} of {where} (give {replace} to store it instead)"
    return None


# ---------------------------------------------------------------------------
# Building the default programs from the human annotations


def _file_entry(path: Path) -> dict[str, str]:
    from booklens.optimizers.artifacts import sha256_of

    return {"name": path.name, "sha256": sha256_of(path)}


def coherence_demo_limit() -> int:
    """cl100k tokens the instructions and demos of the default coherence program may take, so that a
    judged summary of `JUDGED_SUMMARY_TOKENS`, its sentence and the answer still fit the embedded window."""
    from booklens.programs.coherence import answer_budget, demo_token_limit

    return demo_token_limit(EMBEDDED_WINDOW, summary_tokens=JUDGED_SUMMARY_TOKENS,
                            judged_tokens=TARGET_SENTENCE_TOKENS, answer_tokens=answer_budget(1))


def coherence_prompt_tokens(program: Any) -> int:
    """cl100k tokens of the per-sentence prompt's shared part: system message and demos."""
    from booklens.programs.coherence import instructions_and_demos_tokens

    return instructions_and_demos_tokens(program.detect, program.detect.demos)


def _sentence_demo(annotation: Any, index: int, label: Any) -> dict[str, Any]:
    from booklens.programs.coherence import occurrence_targets

    # The sentence as `score` asks it in this summary: a copy of a repeated sentence names its occurrence.
    return {"summary": annotation.summary, "sentence": occurrence_targets(annotation.sentences)[index],
            "verdict": "confusion" if label.confusing else "no confusion",
            "questions": [q.strip() for q in label.questions if q.strip()] if label.confusing else [],
            "error_types": list(label.types) if label.confusing else []}


def _pick_sentences(labels: Sequence[Any], per_side: int, rng: random.Random) -> list[int]:
    confusing = [s.index for s in labels if s.confusing]
    clean = [s.index for s in labels if not s.confusing]
    chosen = rng.sample(confusing, min(per_side, len(confusing))) + rng.sample(clean, min(per_side, len(clean)))
    return sorted(chosen)


def build_coherence_default(human_dir: str | Path, *, seed: int = DEFAULT_SEED) -> tuple[Any, dict[str, Any]]:
    """The default confusion detector and its metadata.

    Rule: the human-annotated summaries are split by book (seed 0, 40/20/40%); from the training split,
    the summaries with at least `COHERENCE_MIN_LABELS` confusing and clean sentences and at most
    `COHERENCE_MAX_SUMMARY_TOKENS` tokens are shuffled with the seed, and the first of each file
    (incremental, hierarchical) is a demo. Of each demo summary, up to `COHERENCE_MAX_CONFUSING`
    confusing sentences and as many clean ones are drawn with the seed and shown in summary order,
    fewer per summary while the instructions and demos exceed `coherence_demo_limit()`. The batched
    predictor gets the same labels, one demo per summary."""
    import dspy

    from booklens.data.booookscore import human_annotation_files, load_human_summaries, split_human_summaries
    from booklens.inputs import as_path
    from booklens.programs.coherence import build_scorer, number_sentences
    from booklens.text import count_tokens

    human_dir = as_path(human_dir, "human_dir", "the folder of BooookScore's human annotations")
    files = human_annotation_files(human_dir)
    missing = [name for name in COHERENCE_DEMO_SUMMARIES if name not in {f.name for f in files}]
    if missing:
        raise BooklensError(f"{human_dir} lacks {', '.join(missing)} (the BooookScore human annotations)")
    splits = split_human_summaries(load_human_summaries(human_dir), seed=seed)
    rng = random.Random(seed)
    eligible = []
    for source, annotation in splits["train"]:
        labels = annotation.sentence_annotations()
        n_confusing = sum(1 for s in labels if s.confusing)
        if (n_confusing >= COHERENCE_MIN_LABELS and len(labels) - n_confusing >= COHERENCE_MIN_LABELS
                and count_tokens(annotation.summary) <= COHERENCE_MAX_SUMMARY_TOKENS):
            eligible.append((source, annotation, labels))
    eligible.sort(key=lambda item: (item[0], item[1].book))
    rng.shuffle(eligible)
    chosen = []
    for name in COHERENCE_DEMO_SUMMARIES:
        match = next((item for item in eligible if item[0] == name), None)
        if match is None:
            raise BooklensError(f"no training-split summary in {name} qualifies as a demo")
        chosen.append(match)

    limit = coherence_demo_limit()
    for per_side in range(COHERENCE_MAX_CONFUSING, 0, -1):
        picks = [_pick_sentences(labels, per_side, random.Random(f"{seed}:{source}:{a.book}"))
                 for source, a, labels in chosen]
        program = build_scorer(batch_size=1, concurrency=1)
        program.detect.demos = [dspy.Example(**_sentence_demo(a, i, labels[i]))
                                for (source, a, labels), indices in zip(chosen, picks) for i in indices]
        if coherence_prompt_tokens(program) <= limit:
            break
    else:  # pragma: no cover - the data always leaves room for one pair
        raise BooklensError("no demo set fits the embedded model's window")
    program.detect_batch.demos = [dspy.Example(
        summary=a.summary, sentences=number_sentences(a.sentences, indices),
        answers=[{"number": i + 1, **{k: v for k, v in _sentence_demo(a, i, labels[i]).items()
                                      if k in ("verdict", "questions", "error_types")}} for i in indices])
        for (source, a, labels), indices in zip(chosen, picks)]
    metadata = {
        "dataset": {"kind": "BooookScore human annotations", "files": [_file_entry(f) for f in files]},
        "split": {"by": "book", "seed": seed, "fractions": _fractions(), "demos_from": "train",
                  "books": {name: len({a.book for _, a in items}) for name, items in splits.items()}},
        "selection": {
            "rule": _rule(build_coherence_default),
            "demo_summaries": [{"file": source, "book": a.book, "sentences": len(a.sentences),
                                "labelled": [i + 1 for i in indices],
                                "confusing": sum(1 for i in indices if labels[i].confusing)}
                               for (source, a, labels), indices in zip(chosen, picks)],
            "per_side": per_side,
            "prompt_tokens": coherence_prompt_tokens(program),
            "prompt_limit": limit,
            "room_for_judged_summary": JUDGED_SUMMARY_TOKENS,
        },
    }
    return program, metadata


def _verification_pool(fables_path: str | Path, seed: int) -> tuple[list[Any], dict[str, Any]]:
    from booklens.data.fables import TABLE5_BOOKS, all_claims, annotator_reason, load_fables, split_summaries
    from booklens.programs.faithfulness import clean_evidence, speaks_of_unsettled_evidence
    from booklens.signatures.faithfulness import FABLES_LABELS
    from booklens.text import count_tokens

    summaries = load_fables(fables_path)
    splits = split_summaries(summaries, seed=seed)
    pool = []
    for claim in all_claims(s for s in splits["train"] if s.book not in TABLE5_BOOKS):
        reason = annotator_reason(claim)
        if not reason or count_tokens(reason) > DEMO_REASON_TOKENS or len(claim.claim.split()) < DEMO_CLAIM_WORDS:
            continue
        # The reason must agree with the label: a can't-verify demo says why it cannot be verified,
        # and no other demo speaks of evidence that does not settle the claim.
        label = FABLES_LABELS[claim.label]
        probe = "faithful" if label == CANT_VERIFY else label
        if speaks_of_unsettled_evidence(reason, probe) != (label == CANT_VERIFY):
            continue
        evidence = count_tokens(" ".join(clean_evidence(claim.evidence)))
        low, high = DEMO_EVIDENCE_TOKENS
        if claim.label == "Inapplicable" or low <= evidence <= high:
            pool.append(claim)
    info = {"split": {"by": "book", "seed": seed, "fractions": _fractions(), "demos_from": "train",
                      "excluded_books": sorted(b for b in TABLE5_BOOKS if b in {s.book for s in splits["train"]}),
                      "books": {name: len({s.book for s in items}) for name, items in splits.items()}}}
    return pool, info


def build_verification_default(fables_path: str | Path, *, binary: bool = False,
                               seed: int = DEFAULT_SEED) -> tuple[Any, dict[str, Any]]:
    """The default claim verifier (four-way, or the binary Table 5 rater) and its metadata.

    Rule: FABLES summaries are split by book (seed 0, 40/20/40%); demos come from the training
    split without Table 5's books. A claim of at least `DEMO_CLAIM_WORDS` words qualifies when its
    annotators gave a reason of at most `DEMO_REASON_TOKENS` tokens that agrees with the label as
    booklens reads reasons (only a can't-verify reason says the claim cannot be settled), and quotes
    of `DEMO_EVIDENCE_TOKENS` tokens (a can't-verify claim may have none). The qualifying claims of
    each label are shuffled with the seed and taken in turn, in the label order of
    `VERIFICATION_DEMOS` (binary: `BINARY_DEMOS`)."""
    from booklens.data.fables import verification_demo
    from booklens.inputs import as_path
    from booklens.optimizers.compile import usable_demos
    from booklens.signatures.faithfulness import FABLES_LABELS

    fables_path = as_path(fables_path, "fables_path", "the FABLES annotations file")
    pool, info = _verification_pool(fables_path, seed)
    by_label: dict[str, list[Any]] = {}
    for claim in sorted(pool, key=lambda c: c.id):
        by_label.setdefault(FABLES_LABELS[claim.label], []).append(claim)
    rng = random.Random(seed)
    for label in sorted(by_label):
        rng.shuffle(by_label[label])
    order = BINARY_DEMOS if binary else VERIFICATION_DEMOS
    taken: dict[str, int] = {}
    claims = []
    for label in order:
        position = taken.get(label, 0)
        candidates = by_label.get(label, [])
        if position >= len(candidates):
            raise BooklensError(f"not enough '{label}' claims in FABLES' training split for the demos")
        claims.append(candidates[position])
        taken[label] = position + 1
    program = new_program("binary" if binary else "verification")
    examples = [verification_demo(c) for c in claims]
    program.verify.demos = examples
    program.verify_without_evidence.demos = examples
    for _, predictor in program.named_predictors():
        predictor.demos = usable_demos(predictor)
    metadata = {
        "dataset": {"kind": "FABLES claim annotations", "files": [_file_entry(Path(fables_path))]},
        **info,
        "selection": {
            "rule": _rule(build_verification_default),
            "demos": [{"id": c.id, "label": FABLES_LABELS[c.label]} for c in claims],
            "demo_tokens": program.demo_tokens(),
        },
    }
    return program, metadata


def _rule(builder: Any) -> str:
    """The selection rule of a builder's docstring as one line, with the constants' values filled in."""
    import re

    text = " ".join(builder.__doc__.split("Rule: ", 1)[1].split())
    names = {"coherence_demo_limit()": f"{coherence_demo_limit():,} tokens"}
    for key, value in globals().items():
        if key.isupper() and isinstance(value, int):
            names[key] = str(value)
        elif key.isupper() and isinstance(value, tuple) and all(isinstance(v, int) for v in value):
            names[key] = " to ".join(str(v) for v in value)
        elif key.isupper() and isinstance(value, tuple):
            names[key] = ", ".join(str(v) for v in value)
    return re.sub(r"`([^`]+)`", lambda m: names.get(m.group(1), m.group(1)), text)


def _fractions() -> dict[str, float]:
    from booklens.data.splits import DEFAULT_FRACTIONS

    return dict(DEFAULT_FRACTIONS)


def check_judges_folder(output: str | Path) -> None:
    """A one-line error unless the default judges can be written to the folder `output`: checked
    before any annotation is read or looked up (`judges build`, `build_defaults`)."""
    from booklens.inputs import as_path
    from booklens.records import nearest_existing_folder, present

    output = as_path(output, "output", "the folder to write the default judges to")
    exists = present(output)
    if exists and not output.is_dir():
        raise BooklensError(f"{output} is a file: the default judges are written to a folder "
                            f"({', '.join(DEFAULT_FILES.values())})")
    if not exists and not nearest_existing_folder(output).is_dir():
        raise BooklensError(f"cannot write the judges to {output}: {nearest_existing_folder(output)} is not a folder")


def build_defaults(human_dir: str | Path, fables_path: str | Path, output: str | Path = DEFAULTS_DIR,
                   *, seed: int = DEFAULT_SEED, unchanged_only: bool = False) -> dict[str, Path]:
    """Write the three default programs to `output`; returns judge -> path. With `unchanged_only`,
    a file of `output` the build would change is a one-line error and nothing is written (`judges
    build` without -o: the shipped judges, which their calibration belongs to, are only rewritten as
    they are)."""
    import tempfile

    from booklens.inputs import as_path
    from booklens.optimizers.artifacts import save_program
    from booklens.records import write_atomically

    output = as_path(output, "output", "the folder to write the default judges to")
    check_judges_folder(output)  # first: building reads every annotation
    human_dir = as_path(human_dir, "human_dir", "the folder of BooookScore's human annotations")
    fables_path = as_path(fables_path, "fables_path", "the FABLES annotations file")
    built = {
        "coherence": build_coherence_default(human_dir, seed=seed),
        "verification": build_verification_default(fables_path, seed=seed),
        "binary": build_verification_default(fables_path, binary=True, seed=seed),
    }
    contents = {}
    with tempfile.TemporaryDirectory() as scratch:  # every file made before any is written
        for judge, (program, metadata) in built.items():
            path = Path(scratch) / DEFAULT_FILES[judge]
            config = {"batch_size": 1} if judge == "coherence" else {"label_set": program.label_set}
            save_program(program, path, task=task_of(judge), program_config=config, seed=seed,
                         optimizer="human-annotated demos (booklens judges build)", lm=None, default=True,
                         fingerprint=program_fingerprint(program), **metadata)
            contents[judge] = path.read_bytes()
    if unchanged_only:
        changed = [DEFAULT_FILES[judge] for judge, data in contents.items()
                   if (output / DEFAULT_FILES[judge]).is_file() and (output / DEFAULT_FILES[judge]).read_bytes() != data]
        if changed:
            raise BooklensError(f"the judges built differ from the ones in {output} ({', '.join(changed)} would "
                                f"change): write them elsewhere with -o DIR, or replace those with -o {output}")
    written = {}
    for judge, data in contents.items():
        path = output / DEFAULT_FILES[judge]

        def write(tmp: str, data: bytes = data) -> None:
            with open(tmp, "wb") as handle:
                handle.write(data)

        try:
            write_atomically(path, write)
        except OSError as exc:
            raise BooklensError(f"cannot write {path}: {exc.strerror or exc}") from None
        written[judge] = path
    return written
