"""Throughput sweep: samples/s, step-time spread, peak memory and OOM boundary per batch size."""
