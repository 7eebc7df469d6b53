"""JSON that every parser reads: no `NaN`, `Infinity` or `-Infinity` tokens.

Python's `json` writes a non-finite float as `NaN` or `Infinity`, which is not JSON: `jq`,
JavaScript's `JSON.parse` and strict parsers refuse the whole document. A model whose logits
overflow, or a user's forward that returns NaN, puts such numbers in the metrics. So every writer
of a `--json` document or a JSON Lines record goes through `dumps`: each non-finite number becomes
`null`, and the document (a JSON object) gains a `non_finite` object that says which and why,
keyed by the JSON Pointer (RFC 6901) of the number, or of the list that held some:

    "max_abs_logits": null, ...
    "non_finite": {"/runs/0/max_abs_logits": "nan", "/runs/0/per_position/kl": "3 of 16: nan, inf"}

`non_finite` is present only when some number was not finite. `allow_nan=False` at the writer
makes any number this walk missed an error instead of a document that does not parse. Imports
nothing heavy: the scan's child processes and `--help` stay light.
"""

from __future__ import annotations

import json
import math
from typing import Any

NON_FINITE = "non_finite"  # the key of the object that names what became null


def _kind(x: float) -> str:
    return "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"


def _token(key) -> str:
    """One reference token of a JSON Pointer: "~" and "/" escaped as RFC 6901 says."""
    return str(key).replace("~", "~0").replace("/", "~1")


def _walk(obj: Any, path: str, found: dict) -> Any:
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        found[path] = _kind(obj)
        return None
    if isinstance(obj, dict):
        return {k: _walk(v, f"{path}/{_token(k)}", found) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in obj):
            return _numbers(obj, path, found)  # a list of numbers: one entry for the list
        return [_walk(v, f"{path}/{i}", found) for i, v in enumerate(obj)]
    return obj


def _numbers(values, path: str, found: dict) -> list:
    bad = [_kind(v) for v in values if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return list(values)
    kinds = ", ".join(dict.fromkeys(bad))
    found[path] = f"{len(bad)} of {len(values)}: {kinds}"
    return [v if not isinstance(v, float) or math.isfinite(v) else None for v in values]


def finite_or_null(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None and, for a dict, a `non_finite` entry
    (JSON Pointer -> "nan", "inf", "-inf", or "K of N: kinds" for a list) when there was any.
    A copy: the caller's object is not changed."""
    found: dict = {}
    out = _walk(obj, "", found)
    if found and isinstance(out, dict):
        out[NON_FINITE] = {**out.get(NON_FINITE, {}), **found} if isinstance(out.get(NON_FINITE), dict) else found
    return out


def dumps(obj: Any, **kwargs) -> str:
    """`json.dumps` of `finite_or_null(obj)` with `allow_nan=False`: strict JSON, always."""
    return json.dumps(finite_or_null(obj), allow_nan=False, **kwargs)


def dump(obj: Any, fp, **kwargs) -> None:
    """`dumps` written to the open text file `fp`."""
    fp.write(dumps(obj, **kwargs))
