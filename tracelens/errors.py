"""User-facing errors. Each carries a one-line message; the CLI maps them to exit code 2."""

from __future__ import annotations


class TracelensError(Exception):
    """Root of every error a user can cause. `str(err)` is the one-line message shown to them."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class BadInputError(TracelensError):
    """A path or option the user gave is unusable (missing folder, bad flag value)."""


class BadTraceError(TracelensError):
    """A trace file cannot be read: not JSON, corrupt gzip, no traceEvents, too large when decompressed."""


class NoTracesError(TracelensError):
    """A run folder holds no trace files."""


class RankError(TracelensError):
    """Rank metadata is missing or contradictory (unknown rank, duplicates, mixed world sizes)."""


class MissingRanksError(RankError):
    """Ranks needed for an analysis are absent."""


class BadConfigError(TracelensError):
    """A model config, layout, rules file or tracelens.toml is invalid."""
