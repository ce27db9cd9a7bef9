"""load_tables: all ranks in one table, the per-rank Parquet cache (hit, rebuild, corrupt, read-only)."""

from __future__ import annotations

import os

import kineto_traces as kt
import pyarrow as pa
import pytest

from tracelens import loader, schema
from tracelens.errors import BadTraceError


def _run(tmp_path, n=2):
    run = tmp_path / "run"
    for r in range(n):
        events = [
            kt.x("user_annotation", "ProfilerStep#1", "100.000", "50.000"),
            kt.x("cpu_op", f"aten::op_rank{r}", f"{110 + r}.500", "2.000"),
            kt.x("kernel", f"kernel_rank{r}", "120.000", "3.000", pid=0, tid=7, device=r, stream=7),
        ]
        kt.write(run / f"host_{r}.pt.trace.json", kt.doc(rank=r, world_size=n, events=events))
    return run


def _no_ingest(*a, **k):
    raise AssertionError("ingested although the cache is valid")


def test_all_ranks_one_table(tmp_path):
    run = _run(tmp_path)
    calls = []
    t = loader.load_tables(run, workers=1, progress=lambda d, n: calls.append((d, n)))
    assert t.events.schema.equals(schema.EVENTS)
    assert t.memory.schema.equals(schema.MEMORY)
    assert t.metadata.schema.equals(schema.METADATA)
    assert t.events.num_rows == 6
    assert t.metadata.column("rank").to_pylist() == [0, 1]
    assert t.metadata.column("world_size").to_pylist() == [2, 2]
    names = dict(zip(t.events.column("name").to_pylist(), t.events.column("rank").to_pylist()))
    assert names["aten::op_rank1"] == 1 and names["kernel_rank0"] == 0
    assert t.events.column("ts_ns").to_pylist()[1] == 110500
    assert isinstance(t.events.column("name").type, pa.DictionaryType)
    assert [f.rank for f in t.files] == [0, 1] and t.run_dir == run
    assert calls[0] == (0, 2) and calls[-1] == (2, 2)


def test_cache_hit_and_invalidation(tmp_path, monkeypatch):
    run = _run(tmp_path)
    first = loader.load_tables(run, workers=1)
    cached = sorted(p.name for p in (run / ".tracelens" / "cache").rglob("*.parquet"))
    assert cached == sorted(f"rank{r}.{k}.parquet" for r in (0, 1) for k in ("events", "memory", "meta"))
    monkeypatch.setattr(loader, "ingest_rank", _no_ingest)
    again = loader.load_tables(run, workers=1)
    assert again.events.equals(first.events) and again.metadata.equals(first.metadata)
    monkeypatch.undo()
    # a changed file gets a new key: it is ingested again, the other rank comes from the cache
    p = run / "host_1.pt.trace.json"
    kt.write(p, kt.doc(rank=1, world_size=2, events=[kt.x("cpu_op", "changed", "1.000", "1.000")]))
    os.utime(p, ns=(p.stat().st_mtime_ns + 10**9, p.stat().st_mtime_ns + 10**9))
    seen = []
    real = loader.ingest_rank
    monkeypatch.setattr(
        loader, "ingest_rank", lambda path, rank, **kw: seen.append(rank) or real(path, rank, **kw)
    )
    t = loader.load_tables(run, workers=1)
    assert seen == [1]
    assert "changed" in t.events.column("name").to_pylist()


@pytest.mark.parametrize("damage", ["garbage", "truncate", "other_schema", "delete"])
def test_corrupt_cache_entry_is_rebuilt(tmp_path, damage):
    run = _run(tmp_path)
    first = loader.load_tables(run, workers=1)
    victim = next((run / ".tracelens" / "cache").rglob("rank1.events.parquet"))
    if damage == "garbage":
        victim.write_bytes(b"not parquet at all")
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-100])
    elif damage == "other_schema":
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"x": [1, 2]}), victim)
    else:
        victim.unlink()
    again = loader.load_tables(run, workers=1)
    assert again.events.equals(first.events)


