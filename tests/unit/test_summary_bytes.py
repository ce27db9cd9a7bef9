"""summary.json's encoder (msgspec, with json.dumps as the fallback) writes the values json.dumps writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tracelens.summary import summary_bytes


def _reference(d: dict) -> object:
    """What json.dumps(default=...) gives, NaN read back as None."""

    def default(o):
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, Path):
            return str(o)
        raise TypeError(type(o).__name__)

    return json.loads(json.dumps(d, default=default))


def test_same_values_as_json_dumps():
    d = {
        "schema": "tracelens.summary/1",
        "n": np.int64(1024),
        "f": np.float64(8.23475110454231e16),
        "small": 1e-5,
        "f32": np.float32(0.1),
        "arr": np.arange(3, dtype=np.int32),
        "path": Path("/runs/a"),
        "text": "Qwen3.5 · é ✓",
        "nested": [{"a": (1, 2.5)}, None, True],
        7: "int key",
    }
    out = summary_bytes(d)
    assert out.endswith(b"}\n") and out.startswith(b"{\n  ")
    assert json.loads(out) == _reference(d)


def test_nan_is_null():
    got = json.loads(summary_bytes({"a": float("nan"), "b": np.float64("nan"), "c": [1.0]}))
    assert got == {"a": None, "b": None, "c": [1.0]}


def test_keys_msgspec_refuses_fall_back_to_json_dumps():
    d = {None: 1, True: 2, "x": np.int64(3)}
    assert json.loads(summary_bytes(d)) == {"null": 1, "true": 2, "x": 3}
    with pytest.raises(ValueError):  # json.dumps' own rule in that fallback: no NaN
        summary_bytes({None: math.nan})


def test_unknown_type_raises_type_error():
    with pytest.raises(TypeError):
        summary_bytes({"x": object()})
