"""Benchmarks: time per certified image, stage by stage, and side-by-side comparisons."""
