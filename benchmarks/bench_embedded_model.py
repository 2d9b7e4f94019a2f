"""Throughput of the embedded model (SmolLM2-135M-Instruct, shipped as Q4_1) in llama.cpp on this machine.

Prints, for several llama.cpp settings and weight formats (booklens runs the shipped Q4_1 weights
unpacked to F16, see `booklens.lm.embedded.WEIGHTS`), prompt tokens/s at a short and a long prompt (attention
grows with the context, so a long prompt is read more slowly) and generated tokens/s after each;
then, with booklens's settings, the cost of repeating a prompt (llama.cpp reuses the cached
prefix) and how the model's tokenizer counts compare with cl100k_base, the tokenizer booklens
budgets with.

One run's figures move by 10-20% with the machine's other load. `--turns N` compares settings
under the same load instead: each setting gets a llama.cpp context of its own, and they take turns
in one process (the first setting of a turn goes last in the next), N turns of reading each
prompt length and writing `--generate` tokens after it; it prints the median seconds per setting.

    python benchmarks/bench_embedded_model.py [--lengths 1000,6000] [--configs all] [--repeats 2]
    python benchmarks/bench_embedded_model.py --turns 3 --lengths 6000 --generate 400 \
        --configs "booklens,no flash attention,q8_0 K cache,Q8_0 weights"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from _cli import names_from, nonnegative_int, positive_int, positive_ints, run

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"
NOVEL = REPO.parent / "shared" / "data" / "books" / "pride_and_prejudice.txt"

CONFIGS = {
    "booklens": {},
    "shipped Q4_1 weights": {"weights": "q4_1"},
    "Q8_0 weights": {"weights": "q8_0"},
    "Q4_0 weights": {"weights": "q4_0"},  # requantized: llama.cpp repacks Q4_0 for its AVX2 kernels
    "BF16 weights": {"weights": "bf16"},
    "no flash attention": {"flash_attn": False},
    "micro-batch 256": {"n_ubatch": 256},
    "micro-batch 128": {"n_ubatch": 128},
    "batch 1024": {"n_batch": 1024, "n_ubatch": 1024},
    "q8_0 KV cache": {"type_k": 8, "type_v": 8},  # a quantized V cache needs flash attention
    "q8_0 K cache": {"type_k": 8},  # greedy answers change (see README)
    "batch 2048": {"n_batch": 2048, "n_ubatch": 2048},
    "1 thread generating": {"n_threads": 1},
    "1 thread": {"n_threads": 1, "n_threads_batch": 1},  # as each of two contexts side by side would run
}


def speed(llm, tokens: list[int], generate: int = 64) -> tuple[float, float]:
    """(prompt tokens/s, written tokens/s) of reading `tokens` from an empty context, then writing."""
    prompt_seconds, generation_seconds = timed(llm, tokens, generate)
    return len(tokens) / prompt_seconds, generate / generation_seconds


def timed(llm, tokens: list[int], generate: int) -> tuple[float, float]:
    """Seconds to read `tokens` from an empty context, and to write `generate` greedy tokens after."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(tokens)
    prompt_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(generate):
        llm.eval([llm.sample(temp=0.0)])
    return prompt_seconds, time.perf_counter() - t0


