"""Benchmark workers of `cadence bench` (one process per rank)."""
