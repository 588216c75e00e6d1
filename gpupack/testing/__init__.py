"""Builders shared by the tests and the benchmarks (not used by any live component)."""
