"""A whole novel on the embedded model: hierarchical summary of Pride and Prejudice (chunk 2048,
window 8192, G_n 900) with SmolLM2-135M in llama.cpp on this machine's cores.

Configurations, each one step from the one before it (see README for their figures):
- before: the settings booklens had before this benchmark existed: llama.cpp without flash
  attention; calls taking turns on a plain lock (first come, first served); every level budgeted
  G_n = 900 tokens with 0.75 words per token; merges given the lower-level summary before them
  and run level by level; generation capped at 1.5 G + 64 tokens; regenerations with the same
  word limit; the weights as shipped (Q4_1).
- previous: the first settings this benchmark measured: flash attention on, and the embedded
  model's summaries capped at 1.5 G + 64 tokens and regenerated up to twice when over budget or
  cut off, as for any model.
- shipped weights: flash attention off; calls sharing a prefix back to back; the paper's level
  budgets and word limits; the embedded model's summaries capped at G + 64 tokens, an answer the
  cap cuts trimmed to whole sentences instead of written again; the weights as shipped (Q4_1).
- F16 weights: as `shipped weights`, with the Q4_1 weights unpacked to F16, which llama.cpp's
  tiled matrix kernels read prompts with.
- flash attention: as `F16 weights`, with llama.cpp's flash attention on.
- budget cap: as `flash attention`, with the embedded model's summaries capped at 1.06 G + 8
  tokens (the budget in SmolLM2's tokens) instead of G + 64.
- after: booklens's defaults now: as `budget cap`, with plain-text answers ended once they
  start to repeat themselves (`RepetitionGuard`).
- micro-batch 256: as `after`, with prompts read in micro-batches of 256 tokens instead of 512.
- no flash attention: as `after`, with llama.cpp's flash attention off.
- Q8_0 weights: as `after`, with the Q4_1 weights stored as Q8_0 instead of F16.

`--profile N` runs the first N level-1 calls (with their regenerations) of each configuration
and prints what llama.cpp did per call: prompt tokens, how many were reused from the previous
call, prompt evaluation time and speed, tokens generated against the cap, repeated tokens the guard
dropped, the finish reason.
`--full` runs the whole book with the chosen configurations and prints the wall time, calls,
tokens, regenerations and whether every summary met its budget. A full run of `before` takes
well over an hour (the first calls of `--profile` give its rate).

    python benchmarks/bench_embedded_novel.py --profile 2 --configs "before,F16 weights,after"
    python benchmarks/bench_embedded_novel.py --full --configs after [--json run.json]

Timing figures are only meaningful on a quiet machine: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from _cli import names_from, nonnegative_int, positive_int, run

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO.parent / "shared" / "data" / "books" / "pride_and_prejudice.txt"


def configurations() -> dict[str, dict[str, Any]]:
    old_cap = {"generation_slack": 1.0, "generation_allowance": 64}  # G + 64 tokens
    unguarded = {"stop_repetition": False}  # every step before the repetition guard
    return {
        "before": {
            "backend": {"flash_attention": False, "weights": "q4_1", "n_ubatch": 512, **unguarded},
            "scheduler": "fifo",
            "program": {"words_per_token": 0.75, "merge_context": "lower-level", "pipelined": False,
                        "level_budgets": [900], "generation_slack": 1.5, "generation_allowance": 64,
                        "max_regenerations": 2, "shrink_on_regeneration": False},
        },
        "previous": {"backend": {"flash_attention": True, "weights": "q4_1", "n_ubatch": 512, **unguarded},
                     "scheduler": "prefix",
                     "program": {"generation_slack": 1.5, "generation_allowance": 64, "max_regenerations": 2}},
        "shipped weights": {"backend": {"flash_attention": False, "weights": "q4_1", "n_ubatch": 512, **unguarded},
                            "scheduler": "prefix", "program": old_cap},
        "F16 weights": {"backend": {"flash_attention": False, "n_ubatch": 512, **unguarded}, "scheduler": "prefix",
                        "program": old_cap},
        "flash attention": {"backend": {"n_ubatch": 512, **unguarded}, "scheduler": "prefix", "program": old_cap},
        "budget cap": {"backend": {**unguarded}, "scheduler": "prefix", "program": {}},
        "after": {"backend": {}, "scheduler": "prefix", "program": {}},
        "micro-batch 256": {"backend": {"n_ubatch": 256}, "scheduler": "prefix", "program": {}},
        "no flash attention": {"backend": {"flash_attention": False}, "scheduler": "prefix", "program": {}},
        "Q8_0 weights": {"backend": {"weights": "q8_0"}, "scheduler": "prefix", "program": {}},
    }


def make_lm(config: dict[str, Any], concurrency: int):
    from booklens.lm import BooklensLM, LocalBackend
    from booklens.lm.embedded import PrefixScheduler

    class FirstComeFirstServed(PrefixScheduler):
        """A plain lock's behaviour: calls run in arrival order, whatever they share."""

        def _choose(self, now: float):
            if self._busy or not self._waiting:
                return None, 0.0
            return min(self._waiting, key=lambda t: t.order), 0.0

    scheduler = FirstComeFirstServed() if config["scheduler"] == "fifo" else PrefixScheduler()
    backend = LocalBackend(scheduler=scheduler, **config["backend"])
    return BooklensLM(backend, cache=None), backend


