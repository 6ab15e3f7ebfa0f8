"""Benchmark harness, metrics and plots."""
