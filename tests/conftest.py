"""Test-wide settings: optional analyzers raise instead of turning failures into warnings."""

import os

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
