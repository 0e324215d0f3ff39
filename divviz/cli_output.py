"""What the CLI prints for machines: strict JSON."""

from __future__ import annotations

import json


def print_json(value, indent: int | None = None) -> int:
    """Print `value` as strict JSON (a NaN or infinite number, which JSON cannot spell, as null); exit code 0."""
    strict = json.loads(json.dumps(value), parse_constant=lambda name: None)  # NaN, Infinity, -Infinity -> null
    print(json.dumps(strict, indent=indent, allow_nan=False))
    return 0
