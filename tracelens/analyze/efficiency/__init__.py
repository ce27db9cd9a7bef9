"""How well the hardware is used: MFU, the per-op table and roofline, inference iterations, K/V head
replication."""
