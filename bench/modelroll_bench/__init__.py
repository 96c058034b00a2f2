"""Benchmarks for modelroll. Speed is measured here, never in timed tests."""
