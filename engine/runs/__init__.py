"""Runs over datasets: building a Smooth from user settings, result files, resume, shards, sweeps, analysis."""
