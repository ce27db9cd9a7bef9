"""tracelens.analyze."""
