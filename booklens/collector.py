"""How booklens processes (a command, a Ray worker of a sweep) set Python's cyclic garbage collector.

Importing DSPy, LiteLLM, the OpenAI client or torch creates millions of objects that live as long
as the process and almost no garbage. At Python's default threshold (a young-generation collection
every 700 allocations) the collector walks them again and again: about a sixth of the LM layer's
import time. Once they are loaded, `gc.freeze()` moves them out of the collector's sight, so later
full collections (and interpreter shutdown) do not walk them again.
"""

from __future__ import annotations

import gc

# Allocations between young-generation collections in a booklens process (Python's default: 700).
GC_THRESHOLD = 10_000


def collect_less_often() -> None:
    """Raise the young-generation threshold to `GC_THRESHOLD` (older generations keep theirs)."""
    gc.set_threshold(GC_THRESHOLD)


def freeze_what_is_loaded() -> None:
    """Exempt every object alive now from later collections (what a cycle left behind is still
    collected when it becomes garbage after this point)."""
    gc.freeze()
