"""A compiled step's memory as ``train_memory.py`` and ``attention.py`` report it."""

from __future__ import annotations

from typing import Any

MB = 2**20


def peak_bytes(stats: Any) -> int:
    """A compiled call's peak on one device (its ``memory_analysis()``): its arguments and
    outputs, less what the donation reuses, and its temporaries."""
    return (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
    )


def memory_figures(stats: Any, digits: int) -> dict[str, Any]:
    """A line's figures of a compiled call's ``memory_analysis()``, in MB."""
    return {
        "arguments_mb": round(stats.argument_size_in_bytes / MB, digits),
        "outputs_mb": round(stats.output_size_in_bytes / MB, digits),
        "reused_mb": round(stats.alias_size_in_bytes / MB, digits),
        "temporaries_mb": round(stats.temp_size_in_bytes / MB, digits),
        "peak_mb": round(peak_bytes(stats) / MB, digits),
    }
