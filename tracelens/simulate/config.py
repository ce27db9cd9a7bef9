"""Simulation configuration: one dataclass, plus parsers for the CLI's fault strings.

Everything a run depends on is in `SimConfig`; `simulate(cfg, out_dir)` is a pure function of it
(same config and seed -> byte-identical files).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tracelens.errors import BadInputError

AXES = ("tp", "cp", "dp", "pp")

#: A tiny hybrid model (HF config dict) for fast tests: 8 layers = 2 x (3 Gated DeltaNet + 1 full attention),
#: hidden 512, 8 Q / 2 KV heads x 64 with output gate; a 16-rank run takes well under a second per step.
TINY_MODEL: dict = {
    "model_type": "qwen3_next",
    "num_hidden_layers": 8,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "attn_output_gate": True,
    "intermediate_size": 1536,
    "vocab_size": 4096,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
}


@dataclass
class SimConfig:
    """A simulated training run: model, layout, schedule, hardware and planted faults."""

    model: Any = "qwen3.5-27b"  # preset name, path to an HF config.json, an HF-style dict, or a ModelSpec
    seq_len: int = 4096
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    microbatches: int = 4
    micro_batch_size: int = 1
    steps: int = 3
    schedule: str = "1f1b"  # "1f1b" | "gpipe" | "interleaved_1f1b"
    virtual_stages: int = 1  # model chunks per rank (interleaved 1F1B: at least 2)
    seed: int = 0
    gpu: str = "H100"  # "H100" | "H200"
    kernel_costs: str = "published"  # a preset of simulate.costs.KERNEL_COSTS
    ranks_per_host: int = 8
    order: str = "tp-cp-dp-pp"  # Megatron order: first axis varies fastest
    sequence_parallel: bool = False
    split: list[int] | None = None  # layers per pipeline stage
    stragglers: list[tuple[int, float, list[int] | None]] = field(default_factory=list)
    clock_offsets: dict[int, float] = field(default_factory=dict)  # host index -> µs
    slow_links: list[tuple[int, float]] = field(default_factory=list)
    host_stalls: list[tuple[int, float]] = field(default_factory=list)  # rank, ms per step
    gzip: bool = True
    compress_level: int = 9  # gzip level: 9 for committed samples (smallest), 1-6 for fast large runs

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def validate(self) -> None:
        """Raise BadInputError on an impossible configuration (one-line message)."""
        for name in ("tp", "pp", "dp", "cp", "microbatches", "micro_batch_size", "steps", "ranks_per_host"):
            if int(getattr(self, name)) < 1:
                raise BadInputError(f"--{name.replace('_', '-')} must be >= 1")
        if not 0 <= self.compress_level <= 9:
            raise BadInputError("--compress-level must be 0..9")
        if self.seq_len < 1:
            raise BadInputError("--seq-len must be >= 1")
        from tracelens.simulate.costs import KERNEL_COSTS

        if self.kernel_costs not in KERNEL_COSTS:
            raise BadInputError(
                f"unknown --kernel-costs {self.kernel_costs!r} (known: {', '.join(KERNEL_COSTS)})"
            )
        if self.schedule not in ("1f1b", "gpipe", "interleaved_1f1b"):
            raise BadInputError(f"unknown schedule {self.schedule!r} (use 1f1b, gpipe or interleaved_1f1b)")
        if self.schedule == "interleaved_1f1b" and (self.virtual_stages < 2 or self.pp < 2):
            raise BadInputError("interleaved_1f1b needs --virtual-stages >= 2 and --pp >= 2")
        if self.schedule != "interleaved_1f1b" and self.virtual_stages != 1:
            raise BadInputError(f"--virtual-stages {self.virtual_stages} needs --schedule interleaved_1f1b")
        if self.virtual_stages > 1 and self.split is not None:
            raise BadInputError("--split and --virtual-stages cannot be combined (chunks are cut evenly)")
        if sorted(self.order.split("-")) != sorted(AXES):
            raise BadInputError(f"--order must be a permutation of tp-cp-dp-pp, got {self.order!r}")
        if self.seq_len % self.cp:
            raise BadInputError(f"--seq-len {self.seq_len} is not divisible by --cp {self.cp}")
        ws = self.world_size
        for rank, factor, _steps in self.stragglers:
            _check_rank(rank, ws, "--straggler")
            if factor <= 0:
                raise BadInputError("--straggler factor must be > 0")
        for rank, factor in self.slow_links:
            _check_rank(rank, ws, "--slow-link")
            if factor <= 0:
                raise BadInputError("--slow-link factor must be > 0")
        for rank, ms in self.host_stalls:
            _check_rank(rank, ws, "--host-stall")
            if ms < 0:
                raise BadInputError("--host-stall milliseconds must be >= 0")
        n_hosts = -(-ws // self.ranks_per_host)
        for host in self.clock_offsets:
            if not 0 <= int(host) < n_hosts:
                raise BadInputError(f"--clock-offset host {host} out of range (0..{n_hosts - 1})")

    def to_json(self) -> dict:
        """JSON-safe dict of every field (the model as given, or its name when it is an object)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if (f.name, v) in (("kernel_costs", "published"), ("virtual_stages", 1)):
                continue  # defaults left out: truth.json of runs made before the option is unchanged
            if f.name == "model" and not isinstance(v, (str, dict)):
                v = getattr(v, "name", str(v))
            elif f.name == "stragglers":
                v = [[r, fac, list(st) if st is not None else None] for r, fac, st in v]
            elif f.name == "slow_links":
                v = [[r, fac] for r, fac in v]
            elif f.name == "host_stalls":
                v = [[r, ms] for r, ms in v]
            elif f.name == "clock_offsets":
                v = {str(k): val for k, val in sorted(v.items())}
            out[f.name] = v
        return out


def _check_rank(rank: int, ws: int, flag: str) -> None:
    if not 0 <= rank < ws:
        raise BadInputError(f"{flag} rank {rank} out of range (world size {ws})")


def _num(text: str, flag: str, kind=float):
    try:
        return kind(text)
    except ValueError:
        raise BadInputError(f"{flag}: {text!r} is not a number") from None


def parse_straggler(spec: str) -> tuple[int, float, list[int] | None]:
    """`RANK:FACTOR[:STEPS]` with STEPS like `0,2` or `1-3` -> (rank, factor, steps or None = all)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise BadInputError(f"--straggler expects RANK:FACTOR[:STEPS], got {spec!r}")
    steps: list[int] | None = None
    if len(parts) == 3 and parts[2]:
        steps = []
        for chunk in parts[2].split(","):
            if "-" in chunk:
                lo, hi = chunk.split("-", 1)
                steps.extend(range(_num(lo, "--straggler", int), _num(hi, "--straggler", int) + 1))
            else:
                steps.append(_num(chunk, "--straggler", int))
    return _num(parts[0], "--straggler", int), _num(parts[1], "--straggler"), steps


def parse_pair(spec: str, flag: str, first=int, second=float) -> tuple:
    """`A:B` -> (first(A), second(B)) with a one-line error naming the flag."""
    parts = spec.split(":")
    if len(parts) != 2:
        raise BadInputError(f"{flag} expects A:B, got {spec!r}")
    return _num(parts[0], flag, first), _num(parts[1], flag, second)


def parse_split(spec: str | None) -> list[int] | None:
    """`16,16,16,16` -> [16, 16, 16, 16]."""
    if not spec:
        return None
    return [_num(x, "--split", int) for x in spec.split(",")]
