"""Canary analysis: spec, statistics, state machine, daemon, metrics read and metrics exported."""
