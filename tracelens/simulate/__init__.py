"""Kineto-format simulator of multi-GPU training runs with planted faults and known ground truth.

`simulate(SimConfig(...), out_dir) -> dict` writes one PyTorch-profiler trace per rank (as a real NCCL
run under `tensorboard_trace_handler` would) plus `truth.json`, and returns the truth dict.
See docs/simulator.md for the model, the semantics and the truth definitions.
"""

from __future__ import annotations

from tracelens.simulate.config import TINY_MODEL, SimConfig, parse_pair, parse_split, parse_straggler
from tracelens.simulate.run import TRUTH_SCHEMA, resolve_model, simulate

__all__ = [
    "TINY_MODEL",
    "TRUTH_SCHEMA",
    "SimConfig",
    "parse_pair",
    "parse_split",
    "parse_straggler",
    "resolve_model",
    "simulate",
]
