"""How the claim-matching threshold of `booklens.metrics.fables` was chosen.

Decomposition precision / recall match claims by the cosine of their all-MiniLM-L6-v2
embeddings. This script measures, on the FABLES claims, for every claim of one summary:

- same book: its best cosine with the claims another summarizer wrote about the same book
  (the five summaries retell one plot, so most claims have a paraphrase there, but not all);
- other book: its best cosine with the claims of one summary of a different book (no true match
  exists, so any value above the threshold is a false match).

It prints the share of claims matched at several thresholds and examples of same-book nearest
claims per similarity band. Cross-book matches bound the false matches, but same-book pairs are
not all paraphrases: MiniLM rates different facts about the same characters highly, so the
examples are what sets the threshold (0.8: below it most pairs are different facts). Baseline in
the same run: exact string equality (threshold 1.0).

    python benchmarks/bench_fables_decomposition_threshold.py [--data PATH]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from _cli import nonnegative_int, run

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "fables" / "FABLES.json"
THRESHOLDS = (0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.9, 1.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=nonnegative_int, default=3, help="same-book pairs to show per similarity band")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"skipped: {args.data} not found (needs ../shared)", file=sys.stderr)
        return 0
    import numpy as np

    from booklens.data.fables import load_fables
    from booklens.metrics.fables import MATCH_THRESHOLD
    from booklens.retrieval import embed

    summaries = [s for s in load_fables(args.data) if s.claims]
    texts = [c.claim for s in summaries for c in s.claims]
    vectors = embed(texts)
    spans, start = [], 0
    for s in summaries:
        spans.append((start, start + len(s.claims)))
        start += len(s.claims)
    rng = random.Random(args.seed)
    same, other = [], []
    pairs: list[tuple[float, str, str]] = []
    for i, s in enumerate(summaries):
        a = vectors[spans[i][0]:spans[i][1]]
        peers = [j for j, t in enumerate(summaries) if t.book == s.book and j != i]
        strangers = [j for j, t in enumerate(summaries) if t.book != s.book]
        for pool, out in ((peers, same), (strangers, other)):
            if not pool:
                continue
            j = rng.choice(pool)
            b = vectors[spans[j][0]:spans[j][1]]
            sim = a @ b.T
            out.extend(sim.max(axis=1).tolist())
            if out is same:
                for r, col in enumerate(sim.argmax(axis=1)):
                    pairs.append((float(sim[r, col]), texts[spans[i][0] + r], texts[spans[j][0] + int(col)]))
    same_a, other_a = np.array(same), np.array(other)
    print(f"{len(texts)} claims in {len(summaries)} summaries; each summary compared with one random other summary "
          f"of the same book and one of another book (seed {args.seed})")
    print()
    print("| threshold | matched within the book | false matches across books |")
    print("| ---: | ---: | ---: |")
    for t in THRESHOLDS:
        mark = " (used)" if abs(t - MATCH_THRESHOLD) < 1e-9 else (" (exact match)" if t == 1.0 else "")
        print(f"| {t:.2f}{mark} | {100 * (same_a >= t - 1e-6).mean():.1f}% | {100 * (other_a >= t - 1e-6).mean():.1f}% |")
    print()
    q = [50, 90, 99]
    print("best-cosine percentiles", {p: round(float(np.percentile(same_a, p)), 3) for p in q}, "within the book;",
          {p: round(float(np.percentile(other_a, p)), 3) for p in q}, "across books")
    if args.examples:
        print()
        print("same-book nearest claims by similarity band (judge whether they state the same fact):")
        for lo, hi in ((0.65, 0.7), (0.7, 0.75), (0.75, 0.8), (0.8, 0.85), (0.85, 0.9), (0.9, 1.01)):
            band = [p for p in pairs if lo <= p[0] < hi]
            rng.shuffle(band)
            print(f"  [{lo:.2f}, {min(hi, 1.0):.2f}): {len(band)} claims")
            for score, a_text, b_text in band[: args.examples]:
                print(f"    {score:.2f}  {a_text.strip()}\n          {b_text.strip()}")
    return 0


if __name__ == "__main__":
    run(main)
