"""`.npz` arrays (images + labels, no pickles), and the validation of raw image/label arrays
that the embedded subset shares."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from diffsmooth.engine.data.base import ArrayDataset
from diffsmooth.engine.errors import UserError


def _to_nchw(images: np.ndarray, where: str, layout: str | None) -> np.ndarray:
    """Bring N,H,W / N,H,W,C / N,C,H,W images to N,C,H,W (C is 1 or 3 unless `layout` says)."""
    if images.ndim == 3:
        if layout not in (None, "nhw"):
            raise UserError(f"{where}: images are 3-D {list(images.shape)}; layout must be 'nhw'")
        return images[:, None]
    if images.ndim != 4:
        raise UserError(f"{where}: images must be N,H,W or N,H,W,C or N,C,H,W "
                        f"(got shape {list(images.shape)})")
    if layout is None:
        first, last = images.shape[1] in (1, 3), images.shape[3] in (1, 3)
        if first == last:
            raise UserError(f"{where}: cannot tell channels from shape {list(images.shape)}; "
                            "pass layout='nhwc' or layout='nchw'")
        layout = "nchw" if first else "nhwc"
    if layout == "nhwc":
        return images.transpose(0, 3, 1, 2)
    if layout == "nchw":
        return images
    raise UserError(f"layout={layout!r}: use 'nhwc', 'nchw' or 'nhw'")


@dataclass(frozen=True)
class Classes:
    """A dataset's classes: how many (None: one past the largest label) and their names (None: unnamed)."""

    count: int | None = None
    names: Sequence[str] | None = None


def arrays_to_dataset(images: np.ndarray, labels: np.ndarray, *, name: str, where: str,
                      layout: str | None = None, classes: Classes = Classes(), pad_to=None,
                      source_indices: np.ndarray | None = None) -> ArrayDataset:
    """Validate raw image/label arrays (uint8, or float in [0,1]) and wrap them."""
    if images.dtype == np.uint8:
        pass
    elif images.dtype.kind == "f":
        if images.size and not np.isfinite(images).all():
            raise UserError(f"{where}: float images contain NaN or inf")
        if images.size and (images.min() < 0 or images.max() > 1):
            low, high = float(images.min()), float(images.max())
            fix = "map them to [0, 1] with (x + 1) / 2" if low >= -1 and high <= 1 else "divide by 255 or store uint8"
            raise UserError(f"{where}: float images must lie in [0, 1] (found {low:.4g}..{high:.4g}); {fix}")
    else:
        raise UserError(f"{where}: images must be uint8 or float in [0, 1] (got {images.dtype})")
    images = _to_nchw(images, where, layout)
    if images.shape[0] == 0:
        raise UserError(f"{where}: holds no images")
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise UserError(f"{where}: labels must be integers (got {labels.dtype})")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise UserError(f"{where}: {images.shape[0]} images but labels have shape "
                        f"{list(labels.shape)}; give one integer label per image")
    return ArrayDataset(images, labels, name=name, num_classes=classes.count,
                        class_names=classes.names, pad_to=pad_to, source_indices=source_indices,
                        where=where)


def read_npz(source, where: str) -> dict[str, np.ndarray]:
    """All arrays of an .npz (no pickles allowed)."""
    try:
        with np.load(source, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except OSError as e:
        raise UserError(f"{where}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    except ValueError as e:
        raise UserError(f"{where}: not a plain .npz of arrays ({e})") from None
    except Exception as e:
        raise UserError(f"{where}: not a readable .npz ({type(e).__name__}: {e})") from None


def load_npz(path: str, split: str = "test", *, layout: str | None = None,
             num_classes: int | None = None, pad_to=None, name: str | None = None
             ) -> ArrayDataset:
    """`.npz` with `images` and `labels` (optional `num_classes`, `class_names`); split ignored."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file; give an .npz with 'images' and 'labels'")
    z = read_npz(path, path)
    for key in ("images", "labels"):
        if key not in z:
            raise UserError(f"{path}: no '{key}' array (found {sorted(z)}); "
                            "store 'images' and 'labels'")
    if num_classes is None and "num_classes" in z:
        if z["num_classes"].size != 1 or z["num_classes"].dtype.kind not in "iu":
            raise UserError(f"{path}: 'num_classes' must be a single integer")
        num_classes = int(z["num_classes"].reshape(()))
    class_names = z.get("class_names")
    if class_names is not None:
        if class_names.dtype.kind not in "US" or class_names.ndim != 1:
            raise UserError(f"{path}: 'class_names' must be a 1-D array of strings")
        class_names = [c.decode() if isinstance(c, bytes) else str(c) for c in class_names]
        if num_classes is None:
            num_classes = len(class_names)
    stem = os.path.splitext(os.path.basename(path))[0]
    return arrays_to_dataset(z["images"], z["labels"], name=name or stem, where=path,
                             layout=layout, classes=Classes(num_classes, class_names),
                             pad_to=pad_to, source_indices=z.get("indices"))
