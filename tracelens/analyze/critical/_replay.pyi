"""The compiled level loop of a graph replay (_replay.c); tracelens.analyze.critical.critical_replay calls it."""

from typing import Any

def levels(
    finish: Any,  # float64, written in place
    entry: Any,  # float64, written in place
    D: Any,
    Q: Any,
    e_src: Any,
    lv: Any,  # int64, six a level: (a, m, b, e0, e1, r0)
    rs: Any,
    sync: tuple[Any, Any, Any, Any, Any, Any] | None,  # (S, Qs, starts, slot, x, x_end)
    /,
) -> None: ...
