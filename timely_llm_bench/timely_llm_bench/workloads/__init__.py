"""LRTrace: the trace catalog of Table 2 and the workload generator of Table 3."""
