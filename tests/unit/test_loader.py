"""load_run / load_tables: all ranks in one table, the per-rank Parquet cache in the user cache folder (hit,
rebuild, corrupt, identity of a file, read-only folders, LRU bound)."""

from __future__ import annotations

import os

import kineto_traces as kt
import pyarrow as pa
import pytest

from tracelens import schema
from tracelens.engine import tasks
from tracelens.errors import BadTraceError
from tracelens.run import load_tables
from tracelens.store import cache


@pytest.fixture(autouse=True)
def cache_dir(tmp_path):
    """A cache of this test's own (set outside monkeypatch: the tests call monkeypatch.undo())."""
    d = tmp_path / "cache"
    old = os.environ.get("TRACELENS_CACHE_DIR")
    os.environ["TRACELENS_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("TRACELENS_CACHE_DIR", None)
    else:
        os.environ["TRACELENS_CACHE_DIR"] = old


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
    t = load_tables(run, workers=1, progress=lambda d, n: calls.append((d, n)))
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


def test_cache_hit_and_invalidation(tmp_path, monkeypatch, cache_dir):
    run = _run(tmp_path)
    listing = sorted(p.name for p in run.rglob("*"))
    first = load_tables(run, workers=1)
    assert sorted(p.name for p in run.rglob("*")) == listing  # nothing written into the run folder
    cached = sorted(p.name for p in (cache_dir / "entries").glob("*/rank*.*"))
    assert cached == sorted(
        [f"rank{r}.events.arrow" for r in (0, 1)]
        + [f"rank{r}.{k}.arrow" for r in (0, 1) for k in ("memory", "meta")]
    )
    monkeypatch.setattr(tasks, "ingest_rank", _no_ingest)
    again = load_tables(run, workers=1)
    assert again.events.equals(first.events) and again.metadata.equals(first.metadata)
    monkeypatch.undo()
    # a changed file gets a new key: it is ingested again, the other rank comes from the cache
    p = run / "host_1.pt.trace.json"
    kt.write(p, kt.doc(rank=1, world_size=2, events=[kt.x("cpu_op", "changed", "1.000", "1.000")]))
    os.utime(p, ns=(p.stat().st_mtime_ns + 10**9, p.stat().st_mtime_ns + 10**9))
    seen = []
    real = tasks.ingest_rank
    monkeypatch.setattr(
        tasks, "ingest_rank", lambda path, rank, *a: seen.append(rank) or real(path, rank, *a)
    )
    t = load_tables(run, workers=1)
    assert seen == [1]
    assert "changed" in t.events.column("name").to_pylist()


@pytest.mark.parametrize("damage", ["garbage", "truncate", "other_schema", "delete"])
def test_corrupt_cache_entry_is_rebuilt(tmp_path, damage):
    run = _run(tmp_path)
    first = load_tables(run, workers=1)
    victim = next((tmp_path / "cache").rglob("rank1.events.arrow"))
    if damage == "garbage":
        victim.write_bytes(b"not arrow at all")
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-100])
    elif damage == "other_schema":
        with pa.OSFile(str(victim), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("x", pa.int64())])) as w:
            w.write_table(pa.table({"x": [1, 2]}))
    else:
        victim.unlink()
    again = load_tables(run, workers=1)
    assert again.events.equals(first.events)


