"""Trace and span ids as frames and the DuckDB store keep them: a span id as one unsigned 64-bit word, a trace id as
two (`trace_hi`, `trace_lo`), each the id's bytes read big-endian, so that the words' hex digits side by side are
the id's (in SQL: printf('%016x%016x', trace_hi, trace_lo)). Words rather than hex text: a third of the bytes, and
the store compresses them without analysing random text, which was most of the cost of writing a request.
Decoders and OTLP/JSON speak hex; the trace fast path writes the words itself."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

TRACE_WORDS, SPAN_WORDS = 2, 1


def words_of_hex(ids: Sequence[str], words_per_id: int) -> np.ndarray:
    """The ids, given as hex of words_per_id * 16 digits each, as a (len(ids), words_per_id) uint64 array."""
    raw = bytes.fromhex("".join(ids))
    if len(raw) != 8 * words_per_id * len(ids):
        raise ValueError(f"ids must be {16 * words_per_id} hex digits each")
    return np.frombuffer(raw, ">u8").astype(np.uint64).reshape(len(ids), words_per_id)


def hex_of_words(*words: np.ndarray) -> pa.Array:
    """Arrow strings of the hex digits of each row's words side by side (one word: a span id; two: a trace id)."""
    rows, width = len(words[0]), 16 * len(words)
    digits = np.column_stack([np.asarray(w, np.uint64) for w in words]).astype(">u8").tobytes().hex().encode()
    offsets = np.arange(0, width * (rows + 1), width, dtype=np.int64)
    return pa.LargeStringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(digits))
