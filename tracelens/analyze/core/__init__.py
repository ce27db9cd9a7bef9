"""Primitives every analyzer shares: interval algebra, integer sets, the shared decode of an events
table's columns, per-row cells of frames, one BLAS thread."""
