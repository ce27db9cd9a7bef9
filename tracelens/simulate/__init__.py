"""tracelens.simulate."""
