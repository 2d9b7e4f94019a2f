"""How well a judge agrees with human annotators, measured on the test splits (`booklens calibrate`).

- coherence: the judge labels every sentence of human-annotated summaries (BooookScore's GPT-4 4096
  summaries, both methods) and is compared with the humans' spans: "confusing" precision, recall,
  F1, Cohen's kappa and accuracy. Sentences the judge failed on are left out and counted.
- verification (four-way): the judge labels FABLES claims given the annotators' evidence quotes
  (the seed's "human evidence" setting); F1 of each label and accuracy over all claims, plus the
  seed's Table 5 convention (faithful and unfaithful F1 over the claims humans labelled faithful or
  unfaithful). A failed verification counts as a wrong label.
- binary: the faithful / unfaithful rater on the faithful and unfaithful claims of Table 5's seven
  books (all in the public release: 723 claims), with F1 per summarizer next to the seed's
  GPT-4-Turbo rater.

A judge that gave no valid verdict on any sentence or claim of the sample has measured nothing:
`JudgedNothing` (a one-line error quoting the first failure) instead of an entry.

The test split is the one the program was compiled on: the books are split with the seed in the
artifact's metadata (`split_seed_of`; 0 for the default and zero-shot judges), so no book the program
learned its demos from is measured, whatever seed draws the sample. A sample item that is one of the
program's demos (an artifact compiled on other data) is refused (`DemosInSample`), and so is a sample
whose human labels are all of one kind (`_one_kind`): kappa and the unfaithful F1 need both.

Samples are whole books of the test split, drawn with a fixed seed, so that the embedded model
calibrates in under an hour on two cores: `COHERENCE_BOOKS` books (both summaries of each) and `VERIFICATION_BOOKS`
books (every summarizer's claims). Each figure carries its sample size and a 95% bootstrap interval
over summaries (`booklens.metrics.bootstrap`). The stored entry depends only on the data, the
program, the LM's answers and the sample, so an unchanged calibration rewrites the same bytes. A
summary none of whose sentences the judge gave a verdict on is counted but is no resampling unit.

`calibrate` measures one judge. `booklens calibrate` is `plan_calibration` (the judges and their data,
checked with no LM), `check_calibration_samples` and `calibrate_judges`, which measures and stores each.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional

from booklens.errors import BooklensError, setting_name
from booklens.lm.base import lm_label, lm_planned_window, lm_server, window_setting
from booklens.vocabulary import BINARY_LABELS, CLAIM_LABELS, counted

COHERENCE_BOOKS = 2
VERIFICATION_BOOKS = 1
SEED = 0
# The evidence a verifier is calibrated with: the annotators' quotes (the seed's "human evidence").
VERIFICATION_EVIDENCE = "given"


class JudgedNothing(BooklensError):
    """The judge gave no valid verdict on any item of the sample: there is no agreement to store."""


class DemosInSample(BooklensError):
    """Part of the sample is among the program's own demos: the agreement would be inflated."""


