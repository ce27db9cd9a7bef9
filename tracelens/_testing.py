"""Build schema-conforming tables from a few dicts: for tests and examples, not for ingest."""

from __future__ import annotations

import pyarrow as pa

from tracelens import schema


def table_from_rows(rows: list[dict], sch: pa.Schema) -> pa.Table:
    """Rows (missing keys -> null) to a table with exactly schema `sch` (dictionary columns encoded)."""
    cols = {}
    for field in sch:
        vals = [row.get(field.name) for row in rows]
        if pa.types.is_dictionary(field.type):
            cols[field.name] = pa.array(vals, pa.string()).dictionary_encode().cast(field.type)
        else:
            cols[field.name] = pa.array(vals, field.type)
    return pa.table(cols, schema=sch)


def events_table(rows: list[dict]) -> pa.Table:
    """Events table from dicts such as {"rank": 0, "kind": "kernel", "name": "gemm", "ts_ns": 0, "dur_ns": 5}."""
    return table_from_rows(rows, schema.EVENTS)
