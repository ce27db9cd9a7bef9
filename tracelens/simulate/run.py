"""`simulate()`: build programs, run the joint schedule, stream the traces, write truth.json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from tracelens.errors import BadInputError
from tracelens.simulate import costs as C
from tracelens.simulate.config import SimConfig
from tracelens.simulate.engine import Engine
from tracelens.simulate.layout import Layout
from tracelens.simulate.program import ProgramBuilder, kv_replication
from tracelens.simulate.truth import StageTruthStatic, rank_step_truth
from tracelens.simulate.writer import (
    FIRST_STEP,
    NCCL_VERSION,
    StageStatic,
    file_name,
    trace_id,
    write_rank,
)

TRUTH_SCHEMA = "tracelens.simtruth/1"
TRIMONTH_S = 7_889_238
T0_NS = 1_793_400_000_000_000_000  # fixed wall clock of the simulated run's first step (2026-10-31)


def resolve_model(model):
    """A ModelSpec from a preset name, a config.json path, an HF-style dict, or a ModelSpec itself."""
    from tracelens.models import get_model, model_from_config

    if isinstance(model, dict):
        return model_from_config(model, name=str(model.get("_name_or_path") or "custom"))
    if isinstance(model, (str, Path)):
        return get_model(model)
    if hasattr(model, "layer_types") and hasattr(model, "hidden_size"):
        return model
    raise BadInputError(f"cannot use {model!r} as a model (give a preset name, a config.json or a dict)")


def _peak(gpu: C.GpuSpec) -> float:
    from tracelens.models.hardware import peak_flops

    return peak_flops(gpu.device_name) or gpu.peak_bf16


def simulate(cfg: SimConfig, out_dir) -> dict:
    """Simulate `cfg`, write one trace per rank and truth.json into `out_dir`; return the truth dict."""
    cfg.validate()
    if cfg.gpu.upper() not in C.GPUS:
        raise BadInputError(f"unknown --gpu {cfg.gpu!r} (known: {', '.join(C.GPUS)})")
    gpu = C.GPUS[cfg.gpu.upper()]
    model = resolve_model(cfg.model)
    peak = _peak(gpu)
    layout = Layout(cfg)
    builder = ProgramBuilder(cfg, model, gpu, peak)
    programs = [builder.build(s) for s in range(cfg.pp)]
    engine = Engine(cfg, layout, programs, gpu, T0_NS)
    timings = engine.run()  # timings[step][stage]

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.pt.trace.json*"):
        old.unlink()
    base_ns = (T0_NS // (TRIMONTH_S * 10**9)) * TRIMONTH_S * 10**9
    pg_count = len(layout.groups)
    statics = [StageStatic(p) for p in programs]
    files = {}
    for rank in range(cfg.world_size):
        c = layout.coords(rank)
        stage = c["pp"]
        col = (c["dp"] * cfg.cp + c["cp"]) * cfg.tp + c["tp"]
        host = layout.host(rank)
        offset_ns = int(round(float(cfg.clock_offsets.get(host, 0.0)) * 1000))
        t_export = int(timings[-1][stage].step_end[col]) + 1_500_000_000 + offset_ns
        name = file_name(layout, rank, t_export) + (".gz" if cfg.gzip else "")
        header = {
            "schemaVersion": 1,
            "deviceProperties": C.device_properties(gpu, min(cfg.ranks_per_host, cfg.world_size)),
            "trace_id": trace_id(cfg.seed, rank),
            "profile_memory": 1,
            "record_shapes": 1,
            "distributedInfo": {
                "backend": "nccl",
                "rank": rank,
                "world_size": cfg.world_size,
                "pg_count": pg_count,
                "pg_config": layout.pg_config(rank),
                "nccl_version": NCCL_VERSION,
            },
            "host_name": layout.host_name(rank),
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": base_ns,
            "_trace_name": f"/workspace/traces/{name}",
        }
        write_rank(
            out / name,
            rank,
            stage,
            col,
            layout,
            statics[stage],
            [t[stage] for t in timings],
            header,
            base_ns,
            offset_ns,
            cfg.gzip,
            cfg.compress_level,
        )
        files[rank] = name

    truth = _truth(cfg, model, gpu, peak, layout, builder, programs, timings, files)
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    _write_run_toml(cfg, out)
    return truth


def _write_run_toml(cfg: SimConfig, out: Path) -> None:
    """tracelens.toml with what a user would know about the run (model, tokens, hardware), deliberately
    without [parallel], so the layout is inferred from the traces (truth.json holds the real one)."""
    if isinstance(cfg.model, dict):
        (out / "model_config.json").write_text(json.dumps(cfg.model, indent=1) + "\n", encoding="utf-8")
        model = "model_config.json"
    elif isinstance(cfg.model, (str, Path)):
        model = str(cfg.model)
    else:
        model = None
    lines = [
        "# Written by `tracelens simulate`: run metadata a user would know. The layout is left out on",
        "# purpose (tracelens infers it from the process groups); truth.json holds the simulator's layout.",
        "[training]",
        f"seq_len = {cfg.seq_len}",
        f"global_batch = {cfg.micro_batch_size * cfg.microbatches * cfg.dp}",
        f"microbatches = {cfg.microbatches}",
        f'schedule = "{cfg.schedule}"',
    ]
    if cfg.virtual_stages > 1:
        lines.append(f"virtual_stages = {cfg.virtual_stages}")
    if model is not None:
        lines += ["[model]", f"config = {json.dumps(model)}"]
    lines += ["[hardware]", f'gpu = "{cfg.gpu.upper()}"', ""]
    (out / "tracelens.toml").write_text("\n".join(lines), encoding="utf-8")


def _mean_step_ns(cfg: SimConfig, layout: Layout, programs, gpu: C.GpuSpec) -> float:
    """Mean step time (over ranks and steps) of a run, timing only (nothing written)."""
    timings = Engine(cfg, layout, programs, gpu, T0_NS).run()
    return float(np.mean([t.step_end - t.step_start for step in timings for t in step]))


def _add_costs(
    cfg: SimConfig, layout: Layout, programs, gpu: C.GpuSpec, faulted: float, faults: dict
) -> None:
    """Counterfactual step-time cost of each planted slowdown: rerun the schedule (same seed, so the same
    jitter) without any fault and with only that fault; `step_time_cost_ns` = with it - without any."""
    kinds = (("stragglers", "stragglers"), ("slow_links", "slow_links"), ("host_stalls", "host_stalls"))
    if not any(getattr(cfg, attr) for attr, _ in kinds):
        faults["clean_step_time_ns"] = faulted
        faults["step_time_cost_ns"] = 0.0
        return
    none = dataclasses.replace(cfg, stragglers=[], slow_links=[], host_stalls=[])
    clean = _mean_step_ns(none, layout, programs, gpu)
    faults["clean_step_time_ns"] = clean
    faults["step_time_cost_ns"] = faulted - clean
    for attr, key in kinds:
        for entry, fault in zip(faults[key], getattr(cfg, attr), strict=True):
            only_fault: dict[str, Any] = {attr: [fault]}
            only = dataclasses.replace(none, **only_fault)
            entry["step_time_cost_ns"] = _mean_step_ns(only, layout, programs, gpu) - clean


def _truth(cfg, model, gpu, peak, layout, builder, programs, timings, files) -> dict:
    from tracelens.models.flops import training_flops_per_token

    sts = [StageTruthStatic(p) for p in programs]
    ranks_out = []
    per_step_time = np.zeros((cfg.steps, cfg.world_size))
    for rank in range(cfg.world_size):
        c = layout.coords(rank)
        stage = c["pp"]
        col = (c["dp"] * cfg.cp + c["cp"]) * cfg.tp + c["tp"]
        steps = []
        for k in range(cfg.steps):
            row = rank_step_truth(sts[stage], timings[k][stage], col)
            row["step"] = FIRST_STEP + k
            per_step_time[k, rank] = row["step_time_ns"]
            steps.append(row)
        ranks_out.append(
            {
                "rank": rank,
                "stage": stage,
                "file": files[rank],
                "host": layout.host(rank),
                "host_name": layout.host_name(rank),
                "steps": steps,
            }
        )
    expected = builder.expected_bubble_fraction()
    stages_out = []
    for s, prog in enumerate(programs):
        counts: dict[str, int] = {}
        for li in prog.layers:
            lt = model.layer_types[li]
            counts[lt] = counts.get(lt, 0) + 1
        members = [r for r in range(cfg.world_size) if layout.coords(r)["pp"] == s]
        per_step = []
        for k in range(cfg.steps):
            rows = [ranks_out[r]["steps"][k] for r in members]
            bub = float(np.mean([x["bubble_ns"] for x in rows]))
            st_ = float(np.mean([x["step_time_ns"] for x in rows]))
            per_step.append(
                {
                    "step": FIRST_STEP + k,
                    "bubble_ns": bub,
                    "step_time_ns": st_,
                    "bubble_fraction": bub / st_,
                    "compute_ns": float(np.mean([x["compute_ns"] for x in rows])),
                }
            )
        stages_out.append(
            {
                "stage": s,
                "ranks": members,
                "layers": prog.layers,
                "first_layer": prog.layers[0],
                "num_layers": len(prog.layers),
                "layer_types": counts,
                "params_per_rank": int(prog.params),
                "expected_bubble_fraction": expected,
                "bubble_fraction": float(np.mean([x["bubble_fraction"] for x in per_step])),
                "steps": per_step,
            }
        )
    tokens = cfg.seq_len * cfg.micro_batch_size * cfg.microbatches * cfg.dp
    fpt = training_flops_per_token(model, cfg.seq_len, "megatron")
    step_mean = per_step_time.mean(axis=1)
    mfu_steps = [
        {
            "step": FIRST_STEP + k,
            "step_time_ns": float(step_mean[k]),
            "mfu": fpt * tokens / (step_mean[k] * 1e-9 * peak * cfg.world_size),
        }
        for k in range(cfg.steps)
    ]
    mean_step = float(step_mean.mean())
    faults = {
        "stragglers": [
            {
                "rank": r,
                "factor": f,
                "steps": None if st is None else [FIRST_STEP + x for x in st],
                "stage": layout.coords(r)["pp"],
                "cause": "compute",
            }
            for r, f, st in cfg.stragglers
        ],
        "clock_offsets": [
            {
                "host": int(h),
                "host_name": f"gpu-node-{int(h):03d}",
                "offset_us": float(us),
                "ranks": [r for r in range(cfg.world_size) if layout.host(r) == int(h)],
            }
            for h, us in sorted(cfg.clock_offsets.items())
        ],
        "slow_links": [
            {"rank": r, "factor": f, "stage": layout.coords(r)["pp"], "cause": "communication"}
            for r, f in cfg.slow_links
        ],
        "host_stalls": [
            {"rank": r, "ms": ms, "stage": layout.coords(r)["pp"], "cause": "host"}
            for r, ms in cfg.host_stalls
        ],
        "kv_replication": kv_replication(cfg, model),
        "unequal_split": len(set(builder.split)) > 1
        or len({tuple(sorted(x["layer_types"].items())) for x in stages_out}) > 1,
    }
    _add_costs(cfg, layout, programs, gpu, float(step_mean.mean()), faults)
    return {
        "schema": TRUTH_SCHEMA,
        "config": cfg.to_json(),
        "model": {
            "name": model.name,
            "num_layers": model.num_layers,
            "layer_types": list(model.layer_types),
            "hidden_size": model.hidden_size,
        },
        "gpu": {"key": gpu.key, "name": gpu.device_name, "peak_flops": peak},
        "layout": {**layout.to_json(), "split": builder.split, "sequence_parallel": cfg.sequence_parallel},
        "memory": {
            "full_recompute_accounting": any(p.full_recompute_memory for p in programs),
            "static_bytes_per_rank_by_stage": [int(p.static_bytes) for p in programs],
            "activation_bytes_per_microbatch_by_stage": [int(p.act_bytes_per_mb) for p in programs],
        },
        "schedule": {
            "name": cfg.schedule,
            "microbatches": cfg.microbatches,
            **({"virtual_stages": cfg.virtual_stages} if cfg.virtual_stages > 1 else {}),
            "steps": cfg.steps,
            "first_step": FIRST_STEP,
            "step_numbers": [FIRST_STEP + k for k in range(cfg.steps)],
        },
        "faults": faults,
        "stages": stages_out,
        "ranks": ranks_out,
        "mfu": {
            "convention": "megatron",
            "flops_per_token": fpt,
            "tokens_per_step": tokens,
            "flops_per_step": fpt * tokens,
            "peak_flops_per_gpu": peak,
            "n_gpus": cfg.world_size,
            "step_time_ns": mean_step,
            "value": fpt * tokens / (mean_step * 1e-9 * peak * cfg.world_size),
            "steps": mfu_steps,
        },
        "attention_share": float(np.mean([x["attention_share"] for r in ranks_out for x in r["steps"]])),
        "definitions": DEFINITIONS,
    }


DEFINITIONS = {
    "step window": "the rank's ProfilerStep#N user_annotation [ts, ts+dur] (CPU clock, before clock offsets)",
    "times": "integer ns on the true clock; trace timestamps of a host with a clock offset are shifted by it",
    "compute_ns": "length of the union of compute kernels (not NCCL, not memcpy/memset) clipped to the "
    "window",
    "comm_ns": "length of the union of NCCL kernels clipped to the window",
    "exposed_comm_ns": "union(all kernels) - union(compute kernels) inside the window",
    "idle_ns": "window - union(all kernels)",
    "bubble_ns": "fill + inflight + drain: fill = first forward compute kernel start - window start; "
    "inflight = "
    "time receives waited for the sender to start (after the first forward); drain = wait inside "
    "the end-of-step world all-reduce for the slowest stage. Waits happen inside NCCL kernels, so "
    "bubble time is also counted in comm_ns / exposed_comm_ns.",
    "attention_ns": "sum of gpu_user_annotation durations of layers.N.self_attn[.backward] modules",
    "attention_share": "attention_ns / step_time_ns (per rank per step); the top-level value is the mean",
    "mfu": "megatron-convention model FLOPs per step / (mean step time x peak x n_gpus)",
}
