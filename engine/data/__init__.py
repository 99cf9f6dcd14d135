"""Datasets behind one small interface (base.py): items are float32 [C,H,W] tensors in [0,1] plus
int labels. One module per format: CIFAR-10 python pickles (cifar10.py), ImageNet-style class
folders (imagenet.py), `.npz` arrays (npz.py), MNIST/Fashion-MNIST IDX files (idx.py) and the
shipped Fashion-MNIST demo subset (embedded.py). Only `pad_to` changes an image's size.
"""

from __future__ import annotations

import inspect
import os

from diffsmooth.engine.choices import DATASET_KINDS
from diffsmooth.engine.data.base import ArrayDataset, ImageDataset, load_arrays, pad_image  # noqa: F401
from diffsmooth.engine.data.cifar10 import CIFAR10_CLASSES, RestrictedUnpickler, load_cifar10, restricted_load  # noqa: F401
from diffsmooth.engine.data.embedded import EMBEDDED_RESOURCE, load_embedded  # noqa: F401
from diffsmooth.engine.data.idx import FASHION_MNIST_CLASSES, find_idx, load_idx, read_idx  # noqa: F401
from diffsmooth.engine.data.imagenet import IMAGE_EXTENSIONS, ImageFolderDataset, center_crop, load_imagenet, resize_shorter  # noqa: F401
from diffsmooth.engine.data.npz import arrays_to_dataset, load_npz  # noqa: F401
from diffsmooth.engine.errors import UserError

_LOADERS = {"cifar10": load_cifar10, "imagenet": load_imagenet, "npz": load_npz,
            "idx": load_idx, "embedded": load_embedded}


def load_dataset(kind: str, path: str | None = None, split: str = "test",
                 **options) -> ImageDataset:
    """Open a dataset of `kind` (one of DATASET_KINDS) at `path`; options go to its loader."""
    loader = _LOADERS.get(kind)
    if loader is None:
        raise UserError(f"dataset kind {kind!r} is unknown; use one of {', '.join(DATASET_KINDS)}")
    allowed = [p.name for p in inspect.signature(loader).parameters.values()
               if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise UserError(f"dataset kind {kind!r} has no option {unknown[0]!r}; "
                        f"options: {', '.join(allowed) or 'none'}")
    if kind != "embedded":
        if path is None or str(path) == "":
            raise UserError(f"dataset kind {kind!r} needs a path (`data` PATH)")
        path = os.path.expanduser(os.fspath(path))
    return loader(path, split, **options)