def make_program(config: dict[str, Any], concurrency: int, lm):
    """The summarizer; settings the configuration leaves out are booklens's for this model."""
    import dspy

    from booklens.programs.summarizer import HierarchicalSummarizer
    from booklens.steps import summary_settings

    with dspy.context(lm=lm):
        settings = {"chunk_size": 2048, "context_window": 8192, "max_summary_tokens": 900,
                    **summary_settings(), **config["program"]}
    return HierarchicalSummarizer(concurrency=concurrency, **settings)


def describe_backend(backend) -> str:
    llm = backend._model()
    params = llm.context_params
    return (f"threads {backend.n_threads}, n_ctx {params.n_ctx}, n_batch {params.n_batch}, "
            f"n_ubatch {params.n_ubatch}, flash attention {'on' if backend.flash_attention else 'off'}, "
            f"KV cache f16, {backend.weights} weights")


def print_calls(stats: list) -> None:
    print(f"  {'call':>4} {'prompt':>6} {'reused':>6} {'eval':>5} {'eval s':>7} {'eval t/s':>8} "
          f"{'gen':>5} {'cap':>5} {'rep':>4} {'gen s':>6} {'gen t/s':>7} {'finish':>6} {'wait s':>6} {'s':>6}")
    for i, s in enumerate(stats):
        eval_rate = s.prompt_eval_tokens / s.prompt_eval_seconds if s.prompt_eval_seconds else 0
        gen_rate = s.generated_tokens / s.generation_seconds if s.generation_seconds else 0
        print(f"  {i:>4} {s.prompt_tokens:>6} {s.reused_tokens:>6} {s.prompt_eval_tokens:>5} "
              f"{s.prompt_eval_seconds:>7.1f} {eval_rate:>8.0f} {s.generated_tokens:>5} {s.max_tokens:>5} "
              f"{s.repeated_tokens:>4} "
              f"{s.generation_seconds:>6.1f} {gen_rate:>7.0f} {s.finish_reason:>6} {s.wait_seconds:>6.1f} "
              f"{s.seconds:>6.1f}")


def totals(stats: list) -> dict[str, Any]:
    evaluated = sum(s.prompt_eval_tokens for s in stats)
    eval_s = sum(s.prompt_eval_seconds for s in stats)
    generated = sum(s.generated_tokens for s in stats)
    gen_s = sum(s.generation_seconds for s in stats)
    return {
        "calls": len(stats),
        "prompt_tokens": sum(s.prompt_tokens for s in stats),
        "reused_tokens": sum(s.reused_tokens for s in stats),
        "evaluated_tokens": evaluated,
        "prompt_eval_seconds": round(eval_s, 1),
        "prompt_tokens_per_second": round(evaluated / eval_s, 1) if eval_s else None,
        "generated_tokens": generated,
        "generation_seconds": round(gen_s, 1),
        "generated_tokens_per_second": round(generated / gen_s, 1) if gen_s else None,
        "cut_off": sum(1 for s in stats if s.finish_reason == "length"),
        "repetition_cuts": sum(1 for s in stats if s.repeated_tokens),
        "repeated_tokens": sum(s.repeated_tokens for s in stats),
    }


def profile(name: str, config: dict[str, Any], text: str, calls: int, concurrency: int) -> dict[str, Any]:
    """The first `calls` level-1 summaries of the book, as the summarizer makes them."""
    import dspy

    from booklens.lm import BooklensAdapter
    from booklens.parallel import parallel_map
    from booklens.text import chunk_text

    lm, backend = make_lm(config, concurrency)
    program = make_program(config, concurrency, lm)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        _, room_merge, _ = program.check_budgets()
        chunks = chunk_text(text, program.chunk_size)
        groups, budgets = program.plan_budgets(chunks, room_merge)
        g1 = budgets[0]
        print(f"\n{name}: {describe_backend(backend)}; {len(chunks)} chunks in {len(groups)} level-1 calls, "
              f"level budgets {budgets}, word limit {program.word_limit(g1)}; concurrency {concurrency}")
        if calls > len(groups):
            print(f"  (--profile {calls}: the book has {len(groups)} level-1 calls, so all of them run)")
            calls = len(groups)
        t0 = time.perf_counter()
        nodes = parallel_map(lambda j: program.summarize_group(chunks, groups, j, g1), range(calls),
                             concurrency=concurrency)
        wall = time.perf_counter() - t0
    stats = list(backend.stats)
    print_calls(stats)
    figures = totals(stats)
    figures.update(wall_seconds=round(wall, 1), level1_calls=len(groups), summaries=len(nodes),
                   summary_tokens=[n.tokens for n in nodes], budget=g1,
                   seconds_per_summary=round(wall / len(nodes), 1))
    print(f"  {len(nodes)} summaries ({[n.tokens for n in nodes]} tokens, budget {g1}) in {wall:.1f} s: "
          f"{wall / len(nodes):.1f} s per level-1 summary; {figures['calls']} calls, "
          f"{figures['cut_off']} cut off at the cap; prompt {figures['prompt_tokens_per_second']} t/s, "
          f"generation {figures['generated_tokens_per_second']} t/s")
    return figures


