"""A small `diffsmooth table` spec on the embedded demo data, shared by the table and table-study tests."""


def small_table_spec(radii=(0.25, 0.5, 0.75)) -> str:
    """One RS line, sigma 0.25 and 0.5, 7 images (skip 83 of 500), n0 20, n-max 200: seconds on a CPU."""
    return f"""
title = "test table"
sigmas = [0.25, 0.5]
radii = [{", ".join(f"{r:g}" for r in radii)}]
n0 = 20
n_max = 200
[data]
dataset = "embedded"
skip = 83
max = 500
[run]
threads = 1
batch = 100
[[line]]
name = "RS"
method = "rs"
"""
