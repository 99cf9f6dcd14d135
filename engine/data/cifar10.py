"""CIFAR-10 from the official python pickles, read with a restricted unpickler that can only
rebuild numpy arrays (a data pickle must never run code)."""

from __future__ import annotations

import importlib
import os
import pickle

import numpy as np

from diffsmooth.engine.data.base import ArrayDataset
from diffsmooth.engine.errors import UserError

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck")


def _numpy_attr(*candidates: tuple[str, str]):
    """First importable (module, name) among candidates; avoids numpy's deprecated shims."""
    for module, name in candidates:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise UserError(f"this numpy has none of {candidates}; cannot read array pickles")


_RECONSTRUCT = (("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"))
_FROMBUFFER = (("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"))
_SCALAR = (("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"))
# Everything a pickled numpy array / dict / list needs, and nothing that can run code.
_PICKLE_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,      # protocol-5 array pickles
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy.core.multiarray", "scalar"): _SCALAR,            # numpy scalar labels
    ("numpy._core.multiarray", "scalar"): _SCALAR,
    ("numpy", "ndarray"): (("numpy", "ndarray"),),
    ("numpy", "dtype"): (("numpy", "dtype"),),
    ("_codecs", "encode"): (("_codecs", "encode"),),         # bytes in Python 3 protocol-2 pickles
    ("builtins", "bytes"): (("builtins", "bytes"),),
    ("builtins", "bytearray"): (("builtins", "bytearray"),),
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler for untrusted array pickles: only numpy array/dtype reconstruction is allowed."""

    source = "pickle"

    def find_class(self, module, name):
        allowed = _PICKLE_ALLOWED.get((module, name))
        if allowed is None:
            raise UserError(f"{self.source}: refusing to unpickle {module}.{name} (only numpy "
                            "arrays, lists and dicts are allowed); is this a CIFAR-10 batch?")
        return _numpy_attr(*allowed)


def restricted_load(path: str):
    """Unpickle a (Python 2 or 3) data pickle at `path` with `RestrictedUnpickler`."""
    try:
        with open(path, "rb") as f:
            u = RestrictedUnpickler(f, encoding="bytes")
            u.source = path
            return u.load()
    except UserError:
        raise
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    except Exception as e:   # truncated / corrupt pickles raise many types
        raise UserError(f"{path}: not a readable CIFAR pickle ({type(e).__name__}: {e})") from None


def _key(d: dict, name: str, path: str):
    """d[name] for dicts with bytes (Python 2 pickles) or str keys."""
    for k in (name.encode(), name):
        if k in d:
            return d[k]
    raise UserError(f"{path}: no '{name}' entry; expected an official CIFAR-10 python batch")


def _read_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> (uint8 [N,3,32,32], int64 [N])."""
    d = restricted_load(path)
    if not isinstance(d, dict):
        raise UserError(f"{path}: pickle holds a {type(d).__name__}, not a CIFAR batch dict")
    data = np.asarray(_key(d, "data", path))
    labels = np.asarray(_key(d, "labels", path))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise UserError(f"{path}: 'data' must be uint8 [N, 3072] (got {data.dtype} "
                        f"{list(data.shape)})")
    if labels.ndim != 1 or labels.shape[0] != data.shape[0] or labels.dtype.kind not in "iu":
        raise UserError(f"{path}: 'labels' must be {data.shape[0]} integers "
                        f"(got {labels.dtype} {list(labels.shape)})")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def load_cifar10(path: str, split: str = "test", *, pad_to=None,
                 num_classes: int = 10) -> ArrayDataset:
    """CIFAR-10 from the official python batches (`cifar-10-batches-py` or its parent)."""
    if split not in ("test", "train"):
        raise UserError(f"split={split!r}: cifar10 has 'test' and 'train'")
    names = ["test_batch"] if split == "test" else [f"data_batch_{k}" for k in range(1, 6)]
    root = path
    if os.path.isfile(path):             # a single batch file: read just that one
        root, names = os.path.dirname(path) or ".", [os.path.basename(path)]
    elif os.path.isdir(os.path.join(path, "cifar-10-batches-py")):
        root = os.path.join(path, "cifar-10-batches-py")
    elif not os.path.isdir(path):
        raise UserError(f"{path}: no such directory; give the folder holding test_batch "
                        "(cifar-10-batches-py) or its parent")
    parts = []
    for name in names:
        f = os.path.join(root, name)
        if not os.path.isfile(f):
            raise UserError(f"{root}: missing {name}; give the cifar-10-batches-py folder "
                            "from the official python version of CIFAR-10")
        parts.append(_read_cifar_batch(f))
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    class_names = CIFAR10_CLASSES if num_classes == 10 else None
    return ArrayDataset(images, labels, name="cifar10", num_classes=num_classes,
                        class_names=class_names, pad_to=pad_to, where=root)
