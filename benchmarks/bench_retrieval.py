"""Evidence retrieval on Pride and Prejudice: recall@5 and MRR of bm25, dense and hybrid,
with index build time, query latency and peak memory.

The evaluation set (`benchmarks/data/pride_and_prejudice_claims.json`) holds paraphrased true
and false claims, each with verbatim quotes from the book that decide it. A passage is relevant
to a claim when it overlaps the location of one of the claim's quotes in the book (quotes are
located after collapsing whitespace). Per claim:
  recall@k = relevant passages among the top k / relevant passages,
  RR       = 1 / rank of the first relevant passage (0 when none is ranked).
A random ranking (seeded) is measured in the same run as the chance baseline.

    python benchmarks/bench_retrieval.py [--book PATH] [--claims PATH] [--k 5] [--passage-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _cli import positive_int, run

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BOOK = ROOT.parent / "shared" / "data" / "books" / "pride_and_prejudice.txt"
DEFAULT_CLAIMS = ROOT / "benchmarks" / "data" / "pride_and_prejudice_claims.json"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def relevant_passages(index, claims: list[dict]) -> list[set[int]]:
    """For each claim, the indices of the passages that overlap one of its quotes."""
    out = []
    for c in claims:
        rel: set[int] = set()
        for quote in c["evidence"]:
            span = index.locate(quote)
            if span is None:
                raise SystemExit(f"quote of {c['id']} not found in the book: {quote[:60]!r}")
            rel.update(p.index for p in index.passages_overlapping(*span))
        out.append(rel)
    return out


def score(rankings: list[list[int]], relevant: list[set[int]], k: int) -> dict[str, float]:
    recalls, rrs, hits = [], [], []
    for ranking, rel in zip(rankings, relevant):
        top = ranking[:k]
        recalls.append(len(rel.intersection(top)) / len(rel))
        hits.append(1.0 if rel.intersection(top) else 0.0)
        rank = next((r for r, i in enumerate(ranking, start=1) if i in rel), None)
        rrs.append(1.0 / rank if rank else 0.0)
    return {"recall": statistics.mean(recalls), "hit": statistics.mean(hits), "mrr": statistics.mean(rrs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--book", type=Path, default=DEFAULT_BOOK)
    ap.add_argument("--claims", type=Path, default=DEFAULT_CLAIMS)
    ap.add_argument("--k", type=positive_int, default=5)
    ap.add_argument("--passage-tokens", type=positive_int, default=256)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if not args.book.exists():
        print(f"skipped: {args.book} not found (needs ../shared)", file=sys.stderr)
        return 0
    if not args.claims.is_file():
        print(f"error: claims file not found: {args.claims}", file=sys.stderr)
        return 1
    load_start = os.getloadavg()[0]

    rss_start = peak_rss_mb()
    from booklens.retrieval import BookIndex, embedding_model
    from booklens.text import count_tokens, read_book

    text = read_book(args.book)
    claims = json.loads(args.claims.read_text(encoding="utf-8"))["claims"]
    book_tokens = count_tokens(text)
    rss_imports = peak_rss_mb()

    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        index = BookIndex.build(text, cache_dir=cache, passage_tokens=args.passage_tokens)
        bm25_build = time.perf_counter() - t0
        rss_bm25 = peak_rss_mb()
        t0 = time.perf_counter()
        embedding_model()
        model_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        index.ensure_dense()
        dense_build = time.perf_counter() - t0
        rss_dense = peak_rss_mb()
        t0 = time.perf_counter()
        warm = BookIndex.build(text, cache_dir=cache, passage_tokens=args.passage_tokens)
        warm.ensure_dense()
        cache_load = time.perf_counter() - t0
        assert warm.loaded_from_cache

    relevant = relevant_passages(index, claims)
    n = len(index.passages)
    rows = []
    rng = random.Random(0)
    rankings = []
    for _ in claims:
        order = list(range(n))
        rng.shuffle(order)
        rankings.append(order)
    rows.append(("random", score(rankings, relevant, args.k), None))
    for mode in ("bm25", "dense", "hybrid"):
        index.rank(claims[0]["claim"], mode, 5)  # warm-up
        rankings, latencies = [], []
        for c in claims:
            t0 = time.perf_counter()
            index.rank(c["claim"], mode, args.k)
            latencies.append(time.perf_counter() - t0)
            rankings.append([i for i, _ in index.rank(c["claim"], mode, None)])
        rows.append((mode, score(rankings, relevant, args.k), statistics.median(latencies) * 1000))

    print(f"book: {args.book.name}, {book_tokens:,} tokens, {n} passages of <= {args.passage_tokens} tokens; "
          f"{len(claims)} claims, {sum(len(r) for r in relevant)} relevant passages; "
          f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print()
    print(f"| mode | recall@{args.k} | hit@{args.k} | MRR | median query latency |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for mode, s, lat in rows:
        lat_s = "-" if lat is None else f"{lat:.1f} ms"
        print(f"| {mode} | {s['recall']:.3f} | {s['hit']:.3f} | {s['mrr']:.3f} | {lat_s} |")
    print()
    print("| index step | time | peak RSS after |")
    print("| --- | ---: | ---: |")
    print(f"| imports + read book | - | {rss_imports:.0f} MB (start {rss_start:.0f} MB) |")
    print(f"| passages + BM25 (cold) | {bm25_build:.2f} s | {rss_bm25:.0f} MB |")
    print(f"| load all-MiniLM-L6-v2 | {model_load:.2f} s | - |")
    print(f"| embed passages + faiss (cold) | {dense_build:.2f} s | {rss_dense:.0f} MB |")
    print(f"| load both from the disk cache | {cache_load:.2f} s | - |")
    if args.json:
        args.json.write_text(json.dumps({
            "book_tokens": book_tokens, "passages": n, "claims": len(claims),
            "modes": {m: {**s, "median_latency_ms": lat} for m, s, lat in rows},
            "bm25_build_s": bm25_build, "model_load_s": model_load, "dense_build_s": dense_build,
            "cache_load_s": cache_load, "peak_rss_mb": rss_dense,
        }, indent=2))
    return 0


if __name__ == "__main__":
    run(main)
