"""How booklens processes (a command, a Ray worker of a sweep) set Python's cyclic garbage collector.

Importing DSPy, LiteLLM, the OpenAI client or torch creates millions of objects that live as long
as the process and almost no garbage. At Python's default threshold (a young-generation collection
every 700 allocations) the collector walks them again and again: about a sixth of the LM layer's
import time. So a command makes no collection while it loads the LM layer (`defer_collection`):
at 10,000 the collections still took 0.22 s of a 1.8 s import on 2 cores. Once the layer is loaded,
`gc.freeze()` moves what is loaded out of the collector's sight, so later collections (and
interpreter shutdown) do not walk it again, and collections come every `GC_THRESHOLD` allocations.
"""

from __future__ import annotations

import gc
import sys

# Allocations between young-generation collections in a booklens process (Python's default: 700).
GC_THRESHOLD = 10_000
# The same while a command loads the LM layer: none in practice (its import allocates about half a
# million objects), while a command that never loads it still collects now and then.
STARTUP_THRESHOLD = 1_000_000
LM_LAYER = "booklens.lm.model"

_deferred = False


def collect_less_often() -> None:
    """Raise the young-generation threshold to `GC_THRESHOLD` (older generations keep theirs)."""
    gc.set_threshold(GC_THRESHOLD)


def defer_collection() -> None:
    """For a process about to load the LM layer (a command, a sweep's worker): `STARTUP_THRESHOLD`
    until it is loaded (`lm_layer_loaded`), then `GC_THRESHOLD`. Where it is loaded already, the
    latter at once."""
    global _deferred
    if LM_LAYER in sys.modules:
        collect_less_often()
        return
    _deferred = True
    gc.set_threshold(STARTUP_THRESHOLD)


def lm_layer_loaded() -> None:
    """The LM layer's import is done: in a process that deferred collection, freeze what is loaded and
    collect every `GC_THRESHOLD` allocations from now on. A library caller's collector is left alone."""
    global _deferred
    if _deferred:
        _deferred = False
        gc.freeze()
        collect_less_often()


def stop_deferring() -> None:
    """Forget a deferral whose process goes on past its command (`booklens.testing.run_command`)."""
    global _deferred
    _deferred = False


def freeze_what_is_loaded() -> None:
    """Exempt every object alive now from later collections (what a cycle left behind is still
    collected when it becomes garbage after this point)."""
    gc.freeze()
