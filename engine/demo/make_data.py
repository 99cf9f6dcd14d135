"""Rebuild the shipped demo subset `assets/fashion_mnist_test_subset.npz` from Fashion-MNIST IDX files.

Rule: the first `per_class` test images of each class in test-set order, kept in test-set order.
The zip is written with fixed timestamps so the same input gives a byte-identical file.

    python -m diffsmooth.engine.demo.make_data [--idx-dir DIR] [--out PATH] [--per-class N]
"""

from __future__ import annotations

import argparse
import io
import os
import zipfile

import numpy as np

from diffsmooth.engine.data.idx import FASHION_MNIST_CLASSES, find_idx, read_idx
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.hashing import sha256_file

DEFAULT_IDX_DIR = "/usr/share/datasets/fashion-mnist"
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets",
                           "fashion_mnist_test_subset.npz")


def select_first_per_class(labels: np.ndarray, per_class: int, num_classes: int) -> np.ndarray:
    """Indices of the first `per_class` items of each class, sorted (test-set order)."""
    chosen = []
    for c in range(num_classes):
        idx = np.flatnonzero(labels == c)[:per_class]
        if len(idx) < per_class:
            raise UserError(f"class {c} has only {len(idx)} images; lower per_class")
        chosen.append(idx)
    return np.sort(np.concatenate(chosen))


def save_npz_reproducible(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Like np.savez_compressed, but with fixed zip timestamps/order so bytes are reproducible."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue(), compresslevel=9)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def build_embedded_subset(idx_dir: str = DEFAULT_IDX_DIR, out_path: str = DEFAULT_OUT,
                          per_class: int = 50) -> str:
    """Write the demo subset (uint8 28x28 images, labels, test indices, class names); return sha256."""
    images = read_idx(find_idx(idx_dir, "t10k", "images-idx3"))
    labels = read_idx(find_idx(idx_dir, "t10k", "labels-idx1"))
    if images.shape != (10000, 28, 28) or labels.shape != (10000,):
        raise UserError(f"{idx_dir}: expected the Fashion-MNIST test set (10000 x 28x28), "
                        f"got images {list(images.shape)} and labels {list(labels.shape)}")
    idx = select_first_per_class(labels, per_class, len(FASHION_MNIST_CLASSES))
    save_npz_reproducible(out_path, {
        "images": images[idx].astype(np.uint8),
        "labels": labels[idx].astype(np.uint8),
        "indices": idx.astype(np.int32),
        "class_names": np.array(FASHION_MNIST_CLASSES),
        "num_classes": np.array(len(FASHION_MNIST_CLASSES), dtype=np.int64),
    })
    return sha256_file(out_path)


def main(argv=None) -> int:
    """Command-line entry: build the subset and print its path, size and sha256."""
    ap = argparse.ArgumentParser(prog="python -m diffsmooth.engine.demo.make_data",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--idx-dir", default=DEFAULT_IDX_DIR)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--per-class", type=int, default=50)
    a = ap.parse_args(argv)
    try:
        digest = build_embedded_subset(a.idx_dir, a.out, a.per_class)
    except UserError as e:
        print(f"error: {e}")
        return 2
    print(f"{a.out}  {os.path.getsize(a.out)} bytes  sha256 {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
