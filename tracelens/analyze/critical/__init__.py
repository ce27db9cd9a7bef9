"""The critical path: the dependency graph across ranks, its replay, and the what-if of each fix."""
