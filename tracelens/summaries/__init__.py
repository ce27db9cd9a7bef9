"""What reads summary.json documents, not traces: `compare` (two runs side by side) and `regress` (the
rules `tracelens check` applies to a candidate against a baseline)."""
