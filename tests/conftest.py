"""Test-wide settings: optional analyzers raise instead of turning failures into warnings; hypothesis runs
derandomized in CI (the same cases every run: a failure reproduces) and explores new cases locally.

Profiles: `ci` (derandomize=True), chosen when the CI environment variable is set; `explore` (random, the
default elsewhere); HYPOTHESIS_PROFILE=ci|explore picks one explicitly.
"""

import os
from pathlib import Path

import pytest
from hypothesis import settings

os.environ["TRACELENS_STRICT"] = "1"

# The analysis cache of the whole test session goes to a temporary folder (never ~/.cache), also for the
# CLI subprocesses the tests start. Tests of the cache itself set their own with --cache-dir or monkeypatch.
if "TRACELENS_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _CACHE = tempfile.mkdtemp(prefix="tracelens-test-cache-")
    os.environ["TRACELENS_CACHE_DIR"] = _CACHE
    atexit.register(shutil.rmtree, _CACHE, True)
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "explore"))

# TRACELENS_TEST_CPU_LOG=FILE appends "cpu_seconds<TAB>test id" per test (this process and the processes
# it waited for): a ranking of the suite's cost that a busy machine does not distort as wall time does.
if os.environ.get("TRACELENS_TEST_CPU_LOG"):
    import resource

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        def cpu() -> float:
            me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

        t0 = cpu()
        yield
        with open(os.environ["TRACELENS_TEST_CPU_LOG"], "a", encoding="utf-8") as fh:
            fh.write(f"{cpu() - t0:.2f}\t{item.nodeid}\n")


_STRAGGLER_SAMPLE = (
    Path(__file__).resolve().parents[1] / "sample_traces" / "qwen35-27b-seq4k-tp2pp2dp2-straggler-skew"
)


@pytest.fixture()
def straggler_run(tmp_path: Path) -> Path:
    """A copy of the straggler-skew sample run (a straggler and a clock skew: findings, fixes with a saving)
    in the test's own folder, for tests whose cache is theirs to damage."""
    import shutil

    dst = tmp_path / _STRAGGLER_SAMPLE.name
    shutil.copytree(_STRAGGLER_SAMPLE, dst, ignore=shutil.ignore_patterns(".tracelens"))
    return dst


@pytest.fixture(scope="module")
def sample_cp():
    """The critical path of the straggler-skew sample run, analysed once per test module (a test may take
    things out of its graph's memo, such as the stored replay plan, so modules do not share it)."""
    if not _STRAGGLER_SAMPLE.exists():
        pytest.skip(f"{_STRAGGLER_SAMPLE} is absent")
    from tracelens.run_analysis import Options, analyze_run

    return analyze_run(_STRAGGLER_SAMPLE, Options(no_cache=True)).critical


@pytest.fixture(params=["native", "python"])
def decoder(request, monkeypatch):
    """Both chunk decoders of tracelens.ingest.kineto, one per test run: the compiled one (`native`; skipped
    where the extension is not built) and msgspec's (`python`). Modules of reader tests opt in with
    `pytestmark = pytest.mark.usefixtures("decoder")`."""
    from tracelens.ingest.kineto import native

    if request.param == "native":
        if native._native is None:
            pytest.skip("the compiled decoder is not built (no C compiler at install time)")
        monkeypatch.setattr(native, "AVAILABLE", True)
    else:
        monkeypatch.setattr(native, "AVAILABLE", False)
    return request.param


@pytest.fixture
def python_decoder(monkeypatch):
    """msgspec's decoders only (tests of their internals: lean args, views of the buffer)."""
    from tracelens.ingest.kineto import native

    monkeypatch.setattr(native, "AVAILABLE", False)
