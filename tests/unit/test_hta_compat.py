"""HTA-compatible breakdown and overlap on tiny hand-built event tables with known answers."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelens.analyze.rank import hta_compat as h
from tracelens.schema import EVENTS

US = 1000  # ns per µs


def table(rows: list[dict]) -> pa.Table:
    """EVENTS table from short row dicts: rank, kind, name, ts, dur (µs, may be fractional), stream, corr."""
    cols: dict[str, list] = {f.name: [None] * len(rows) for f in EVENTS}
    for i, r in enumerate(rows):
        cols["rank"][i] = r.get("rank", 0)
        cols["kind"][i] = r.get("kind", "kernel")
        cols["name"][i] = r.get("name", "gemm_kernel")
        cols["ts_ns"][i] = round(r["ts"] * US)
        cols["dur_ns"][i] = round(r["dur"] * US) if r["dur"] is not None else None
        cols["stream"][i] = r.get(
            "stream", 7 if cols["kind"][i] in ("kernel", "gpu_memcpy", "gpu_memset") else None
        )
        cols["correlation"][i] = r.get("corr")
        cols["tid"][i] = r.get("tid")
    return pa.Table.from_pydict(cols, schema=EVENTS)


def k(ts: float, dur: float, name: str = "gemm_kernel", **kw) -> dict:
    return {"ts": ts, "dur": dur, "name": name, **kw}


def cpu(ts: float, dur: float, name: str, kind: str = "cpu_op", **kw) -> dict:
    return {"ts": ts, "dur": dur, "name": name, "kind": kind, **kw}


def one(tbl: pa.Table, rank: int = 0) -> dict:
    return next(r for r in tbl.to_pylist() if r["rank"] == rank)


# --- kernel classes ---------------------------------------------------------------------------------

# HTA 0.5 hta/utils/utils.py, verbatim, as the oracle for the vectorised translation.
_HTA_COMM = re.compile(r"^nccl.*Kernel")
_HTA_MEM = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_HTA_NOT_COMP = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def _hta_kernel_type(name: str) -> int:
    if _HTA_COMM.match(name):
        return h.COMMUNICATION
    if _HTA_MEM.match(name):
        return h.MEMORY
    if not _HTA_NOT_COMP.match(name):
        return h.COMPUTATION
    return h.OTHER


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", h.COMMUNICATION),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", h.COMMUNICATION),
        ("Memcpy HtoD (Pageable -> Device)", h.MEMORY),
        ("Memset (Device)", h.MEMORY),
        ("dma_copy", h.MEMORY),
        ("void at::native::vectorized_elementwise_kernel<4>(int)", h.COMPUTATION),
        ("Stream Sync", h.OTHER),
        ("Context Sync", h.OTHER),
        ("void cudaMemcpyKernel(int)", h.OTHER),  # contains Memcpy: not compute, not memory
        ("xMemset", h.COMPUTATION),  # Memset counts only at the start
        ("nccl_helper", h.COMPUTATION),  # nccl without Kernel
        ("rcclKernel_AllReduce", h.COMPUTATION),  # HTA 0.5 has no RCCL rule
    ],
)
def test_kernel_type_known_names(name: str, want: int) -> None:
    assert h.kernel_type(pa.array([name]))[0] == want
    assert _hta_kernel_type(name) == want


_FRAGMENTS = [
    "nccl",
    "Kernel",
    "Dev",
    "Memcpy",
    "Memset",
    "dma",
    "Sync",
    "sync",
    " ",
    "_",
    "x",
    "<int>",
    "\n",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_FRAGMENTS), max_size=5).map("".join), min_size=1, max_size=20))
def test_kernel_type_agrees_with_hta_regexes(names: list[str]) -> None:
    want = [_hta_kernel_type(n) for n in names]
    assert h.kernel_type(pa.array(names)).tolist() == want
    # dictionary-encoded, chunked (as in the events table)
    chunked = pa.chunked_array([pa.array(names).dictionary_encode()])
    assert h.kernel_type(chunked).tolist() == want


# --- temporal breakdown -----------------------------------------------------------------------------


def test_breakdown_without_steps_uses_first_to_last_gpu_event() -> None:
    ev = table(
        [
            k(0, 10),
            k(5, 10),  # compute union [0, 15)
            k(20, 10, "ncclKernel_AllReduce"),
            k(40, 5, "Memcpy DtoH", kind="gpu_memcpy"),
            cpu(-100, 1000, "aten::mm"),  # CPU rows never count
        ]
    )
    got = one(h.temporal_breakdown(ev))
    assert got["kernel_time_ns"] == 45 * US
    assert got["idle_time_ns"] == 15 * US  # [15,20) and [30,40)
    assert got["compute_time_ns"] == 15 * US
    assert got["non_compute_time_ns"] == 15 * US
    assert got["idle_time_pctg"] == 33.33
    assert got["compute_time_pctg"] == 33.33
    assert got["non_compute_time_pctg"] == 33.33


def test_sync_and_annotation_rows() -> None:
    ev = table(
        [
            k(0, 10),
            k(10, 10, "Stream Sync", kind="other", stream=7, corr=3),  # OTHER: non-compute
            k(30, 10, "Event Sync", kind="other", stream=-1, corr=4),  # stream -1: not a GPU row
            k(0, 100, "ProfilerStep#1", kind="gpu_user_annotation", stream=7),  # HTA sees no stream
        ]
    )
    got = one(h.temporal_breakdown(ev))
    assert got["kernel_time_ns"] == 20 * US
    assert got["compute_time_ns"] == 10 * US
    assert got["non_compute_time_ns"] == 10 * US
    assert got["idle_time_ns"] == 0


def test_cuda_sync_rows_without_stream_use_their_tid() -> None:
    # Kineto puts cuda_sync events on their stream's timeline (tid = args.stream); an events table that
    # leaves their stream null still gives HTA's view through the tid.
    ev = table(
        [
            k(0, 10),
            k(10, 10, "Stream Sync", kind="other", stream=None, tid=7, corr=3),
            k(30, 10, "Event Sync", kind="other", stream=None, tid=-1, corr=4),
        ]
    )
    got = one(h.temporal_breakdown(ev))
    assert got["kernel_time_ns"] == 20 * US
    assert got["non_compute_time_ns"] == 10 * US


def _two_steps(rank: int = 0, last: str = "ProfilerStep#2") -> list[dict]:
    return [
        cpu(0, 100, "ProfilerStep#1", kind="user_annotation", rank=rank),
        cpu(100, 100, last, kind="user_annotation", rank=rank),
        cpu(10, 2, "cudaLaunchKernel", kind="cuda_runtime", corr=1, rank=rank),
        cpu(90, 2, "cudaLaunchKernel", kind="cuda_runtime", corr=2, rank=rank),
        cpu(150, 2, "cudaLaunchKernel", kind="cuda_runtime", corr=3, rank=rank),
        k(20, 10, corr=1, rank=rank),
        k(110, 10, "ncclKernel_AllReduce", corr=2, rank=rank),  # launched in step 1, runs in step 2
        k(160, 10, corr=3, rank=rank),  # launched in the last step: dropped
    ]


def test_last_profiler_step_is_dropped_by_launch_time() -> None:
    got = one(h.temporal_breakdown(table(_two_steps())))
    assert got["kernel_time_ns"] == 100 * US  # [20, 120)
    assert got["compute_time_ns"] == 10 * US
    assert got["non_compute_time_ns"] == 10 * US
    assert got["idle_time_ns"] == 80 * US
    kept = one(h.temporal_breakdown(table(_two_steps()), include_last_profiler_step=True))
    assert kept["kernel_time_ns"] == 150 * US  # [20, 170)
    assert kept["compute_time_ns"] == 20 * US


def test_single_step_name_disables_the_filter() -> None:
    rows = [r for r in _two_steps() if r["name"] != "ProfilerStep#2"]
    got = one(h.temporal_breakdown(table(rows)))
    assert got["kernel_time_ns"] == 150 * US  # nothing dropped


def test_step_names_are_counted_across_ranks() -> None:
    # Each rank alone has one step name, but the run has two: HTA filters every rank.
    rank0 = [r for r in _two_steps(0) if r["name"] != "ProfilerStep#2"]
    rank1 = [r for r in _two_steps(1) if r["name"] != "ProfilerStep#1"]
    got = h.temporal_breakdown(table(rank0 + rank1))
    # rank 0: its last (only) step starts at 0 and the launches come later: nothing survives
    assert one(got, 0)["kernel_time_ns"] is None
    # rank 1: last step starts at 100: kernels of corr 1 and 2 survive
    assert one(got, 1)["kernel_time_ns"] == 100 * US


def test_rank_without_gpu_events_gets_nulls() -> None:
    ev = table([k(0, 10, rank=0), cpu(0, 10, "aten::add", rank=1)])
    got = h.temporal_breakdown(ev)
    assert got.column("rank").to_pylist() == [0, 1]
    assert one(got, 1)["idle_time_pctg"] is None
    assert one(h.comm_comp_overlap(ev), 1)["comp_comm_overlap_pctg"] is None


def test_uncorrelated_stream_rows_are_cpu_for_the_filter() -> None:
    # A row with a stream but no correlation (e.g. MTIA ccp events) is filtered by its own start time
    # and still counted as GPU time.
    rows = _two_steps() + [
        k(50, 5, "ccp_kernel", kind="other", stream=3),
        k(120, 5, "ccp_kernel", kind="other", stream=3),
    ]
    got = one(h.temporal_breakdown(table(rows)))
    # [50,55) kept (starts before step 2), [120,125) dropped (after); window still [20, 120)
    assert got["kernel_time_ns"] == 100 * US
    assert got["compute_time_ns"] == 15 * US


def test_sub_microsecond_timestamps_are_rounded_like_hta() -> None:
    # ts 1.5 dur 2.0 -> [2, 3); ts 10.25 dur 0.5 -> [11, 10): a negative interval, as in HTA
    ev = table([k(1.5, 2.0), k(4.0, 3.9), k(10.25, 0.5)])
    got = one(h.temporal_breakdown(ev))
    # HTA merge: [2,3), [4,7), [11,10) -> kernel_time = 10 - 2 = 8, busy = 1 + 3 - 1 = 3
    assert got["kernel_time_ns"] == 8 * US
    assert got["idle_time_ns"] == 5 * US
    assert got["compute_time_ns"] == 3 * US


def test_integral_timestamps_are_not_rounded() -> None:
    ev = table([k(1, 2.5), k(10, 0.25)])
    got = one(h.temporal_breakdown(ev))
    assert got["kernel_time_ns"] == 9250
    assert got["compute_time_ns"] == 2750


def test_rounding_is_relative_to_base_time() -> None:
    base = 1_700_000_000_000_000_123  # ns, not a multiple of 1000
    ev = table([k(0, 2), k(5, 1)])
    ev = ev.set_column(
        ev.schema.get_field_index("ts_ns"), "ts_ns", pa.array([base + 0, base + 5000], pa.int64())
    )
    # relative to the base the times are whole µs: no rounding, kernel_time 6 µs
    assert one(h.temporal_breakdown(ev, base_time_ns={0: base}))["kernel_time_ns"] == 6 * US


def test_null_durations_are_dropped() -> None:
    got = one(h.temporal_breakdown(table([k(0, 10), k(100, None)])))
    assert got["kernel_time_ns"] == 10 * US


# --- comm / comp overlap ----------------------------------------------------------------------------


def test_overlap_known_answer() -> None:
    ev = table(
        [
            k(0, 10, "ncclKernel_AllReduce"),
            k(20, 10, "ncclKernel_AllReduce"),
            k(5, 10),  # overlaps the first comm by 5
            k(25, 2),
            k(26, 2),  # merged [25, 28) overlaps the second by 3
            k(30, 5),  # touches the comm end: no overlap
            k(0, 30, "Memcpy HtoD", kind="gpu_memcpy"),  # memory never counts
        ]
    )
    got = one(h.comm_comp_overlap(ev))
    assert got["comm_time_ns"] == 20 * US
    assert got["overlap_time_ns"] == 8 * US
    assert got["comp_comm_overlap_pctg"] == 40.0


def test_overlap_without_comm_is_null_and_without_comp_is_zero() -> None:
    assert one(h.comm_comp_overlap(table([k(0, 10)])))["comp_comm_overlap_pctg"] is None
    assert one(h.comm_comp_overlap(table([k(0, 10, "ncclKernel_X")])))["comp_comm_overlap_pctg"] == 0.0


# --- against a literal transcription of HTA's pandas code on random kernels -------------------------


def _hta_merge_pd(df: pd.DataFrame) -> pd.DataFrame:
    """hta.utils.utils.merge_kernel_intervals (HTA 0.5), transcribed."""
    df = df.sort_values(by="ts")
    df["end"] = df["ts"] + df["dur"]
    df["group"] = (df["ts"] > df["end"].shift().cummax()).cumsum()
    return (
        df.groupby("group", as_index=False)
        .agg({"ts": "min", "end": "max"})
        .drop(["group"], axis=1)
        .sort_values(by="ts")
    )


def _hta_oracle(df: pd.DataFrame) -> tuple[float, float, float, float, float]:
    merged = _hta_merge_pd(df.copy())
    kernel_time = merged.iloc[-1]["end"] - merged.iloc[0]["ts"]
    idle = kernel_time - (merged.end.sum() - merged.ts.sum())
    comp = _hta_merge_pd(df[df.kt == h.COMPUTATION].copy())
    compute = comp.end.sum() - comp.ts.sum()
    comm = _hta_merge_pd(df[df.kt == h.COMMUNICATION].copy())
    status = (
        pd.concat(
            [
                comm.melt(var_name="status", value_name="time").replace({"ts": 1, "end": -1}),
                comp.melt(var_name="status", value_name="time").replace({"ts": 2, "end": -2}),
            ]
        )
        .sort_values(by="time")
        .reset_index(drop=True)
    )
    status["running"] = status["status"].cumsum()
    ov = status[status["running"].eq(3)]
    shifted = ov.merge(status.shift(-1).dropna(), left_index=True, right_index=True)
    overlap = (shifted["time_y"] - shifted["time_x"]).sum()
    comm_time = (comm["end"] - comm["ts"]).sum()
    return kernel_time, idle, compute, overlap, comm_time


_NAME_OF = {
    h.COMPUTATION: "gemm_kernel",
    h.COMMUNICATION: "ncclKernel_AllReduce",
    h.MEMORY: "Memcpy DtoD",
    h.OTHER: "Stream Sync",
}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 200), st.integers(1, 40), st.sampled_from(sorted(_NAME_OF))),
        min_size=1,
        max_size=30,
    )
)
def test_matches_transcribed_hta_on_random_kernels(kernels: list[tuple[int, int, int]]) -> None:
    df = pd.DataFrame(kernels, columns=["ts", "dur", "kt"])
    kernel_time, idle, compute, overlap, comm_time = _hta_oracle(df)
    ev = table([k(t, d, _NAME_OF[c]) for t, d, c in kernels])
    got = one(h.temporal_breakdown(ev))
    assert got["kernel_time_ns"] == kernel_time * US
    assert got["idle_time_ns"] == idle * US
    assert got["compute_time_ns"] == compute * US
    assert got["non_compute_time_ns"] == (kernel_time - compute - idle) * US
    assert got["compute_time_pctg"] == round(100 * compute / kernel_time, 2)
    ov = one(h.comm_comp_overlap(ev))
    assert ov["comm_time_ns"] == comm_time * US
    assert ov["overlap_time_ns"] == overlap * US
    if comm_time:
        assert ov["comp_comm_overlap_pctg"] == round(100 * overlap / comm_time, 2)
    else:
        assert ov["comp_comm_overlap_pctg"] is None
    assert np.isfinite(got["idle_time_pctg"])


def test_summary_rows_join_both_tables_in_ms() -> None:
    ev = table([k(0, 10, "ncclKernel_X"), k(5, 10), k(0, 4, rank=1)])
    meta = pa.table({"rank": pa.array([0, 1], pa.int32()), "base_time_ns": pa.array([0, None], pa.int64())})
    rows = h.summary_rows(ev, meta)
    assert [r["rank"] for r in rows] == [0, 1]
    assert rows[0]["kernel_time_ms"] == 0.015
    assert rows[0]["compute_time_pctg"] == 66.67
    assert rows[0]["non_compute_time_pctg"] == 33.33
    assert rows[0]["comp_comm_overlap_pctg"] == 50.0
    assert rows[1]["comp_comm_overlap_pctg"] is None
    assert rows[1]["idle_time_ms"] == 0.0


def test_negative_part_from_rounding_is_null() -> None:
    # sub-µs timestamps: HTA rounds inward, so a 0.5 µs memcpy at 10.2 becomes [11, 10] (length -1) and HTA's
    # non-compute time (busy 9 - compute 10) is negative: something HTA cannot analyse -> null, as promised
    ev = table([k(0, 10), k(10.2, 0.5, "Memcpy DtoH", kind="gpu_memcpy")])
    got = one(h.temporal_breakdown(ev))
    assert got["kernel_time_ns"] == 10 * US and got["compute_time_ns"] == 10 * US
    assert got["non_compute_time_ns"] is None and got["non_compute_time_pctg"] is None
    assert got["compute_time_pctg"] == 100.0


def test_triton_cpu_op_with_stream_is_a_gpu_kernel_for_hta(tmp_path) -> None:
    import gzip
    import json

    from tracelens.ingest import kineto

    evs = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 0, "dur": 10,
         "args": {"stream": 7, "correlation": 1, "device": 0}},
        {"ph": "X", "cat": "cpu_op", "name": "triton_poi_fused_add_0", "pid": 1, "tid": 1, "ts": 20, "dur": 10,
         "args": {"stream": 0, "kernel_backend": "triton"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 40, "dur": 10, "args": {}},
    ]  # fmt: skip
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": evs}).encode()))
    ev = kineto.read(p).events
    assert ev.column("stream").to_pylist() == [7, 0, None]
    got = one(h.temporal_breakdown(ev))
    assert got["kernel_time_ns"] == 30 * US and got["compute_time_ns"] == 20 * US  # HTA: [0,10) + [20,30)
