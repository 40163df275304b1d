"""JSON as sloscope answers it (`rca`, `graph`, GET /rca, /graph and /sampling, the report's embedded answer, the
demo's results): always valid JSON, which has no NaN or Infinity (RFC 8259). A number that is not finite, which
an aggregate can make of extreme stored values, is answered as null, as an absent measurement is."""

from __future__ import annotations

import json
import math


def finite(value):
    """`value` with every float that is not finite replaced by None, in dicts, lists and tuples at any depth."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value, **options) -> str:
    """json.dumps of finite(value); refuses (ValueError) what would still not be JSON."""
    return json.dumps(finite(value), allow_nan=False, **options)