def test_read_only_run_dir_uses_user_cache(tmp_path, monkeypatch):
    run = _run(tmp_path)
    monkeypatch.delenv("TRACELENS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    os.chmod(run, 0o555)
    try:
        t = load_tables(run, workers=1)
    finally:
        os.chmod(run, 0o755)
    assert t.events.num_rows == 6
    assert not (run / ".tracelens").exists()
    assert list((tmp_path / "xdg" / "tracelens").rglob("rank0.events.arrow"))


def test_read_only_run_and_unwritable_cache_fall_back_to_no_cache(tmp_path):
    """No cache folder can be made (its parent is a file: unwritable even for root): the run is analyzed
    without cache, with a warning, and nothing is written into the (read-only) run folder."""
    run = _run(tmp_path)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    os.chmod(run, 0o555)
    try:
        t = load_tables(run, workers=1, cache_dir=blocker / "cache")
        assert t.events.num_rows == 6 and t.cache_root is None
        assert any("not writable" in w for w in t.warnings)
    finally:
        os.chmod(run, 0o755)
    assert sorted(p.name for p in run.iterdir()) == ["host_0.pt.trace.json", "host_1.pt.trace.json"]


def test_same_size_edit_with_mtime_restored_is_not_served_stale(tmp_path):
    """`touch -r` puts the old mtime back after a same-size edit; the ctime still moves, so the key does."""
    import shutil
    import time

    run = _run(tmp_path)
    p = run / "host_1.pt.trace.json"
    first = load_tables(run, workers=1)
    assert "kernel_rank1" in first.events.column("name").to_pylist()
    ref = tmp_path / "ref"
    shutil.copy2(p, ref)
    time.sleep(0.01)
    p.write_bytes(p.read_bytes().replace(b"kernel_rank1", b"kernel_edit1"))  # same size
    st = ref.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -r ref
    assert p.stat().st_size == ref.stat().st_size and p.stat().st_mtime_ns == ref.stat().st_mtime_ns
    again = load_tables(run, workers=1)
    names = again.events.column("name").to_pylist()
    assert "kernel_edit1" in names and "kernel_rank1" not in names


def test_cache_is_bounded_least_recently_used_first(tmp_path, cache_dir, monkeypatch):
    runs = []
    for i in range(3):
        runs.append(_run(tmp_path / f"r{i}", n=1))
    load_tables(runs[0], workers=1)
    one = sum(f.stat().st_size for f in (cache_dir / "entries").rglob("*") if f.is_file())
    load_tables(runs[1], workers=1)
    os.utime(next((cache_dir / "entries").iterdir()), (0, 0))  # force an order
    entries = {}
    for d in (cache_dir / "entries").iterdir():
        entries[d.stat().st_mtime] = d
    oldest = entries[min(entries)]
    # room for two runs' entries: the third load evicts the least recently used one, never its own
    monkeypatch.setenv("TRACELENS_CACHE_MAX_BYTES", str(int(one * 2.5)))
    third = load_tables(runs[2], workers=1)
    left = sorted((cache_dir / "entries").iterdir())
    assert not oldest.exists() and len(left) == 2
    assert third.entries[0].folder in left
    assert third.events.num_rows == 3


def test_no_cache_writes_nothing(tmp_path):
    run = _run(tmp_path)
    t = load_tables(run, no_cache=True, workers=1)
    assert t.events.num_rows == 6 and not (run / ".tracelens").exists()
    assert not (tmp_path / "cache" / "entries").exists()
    single = load_tables(run / "host_0.pt.trace.json", no_cache=True)
    assert single.metadata.column("rank").to_pylist() == [0] and single.events.num_rows == 3


def test_parallel_workers_match_serial(tmp_path):
    run = _run(tmp_path, n=3)
    serial = load_tables(run, no_cache=True, workers=1)
    calls = []
    par = load_tables(run, no_cache=True, workers=2, progress=lambda d, n: calls.append(d))
    assert par.events.equals(serial.events)
    assert par.metadata.drop_columns(["path"]).equals(serial.metadata.drop_columns(["path"]))
    assert calls[-1] == 3


def test_worker_error_is_raised_in_parent(tmp_path):
    run = _run(tmp_path, n=2)
    bad = run / "host_1.pt.trace.json"
    bad.write_bytes(bad.read_bytes()[:-40])  # cut mid-write
    with pytest.raises(BadTraceError, match="host_1"):
        load_tables(run, no_cache=True, workers=2)


def _entry(tmp_path, scratch: bool) -> cache.RankEntry:
    trace = tmp_path / "trace.json"
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.write_text("{}")
    e = cache.entry(tmp_path, trace, 0, scratch=scratch)
    e.folder.mkdir(parents=True)
    return e


@pytest.mark.parametrize("scratch", [False, True])
def test_all_null_columns_are_synthesized_identically(tmp_path, scratch):
    """Cached columns that are entirely null when written are noted in the file and built without
    decompressing them; the table must equal the one written, whole or some columns, and a list column of
    empty lists is read (never taken for nulls)."""
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
    e = _entry(tmp_path, scratch)
    cache.write_events(e, t)
    noted = cache.ipc_schema(e.events).metadata[cache._ALL_NULL].decode().split(",")
    assert "collective" in noted and "seq" in noted and "step" in noted
    assert not {"name", "ts_ns", "pg_ranks"} & set(noted)
    got = cache.read_checked(e.events, "events", mapped=not e.compressed)
    assert got.equals(t) and got.schema.metadata is None
    assert got.column("pg_ranks").to_pylist() == [[], None, [], None, None]
    some = ["seq", "name", "collective", "ts_ns"]
    assert cache.read_checked(e.events, "events", some, mapped=not e.compressed).equals(t.select(some))


def test_cached_events_round_trip_exactly(tmp_path):
    """A cached events file gives back exactly the table written, int64 extremes and nulls included, and its
    buffers are compressed (a scratch entry's are not)."""
    big = [-(2**63), 2**63 - 1, 0, None, -1, 2**62, 5]
    cols = {}
    for f in schema.EVENTS:
        if pa.types.is_dictionary(f.type):
            cols[f.name] = pa.array(["b", None, "a", "b", "c", "a", "b"]).dictionary_encode().cast(f.type)
        elif f.name == "pg_ranks":
            cols[f.name] = pa.array([[0, 1], None, [], [0, 1], [2, 3, 4], None, [0, 1]], f.type)
        elif f.type == pa.int64():
            cols[f.name] = pa.array(big, pa.int64())
        else:
            cols[f.name] = pa.array([3, None, -(2**31), 2**31 - 1, 3, 3, 0], f.type)
    t = pa.table(cols, schema=schema.EVENTS)
    e = _entry(tmp_path, scratch=False)
    cache.write_events(e, t)
    got = cache.read_checked(e.events, "events")
    assert got.schema.equals(schema.EVENTS) and got.equals(t) and got.to_pylist() == t.to_pylist()
    # compressed: a table of many repeated rows takes a fraction of the scratch entry's bytes
    many = pa.concat_tables([t] * 2000).combine_chunks()
    cache.write_events(e, many)
    s = _entry(tmp_path / "s", scratch=True)
    cache.write_events(s, many)
    assert e.events.stat().st_size * 5 < s.events.stat().st_size
    assert cache.read_checked(e.events, "events").equals(many)
    assert cache.read_checked(s.events, "events", mapped=True).equals(many)


def test_discovery_memo_skips_reading_unchanged_traces(tmp_path, monkeypatch):
    import json

    from tracelens.ingest import kineto

    run = _run(tmp_path)
    first = load_tables(run, workers=1)
    memo = next((tmp_path / "cache" / "memo").glob("*.json"))
    doc = json.loads(memo.read_text())
    assert sorted(v[1] for v in doc["files"].values()) == [0, 1]  # the ranks distributedInfo gave

    def no_peek(p):
        raise AssertionError(f"{p} opened again although unchanged")

    monkeypatch.setattr(kineto, "peek", no_peek)
    again = load_tables(run, workers=1)
    assert again.events.equals(first.events)
    assert [f.rank for f in again.files] == [0, 1]
    monkeypatch.undo()
    # a changed file is read again; a memo of another tracelens version is ignored
    p = run / "host_1.pt.trace.json"
    os.utime(p, ns=(p.stat().st_mtime_ns + 10**9, p.stat().st_mtime_ns + 10**9))
    seen = []
    real = kineto.peek
    monkeypatch.setattr(kineto, "peek", lambda q: seen.append(q.name) or real(q))
    load_tables(run, workers=1)
    assert seen == ["host_1.pt.trace.json"]
    doc = json.loads(memo.read_text())
    memo.write_text(json.dumps({**doc, "version": "0.0.0-other"}))
    seen.clear()
    load_tables(run, workers=1)
    assert sorted(seen) == ["host_0.pt.trace.json", "host_1.pt.trace.json"]


def test_no_traces_creates_no_cache_folder(tmp_path):
    from tracelens.errors import NoTracesError

    d = tmp_path / "empty"
    d.mkdir()
    (d / "notes.txt").write_text("not a trace")
    with pytest.raises(NoTracesError):
        load_tables(d)
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]


