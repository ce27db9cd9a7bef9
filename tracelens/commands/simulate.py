"""`tracelens simulate`: write a simulated multi-rank run (Kineto traces + truth.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracelens._app import app


@app.command("simulate")
def simulate_cmd(
    out: Annotated[
        Path, typer.Option("-o", "--out", help="Output folder (one trace per rank + truth.json).")
    ],
    model: Annotated[
        str, typer.Option("--model", help="Preset name or path to an HF config.json.")
    ] = "qwen3.5-27b",
    seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length (tokens per sample).")] = 4096,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel degree.")] = 1,
    dp: Annotated[int, typer.Option("--dp", help="Data-parallel degree.")] = 1,
    cp: Annotated[
        int, typer.Option("--cp", help="Context-parallel degree (Ulysses all-to-all around attention).")
    ] = 1,
    microbatches: Annotated[int, typer.Option("--microbatches", help="Microbatches per step.")] = 4,
    micro_batch_size: Annotated[int, typer.Option("--micro-batch-size", help="Samples per microbatch.")] = 1,
    steps: Annotated[int, typer.Option("--steps", help="Profiled steps.")] = 3,
    schedule: Annotated[
        str, typer.Option("--schedule", help="Pipeline schedule: 1f1b, gpipe or interleaved_1f1b.")
    ] = "1f1b",
    virtual_stages: Annotated[
        int,
        typer.Option("--virtual-stages", help="Model chunks per rank (interleaved_1f1b: at least 2)."),
    ] = 1,
    seed: Annotated[
        int, typer.Option("--seed", help="Random seed (same seed -> byte-identical output).")
    ] = 0,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU type: H100 or H200.")] = "H100",
    kernel_costs: Annotated[
        str,
        typer.Option(
            "--kernel-costs",
            help="Kernel-cost preset: published (default) or h200-measured (docs/calibration.md).",
        ),
    ] = "published",
    ranks_per_host: Annotated[int, typer.Option("--ranks-per-host", help="GPUs per host.")] = 8,
    order: Annotated[
        str, typer.Option("--order", help="Rank order, fastest-varying axis first.")
    ] = "tp-cp-dp-pp",
    sequence_parallel: Annotated[
        bool, typer.Option("--sequence-parallel", help="Megatron sequence parallelism.")
    ] = False,
    split: Annotated[str | None, typer.Option("--split", help="Layers per stage, e.g. 22,21,21.")] = None,
    straggler: Annotated[
        list[str] | None, typer.Option("--straggler", help="RANK:FACTOR[:STEPS] compute slowdown.")
    ] = None,
    clock_offset: Annotated[
        list[str] | None, typer.Option("--clock-offset", help="HOST:US clock offset of a host.")
    ] = None,
    slow_link: Annotated[
        list[str] | None, typer.Option("--slow-link", help="RANK:FACTOR slower transfers of a rank.")
    ] = None,
    host_stall: Annotated[
        list[str] | None, typer.Option("--host-stall", help="RANK:MS CPU stall per step before launches.")
    ] = None,
    no_gzip: Annotated[
        bool, typer.Option("--no-gzip", help="Write plain .json instead of .json.gz.")
    ] = False,
    compress_level: Annotated[
        int, typer.Option("--compress-level", help="gzip level 0-9 (9: smallest files, 1: fastest).")
    ] = 9,
    nccl_outputs: Annotated[
        bool,
        typer.Option(
            "--nccl-outputs",
            help="Also write Flight Recorder dumps, NCCL profiler-plugin traces and NCCL logs.",
        ),
    ] = False,
    hang: Annotated[
        str | None,
        typer.Option(
            "--hang", help="RANK:SEQ[:PG] plant a hang in the NCCL outputs (implies --nccl-outputs)."
        ),
    ] = None,
) -> None:
    """Simulate a TP x PP x DP x CP training run and write PyTorch-profiler traces with known truth."""
    from tracelens.simulate import SimConfig, parse_pair, parse_split, parse_straggler, simulate

    cfg = SimConfig(
        model=model,
        seq_len=seq_len,
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        microbatches=microbatches,
        micro_batch_size=micro_batch_size,
        steps=steps,
        schedule=schedule.lower(),
        virtual_stages=virtual_stages,
        seed=seed,
        gpu=gpu,
        kernel_costs=kernel_costs,
        ranks_per_host=ranks_per_host,
        order=order,
        sequence_parallel=sequence_parallel,
        split=parse_split(split),
        stragglers=[parse_straggler(s) for s in straggler or []],
        clock_offsets=dict(parse_pair(s, "--clock-offset", int, float) for s in clock_offset or []),
        slow_links=[parse_pair(s, "--slow-link") for s in slow_link or []],
        host_stalls=[parse_pair(s, "--host-stall") for s in host_stall or []],
        gzip=not no_gzip,
        compress_level=compress_level,
    )
    truth = simulate(cfg, out)
    if nccl_outputs or hang:
        from tracelens.simulate.nccl_outputs import parse_hang, write_for_run

        write_for_run(out, hang=parse_hang(hang) if hang else None)
    mfu = truth["mfu"]["value"]
    typer.echo(
        f"wrote {cfg.world_size} rank traces and truth.json to {out} "
        f"(mean step {truth['mfu']['step_time_ns'] / 1e6:,.1f} ms, MFU {mfu:.1%})"
    )
