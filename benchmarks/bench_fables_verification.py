"""Claim verification against FABLES' human labels in the human-evidence setting (the seed's Table 5,
"Human Evidence" columns): each claim is verified from the quotes its annotator gave.

Claims come from one split of `booklens.data.fables.split_summaries` (by book, seed 0) and only
those whose human label is faithful or unfaithful are scored, as in the seed. `--limit N` evaluates
a fixed subset: the first N claims after a seeded shuffle (`--sample-seed`), so the subset keeps the
split's label mix and a larger N contains every smaller one. Calls are cached (in booklens's cache
directory unless `--cache-dir` names another), so a run that is stopped (or limited with
`--max-minutes`) resumes where it stopped; a rerun replays the calls it finds there, so its time
is not a measure of the LM: give a fresh `--cache-dir` to time the calls.

The verifier is the zero-shot program (the commands' `--zero-shot`) unless `--judge default` asks
for booklens's default few-shot judge. The always-"faithful" rater is measured on the same claims
as a baseline.

    python benchmarks/bench_fables_verification.py --lm local --limit 200 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from _cli import nonnegative_float, nonnegative_int, positive_int, run

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "fables" / "FABLES.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--lm", default="local")
    ap.add_argument("--api-base")
    ap.add_argument("--cache-dir", type=Path)
    ap.add_argument("--split", default="test", choices=("train", "dev", "test"))
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--limit", type=nonnegative_int, default=0,
                    help="evaluate the first N claims of the shuffled split (0: all)")
    ap.add_argument("--sample-seed", type=int, default=0)
    ap.add_argument("--judge", choices=("zero-shot", "default"), default="zero-shot",
                    help="the zero-shot verifier, or booklens's default few-shot judge")
    ap.add_argument("--concurrency", type=positive_int, default=2)
    ap.add_argument("--batch", type=positive_int, default=8,
                    help="claims per batch (the time limit is checked between)")
    ap.add_argument("--max-minutes", type=nonnegative_float, default=0.0,
                    help="stop starting new batches after this long (0: no limit)")
    ap.add_argument("--json", type=Path, help="write per-claim predictions and the scores here")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"skipped: {args.data} not found (needs ../shared)", file=sys.stderr)
        return 0

    from booklens.data.fables import load_fables, split_summaries
    from booklens.judges import load_judge
    from booklens.lm import configure, make_lm, usage_step
    from booklens.metrics.fables import (
        SEED_TABLE5_HUMAN_EVIDENCE,
        format_confusion,
        format_f1_table,
        verification_report,
    )
    from booklens.programs.faithfulness import build_checker
    from booklens.signatures.faithfulness import FABLES_LABELS

    summaries = split_summaries(load_fables(args.data), seed=args.split_seed)[args.split]
    claims = [c for s in summaries for c in s.claims if c.label in ("Yes", "No")]
    random.Random(args.sample_seed).shuffle(claims)
    if args.limit:
        claims = claims[: args.limit]

    lm = configure(make_lm(args.lm, api_base=args.api_base, cache_dir=args.cache_dir))
    verifier = load_judge("verification", zero_shot=args.judge == "zero-shot")
    checker = build_checker(evidence_mode="given", concurrency=args.concurrency, verifier=verifier)
    verdicts = []
    started = time.perf_counter()
    stopped_early = False
    with usage_step("verify"):
        for i in range(0, len(claims), args.batch):
            if args.max_minutes and time.perf_counter() - started > args.max_minutes * 60:
                stopped_early = True
                break
            batch = claims[i : i + args.batch]
            verdicts += checker.verify_claims([c.claim for c in batch], given_evidence=[c.evidence for c in batch])
            print(f"  {len(verdicts)}/{len(claims)} claims, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    elapsed = time.perf_counter() - started
    done = claims[: len(verdicts)]
    gold = [FABLES_LABELS[c.label] for c in done]
    pred = [v.label for v in verdicts]
    groups = [c.summarizer for c in done]
    report = verification_report(gold, pred, groups)
    baseline = verification_report(gold, ["faithful"] * len(gold), groups)
    usage = lm.usage.snapshot()

    books = sorted({c.book for c in done})
    print(f"FABLES {args.split} split (seed {args.split_seed}): {len(done)} claims"
          f"{' (stopped early at the time limit)' if stopped_early else ''} from {len(books)} books, "
          f"gold {dict(Counter(gold))}; evidence = the annotators' quotes; LM {args.lm}; "
          f"{'zero-shot verifier' if args.judge == 'zero-shot' else 'default few-shot judge'}")
    print(f"subset: first {len(done)} of the split's faithful/unfaithful claims shuffled with seed {args.sample_seed}")
    print()
    print(format_f1_table(report, reference=SEED_TABLE5_HUMAN_EVIDENCE, reference_name="seed GPT-4-T"))
    print()
    print("always 'faithful' on the same claims:")
    print(format_f1_table(baseline))
    print()
    print(format_confusion(report["overall"]["confusion"]))
    print()
    per_call = (f"{elapsed / usage['calls']:.1f} s per uncached call" if usage["calls"]
                else "every call replayed from the cache")
    print(f"predicted: {dict(Counter(p or 'failed' for p in pred))}; {elapsed:.0f} s this run ({per_call}); "
          f"LM calls {usage['calls']} (+{usage['cached_calls']} replayed from {lm.call_cache.path.parent}), "
          f"{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens")
    if args.json:
        args.json.write_text(json.dumps({
            "split": args.split, "split_seed": args.split_seed, "sample_seed": args.sample_seed,
            "claims": len(done), "stopped_early": stopped_early, "lm": args.lm, "judge": args.judge, "report": report,
            "baseline_always_faithful": baseline, "seconds": elapsed, "usage": usage,
            "predictions": [{"id": c.id, "gold": g, "pred": v.label, "reason": v.reason, "error": v.error,
                             "attempts": v.attempts} for c, g, v in zip(done, gold, verdicts)],
        }, indent=2))
    return 0


if __name__ == "__main__":
    run(main)
