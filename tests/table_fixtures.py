"""A small `diffsmooth table` spec on the embedded demo data, shared by the table and table-study tests."""


def small_table_spec(radii=(0.25, 0.5, 0.75), title="test table", n_max=200, skip=83) -> str:
    """One RS line, sigma 0.25 and 0.5, 7 images (skip 83 of 500), n0 20, n-max 200: seconds on a CPU."""
    return f"""
title = "{title}"
sigmas = [0.25, 0.5]
radii = [{", ".join(f"{r:g}" for r in radii)}]
n0 = 20
n_max = {n_max}
[data]
dataset = "embedded"
skip = {skip}
max = 500
[run]
threads = 1
batch = 100
[[line]]
name = "RS"
method = "rs"
"""


def write_cifar10_test_batch(data) -> None:
    """DATA/cifar-10-batches-py/test_batch as the CIFAR-10 download holds it: 10,000 random images, labels 0-9."""
    import pickle

    import numpy as np

    batches = data / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    images = np.random.default_rng(0).integers(0, 256, (10000, 3072), dtype=np.uint8)
    (batches / "test_batch").write_bytes(pickle.dumps({"data": images, "labels": list(range(10)) * 1000}))