def full(name: str, config: dict[str, Any], text: str, concurrency: int) -> dict[str, Any]:
    import dspy

    from booklens.errors import BooklensError
    from booklens.lm import BooklensAdapter
    from booklens.text import count_tokens

    lm, backend = make_lm(config, concurrency)
    program = make_program(config, concurrency, lm)
    print(f"\n{name}: {describe_backend(backend)}; concurrency {concurrency}", flush=True)
    load_before = os.getloadavg()
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        t0 = time.perf_counter()
        try:
            result = program(book=text)
        except BooklensError as exc:  # one configuration's failure should not cost the others' runs
            wall = time.perf_counter() - t0
            figures = totals(list(backend.stats))
            figures.update(failed=str(exc), wall_seconds=round(wall, 1))
            print(f"  failed after {wall / 60:.1f} min ({figures['calls']} calls): {exc}", flush=True)
            return figures
        wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    stats = list(backend.stats)
    figures = totals(stats)
    nodes = result.nodes
    per_level: dict[int, int] = {}
    for n in nodes:
        per_level[n.level] = per_level.get(n.level, 0) + 1
    over = [n.id for n in nodes if n.tokens > n.budget]
    final_tokens = count_tokens(result.summary)
    figures.update(
        wall_seconds=round(wall, 1), wall_minutes=round(wall / 60, 1),
        summaries=len(nodes), per_level=per_level, level_budgets=result.level_budgets, regenerations=figures["calls"] - len(nodes),
        truncated=sum(1 for n in nodes if n.truncated), over_budget_after_trim=over,
        final_summary_tokens=final_tokens, final_budget=program.max_summary_tokens,
        covers_every_chunk=sorted(nodes[-1].chunks) == list(range(len(result.chunks))),
        load_before=[round(x, 2) for x in load_before], load_after=[round(x, 2) for x in load_after],
        summary=result.summary,
    )
    print(f"  {wall / 60:.1f} min ({wall:.0f} s); {len(nodes)} summaries per level "
          f"{'+'.join(str(per_level[k]) for k in sorted(per_level))}; {figures['calls']} calls "
          f"({figures['regenerations']} regenerations, {figures['cut_off']} cut off at the cap or for "
          f"repeating themselves ({figures['repetition_cuts']}, {figures['repeated_tokens']} repeated tokens "
          f"dropped), {figures['truncated']} trimmed to budget)")
    print(f"  prompt: {figures['prompt_tokens']} tokens, {figures['reused_tokens']} reused, "
          f"{figures['evaluated_tokens']} evaluated in {figures['prompt_eval_seconds']} s "
          f"({figures['prompt_tokens_per_second']} t/s); generation: {figures['generated_tokens']} tokens in "
          f"{figures['generation_seconds']} s ({figures['generated_tokens_per_second']} t/s)")
    print(f"  final summary {final_tokens} tokens (budget {program.max_summary_tokens}); every summary within "
          f"its budget: {not over}; covers every chunk: {figures['covers_every_chunk']}; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    return figures


def main() -> None:
    configs = configurations()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=nonnegative_int, default=0,
                        help="run the first N level-1 calls per configuration")
    parser.add_argument("--full", action="store_true", help="summarize the whole book")
    parser.add_argument("--configs", type=names_from(configs), default="before,after",
                        help=f"comma-separated names from: {', '.join(configs)}; or all")
    parser.add_argument("--concurrency", type=positive_int, default=4, help="the CLI's default")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.profile and not args.full:
        parser.error("nothing to run: give --profile N (the first N level-1 calls) or --full (the whole book)")
    if not BOOK.exists():
        sys.exit(f"error: {BOOK} not found (the shared data folder)")
    import booklens  # noqa: F401  - offline settings
    from booklens.text import count_tokens, read_book

    text = read_book(BOOK)
    print(f"Pride and Prejudice: {count_tokens(text)} tokens (cl100k_base); {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.2f}")
    results: dict[str, Any] = {}
    for name in args.configs:
        if args.profile:
            results[f"{name} profile"] = profile(name, configs[name], text, args.profile, args.concurrency)
        if args.full:
            results[f"{name} full"] = full(name, configs[name], text, args.concurrency)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    run(main)