def split_seed_of(program: Any) -> Optional[int]:
    """The seed of the book split a loaded artifact was compiled on (its demos come from that split's
    training books), or None for a program that was not loaded from an artifact."""
    block = getattr(program, "_booklens_artifact", None)
    if not isinstance(block, dict):
        return None
    split = block.get("split")
    for value in ((split or {}).get("seed") if isinstance(split, dict) else None, block.get("seed")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _demo_values(program: Any, field: str) -> set[str]:
    """The `field` of every demo of every predictor, whitespace-normalized."""
    values = set()
    for _, predictor in program.named_predictors():
        for demo in predictor.demos:
            value = demo.get(field) if hasattr(demo, "get") else None
            if isinstance(value, str):
                values.add(" ".join(value.split()))
    return values


def _refuse_demos(judge: str, found: int, total: int, what: str) -> None:
    if found:
        raise DemosInSample(f"{judge} calibration: {found} of the {total} {what} of the sample "
                            f"{'is a demo' if found == 1 else 'are demos'} of this program (compiled on other "
                            "data or another split), so its agreement would be inflated; calibrate a program "
                            f"compiled on this data, or draw another sample with {setting_name('--seed')}")


def _judged_nothing(judge: str, items: int, what: str, failed: int, errors: list[str]) -> Optional[JudgedNothing]:
    """The error for a calibration whose every one of `items` failed (`steps.all_failed`, the rule
    score and verify apply): figures of no verdict would read as a measured (null) agreement."""
    from booklens.steps import all_failed

    reason = all_failed(f"{judge} calibration: the judge gave no valid verdict on any of the {counted(items, what)}",
                        items, failed, errors)
    return JudgedNothing(f"{reason}; nothing stored") if reason else None


def _empty_sample(judge: str, source: str | Path, what: str, table5: bool = False, books: int = 0) -> BooklensError:
    """A sample with nothing to compare: an entry of no figures would replace a measured one. `books`:
    how many test-split books were drawn (none when the test split is empty)."""
    if table5:
        why = "none of the seven books of FABLES' Table 5 is in it with faithful or unfaithful claims"
    elif books:
        why = f"the summaries of the {counted(books, 'book')} it drew from the test split have no claim with a label"
    else:
        why = "its test split is empty: give the whole data set"
    return BooklensError(f"{judge} calibration: the sample drawn from {source} holds no {what} ({why}); "
                         "nothing stored")


def _one_kind(judge: str, source: str | Path, labels: list[bool], items: str, verb: str, kind: str,
              figures: str, table5: bool = False) -> Optional[BooklensError]:
    """The refusal of a sample whose human `labels` (True: the `kind` the judge must find) are all alike:
    the `figures` named (the low-agreement warning reads one of them) are then 0 or undefined whatever
    the judge says, and such an entry would stand beside every later score as the judge's agreement.
    None when the sample holds both kinds."""
    found = sum(labels)
    if 0 < found < len(labels):
        return None
    share = f"none of the {len(labels)}" if found == 0 else f"all {len(labels)}"
    where = ("give FABLES data whose Table 5 books hold both" if table5
             else f"draw another sample with {setting_name('--books')} or {setting_name('--seed')}, or give other "
                  "annotations")
    what = (f"the humans {verb} {share} {items} of the sample drawn from {source} {kind}" if labels
            else f"the sample drawn from {source} holds no {items}")
    return BooklensError(f"{judge} calibration: {what}: {figures} to tell one judge from another; {where}; "
                         "nothing stored")


def _sample_books(books: list[str], count: Optional[int], seed: int, *, asked: bool = False,
                  split: str = "the test split") -> list[str]:
    """`count` books drawn with the seed (all of them when `count` is None or larger), sorted. A count
    the user `asked` for above the books of `split` is refused, as `compile --demos` above the training
    set is: the sample would be smaller than the one asked for, said nowhere but in its name."""
    if asked and count is not None and count > len(books):
        raise BooklensError(f"{setting_name('--books')} {count} asks for more books than the {len(books)} of {split} "
                            f"it draws them from: give at most {len(books)}")
    ordered = sorted(books)
    random.Random(seed).shuffle(ordered)
    return sorted(ordered if count is None else ordered[:count])


def _usage(meter: Any) -> dict[str, int]:
    data = meter.work()
    return {"calls": data["calls"], "prompt_tokens": data["prompt_tokens"],
            "completion_tokens": data["completion_tokens"]}


# ---------------------------------------------------------------------------
# Coherence


def coherence_sample(human_dir: str | Path, *, books: Optional[int] = COHERENCE_BOOKS, seed: int = SEED,
                     split_seed: Optional[int] = None, asked: bool = False
                     ) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """The human-annotated summaries of `books` books drawn with `seed` from the test split of the
    books split with `split_seed` (default: `seed`). `asked`: see `_sample_books`."""
    from booklens.data.booookscore import human_annotation_files, load_human_summaries, split_human_summaries
    from booklens.inputs import as_path
    from booklens.judges import _file_entry

    human_dir = as_path(human_dir, "human_dir", "the folder of BooookScore's human annotations")
    _check_books(books)
    split_seed = seed if split_seed is None else split_seed
    test = split_human_summaries(load_human_summaries(human_dir), seed=split_seed)["test"]
    chosen = _sample_books(list({a.book for _, a in test}), books, seed, asked=asked,
                           split=f"BooookScore's test split (split with seed {split_seed})")
    items = [(source, a) for source, a in test if a.book in chosen]
    items.sort(key=lambda item: (item[1].book, item[0]))
    info = {"files": [_file_entry(f) for f in human_annotation_files(human_dir)], "split": "test", "seed": seed,
            "split_seed": split_seed, "books": chosen,
            "selection": f"{len(chosen)} of the {len({a.book for _, a in test})} test-split books (split with "
                         f"seed {split_seed}), drawn with seed {seed}; every human-annotated summary of each"}
    return items, info


def _coherence_items(program: Any, *, human_dir: str | Path, books: Optional[int], seed: int,
                     split_seed: Optional[int], asked: bool = False, window: Optional[int] = None,
                     setting: Optional[dict[str, Any]] = None) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """The coherence sample, or the refusals to measure on it (more books asked for than there are,
    no annotated sentence, demos in it, a summary that does not fit a known `window` even with no demo;
    `setting`: the option that set that window, `booklens.lm.base.window_setting`)."""
    from booklens.programs.coherence import refuse_misfits

    items, info = coherence_sample(human_dir, books=books, seed=seed, split_seed=split_seed, asked=asked)
    if not any(a.sentence_annotations() for _, a in items):
        raise _empty_sample("coherence", human_dir, "annotated sentence")
    alike = _one_kind("coherence", human_dir, [s.confusing for _, a in items for s in a.sentence_annotations()],
                      "sentences", "marked", "confusing",
                      'kappa and the "confusing" F1 need both confusing and clean sentences')
    if alike:
        raise alike
    shown = _demo_values(program, "summary")
    _refuse_demos("coherence", sum(1 for _, a in items if " ".join(a.summary.split()) in shown), len(items),
                  "summaries")
    refuse_misfits(program, ((f"{a.book!r} of {source}", a.summary) for source, a in items), window,
                   **(setting or {}))
    return items, info


def calibrate_coherence(program: Any, *, human_dir: str | Path, books: Optional[int] = COHERENCE_BOOKS,
                        seed: int = SEED, split_seed: Optional[int] = None, asked: bool = False,
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the confusion detector on the sample; figures against the human spans."""
    from booklens.lm import current_lm
    from booklens.metrics.bootstrap import confusion_counts, figure
    from booklens.lm.usage import UsageTracker
    from booklens.optimizers.evaluate import metered
    from booklens.programs.coherence import demos_note

    import dspy

    _check_program("coherence", program)
    items, info = _coherence_items(program, human_dir=human_dir, books=books, seed=seed, split_seed=split_seed,
                                   asked=asked, window=getattr(current_lm(), "context_window", None),
                                   setting=window_setting(current_lm(), "--context-window"))
    meter = UsageTracker()
    lm = metered(current_lm(), meter)
    units: list[list[int]] = []
    failed = sentences = 0
    errors: list[str] = []
    rows = []
    notes: list[str] = []  # the summaries judged with fewer demos than the program has, as `score` says it
    with dspy.context(lm=lm):
        for n, (source, annotation) in enumerate(items, start=1):
            prediction = program(summary=annotation.summary, sentences=annotation.sentences)
            human = annotation.sentence_annotations()
            pairs = [(p.confusing, h.confusing) for p, h in zip(prediction.annotations, human)
                     if p.status == "ok" and p.confusing is not None]
            failed += len(human) - len(pairs)
            errors += [p.error for p in prediction.annotations if p.status != "ok" and p.error]
            sentences += len(human)
            if pairs:  # a summary with no sentence compared is no unit: resampled, it would stand in for one
                units.append(confusion_counts([bool(p) for p, _ in pairs], [bool(h) for _, h in pairs]))
            rows.append({"file": source, "book": annotation.book, "sentences": len(human),
                         "judge_confusing": sum(1 for p, _ in pairs if p),
                         "human_confusing": sum(1 for h in human if h.confusing),
                         "demos_left_out": getattr(prediction, "demos_dropped", 0) or 0})
            note = demos_note(prediction)
            if note:
                notes.append(f"{annotation.book!r} ({source}): {note}")
            if progress:
                progress(f"coherence: {n}/{len(items)} summaries")
    compared = sentences - failed
    nothing = _judged_nothing("coherence", sentences, "sentence", failed, errors)
    if nothing:
        raise nothing
    tp, fp, fn, tn = (sum(u[i] for u in units) for i in range(4))
    figures = {name: figure(units, name, n=compared, seed=seed)
               for name in ("precision", "recall", "f1", "kappa", "accuracy")}
    return {
        "sample_name": f"BooookScore's test split ({len(items)} summar{'y' if len(items) == 1 else 'ies'} "
                       f"of {counted(len(info['books']), 'book')})",
        "data": info,
        "n": {"summaries": len(items), "sentences": sentences, "compared": compared, "failed": failed},
        "counts": {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "human_confusing": tp + fn, "judge_confusing": tp + fp},
        "figures": figures,
        "summaries": rows,
        "notes": notes,
        "usage": _usage(meter),
    }


# ---------------------------------------------------------------------------
# Verification


def verification_sample(fables_path: str | Path, *, books: Optional[int] = VERIFICATION_BOOKS,
                        table5: bool = False, seed: int = SEED, split_seed: Optional[int] = None,
                        asked: bool = False) -> tuple[list[Any], dict[str, Any]]:
    """FABLES summaries to verify: `books` books drawn with `seed` from the test split of the books
    split with `split_seed` (default: `seed`), or Table 5's books. `asked`: see `_sample_books`."""
    from booklens.data.fables import TABLE5_BOOKS, load_fables, split_summaries
    from booklens.inputs import as_path
    from booklens.judges import _file_entry

    fables_path = as_path(fables_path, "fables_path", "the FABLES annotations file")
    _check_books(books)
    summaries = load_fables(fables_path)
    if table5:
        present = {s.book for s in summaries}
        chosen = sorted(b for b in TABLE5_BOOKS if b in present)
        absent = sorted(b for b in TABLE5_BOOKS if b not in present)
        pool = [s for s in summaries if s.book in chosen]
        selection = "the seven books of the seed's Table 5" + (
            f" present in the release (absent: {', '.join(absent)})" if absent else " (all in the release)")
    else:
        split_seed = seed if split_seed is None else split_seed
        test = split_summaries(summaries, seed=split_seed)["test"]
        chosen = _sample_books(list({s.book for s in test}), books, seed, asked=asked,
                               split=f"FABLES' test split (split with seed {split_seed})")
        pool = [s for s in test if s.book in chosen]
        selection = (f"{len(chosen)} of the {len({s.book for s in test})} test-split books (split with seed "
                     f"{split_seed}), drawn with seed {seed}; every summarizer's claims of each")
    pool.sort(key=lambda s: (s.book, s.summarizer))
    info = {"files": [_file_entry(Path(fables_path))], "split": "table5" if table5 else "test", "seed": seed,
            **({} if table5 else {"split_seed": split_seed}), "books": chosen, "selection": selection}
    return pool, info


def _verification_items(program: Any, *, fables_path: str | Path, books: Optional[int], table5: bool, seed: int,
                        split_seed: Optional[int], asked: bool = False
                        ) -> tuple[list[Any], dict[str, Any], tuple[str, ...]]:
    """The verification sample and the labels measured on it, or the refusals to measure on it (no
    labelled claim, demos in it)."""
    from booklens.signatures.faithfulness import FABLES_LABELS

    binary = getattr(program, "label_set", "four-way") == "binary"
    keep = ("Yes", "No") if binary or table5 else tuple(FABLES_LABELS)
    summaries, info = verification_sample(fables_path, books=books, table5=table5 or binary and books is None,
                                          seed=seed, split_seed=split_seed, asked=asked)
    shown = _demo_values(program, "claim")
    claims_in_sample = [c.claim for s in summaries for c in s.claims if c.label in keep]
    if not claims_in_sample:
        raise _empty_sample("binary" if binary else "verification", fables_path, "labelled claim",
                            table5=info["split"] == "table5", books=len(info["books"]))
    # The bar a verifier is held to is its unfaithful F1 on the claims humans labelled faithful or unfaithful.
    alike = _one_kind("binary" if binary else "verification", fables_path,
                      [c.label == "No" for s in summaries for c in s.claims if c.label in ("Yes", "No")],
                      "faithful or unfaithful claims", "labelled", "unfaithful",
                      "the unfaithful F1 needs both faithful and unfaithful claims", table5=info["split"] == "table5")
    if alike:
        raise alike
    _refuse_demos("binary" if binary else "verification",
                  sum(1 for c in claims_in_sample if " ".join(c.split()) in shown), len(claims_in_sample), "claims")
    return summaries, info, keep


def calibrate_verification(program: Any, *, fables_path: str | Path, books: Optional[int] = VERIFICATION_BOOKS,
                           table5: bool = False, seed: int = SEED, split_seed: Optional[int] = None,
                           asked: bool = False, concurrency: int = 1,
                           progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the verifier with the annotators' evidence on the sample; figures against the human labels.

    The binary rater (and `table5=True`) is scored on the claims humans labelled faithful or
    unfaithful only, as the seed's Table 5 is."""
    import dspy

    from booklens.lm import current_lm
    from booklens.metrics.bootstrap import confusion_counts, figure
    from booklens.metrics.fables import verification_report
    from booklens.lm.usage import UsageTracker
    from booklens.optimizers.evaluate import metered
    from booklens.programs.faithfulness import FaithfulnessChecker
    from booklens.signatures.faithfulness import FABLES_LABELS

    _check_program("binary" if table5 else "verification", program)
    binary = getattr(program, "label_set", "four-way") == "binary"
    summaries, info, keep = _verification_items(program, fables_path=fables_path, books=books, table5=table5,
                                                seed=seed, split_seed=split_seed, asked=asked)
    meter = UsageTracker()
    lm = metered(current_lm(), meter)
    checker = FaithfulnessChecker(verifier=program, evidence_mode=VERIFICATION_EVIDENCE,
                                 concurrency=concurrency)
    gold: list[str] = []
    pred: list[Optional[str]] = []
    groups: list[str] = []
    units: list[tuple[list[str], list[Optional[str]]]] = []
    relabelled = 0
    errors: list[str] = []
    # Only the summaries with claims of the measured labels are judged: the progress counts those.
    judged = [(summary, [c for c in summary.claims if c.label in keep]) for summary in summaries]
    judged = [(summary, claims) for summary, claims in judged if claims]
    with dspy.context(lm=lm):
        for n, (summary, claims) in enumerate(judged, start=1):
            verdicts = checker.verify_claims([c.claim for c in claims], given_evidence=[c.evidence for c in claims])
            g = [FABLES_LABELS[c.label] for c in claims]
            p = [v.label for v in verdicts]
            relabelled += sum(1 for v in verdicts if v.relabelled)
            errors += [v.error for v in verdicts if v.label is None and v.error]
            gold += g
            pred += p
            groups += [summary.summarizer] * len(claims)
            units.append((g, p))
            if progress:
                progress(f"{'binary' if binary else 'verification'}: {n}/{len(judged)} summaries")
    nothing = _judged_nothing("binary" if binary else "verification", len(gold), "claim",
                              sum(1 for x in pred if x is None), errors)
    if nothing:
        raise nothing
    labels = BINARY_LABELS if binary or table5 else CLAIM_LABELS
    f1 = {}
    for label in labels:
        per_unit = [confusion_counts([x == label for x in p], [x == label for x in g]) for g, p in units]
        f1[label] = figure(per_unit, "f1", n=len(gold), seed=seed)
        f1[label]["support"] = sum(1 for x in gold if x == label)
    # (right, wrong, 0, 0) per summary: "accuracy" of those counts is the share of right labels
    right = [sum(1 for a, b in zip(g, p) if a == b) for g, p in units]
    accuracy = figure([[r, len(g) - r, 0, 0] for r, (g, _) in zip(right, units)], "accuracy", n=len(gold),
                      seed=seed)
    report = verification_report(gold, pred, groups, labels=BINARY_LABELS)
    entry = {
        "sample_name": (_table5_name(len(info["books"])) if info["split"] == "table5"
                        else f"FABLES' test split ({counted(len(info['books']), 'book')}, "
                             f"{counted(len(gold), 'claim')})"),
        "setting": "human evidence: the annotators' quotes (FABLES Table 5)",
        "data": info,
        "n": {"summaries": len(units), "claims": len(gold)},
        "counts": {"claims": len(gold), "unfaithful": sum(1 for x in gold if x == "unfaithful"),
                   "unfaithful_found": sum(1 for a, b in zip(gold, pred) if a == b == "unfaithful"),
                   "failed": sum(1 for x in pred if x is None), "relabelled_cant_verify": relabelled,
                   "predicted": {label: sum(1 for x in pred if x == label) for label in labels}},
        "figures": {"f1": f1, "accuracy": accuracy},
        "table5": {"n": report["overall"]["n"],
                   "f1_faithful": report["overall"]["f1"]["faithful"]["f1"],
                   "f1_unfaithful": report["overall"]["f1"]["unfaithful"]["f1"],
                   "accuracy": report["overall"]["accuracy"],
                   "by_summarizer": {name: {"n": s["n"], "f1_faithful": s["f1"]["faithful"]["f1"],
                                            "f1_unfaithful": s["f1"]["unfaithful"]["f1"],
                                            "accuracy": s["accuracy"]}
                                     for name, s in report["by_summarizer"].items()}},
        "usage": _usage(meter),
    }
    return entry


def _table5_name(present: int) -> str:
    """The name of the Table 5 sample: the seven books, or how many of them a smaller FABLES file holds."""
    from booklens.data.fables import TABLE5_BOOKS

    total = len(TABLE5_BOOKS)
    return "FABLES Table 5's seven books" if present == total else f"{present} of FABLES Table 5's seven books"


# ---------------------------------------------------------------------------
# One call for the command


def _check_program(judge: str, program: Any) -> None:
    """The judge's program to measure, or one line naming it: a judge's name or None handed over
    in its place failed deep inside, after the annotations were read."""
    if not callable(program) or not hasattr(program, "named_predictors"):
        from booklens.errors import kind_of

        raise BooklensError(f"program must be a judge program (booklens.judges.load_judge({judge!r})), "
                            f"not {kind_of(program)}")


def _check_books(books: Optional[int]) -> None:
    """`--books` as the commands bound it; None is every book (or the default sample)."""
    from booklens.parallel import check_at_least

    if books is not None:
        check_at_least("--books", books)


def _sample_of(judge: str, program: Any, *, human_dir: str | Path | None, fables_path: str | Path | None,
               books: Optional[int], seed: int) -> dict[str, Any]:
    """What `calibrate` samples `judge` from: the keyword arguments of its calibrate_* function."""
    from booklens.inputs import as_path
    from booklens.judges import JUDGES

    if judge not in JUDGES:
        raise BooklensError(f"unknown judge {judge!r}: use {', '.join(JUDGES)}")
    _check_books(books)
    _check_program(judge, program)
    split_seed = split_seed_of(program)
    split_seed = SEED if split_seed is None else split_seed
    if judge == "coherence":
        if human_dir is None:
            raise BooklensError("coherence calibration needs the BooookScore human annotations "
                                f"({setting_name('--coherence-data', keyword='human_dir')})")
        human_dir = as_path(human_dir, "human_dir", "the folder of BooookScore's human annotations")
        return {"human_dir": human_dir, "seed": seed, "split_seed": split_seed,
                "books": COHERENCE_BOOKS if books is None else books, "asked": books is not None}
    if fables_path is None:
        raise BooklensError("verification calibration needs FABLES "
                            f"({setting_name('--fables-data', keyword='fables_path')})")
    fables_path = as_path(fables_path, "fables_path", "the FABLES annotations file")
    table5 = judge == "binary"
    return {"fables_path": fables_path, "seed": seed, "split_seed": split_seed, "table5": table5,
            "books": None if table5 else (VERIFICATION_BOOKS if books is None else books),
            "asked": books is not None and not table5}


def check_sample(judge: str, program: Any, *, human_dir: str | Path | None = None,
                 fables_path: str | Path | None = None, books: Optional[int] = None, seed: int = SEED,
                 window: Optional[int] = None, setting: Optional[dict[str, Any]] = None) -> None:
    """Read the data `calibrate` would measure `judge` on and make every refusal it would make before
    its first LM call (unreadable data, an empty sample, the program's demos in it, a summary too long
    for the LM's `window` when it is known; `setting`: the option that set it, as `window_setting`
    says), calling no LM: a command that calibrates several judges fails before the first one's calls,
    not after them."""
    sample = _sample_of(judge, program, human_dir=human_dir, fables_path=fables_path, books=books, seed=seed)
    if judge == "coherence":
        _coherence_items(program, **sample, window=window, setting=setting)
    else:
        _verification_items(program, **sample)


def calibrate(judge: str, program: Any, lm: Any, *, human_dir: str | Path | None = None,
              fables_path: str | Path | None = None, books: Optional[int] = None, seed: int = SEED,
              concurrency: int = 1, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure `program` (a judge's program) with the configured LM; the calibration entry to store.

    `seed` draws the sample of test-split books; the split itself is the one the program was compiled
    on (`split_seed_of`, else `SEED`), so the sample never holds a book the program learned from."""
    from booklens.judges import calibration_key, demo_count, judge_mode, program_fingerprint
    from booklens.lm.model import require_lm
    from booklens.parallel import check_at_least

    check_at_least("--concurrency", concurrency)
    require_lm(lm, "lm")  # the calibration is stored under its name: a string would name a model never asked
    sample = _sample_of(judge, program, human_dir=human_dir, fables_path=fables_path, books=books, seed=seed)
    if judge == "coherence":
        body = calibrate_coherence(program, **sample, progress=progress)
    else:
        body = calibrate_verification(program, **sample, concurrency=concurrency, progress=progress)
    mode = judge_mode(judge, program)
    fingerprint = program_fingerprint(program)
    lm_name, server, window = lm_label(lm), lm_server(lm), lm_planned_window(lm)
    head = {"key": calibration_key(judge, mode, lm_name, fingerprint, server, window), "judge": judge, "mode": mode,
            "lm": lm_name, **({"api_base": server} if server else {}), **({"context_window": window} if window else {}),
            "program": getattr(program, "_booklens_judge", "program"),
            "program_sha256": fingerprint, "demos": demo_count(judge, program)}
    return {**head, **body}


# ---------------------------------------------------------------------------
# `booklens calibrate` as library calls: plan (no LM), check the samples, then measure each judge


class CalibrationPlan(NamedTuple):
    """The judges to measure (name -> program, as `load_judge` built them) and where."""

    programs: dict[str, Any]
    human_dir: Optional[Path]
    fables_path: Optional[Path]
    books: Optional[int]
    seed: int
    store: Path


class Calibrated(NamedTuple):
    """One judge measured: its stored entry, why it was not stored (None: it was), its calls, time."""

    judge: str
    program: Any
    entry: dict[str, Any]
    not_stored: Optional[str]
    usage: dict[str, Any]
    seconds: float


def human_annotations_dir(path: str | Path | None) -> Path:
    """The BooookScore human annotations a coherence judge reads: `path`, else the shared data's."""
    from booklens.data.booookscore import default_data_dir

    return Path(path) if path is not None else default_data_dir() / "human"


def fables_file(path: str | Path | None) -> Path:
    """The FABLES file a judge reads: as `compile --data` takes it, the file or the FABLES.json in a folder."""
    if path is not None:
        from booklens.optimizers.tasks import data_files, get_task

        return data_files(get_task("verification"), Path(path))[0]
    from booklens.data.fables import default_fables_path

    return default_fables_path()


def judge_of_artifact(path: str | Path) -> str:
    """The judge a compiled artifact is: coherence, verification (four-way) or binary."""
    from booklens.optimizers.artifacts import artifact_metadata, canonical_task

    block = artifact_metadata(path)
    task = canonical_task(block["task"])
    if task == "coherence":
        return "coherence"
    if task == "verification":
        return "binary" if (block.get("program_config") or {}).get("label_set") == "binary" else "verification"
    raise BooklensError(f"{path} is a compiled '{task}' program; only coherence and verification programs are "
                        "judges")


def plan_calibration(judges: Optional[list[str]] = None, *, program: str | Path | None = None,
                     zero_shot: bool = False, coherence_data: str | Path | None = None,
                     fables_data: str | Path | None = None, books: Optional[int] = None, batch_size: int = 1,
                     seed: int = SEED, store: str | Path | None = None, cache_dir: str | Path | None = None
                     ) -> CalibrationPlan:
    """Check what `booklens calibrate` is asked before any LM: the judges (default coherence and
    verification, or the judge of `program`), options no chosen judge uses, the store (default the
    user's, `<cache>/calibration.json`) and the programs themselves. One-line `BooklensError`s."""
    from booklens.errors import check_flag, kind_of
    from booklens.inputs import as_path
    from booklens.judges import JUDGES, check_program_or_zero_shot, load_judge, read_store, user_store_path
    from booklens.parallel import check_at_least
    from booklens.records import present

    if judges is not None and (isinstance(judges, (str, Path)) or not isinstance(judges, Iterable)):
        raise BooklensError(f"judges must be a list of judge names, not {kind_of(judges)}")
    judges = list(judges) if judges is not None else None
    for value in judges or []:
        if not isinstance(value, str):
            raise BooklensError(f"judges must be a list of judge names, not one holding {kind_of(value)}")
    paths = {name: as_path(value, name) if value is not None else None for name, value in
             (("program", program), ("coherence_data", coherence_data), ("fables_data", fables_data),
              ("store", store), ("cache_dir", cache_dir))}
    program, coherence_data, fables_data, store = (paths[name] for name in ("program", "coherence_data",
                                                                            "fables_data", "store"))
    check_flag("zero_shot", zero_shot)
    if books is not None:
        check_at_least("--books", books)
    check_at_least("--batch-size", batch_size)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise BooklensError(f"{setting_name('--seed')} must be 0 or more (got {seed!r})")
    check_program_or_zero_shot(program is not None, zero_shot)
    if program is not None:
        # before DSPy loads, in the words `read_artifact` (which loads it) has for these
        if not present(program):
            raise BooklensError(f"program artifact not found: {program}")
        if program.is_dir():
            raise BooklensError(f"program artifact is a directory, not a file: {program}")
        chosen = [judge_of_artifact(program)]
        if judges and chosen != list(dict.fromkeys(judges)):
            raise BooklensError(f"{program} is a {chosen[0]} program; {setting_name('--judge', keyword='judges')} "
                            f"{', '.join(judges)} does not match")
    else:
        chosen = list(dict.fromkeys(judges or ["coherence", "verification"]))
    unknown = [j for j in chosen if j not in JUDGES]
    if unknown:
        raise BooklensError(f"unknown judge '{unknown[0]}' (use one of {', '.join(JUDGES)})")
    # Options no chosen judge uses would be ignored without a word.
    if coherence_data is not None and "coherence" not in chosen:
        raise BooklensError(f"{setting_name('--coherence-data')} is for the coherence judge")
    if fables_data is not None and all(j == "coherence" for j in chosen):
        raise BooklensError(f"{setting_name('--fables-data')} is for the verification and binary judges")
    if books is not None and chosen == ["binary"]:
        raise BooklensError("the binary rater is always measured on FABLES Table 5's seven books: "
                            f"{setting_name('--books')} does not apply")
    if seed != 0 and chosen == ["binary"]:  # it would only move the bootstrap intervals of the same sample
        raise BooklensError("the binary rater is always measured on FABLES Table 5's seven books: "
                            f"{setting_name('--seed')} draws no sample for it")
    human_dir = human_annotations_dir(coherence_data) if "coherence" in chosen else None
    fables = fables_file(fables_data) if any(j != "coherence" for j in chosen) else None
    store = Path(store) if store is not None else user_store_path(cache_dir)
    read_store(store)  # a file that is not a calibration store fails now, not after every judgment
    if batch_size > 1 and "coherence" not in chosen:
        raise BooklensError(f"{setting_name('--batch-size')} is for the coherence judge")
    # bad artifacts fail first
    programs = {j: load_judge(j, program, zero_shot=zero_shot, **({"batch_size": batch_size} if j == "coherence"
                                                                  else {})) for j in chosen}
    return CalibrationPlan(programs, human_dir, fables, books, seed, store)


def check_calibration_samples(plan: CalibrationPlan, window: Optional[int] = None,
                              context_window: Optional[int] = None) -> None:
    """Every judge's data read and checked now (`check_sample`), so that a second judge's bad data
    fails before the first judge's calls. `window`: the one the judges' LM has (a server's own,
    `booklens.lm.served_context_window`), None when unknown; `context_window`: the window set
    (`--context-window`), which must not be larger."""
    from booklens.lm.base import refuse_larger_window, set_window
    from booklens.vocabulary import JUDGE_WINDOW_OPTION

    setting = None
    if context_window is not None:  # what the judges plan for; first, so no summary is refused for a
        refuse_larger_window(context_window, window, JUDGE_WINDOW_OPTION)  # window the model lacks
        setting = set_window(JUDGE_WINDOW_OPTION, window)
        window = context_window
    for name, program in plan.programs.items():
        check_sample(name, program, human_dir=plan.human_dir, fables_path=plan.fables_path, books=plan.books,
                     seed=plan.seed, window=window, setting=setting)


def calibrate_judges(plan: CalibrationPlan, lm: Any, *, concurrency: int = 1, replace: bool = False,
                     progress: Callable[[str], None] | None = None) -> Iterator[Calibrated]:
    """Measure each planned judge with `lm` (DSPy's configured LM) and store its entry in the plan's
    store (`store_calibration`: kept unless `replace`, when the store holds one measured on more).
    Yields each judge as it is done; a judge that judged nothing does not stop the others, and the
    run then ends in one `BooklensError` naming each that did not."""
    from booklens.errors import check_flag
    from booklens.judges import store_calibration
    from booklens.lm.usage import usage_scope
    from booklens.parallel import check_at_least

    if not isinstance(plan, CalibrationPlan):
        raise BooklensError(f"plan must be what plan_calibration returns, not {type(plan).__name__}")
    check_at_least("--concurrency", concurrency)
    check_flag("replace", replace)
    from booklens.steps import judge_window_advice
    from booklens.vocabulary import JUDGE_WINDOW_OPTION

    failures: list[str] = []
    for name, program in plan.programs.items():
        if hasattr(program, "concurrency"):
            program.concurrency = concurrency
        started = time.perf_counter()
        # The stored entry counts calls without telling cached ones apart, so that an unchanged
        # calibration rewrites the same bytes; `usage` tells them apart.
        with usage_scope() as tracker, judge_window_advice(lm, JUDGE_WINDOW_OPTION):
            try:
                entry = calibrate(name, program, lm, human_dir=plan.human_dir, fables_path=plan.fables_path,
                                  books=plan.books, seed=plan.seed, concurrency=concurrency, progress=progress)
            except JudgedNothing as exc:  # the other judges still get measured; the run fails at the end
                failures.append(str(exc))
                continue
        seconds = time.perf_counter() - started
        kept = store_calibration(entry, plan.store, replace=replace)
        yield Calibrated(name, program, entry, kept, tracker.work(), seconds)
    if failures:
        raise BooklensError("; ".join(failures))
