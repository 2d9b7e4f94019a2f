"""Throughput of the embedded model (SmolLM2-135M-Instruct, shipped as Q4_1) in llama.cpp on this machine.

Prints, for several llama.cpp settings and weight formats (booklens runs the shipped Q4_1 weights
unpacked to F16, see `booklens.lm.embedded.WEIGHTS`), prompt tokens/s at a short and a long prompt (attention
grows with the context, so a long prompt is read more slowly) and generated tokens/s after each;
then, with booklens's settings, the cost of repeating a prompt (llama.cpp reuses the cached
prefix) and how the model's tokenizer counts compare with cl100k_base, the tokenizer booklens
budgets with.

    python benchmarks/bench_embedded_model.py [--lengths 1000,6000] [--configs all]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import booklens  # noqa: F401  - offline settings
from booklens.lm import LocalBackend
from booklens.lm.embedded import FLASH_ATTENTION, N_BATCH, N_UBATCH, WEIGHTS, stored_weights
from booklens.text import count_tokens

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
    "batch 1024": {"n_batch": 1024, "n_ubatch": 1024},
    "q8_0 KV cache": {"type_k": 8, "type_v": 8},  # a quantized V cache needs flash attention
    "q8_0 K cache": {"type_k": 8},  # greedy answers change (see README)
    "batch 2048": {"n_batch": 2048, "n_ubatch": 2048},
    "1 thread generating": {"n_threads": 1},
}


def speed(llm, tokens: list[int], generate: int = 64) -> tuple[float, float]:
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(tokens)
    prompt_rate = len(tokens) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(generate):
        llm.eval([llm.sample(temp=0.0)])
    return prompt_rate, generate / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="1000,6000", help="prompt lengths in model tokens")
    parser.add_argument("--configs", default="all", help="comma-separated names from CONFIGS, or all")
    parser.add_argument("--repeats", type=int, default=2, help="the best of this many runs is shown")
    args = parser.parse_args()
    from llama_cpp import Llama

    backend = LocalBackend()
    text = (NOVEL if NOVEL.exists() else STORY).read_text(encoding="utf-8")
    lengths = [int(n) for n in args.lengths.split(",")]
    names = list(CONFIGS) if args.configs == "all" else args.configs.split(",")
    print(f"model: {Path(backend.model_path).name}, threads: {backend.n_threads}, cores: {os.cpu_count()}; "
          f"booklens: {WEIGHTS} weights, flash attention {FLASH_ATTENTION}, n_batch {N_BATCH}, n_ubatch {N_UBATCH}; "
          f"load average {os.getloadavg()[0]:.2f}")
    header = "".join(f"{f'prompt {n}':>13}{f'gen @{n}':>10}" for n in lengths)
    print(f"{'settings':<30}{header}   (tokens/s)")
    for name in names:
        settings = {"flash_attn": FLASH_ATTENTION, "n_batch": N_BATCH, "n_ubatch": N_UBATCH,
                    "n_threads": backend.n_threads, "n_threads_batch": backend.n_threads, **CONFIGS[name]}
        path = stored_weights(backend.model_path, settings.pop("weights", WEIGHTS))
        llm = Llama(model_path=path, n_ctx=8192, verbose=False, **settings)
        row = ""
        for n in lengths:
            tokens = llm.tokenize(text[20_000:20_000 + 6 * n].encode())[:n]
            best = max((speed(llm, tokens) for _ in range(args.repeats)), key=lambda r: r[0])
            row += f"{best[0]:>13.0f}{best[1]:>10.0f}"
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
    main()
