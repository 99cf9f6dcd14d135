"""MNIST / Fashion-MNIST IDX files (raw or gzip); 28x28 grey images zero-padded to 32x32."""

from __future__ import annotations

import gzip
import math
import os

import numpy as np

from diffsmooth.engine.data.base import ArrayDataset
from diffsmooth.engine.errors import UserError

FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")

_IDX_DTYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
               0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def _read_exact(f, n: int, chunk: int = 1 << 22) -> bytes:
    """Read up to n bytes in chunks (never allocating more than the file really holds)."""
    out = bytearray()
    while len(out) < n:
        b = f.read(min(chunk, n - len(out)))
        if not b:
            break
        out += b
    return bytes(out)


def read_idx(path: str) -> np.ndarray:
    """Parse an IDX file (raw or gzip): magic 0,0,dtype,ndim; big-endian uint32 dims; data."""
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
            head = _read_exact(f, 4)
            if len(head) < 4:
                raise UserError(f"{path}: truncated IDX file (no 4-byte magic number)")
            if head[0] != 0 or head[1] != 0 or head[2] not in _IDX_DTYPES or head[3] == 0:
                raise UserError(f"{path}: bad IDX magic number {head.hex()} "
                                "(want 0000 + dtype code 08/09/0b/0c/0d/0e + ndim)")
            dtype, ndim = _IDX_DTYPES[head[2]], head[3]
            dims_raw = _read_exact(f, 4 * ndim)
            if len(dims_raw) < 4 * ndim:
                raise UserError(f"{path}: truncated IDX header ({ndim} dimensions announced)")
            dims = tuple(int(d) for d in np.frombuffer(dims_raw, dtype=">u4"))
            nbytes = math.prod(dims) * dtype.itemsize
            data = _read_exact(f, nbytes + 1)
    except UserError:
        raise
    except OSError as e:   # includes gzip.BadGzipFile and truncated gzip streams (EOFError below)
        raise UserError(f"{path}: cannot read IDX file ({e})") from None
    except EOFError:
        raise UserError(f"{path}: truncated gzip stream") from None
    except Exception as e:  # zlib.error on corrupt gzip data
        raise UserError(f"{path}: corrupt IDX file ({type(e).__name__}: {e})") from None
    if len(data) < nbytes:
        raise UserError(f"{path}: truncated IDX file: header says {list(dims)} "
                        f"({nbytes} bytes of data), file has {len(data)}")
    if len(data) > nbytes:
        raise UserError(f"{path}: IDX file is longer than its header {list(dims)} says")
    return np.frombuffer(data, dtype=dtype).reshape(dims).astype(dtype.newbyteorder("="))


def find_idx(root: str, prefix: str, kind: str) -> str:
    """Path of `{prefix}-{kind}-ubyte[.gz]` (also the `prefix-images.idx3-ubyte` spelling)."""
    stems = [f"{prefix}-{kind}-ubyte", f"{prefix}-{kind.replace('-', '.')}-ubyte"]
    for stem in stems:
        for name in (stem, stem + ".gz"):
            p = os.path.join(root, name)
            if os.path.isfile(p):
                return p
    raise UserError(f"{root}: missing {stems[0]}[.gz]; give a folder with the MNIST/Fashion-MNIST "
                    "IDX files (e.g. /usr/share/datasets/fashion-mnist)")


def load_idx(path: str, split: str = "test", *, pad_to=32, num_classes: int | None = 10,
             name: str | None = None) -> ArrayDataset:
    """MNIST-style IDX folder; 28x28 grey images are zero-padded to 32x32 by default (pad_to)."""
    if not os.path.isdir(path):
        raise UserError(f"{path}: no such directory; give the folder holding the IDX files")
    prefix = {"test": "t10k", "train": "train"}.get(split)
    if prefix is None:
        raise UserError(f"split={split!r}: idx datasets have 'test' (t10k) and 'train'")
    ipath = find_idx(path, prefix, "images-idx3")
    lpath = find_idx(path, prefix, "labels-idx1")
    images, labels = read_idx(ipath), read_idx(lpath)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise UserError(f"{ipath}: expected uint8 images [N,H,W] (got {images.dtype} "
                        f"{list(images.shape)})")
    if labels.ndim != 1 or labels.dtype != np.uint8 or labels.shape[0] != images.shape[0]:
        raise UserError(f"{lpath}: expected {images.shape[0]} uint8 labels (got {labels.dtype} "
                        f"{list(labels.shape)})")
    base = os.path.basename(os.path.normpath(path))
    class_names = FASHION_MNIST_CLASSES if "fashion" in base.lower() and num_classes == 10 \
        else None
    return ArrayDataset(images[:, None], labels, name=name or base, num_classes=num_classes,
                        class_names=class_names, pad_to=pad_to, where=path)