def take_turns(llms: dict, tokens: dict[int, list[int]], turns: int, generate: int) -> None:
    """Every setting reads each prompt and writes `generate` tokens, the settings taking turns; the
    median seconds over the turns, per setting and prompt length."""
    names = list(llms)
    seconds = {(name, n): [] for name in names for n in tokens}
    for turn in range(turns):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            for n, prompt in tokens.items():
                seconds[name, n].append(sum(timed(llms[name], prompt, generate)))
    header = "".join(f"{f'{n} + {generate}':>16}" for n in tokens)
    print(f"{'settings':<30}{header}   (median seconds over {turns} turns: prompt tokens + written tokens)")
    for name in names:
        print(f"{name:<30}" + "".join(f"{statistics.median(seconds[name, n]):>16.1f}" for n in tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=positive_ints, default="1000,6000",
                        help="prompt lengths in model tokens, comma-separated")
    parser.add_argument("--configs", type=names_from(CONFIGS), default="all",
                        help=f"comma-separated names from: {', '.join(CONFIGS)}; or all")
    parser.add_argument("--repeats", type=positive_int, default=2,
                        help="runs of each prompt length per setting: the best prompt and the best writing rate are shown")
    parser.add_argument("--turns", type=nonnegative_int, default=0,
                        help="instead, the settings take turns in one process this many times (medians shown)")
    parser.add_argument("--generate", type=nonnegative_int, default=None,
                        help="tokens written after each prompt (64; with --turns, 400)")
    args = parser.parse_args()
    generate = args.generate if args.generate is not None else (400 if args.turns else 64)
    if not args.turns and generate == 0:
        parser.error("--generate 0 leaves no writing rate to measure (it is for --turns)")
    if max(args.lengths) + generate > 8192:
        parser.error(f"--lengths and --generate: a prompt of {max(args.lengths)} tokens and {generate} written "
                     "tokens do not fit the 8,192-token context")
    import booklens  # noqa: F401  - offline settings
    from llama_cpp import Llama

    from booklens.lm import LocalBackend
    from booklens.lm.embedded import FLASH_ATTENTION, N_BATCH, N_UBATCH, WEIGHTS, stored_weights
    from booklens.text import count_tokens

    backend = LocalBackend()
    if not NOVEL.exists():
        sys.exit(f"error: {NOVEL} not found (the shared data folder)")
    text = NOVEL.read_text(encoding="utf-8")
    lengths, names = args.lengths, args.configs
    print(f"model: {Path(backend.model_path).name}, threads: {backend.n_threads}, cores: {os.cpu_count()}; "
          f"booklens: {WEIGHTS} weights, flash attention {FLASH_ATTENTION}, n_batch {N_BATCH}, n_ubatch {N_UBATCH}; "
          f"load average {os.getloadavg()[0]:.2f}")

    def load(name: str):
        settings = {"flash_attn": FLASH_ATTENTION, "n_batch": N_BATCH, "n_ubatch": N_UBATCH,
                    "n_threads": backend.n_threads, "n_threads_batch": backend.n_threads, **CONFIGS[name]}
        path = stored_weights(backend.model_path, settings.pop("weights", WEIGHTS))
        return Llama(model_path=path, n_ctx=8192, verbose=False, **settings)

    def prompt(llm, n: int) -> list[int]:
        return llm.tokenize(text[20_000:20_000 + 6 * n].encode())[:n]

    if args.turns:
        llms = {name: load(name) for name in names}
        first = next(iter(llms.values()))  # every setting has the same tokenizer
        take_turns(llms, {n: prompt(first, n) for n in lengths}, args.turns, generate)
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
        return
    header = "".join(f"{f'prompt {n}':>13}{f'gen @{n}':>10}" for n in lengths)
    print(f"{'settings':<30}{header}   (tokens/s; best of {args.repeats}, {generate} tokens written)")
    for name in names:
        llm = load(name)
        row = ""
        for n in lengths:
            runs = [speed(llm, prompt(llm, n), generate) for _ in range(args.repeats)]
            row += f"{max(r[0] for r in runs):>13.0f}{max(r[1] for r in runs):>10.0f}"
        print(f"{name:<30}{row}", flush=True)
        del llm

    llm = backend._model()
    prompt = text[20_000:26_000]
    llm.reset()
    llm.create_completion(prompt, max_tokens=1, temperature=0.0)
    t0 = time.perf_counter()
    llm.create_completion(prompt, max_tokens=1, temperature=0.0)
    print(f"same prompt again (cached prefix): {time.perf_counter() - t0:.3f} s")
    sample = STORY.read_text(encoding="utf-8")
    smol = len(llm.tokenize(sample.encode(), add_bos=False))
    cl100k = count_tokens(sample)
    print(f"tokenizer: sample story = {smol} SmolLM2 tokens vs {cl100k} cl100k_base tokens "
          f"(ratio {smol / cl100k:.2f}); load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    run(main)
