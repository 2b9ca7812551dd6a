"""Hypothesis strategies for LMCache MP workloads.

Every strategy shrinks toward a small, readable case: chunk size 16, one
chunk, one layer, TP 1, the stored prompt itself as the query.
"""

from strategies.layouts import kv_layouts, rank_layouts, tiny_layouts
from strategies.workloads import (
    chunk_counts,
    chunk_sizes,
    long_prefix_workloads,
    prompt_lengths,
    workloads,
)

__all__ = [
    "chunk_counts",
    "chunk_sizes",
    "kv_layouts",
    "long_prefix_workloads",
    "prompt_lengths",
    "rank_layouts",
    "tiny_layouts",
    "workloads",
]