def test_real_path_is_resolve(tmp_path, monkeypatch):
    """store.cache.real_path (the cache keys' path) equals Path.resolve() for plain, relative and linked
    paths, a link to a folder followed by "..", and a file that is itself a link."""
    from pathlib import Path

    from tracelens.store.cache import real_path

    (tmp_path / "data" / "run").mkdir(parents=True)
    (tmp_path / "data" / "run" / "rank0.json").write_text("{}")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data" / "run")
    (tmp_path / "elsewhere" / "file").symlink_to(tmp_path / "data" / "run" / "rank0.json")
    monkeypatch.chdir(tmp_path / "data")
    paths = [
        tmp_path / "data" / "run" / "rank0.json",
        Path("run/rank0.json"),
        Path("./run/./rank0.json"),
        tmp_path / "link" / "rank0.json",
        tmp_path / "link" / ".." / "run" / "rank0.json",
        tmp_path / "elsewhere" / "file",
        tmp_path / "link",
        Path("."),
    ]
    for p in paths:
        assert real_path(p) == str(p.resolve()), p
    assert real_path(tmp_path / "link" / ".." / "run" / "rank0.json") == str(
        tmp_path / "data" / "run" / "rank0.json"
    )


def test_events_of_some_columns_equals_the_selected_full_table(tmp_path, cache_dir):
    """Run.events_of(ranks, columns) reads only those columns: the same as selecting them from the full
    table, with the statistics' all-null columns (the collective fields here) still built as nulls."""
    run = _run(tmp_path)
    t = load_tables(run, workers=1)
    cols = ["rank", "name", "collective", "ts_ns"]
    assert t.events_of([0, 1], cols).equals(t.events.select(cols))
    assert t.events_of([1], cols).equals(t.events_of([1]).select(cols))
    assert t.events_of([1], cols).column_names == cols
