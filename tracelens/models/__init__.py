"""tracelens.models."""
