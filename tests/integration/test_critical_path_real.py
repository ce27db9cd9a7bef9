"""Sync edges of the critical path on real traces (hta/trace_filter, hta/critical_path/cuda_event_sync).

Ground truth comes from the raw trace JSON, read here independently of the ingest: the CPU calls that
blocked on the GPU (a device-to-host copy whose own device copy ended inside the call) and the times around
them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from tracelens.analyze.critical import critical_path as CP
from tracelens.run_analysis import analyze_run

REPO = Path(__file__).resolve().parents[2]
HTA = REPO.parent / "shared" / "traces" / "hta"
TRACE_FILTER = HTA / "trace_filter"
EVENT_SYNC = HTA / "critical_path" / "cuda_event_sync"


def _load(path: Path) -> dict:
    with gzip.open(path) as f:
        return json.load(f)


def _raw(path: Path) -> list[dict]:
    return [e for e in _load(path)["traceEvents"] if e.get("ph") == "X"]


def _blocking_copies(ev: list[dict]) -> list[tuple[dict, dict]]:
    """(cudaMemcpyAsync call, its device copy) where the copy ended inside the call."""
    dev = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "gpu_memcpy"}
    out = []
    for c in ev:
        if c.get("cat") == "cuda_runtime" and c["name"] == "cudaMemcpyAsync":
            k = dev.get(c["args"]["correlation"])
            if k is not None and c["ts"] < k["ts"] + k["dur"] <= c["ts"] + c["dur"]:
                out.append((c, k))
    return out


@pytest.fixture(scope="module")
def trace_filter():
    if not TRACE_FILTER.exists():
        pytest.skip(f"{TRACE_FILTER} is absent")
    return analyze_run(TRACE_FILTER).critical


def test_trace_filter_syncs_found_and_replay_reproduces(trace_filter):
    cp = trace_filter
    g, rp = cp.graph, cp.baseline
    raw = [_blocking_copies(_raw(p)) for p in sorted(TRACE_FILTER.glob("*.json.gz"))]
    # every blocking copy is a device-to-host copy into pageable memory (.item()-like) returning 9-17 µs late
    assert all("DtoH" in k["name"] for r in raw for _, k in r)
    assert all(0 < c["ts"] + c["dur"] - (k["ts"] + k["dur"]) <= 20 for r in raw for c, k in r)
    assert g.n_syncs == sum(len(r) for r in raw) == 16
    assert (g.k_sync_x >= 0).sum() > 1000  # most launches of both steps follow one
    # with nothing changed the replay reproduces the observed times: every segment ends when its last kernel
    # ended, every step lasts from its first release to its last device end
    seg = g.n_type == CP.SEG
    assert np.array_equal(rp.finish[seg], g.k_end[g.n_last_k[seg]])
    for st, t in rp.step_time.items():
        assert t == g.k_end[g.k_step == st].max() - g.step_origin[st]
    assert round(CP.mean_step_ns(rp) / 1e6, 3) == 612.312  # the same as without sync edges


def test_trace_filter_path_runs_through_the_syncs(trace_filter):
    cp = trace_filter
    g, rp = cp.graph, cp.baseline
    df = cp.segments
    host = df[df["kind"] == "host"]
    # the host stretch from the step's start is only what precedes the first copy (was the whole step: 599
    # and 623 ms); the rest of the host time comes after the last copy the CPU waited for
    assert host[host["op"] == "launch"]["dur_ns"].max() < 5e6
    after = host[host["op"] == "after sync"]
    assert set(after["step"]) == {551, 552}
    # the long stretch: rank 1 runs its CPU ops for ~0.6 s after its last blocking copy without waiting for
    # the GPU again (every later runtime call returns within 50 µs): the step is host-bound after that copy
    longest = after.loc[after["dur_ns"].idxmax()]
    assert longest["dur_ns"] > 590e6
    # it starts at the end of a device-to-host copy the CPU waited for
    x_ends = g.k_end[np.unique(g.k_sync_x[g.k_sync_x >= 0])]
    assert np.isclose(x_ends, longest["start_ns"]).any()
    d = cp.to_dict()
    assert sum(d["by_kind_ms"].values()) == pytest.approx(d["step_time_ms"], rel=1e-9)
    # a change upstream of the sync now moves what follows it: the copy that step 552's last stretch waited
    # for, 1 ms longer, delays that step by exactly 1 ms (releases fixed on the CPU clock: by nothing)
    st = int(longest["step"])
    last = int(np.argmax(np.where(g.k_step == st, g.k_end, -np.inf)))
    x = int(g.k_sync_x[last])
    assert x >= 0
    dur = g.k_dur.copy()
    dur[x] += 1e6
    slower = CP.replay(g, dur)
    assert slower.step_time[st] - rp.step_time[st] == pytest.approx(1e6)


def test_event_sync_trace_compute_host_compute():
    if not EVENT_SYNC.exists():
        pytest.skip(f"{EVENT_SYNC} is absent")
    ev = _raw(EVENT_SYNC / "event_sync_trace.json.gz")
    (call, copy), = _blocking_copies(ev)  # fmt: skip
    spin = next(e for e in ev if e.get("cat") == "kernel" and "spin_kernel" in e["name"])
    cp = analyze_run(EVENT_SYNC).critical
    assert cp.graph.n_syncs >= 1
    segs = cp.to_dict()["segments"]
    kinds = [(s["kind"], s["op"]) for s in segs]
    # ... the D2H copy -> the CPU from the copy's end to the spin kernel's launch -> the spin kernel
    assert kinds[-3:] == [("compute", "compute"), ("host", "after sync"), ("compute", "compute")]
    assert segs[-1]["ms"] * 1e3 == pytest.approx(spin["dur"])
    # the host stretch: from the copy's end to the spin kernel's release (its launch + the 10 µs launch latency
    # of the trace, when it started)
    assert segs[-2]["ms"] * 1e3 == pytest.approx(spin["ts"] - (copy["ts"] + copy["dur"]))
    assert cp.baseline.step_time[100] / 1e3 == pytest.approx(
        spin["ts"] + spin["dur"] - 1707417525512.12 * 1e3, abs=1
    )


QWEN_H100 = REPO.parent / "shared" / "traces" / "more" / "tracelens-h100-qwen15"


def test_h100_qwen_launch_bound_step_reads_gpu_host_gpu():
    """A one-step inference trace: the CPU waits in cudaDeviceSynchronize while the GPU runs the first 13 ms,
    then launches the rest. Releases fixed on the CPU clock made 17.5 ms of the 49.3 ms step "host"."""
    if not QWEN_H100.exists():
        pytest.skip(f"{QWEN_H100} is absent")
    (trace,) = QWEN_H100.glob("*.json.gz")
    ev = _raw(trace)
    base_us = _load(trace)["baseTimeNanoseconds"] / 1e3  # trace times are µs after it
    dev_ends = np.array(
        [e["ts"] + e["dur"] for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    )
    # ground truth: the synchronize calls during which device work ended, returning within 50 µs of that end
    blocked = []
    for c in ev:
        if c.get("cat") == "cuda_runtime" and c["name"].endswith("Synchronize"):
            inside = dev_ends[(dev_ends > c["ts"]) & (dev_ends <= c["ts"] + c["dur"])]
            if inside.size and c["ts"] + c["dur"] - inside.max() <= 50:
                blocked.append(inside.max())
    a = analyze_run(QWEN_H100)
    cp = a.critical
    assert cp.graph.n_syncs == len(blocked) == 3
    d = cp.to_dict()
    segs = d["segments"]
    kinds = [(s["kind"], s["op"]) for s in segs]
    assert (
        "host",
        "launch",
    ) not in kinds  # no host stretch from the step's start: the path starts on the GPU
    assert kinds[0] == ("compute", "compute") and kinds[-2:] == [("compute", "compute"), ("wait", "gap")]
    # the CPU after the first blocking sync: from the end of the work it waited for (trace µs -> ms)
    first_after = next(s for s in segs if s["op"] == "after sync")
    assert first_after["start_ms"] == pytest.approx((base_us + min(blocked)) / 1e3, abs=1e-6)
    assert d["by_kind_ms"]["host"] < 0.1 * d["step_time_ms"]
    # without the syncs the same graph puts 35% of the step on the host; the replayed step is the same
    ev_t = a.run.events_of(a.ranks)
    cross = a.cross
    ref = CP.analyze_critical_path(
        CP.device_nodes(ev_t, a.spans),
        cross.collectives if cross else None,
        cross.offsets_ns if cross else None,
    )
    assert ref.to_dict()["by_kind_ms"]["host"] > 0.3 * d["step_time_ms"]
    assert ref.baseline.step_time == cp.baseline.step_time
