"""tracelens.ingest."""
