"""tracelens.report."""
