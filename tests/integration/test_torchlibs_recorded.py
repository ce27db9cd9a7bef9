"""Runs recorded with PyTorch's own parallelism libraries in configurations ../shared/runs does not hold
(tests/data/torchlibs, `scripts/record_torch_parallel.py`; each folder's manifest.json has the truth and the
command that recorded it), checked as ../shared/runs/evaluate.py checks: a TP x PP x DP run (DTensor tensor
parallelism, pipelining, FSDP2, DeviceMesh dimensions named `pipe`, `replicate`, `model`) whose TP rank 5
runs an extra matmul in every MLP; a DualPipeV pipeline without replicas whose rank 1 does; a GPipe pipeline
over groups made with `new_group` (no names) and no module annotations whose rank 2 sleeps 40 ms before each
step's forward; an interleaved 1F1B pipeline without replicas (v = 2, m = 6) whose rank 1 sleeps 40 ms inside
`record_function("dataloader")` before each step's forward; FSDP2 over two ranks whose rank 1 runs the extra
matmul (rank 0 waits for it inside autograd nodes: FSDP's all-gathers); DTensor TP 2 x FSDP2 2 whose rank 2
sleeps inside `record_function("dataloader")` (its peers wait in `_c10d_functional::wait_tensor`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.manifest_checks import check_layout, check_schedule, check_verdicts
from tracelens.run_analysis import Options, analyze_run

DATA = Path(__file__).resolve().parents[1] / "data" / "torchlibs"
RUNS = sorted(p.name for p in DATA.iterdir() if (p / "manifest.json").exists())


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("torchlibs") / "cache")
    return {n: analyze_run(DATA / n, Options(cache_dir=cache)).summary() for n in RUNS}


@pytest.mark.parametrize("run", RUNS)
def test_recorded_run_as_its_manifest_says(summaries, run):
    man = json.loads((DATA / run / "manifest.json").read_text())
    s = summaries[run]
    check_layout(man, s)
    check_schedule(man, s)
    check_verdicts(man, s)


def test_the_slow_tensor_parallel_rank_is_named_against_its_stage_peers(summaries):
    s = summaries["tp2pp2dp2_fsdp_slow5"]
    assert s["run"]["layout"]["evidence"]["tp"]["basis"] == "roles"  # the groups' names say nothing
    (st,) = s["stragglers"]
    assert (st["rank"], st["cause"], st["stage"]) == (5, "compute", 1)
    assert set(st["evidence"]["peers"]) == {4, 6, 7}


def test_a_pipeline_rank_without_replicas_named_by_its_work_per_layer(summaries):
    (st,) = summaries["pp2_dualpipev_slow1"]["stragglers"]
    assert st["rank"] == 1 and st["evidence"]["work_per_layer_ratio"] > 2


def test_a_host_stall_in_a_pipeline_without_replicas_is_measured_against_the_other_stage():
    """No rank shares rank 1's stage: its 40 ms sleep (inside a `dataloader` annotation, which is no work) is
    a gap with no op and no communication in flight, measured against rank 0's longest gaps."""
    from tracelens.analyze.rank.cpu_evidence import GAP_FRAME

    s = analyze_run(DATA / "pp2_interleaved_m6_stall1_rf", Options(no_cache=True)).summary()
    (st,) = s["stragglers"]
    assert (st["rank"], st["cause"]) == (1, "host")
    ev = st["evidence"]
    assert ev["peers"] == [] and ev["peer_kind"] == "other stages" and ev["host_frames"] == [GAP_FRAME]
    assert 30 < ev["idle_excess_ms"] < 60  # (the sleep is 40 ms; time-shared cores stretch it a little)
    assert "vs other stages" in s["headlines"][0]


def test_waiting_for_a_collective_inside_a_frame_is_no_host_stall(summaries):
    """FSDP2's all-gather, launched and waited for inside an autograd node on the fast rank, and
    `_c10d_functional::wait_tensor` on the TP ranks that wait for the stalled one, are waits for peers: only
    the planted straggler is named."""
    assert [(x["rank"], x["cause"]) for x in summaries["dp2_fsdp_slow1"]["stragglers"]] == [(1, "compute")]
    assert [(x["rank"], x["cause"]) for x in summaries["tp2dp2_fsdp_stall2_rf"]["stragglers"]] == [
        (2, "host")
    ]
