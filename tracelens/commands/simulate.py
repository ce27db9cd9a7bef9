"""`tracelens simulate`: write a simulated multi-rank run (Kineto traces + truth.json)."""

from __future__ import annotations

from pathlib import Path

import typer

from tracelens.cli import app


@app.command("simulate")
def simulate_cmd(
    out: Path = typer.Option(..., "-o", "--out", help="Output folder (one trace per rank + truth.json)."),
    model: str = typer.Option("qwen3.5-27b", "--model", help="Preset name or path to an HF config.json."),
    seq_len: int = typer.Option(4096, "--seq-len", help="Sequence length (tokens per sample)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel degree."),
    cp: int = typer.Option(1, "--cp", help="Context-parallel degree (Ulysses all-to-all around attention)."),
    microbatches: int = typer.Option(4, "--microbatches", help="Microbatches per step."),
    micro_batch_size: int = typer.Option(1, "--micro-batch-size", help="Samples per microbatch."),
    steps: int = typer.Option(3, "--steps", help="Profiled steps."),
    schedule: str = typer.Option("1f1b", "--schedule", help="Pipeline schedule: 1f1b or gpipe."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed -> byte-identical output)."),
    gpu: str = typer.Option("H100", "--gpu", help="GPU type: H100 or H200."),
    ranks_per_host: int = typer.Option(8, "--ranks-per-host", help="GPUs per host."),
    order: str = typer.Option("tp-cp-dp-pp", "--order", help="Rank order, fastest-varying axis first."),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel", help="Megatron sequence parallelism."),
    split: str = typer.Option(None, "--split", help="Layers per stage, e.g. 22,21,21."),
    straggler: list[str] = typer.Option([], "--straggler", help="RANK:FACTOR[:STEPS] compute slowdown."),
    clock_offset: list[str] = typer.Option([], "--clock-offset", help="HOST:US clock offset of a host."),
    slow_link: list[str] = typer.Option([], "--slow-link", help="RANK:FACTOR slower transfers of a rank."),
    host_stall: list[str] = typer.Option([], "--host-stall", help="RANK:MS CPU stall per step before launches."),
    no_gzip: bool = typer.Option(False, "--no-gzip", help="Write plain .json instead of .json.gz."),
) -> None:
    """Simulate a TP x PP x DP x CP training run and write PyTorch-profiler traces with known truth."""
    from tracelens.simulate import SimConfig, parse_pair, parse_split, parse_straggler, simulate

    cfg = SimConfig(
        model=model, seq_len=seq_len, tp=tp, pp=pp, dp=dp, cp=cp, microbatches=microbatches,
        micro_batch_size=micro_batch_size, steps=steps, schedule=schedule.lower(), seed=seed, gpu=gpu,
        ranks_per_host=ranks_per_host, order=order, sequence_parallel=sequence_parallel,
        split=parse_split(split),
        stragglers=[parse_straggler(s) for s in straggler],
        clock_offsets=dict(parse_pair(s, "--clock-offset", int, float) for s in clock_offset),
        slow_links=[parse_pair(s, "--slow-link") for s in slow_link],
        host_stalls=[parse_pair(s, "--host-stall") for s in host_stall],
        gzip=not no_gzip,
    )
    truth = simulate(cfg, out)
    mfu = truth["mfu"]["value"]
    typer.echo(
        f"wrote {cfg.world_size} rank traces and truth.json to {out} "
        f"(mean step {truth['mfu']['step_time_ns'] / 1e6:,.1f} ms, MFU {mfu:.1%})"
    )