def test_read_only_run_dir_uses_user_cache(tmp_path, monkeypatch):
    run = _run(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    os.chmod(run, 0o555)
    try:
        t = loader.load_tables(run, workers=1)
    finally:
        os.chmod(run, 0o755)
    assert t.events.num_rows == 6
    assert not (run / ".tracelens").exists()
    assert list((tmp_path / "xdg" / "tracelens").rglob("rank0.events.parquet"))


def test_no_cache_writes_nothing(tmp_path):
    run = _run(tmp_path)
    t = loader.load_tables(run, no_cache=True, workers=1)
    assert t.events.num_rows == 6 and not (run / ".tracelens").exists()
    single = loader.load_tables(run / "host_0.pt.trace.json", no_cache=True)
    assert single.metadata.column("rank").to_pylist() == [0] and single.events.num_rows == 3


def test_parallel_workers_match_serial(tmp_path):
    run = _run(tmp_path, n=3)
    serial = loader.load_tables(run, no_cache=True, workers=1)
    calls = []
    par = loader.load_tables(run, no_cache=True, workers=2, progress=lambda d, n: calls.append(d))
    assert par.events.equals(serial.events)
    assert par.metadata.drop_columns(["path"]).equals(serial.metadata.drop_columns(["path"]))
    assert calls[-1] == 3


def test_worker_error_is_raised_in_parent(tmp_path):
    run = _run(tmp_path, n=2)
    bad = run / "host_1.pt.trace.json"
    bad.write_bytes(bad.read_bytes()[:-40])  # cut mid-write
    with pytest.raises(BadTraceError, match="host_1"):
        loader.load_tables(run, no_cache=True, workers=2)


def test_all_null_columns_are_synthesized_identically(tmp_path):
    """Cached columns the Parquet statistics call entirely null are built without decoding; the table must
    equal a full read, and a list column of empty lists (its leaf statistics count them as nulls) is read."""
    import pyarrow.parquet as pq

    n = 5
    cols = {}
    for f in schema.EVENTS:
        if f.name == "name":
            cols[f.name] = pa.array(["a", "b", "a", "c", "b"]).dictionary_encode().cast(f.type)
        elif f.name == "ts_ns":
            cols[f.name] = pa.array(range(n), pa.int64())
        elif f.name == "pg_ranks":
            cols[f.name] = pa.array([[], None, [], None, None], f.type)  # empty lists, not nulls
        else:
            cols[f.name] = pa.nulls(n, f.type)
    t = pa.table(cols, schema=schema.EVENTS)
    p = tmp_path / "rank0.events.parquet"
    loader._write_atomic(t, p)
    with pq.ParquetFile(p) as f:
        empty = loader._all_null_columns(f.metadata)
    assert "collective" in empty and "seq" in empty and "step" in empty
    assert not {"name", "ts_ns", "pg_ranks"} & empty
    got = loader._read_checked(p, "events")
    assert got.equals(pq.read_table(p)) and got.equals(t)
    assert got.column("pg_ranks").to_pylist() == [[], None, [], None, None]


def test_discovery_memo_skips_reading_unchanged_traces(tmp_path, monkeypatch):
    import json

    from tracelens.ingest import kineto

    run = _run(tmp_path)
    first = loader.load_tables(run, workers=1)
    memo = run / ".tracelens" / "cache" / loader.DISCOVER_MEMO
    doc = json.loads(memo.read_text())
    assert sorted(v[1] for v in doc["files"].values()) == [0, 1]  # the ranks distributedInfo gave

    def no_peek(p):
        raise AssertionError(f"{p} opened again although unchanged")

    monkeypatch.setattr(kineto, "peek", no_peek)
    again = loader.load_tables(run, workers=1)
    assert again.events.equals(first.events)
    assert [f.rank for f in again.files] == [0, 1]
    monkeypatch.undo()
    # a changed file is read again; a memo of another tracelens version is ignored
    p = run / "host_1.pt.trace.json"
    os.utime(p, ns=(p.stat().st_mtime_ns + 10**9, p.stat().st_mtime_ns + 10**9))
    seen = []
    real = kineto.peek
    monkeypatch.setattr(kineto, "peek", lambda q: seen.append(q.name) or real(q))
    loader.load_tables(run, workers=1)
    assert seen == ["host_1.pt.trace.json"]
    doc = json.loads(memo.read_text())
    memo.write_text(json.dumps({**doc, "version": "0.0.0-other"}))
    seen.clear()
    loader.load_tables(run, workers=1)
    assert sorted(seen) == ["host_0.pt.trace.json", "host_1.pt.trace.json"]


def test_no_traces_creates_no_cache_folder(tmp_path):
    from tracelens.errors import NoTracesError

    d = tmp_path / "empty"
    d.mkdir()
    (d / "notes.txt").write_text("not a trace")
    with pytest.raises(NoTracesError):
        loader.load_tables(d)
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]
