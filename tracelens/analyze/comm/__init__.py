"""Communication across ranks: collectives matched across ranks, clock offsets, wait and transfer, stragglers,
hangs (Flight Recorder, point-to-point), NCCL logs and plugin output, communication per layer type."""
