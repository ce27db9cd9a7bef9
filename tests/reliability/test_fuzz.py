"""Fuzzing: hypothesis-driven mutations of real traces (delete fields, change types, shuffle, duplicate,
truncate, flip bytes, gzip) and of every other input format (Flight Recorder JSON and pickle, NCCL
profiler plugin, NCCL log). The only outcomes allowed are a result or a TracelensError.

Seeds are small real traces: the HTA test traces (../shared/traces/hta, when present) and the repo's
cpu-gloo-4rank sample, each cut to a few dozen events so a case takes milliseconds (library functions are
called directly, no subprocess). Together the tests below run well over 2,000 cases.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import os
import pickle
import random
from pathlib import Path

import pytest
from broken_traces import GLOO, HTA, LOG_TEXT, PLUGIN_TEXT, kineto_doc, step_events
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tracelens import schema
from tracelens.analyze.rank.breakdown import breakdown, class_sets
from tracelens.discover import discover
from tracelens.errors import TracelensError
from tracelens.ingest import flight_recorder, kineto, nccl_log, nccl_plugin
from tracelens.ingest.sniff import detect_format

#: Small real Kineto traces (HTA's test data), relative to ../shared/traces/hta.
HTA_SEEDS = [
    "trace_file_list/inference_rank_1.json.gz",
    "triton_example/triton_example.json.gz",
    "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    "cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
    "rank_non_gpu/rank_non_gpu.json.gz",
    "mtia_inference_trace/mtia_inference_rank_0.json.gz",
]
MAX_EVENTS = 48
#: TRACELENS_FUZZ_SCALE=10 runs ten times as many cases (a deeper run by hand; CI uses 1).
SCALE = max(1, int(os.environ.get("TRACELENS_FUZZ_SCALE", "1")))

SETTINGS = dict(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)


def _small(doc: dict) -> dict:
    """The trace with at most MAX_EVENTS events: the first half and an even sample of the rest."""
    evs = doc.get("traceEvents") or []
    if len(evs) > MAX_EVENTS:
        half = MAX_EVENTS // 2
        rest = evs[half:]
        evs = evs[:half] + rest[:: max(1, len(rest) // half)][:half]
    out = {k: v for k, v in doc.items() if k != "traceEvents"}
    out["traceEvents"] = evs
    return out


def _load_seeds() -> list[dict]:
    seeds = [kineto_doc(0, 2, step_events())]  # always present: hand-built
    gloo = sorted((GLOO / "traces").glob("*.json.gz")) if GLOO.exists() else []
    for p in gloo[:2]:
        seeds.append(_small(json.loads(gzip.decompress(p.read_bytes()))))
    if HTA.exists():
        for rel in HTA_SEEDS:
            p = HTA / rel
            if p.exists():
                seeds.append(_small(json.loads(gzip.decompress(p.read_bytes()))))
    return seeds


SEEDS = _load_seeds()


def test_seeds_present():
    """The fuzz runs on real traces when they are there (the HTA set is optional, the sample is not)."""
    if not HTA.exists():
        pytest.skip(f"real HTA traces absent ({HTA}): fuzzing the repo sample and hand-built traces only")
    assert len(SEEDS) >= 1 + len(HTA_SEEDS)


# ------------------------------------------------------------------------------- mutation machinery
HOSTILE = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            False,
            0,
            -1,
            2**63,
            -(2**63) - 1,
            2**70,
            1e308,
            -1e-300,
            0.5,
            "",
            "0",
            "12.5",
            "-3",
            "1e400",
            "NaN",
            "Infinity",
            "null",
            "ProfilerStep#",
            "ProfilerStep#-1",
            "ProfilerStep#99999999999999999999",
            "[0, 1, ..., 7]",
            "[",
            "0x",
            "kernel",
            "cuda_runtime",
            "ac2g",
            "X",
            "i",
            [],
            {},
            [None],
            [[1, 2], [3]],
            {"rank": "x"},
            {"": None},
            "\u0000",
            "\ud7ff\ue000",
            "é" * 3,
        ]
    ),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=12),
)

OPS = st.lists(
    st.tuples(
        st.sampled_from(["delete", "retype", "shuffle", "duplicate", "swap"]), st.integers(0, 2**31), HOSTILE
    ),
    max_size=6,
)


def _nodes(doc) -> list[tuple[object, object]]:
    """Every (container, key/index) of a JSON document, depth first."""
    out: list[tuple[object, object]] = []
    stack = [doc]
    while stack:
        c = stack.pop()
        items = c.items() if isinstance(c, dict) else enumerate(c) if isinstance(c, list) else ()
        for k, v in items:
            out.append((c, k))
            if isinstance(v, dict | list):
                stack.append(v)
    return out


def mutate(doc, ops) -> object:
    """Apply structural mutations (positions chosen by index modulo the node count)."""
    doc = copy.deepcopy(doc)
    for op, idx, value in ops:
        nodes = _nodes(doc)
        if not nodes:
            return value if op == "retype" else doc
        c, k = nodes[idx % len(nodes)]
        if op == "delete":
            del c[k]
        elif op == "retype":
            c[k] = copy.deepcopy(value)
        elif op == "shuffle":
            target = c[k]
            if isinstance(target, list):
                random.Random(idx).shuffle(target)
            elif isinstance(target, dict):
                keys = list(target)
                random.Random(idx).shuffle(keys)
                c[k] = {kk: target[kk] for kk in keys}
        elif op == "duplicate" and isinstance(c, list):
            c.insert(k, copy.deepcopy(c[k]))
        elif op == "swap":
            c2, k2 = nodes[(idx // 7) % len(nodes)]
            if c2 is not c or k2 != k:
                with contextlib.suppress(KeyError, IndexError):
                    c[k], c2[k2] = c2[k2], c[k]
    return doc


BYTES_OPS = st.lists(
    st.tuples(st.sampled_from(["cut", "flip", "insert", "drop"]), st.floats(0, 1), st.integers(0, 255)),
    max_size=3,
)


def mutate_bytes(data: bytes, ops) -> bytes:
    for op, where, b in ops:
        i = int(where * len(data))
        if op == "cut":
            data = data[:i]
        elif op == "flip" and data:
            i = min(i, len(data) - 1)
            data = data[:i] + bytes([data[i] ^ (b or 1)]) + data[i + 1 :]
        elif op == "insert":
            data = data[:i] + bytes([b]) * (1 + b % 5) + data[i:]
        elif op == "drop":
            data = data[:i] + data[i + 1 + b % 7 :]
    return data


def _serialize(doc) -> bytes:
    try:
        return json.dumps(doc, ensure_ascii=False, allow_nan=True).encode("utf-8", errors="surrogatepass")
    except (TypeError, ValueError):
        return b"{}"


def _only_tracelens_errors(fn, *args, **kw):
    """Run fn; a TracelensError is an allowed outcome (returns None), anything else fails the test."""
    try:
        return fn(*args, **kw)
    except TracelensError as err:
        msg = str(err)
        assert msg and "\n" not in msg
        return None


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# -------------------------------------------------------------------------------------- Kineto
@settings(max_examples=900 * SCALE, **SETTINGS)
@given(
    seed=st.integers(0, 10**6),
    ops=OPS,
    bops=BYTES_OPS,
    gz=st.booleans(),
    gz_cut=st.one_of(st.none(), st.floats(0, 1)),
    salvage=st.booleans(),
)
# found by the ci profile: a flipped byte inside a string that only the one-by-one loose decode rejects; the
# error's frames held msgspec.Raw slices of the buffer ("BufferError: memoryview has 17 exported buffers")
@example(
    seed=0,
    ops=[("delete", 0, None), ("swap", 64, None)],
    bops=[("flip", 1.0, 0), ("flip", 0.375, 128)],
    gz=False,
    gz_cut=None,
    salvage=True,
)
def test_fuzz_kineto(work, seed, ops, bops, gz, gz_cut, salvage):
    doc = mutate(SEEDS[seed % len(SEEDS)], ops)
    data = mutate_bytes(_serialize(doc), bops)
    if gz:
        data = gzip.compress(data, compresslevel=1)
        if gz_cut is not None:
            data = data[: int(gz_cut * len(data))]
    p = work / "rank0.json"
    p.write_bytes(data)
    detect_format(p)
    _only_tracelens_errors(kineto.peek, p)
    tr = _only_tracelens_errors(kineto.read, p, salvage=salvage)
    if tr is not None:
        assert tr.events.schema.equals(schema.EVENTS)
        assert tr.memory.schema.equals(schema.MEMORY)
        bd = breakdown(tr.events, sets=class_sets(tr.events))
        assert bd.num_rows >= 0


@settings(max_examples=120 * SCALE, **SETTINGS)
@given(seed=st.integers(0, 10**6), ops=OPS, cut=st.one_of(st.none(), st.floats(0.05, 1)))
def test_fuzz_kineto_whole_analysis(work, seed, ops, cut):
    """The whole analysis (summary and report) on mutated two-rank runs."""
    from tracelens.report.html import render
    from tracelens.run import load_tables
    from tracelens.run_analysis import Analysis, Options

    d = work / f"run{seed % 4}"
    d.mkdir(exist_ok=True)
    for r in range(2):
        doc = mutate(SEEDS[(seed + r) % len(SEEDS)], ops if r == 0 else ops[::-1])
        data = _serialize(doc)
        if cut is not None and r == 1:
            data = data[: int(cut * len(data))]
        (d / f"rank{r}.json").write_bytes(data)
    # what analyze_run does, with the ranks read in this process: fast
    loaded = _only_tracelens_errors(load_tables, d, no_cache=True, workers=1, salvage=True)
    if loaded is not None:
        a = Analysis(path=d, options=Options(no_cache=True), run=loaded)
        s = _only_tracelens_errors(a.summary)
        if s is not None:
            json.dumps(s, default=str)
            render(s, [])


# ------------------------------------------------------------------------------ Flight Recorder
def _fr_seed() -> dict:
    p = GLOO / "flight_recorder" / "json" / "fr_trace_rank_1.json"
    if p.exists():
        return json.loads(p.read_text())
    return {"version": "2.4", "pg_config": {}, "entries": []}


FR_SEED = _fr_seed()


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(ops=OPS, bops=BYTES_OPS, gz=st.booleans())
def test_fuzz_flight_recorder_json(work, ops, bops, gz):
    from tracelens.analyze.comm.hang import diagnose

    data = mutate_bytes(_serialize(mutate(FR_SEED, ops)), bops)
    p = work / "fr_trace_rank_1.json"
    p.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    detect_format(p)
    t = _only_tracelens_errors(flight_recorder.read, p)
    if t is not None:
        _only_tracelens_errors(diagnose, t, expected_ranks=range(4))
    _only_tracelens_errors(flight_recorder.read_status, p)


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(ops=OPS, bops=BYTES_OPS, protocol=st.sampled_from([2, 4, 5]))
def test_fuzz_flight_recorder_pickle(work, ops, bops, protocol):
    doc = mutate(FR_SEED, ops)
    try:
        data = pickle.dumps(doc, protocol=protocol)
    except (TypeError, ValueError):
        data = pickle.dumps({}, protocol=protocol)
    data = mutate_bytes(data, bops)
    p = work / "fr_trace_rank_2"
    p.write_bytes(data)
    detect_format(p)
    _only_tracelens_errors(flight_recorder.read, p)


# --------------------------------------------------------------------------------- NCCL plugin
PLUGIN_SEED = json.loads(PLUGIN_TEXT)


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(ops=OPS, bops=BYTES_OPS, gz=st.booleans())
def test_fuzz_nccl_plugin(work, ops, bops, gz):
    data = mutate_bytes(_serialize(mutate(PLUGIN_SEED, ops)), bops)
    p = work / "prof_987654321_2.json"
    p.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    detect_format(p)
    t = _only_tracelens_errors(nccl_plugin.read, p)
    if t is not None:
        _only_tracelens_errors(nccl_plugin.align_ranks, t)
    _only_tracelens_errors(nccl_plugin.read_details, p)
    _only_tracelens_errors(nccl_plugin.read_many, [p])


# ------------------------------------------------------------------------------------ NCCL log
LOG_LINES = LOG_TEXT.splitlines(keepends=True)
LINE_OPS = st.lists(
    st.tuples(st.sampled_from(["delete", "dup", "cut", "token", "swap"]), st.integers(0, 2**31), HOSTILE),
    max_size=6,
)


def mutate_log(ops) -> bytes:
    lines = list(LOG_LINES)
    for op, idx, value in ops:
        if not lines:
            break
        i = idx % len(lines)
        if op == "delete":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][: idx % (len(lines[i]) + 1)]
        elif op == "token":
            toks = lines[i].split(" ")
            toks[idx % len(toks)] = str(value)
            lines[i] = " ".join(toks)
        elif op == "swap":
            j = (idx // 7) % len(lines)
            lines[i], lines[j] = lines[j], lines[i]
    return "".join(lines).encode("utf-8", errors="surrogatepass")


@settings(max_examples=300 * SCALE, **SETTINGS)
@given(ops=LINE_OPS, bops=BYTES_OPS, gz=st.booleans())
def test_fuzz_nccl_log(work, ops, bops, gz):
    data = mutate_bytes(mutate_log(ops), bops)
    p = work / "nccl_rank3.log"
    p.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    detect_format(p)
    _only_tracelens_errors(nccl_log.read, p)
    _only_tracelens_errors(nccl_log.read_many, [p, p])
    _only_tracelens_errors(nccl_log.read_comms, p)


# ---------------------------------------------------------------------------------- discovery
@settings(max_examples=150 * SCALE, **SETTINGS)
@given(ops=OPS, bops=BYTES_OPS, which=st.integers(0, 3))
def test_fuzz_discovery_of_a_mixed_folder(work, ops, bops, which):
    """A folder of one good trace and one mutated file of any format: discover either works or says why."""
    d = work / "mixed"
    d.mkdir(exist_ok=True)
    for f in d.iterdir():
        f.unlink()
    (d / "rank0.json").write_bytes(_serialize(kineto_doc(0, 2)))
    seed = [SEEDS[0], FR_SEED, PLUGIN_SEED, None][which]
    data = mutate_log(ops) if seed is None else _serialize(mutate(seed, ops))
    (d / ["rank1.json", "fr_trace_rank_1", "prof_1_1.json", "nccl.log"][which]).write_bytes(
        mutate_bytes(data, bops)
    )
    files = _only_tracelens_errors(discover, d)
    if files is not None:
        assert any(f.path.name == "rank0.json" for f in files)
