"""Datasets behind one small interface: items are float32 [C,H,W] tensors in [0,1] plus int labels.

Loaders: CIFAR-10 python pickles (restricted unpickler), ImageNet-style class folders (Resize 256,
CenterCrop 224, lazy), `.npz` arrays, MNIST/Fashion-MNIST IDX files and the shipped Fashion-MNIST
demo subset. Only `pad_to` (explicit, used for 28x28 grey images) changes an image's size here.
"""

from __future__ import annotations

import gzip
import inspect
import io
import math
import os
import pickle
from typing import Sequence

import numpy as np
import torch

from diffsmooth.engine.errors import UserError

DATASET_KINDS = ("cifar10", "imagenet", "npz", "idx", "embedded")

EMBEDDED_RESOURCE = "assets/fashion_mnist_test_subset.npz"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck")
# torchvision's ImageFolder extensions (case-insensitive), so file order and indices match it.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


# --------------------------------------------------------------------------------------------
# Common interface


def _pad_size(pad_to) -> tuple[int, int] | None:
    """Normalise a `pad_to` option (None, int or (H, W)) to None or an (H, W) pair."""
    if pad_to is None:
        return None
    if isinstance(pad_to, (int, np.integer)) and not isinstance(pad_to, bool):
        size = (int(pad_to), int(pad_to))
    elif isinstance(pad_to, (tuple, list)) and len(pad_to) == 2:
        size = (int(pad_to[0]), int(pad_to[1]))
    else:
        raise UserError(f"pad_to={pad_to!r}: give None, an int or an (H, W) pair")
    if min(size) < 1:
        raise UserError(f"pad_to={pad_to!r}: sizes must be positive")
    return size


def pad_image(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Zero-pad [..., H, W] to `size`, centred (an odd remainder goes to the bottom/right)."""
    h, w = x.shape[-2:]
    th, tw = size
    if h == th and w == tw:
        return x
    if h > th or w > tw:
        raise UserError(f"pad_to={size}: images are {h}x{w}, larger than the padded size")
    top, left = (th - h) // 2, (tw - w) // 2
    return torch.nn.functional.pad(x, (left, tw - w - left, top, th - h - top))


class ImageDataset:
    """Base class: `name`, `num_classes`, `image_shape` (C,H,W after padding), items in [0,1]."""

    name: str = "dataset"
    num_classes: int = 0
    image_shape: tuple[int, int, int] = (0, 0, 0)
    class_names: tuple[str, ...] | None = None
    _pad: tuple[int, int] | None = None      # (H, W) that items are zero-padded to, if any

    def __len__(self) -> int:
        raise NotImplementedError

    def _load(self, i: int) -> tuple[torch.Tensor, int]:
        """Item i before padding; subclasses implement this."""
        raise NotImplementedError

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for {self.name} ({n} images)")
        x, y = self._load(i)
        if self._pad is not None:
            x = pad_image(x, self._pad)
        return x, int(y)

    def _set_shape(self, c: int, h: int, w: int, pad_to=None) -> None:
        """Record the stored image shape and the optional padding that items get."""
        self._pad = _pad_size(pad_to)
        if self._pad is not None:
            if h > self._pad[0] or w > self._pad[1]:
                raise UserError(f"pad_to={pad_to!r}: {self.name} images are {h}x{w}, "
                                "larger than the padded size")
            h, w = self._pad
        self.image_shape = (int(c), int(h), int(w))

    def indices_selected(self, skip: int = 1, max_index: int | None = None) -> list[int]:
        """Cohen's selection: indices i with i % skip == 0 and i < max_index (None/-1: no limit)."""
        if isinstance(skip, bool) or not isinstance(skip, (int, np.integer)) or skip < 1:
            raise UserError(f"skip={skip!r}: must be an integer >= 1")
        stop = len(self)
        if max_index is not None and max_index != -1:
            if isinstance(max_index, bool) or not isinstance(max_index, (int, np.integer)) \
                    or max_index < 0:
                raise UserError(f"max={max_index!r}: must be a non-negative integer or -1")
            stop = min(stop, int(max_index))
        chosen = list(range(0, stop, int(skip)))
        if not chosen:
            raise UserError(f"skip={skip}, max={max_index} selects no images from {self.name} "
                            f"({len(self)} images): lower skip or raise max")
        return chosen

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, n={len(self)}, "
                f"num_classes={self.num_classes}, image_shape={self.image_shape})")


class ArrayDataset(ImageDataset):
    """Images held in memory as uint8 (0..255) or float32 ([0,1]) arrays in N,C,H,W layout."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, *, name: str,
                 num_classes: int | None = None, class_names=None, pad_to=None,
                 source_indices: np.ndarray | None = None, where: str | None = None):
        where = where or name
        if images.ndim != 4:
            raise UserError(f"{where}: images must be N,C,H,W (got shape {images.shape})")
        if images.dtype != np.uint8:
            images = images.astype(np.float32, copy=False)
        labels = np.asarray(labels).astype(np.int64, copy=False)
        if labels.shape != (images.shape[0],):
            raise UserError(f"{where}: {images.shape[0]} images but labels have shape "
                            f"{labels.shape}; give one integer label per image")
        self.name = name
        self._images = torch.from_numpy(np.ascontiguousarray(images))
        self._labels = torch.from_numpy(np.ascontiguousarray(labels))
        self.num_classes = _check_labels(where, labels, num_classes)
        self.class_names = tuple(str(c) for c in class_names) if class_names is not None else None
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise UserError(f"{where}: {len(self.class_names)} class names for "
                            f"{self.num_classes} classes")
        self.source_indices = source_indices
        self._set_shape(*images.shape[1:], pad_to=pad_to)

    def __len__(self) -> int:
        return int(self._images.shape[0])

    def _to_float(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 -> float32 / 255 (as torchvision's ToTensor); floats pass through."""
        return x.to(torch.float32) / 255 if x.dtype == torch.uint8 else x.clone()

    def _load(self, i: int):
        return self._to_float(self._images[i]), int(self._labels[i])

    def batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Vectorised load of many items (same values as stacking __getitem__)."""
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        x = self._to_float(self._images[idx])
        if self._pad is not None:
            x = pad_image(x, self._pad)
        return x, self._labels[idx].clone()


def _check_labels(name: str, labels: np.ndarray, num_classes: int | None) -> int:
    """Validate integer labels against num_classes (default max+1); return num_classes."""
    if labels.size and labels.min() < 0:
        raise UserError(f"{name}: labels must be >= 0 (found {int(labels.min())})")
    top = int(labels.max()) + 1 if labels.size else 0
    if num_classes is None:
        num_classes = top
    num_classes = int(num_classes)
    if num_classes < 1:
        raise UserError(f"{name}: num_classes must be >= 1 (got {num_classes})")
    if top > num_classes:
        raise UserError(f"{name}: label {top - 1} does not fit num_classes={num_classes}; "
                        "raise num_classes or fix the labels")
    return num_classes


def load_arrays(dataset: ImageDataset, indices: Sequence[int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack items into (float32 [N,C,H,W], int64 [N]); all items when indices is None."""
    n = len(dataset)
    indices = range(n) if indices is None else [int(i) for i in indices]
    for i in indices:
        if not 0 <= i < n:
            raise UserError(f"index {i} out of range for {dataset.name} ({n} images)")
    if len(indices) == 0:
        return (torch.zeros((0, *dataset.image_shape), dtype=torch.float32),
                torch.zeros((0,), dtype=torch.long))
    if isinstance(dataset, ArrayDataset):
        return dataset.batch(indices)
    xs, ys = zip(*(dataset[i] for i in indices))
    return torch.stack(xs), torch.tensor(ys, dtype=torch.long)


# --------------------------------------------------------------------------------------------
# CIFAR-10 python pickles


def _numpy_attr(*candidates: tuple[str, str]):
    """First importable (module, name) among candidates; avoids numpy's deprecated shims."""
    import importlib
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


# --------------------------------------------------------------------------------------------
# ImageNet-style class folders


class ImageFolderDataset(ImageDataset):
    """Class-subfolder images (torchvision ImageFolder order), Resize(resize) + CenterCrop(crop)."""

    def __init__(self, root: str, *, resize: int | None = 256, crop: int | None = 224,
                 num_classes: int | None = None, name: str = "imagenet", pad_to=None):
        self.root = root
        self.name = name
        self.resize, self.crop = resize, crop
        if crop is not None and resize is not None and crop > resize:
            raise UserError(f"crop={crop} is larger than resize={resize}; crop must fit")
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not classes:
            raise UserError(f"{root}: no class subfolders; give a folder like val/ with one "
                            "subfolder of images per class")
        self.classes = classes
        self.class_names = tuple(classes)
        samples: list[tuple[str, int]] = []
        for k, cls in enumerate(classes):
            before = len(samples)
            for dirpath, _, files in sorted(os.walk(os.path.join(root, cls), followlinks=True)):
                for fname in sorted(files):
                    if fname.lower().endswith(IMAGE_EXTENSIONS):
                        samples.append((os.path.join(dirpath, fname), k))
            if len(samples) == before:
                raise UserError(f"{os.path.join(root, cls)}: class folder has no images "
                                f"({', '.join(IMAGE_EXTENSIONS)})")
        self.samples = samples
        self.num_classes = len(classes) if num_classes is None else int(num_classes)
        if self.num_classes < len(classes):
            raise UserError(f"{root}: {len(classes)} class folders but num_classes="
                            f"{self.num_classes}")
        self._native_hw = (crop, crop) if crop is not None else None
        if self._native_hw is None:
            self._load(0)        # uncropped: the first image fixes the size
        self._set_shape(3, *self._native_hw, pad_to=pad_to)

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, i: int):
        from PIL import Image
        path, label = self.samples[i]
        try:
            with Image.open(path) as im:
                im = im.convert("RGB")
        except Exception as e:
            raise UserError(f"{path}: cannot read image ({e})") from None
        if self.resize is not None:
            im = resize_shorter(im, self.resize)
        if self.crop is not None:
            im = center_crop(im, self.crop)
        a = np.asarray(im, dtype=np.uint8)
        x = torch.from_numpy(a.copy()).permute(2, 0, 1).to(torch.float32) / 255
        hw = tuple(x.shape[1:])
        if self._native_hw is None:
            self._native_hw = hw
        elif hw != self._native_hw:
            raise UserError(f"{path}: size {hw} differs from the other images' "
                            f"{self._native_hw}; set crop so that all images match")
        return x, label


def resize_shorter(im, size: int):
    """Resize so the shorter side is `size` (long side int(size*long/short)), bilinear."""
    from PIL import Image
    w, h = im.size
    short, long = (w, h) if w <= h else (h, w)
    if short == size:
        return im
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    return im.resize((new_w, new_h), Image.BILINEAR)


def center_crop(im, size: int):
    """Centre crop to size x size (top = int(round((h - size) / 2)), likewise left)."""
    w, h = im.size
    if size > w or size > h:
        raise UserError(f"crop={size} is larger than the resized image {w}x{h}")
    top = int(round((h - size) / 2.0))
    left = int(round((w - size) / 2.0))
    return im.crop((left, top, left + size, top + size))


def load_imagenet(path: str, split: str = "test", *, resize: int | None = 256,
                  crop: int | None = 224, num_classes: int | None = None,
                  pad_to=None) -> ImageFolderDataset:
    """ImageNet-style folder: `path` is the class-subfolder dir (or its parent holding val/)."""
    if not os.path.isdir(path):
        raise UserError(f"{path}: no such directory; give the ImageNet val folder "
                        "(one subfolder per class)")
    sub = {"test": "val", "val": "val", "train": "train"}.get(split)
    if sub is None:
        raise UserError(f"split={split!r}: imagenet has 'test' (val/) and 'train'")
    if os.path.isdir(os.path.join(path, sub)):
        path = os.path.join(path, sub)
    return ImageFolderDataset(path, resize=resize, crop=crop, num_classes=num_classes,
                              name="imagenet", pad_to=pad_to)


# --------------------------------------------------------------------------------------------
# .npz arrays


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


def arrays_to_dataset(images: np.ndarray, labels: np.ndarray, *, name: str, where: str,
                      layout: str | None = None, num_classes: int | None = None,
                      class_names=None, pad_to=None,
                      source_indices: np.ndarray | None = None) -> ArrayDataset:
    """Validate raw image/label arrays (uint8, or float in [0,1]) and wrap them."""
    if images.dtype == np.uint8:
        pass
    elif images.dtype.kind == "f":
        if images.size and not np.isfinite(images).all():
            raise UserError(f"{where}: float images contain NaN or inf")
        if images.size and (images.min() < 0 or images.max() > 1):
            raise UserError(f"{where}: float images must lie in [0, 1] (found "
                            f"{float(images.min()):.4g}..{float(images.max()):.4g}); "
                            "divide by 255 or store uint8")
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
    return ArrayDataset(images, labels, name=name, num_classes=num_classes,
                        class_names=class_names, pad_to=pad_to, source_indices=source_indices,
                        where=where)


def _read_npz(source, where: str) -> dict[str, np.ndarray]:
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
    z = _read_npz(path, path)
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
                             layout=layout, num_classes=num_classes, class_names=class_names,
                             pad_to=pad_to, source_indices=z.get("indices"))


# --------------------------------------------------------------------------------------------
# IDX (MNIST / Fashion-MNIST)

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


def _find_idx(root: str, prefix: str, kind: str) -> str:
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
    ipath = _find_idx(path, prefix, "images-idx3")
    lpath = _find_idx(path, prefix, "labels-idx1")
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


# --------------------------------------------------------------------------------------------
# Embedded demo subset


def load_embedded(path: str | None = None, split: str = "test", *, pad_to=32) -> ArrayDataset:
    """The shipped 500-image Fashion-MNIST test subset (see engine/demo/assets/DATA.md); padded to 32x32."""
    from importlib import resources
    if path is not None:
        raise UserError(f"path={path!r}: the embedded dataset ships with the package; "
                        "give no path (or use kind 'npz' for a file)")
    if split != "test":
        raise UserError(f"split={split!r}: the embedded subset holds only 'test' images")
    res = resources.files("diffsmooth.engine.demo").joinpath(EMBEDDED_RESOURCE)
    try:
        blob = res.read_bytes()
    except OSError as e:
        raise UserError(f"{EMBEDDED_RESOURCE}: package data missing ({e}); reinstall the "
                        "package or run python -m diffsmooth.engine.demo.make_data") from None
    z = _read_npz(io.BytesIO(blob), EMBEDDED_RESOURCE)
    names = [str(c) for c in z["class_names"]]
    return arrays_to_dataset(z["images"], z["labels"], name="fashion-mnist-subset",
                             where=EMBEDDED_RESOURCE, layout="nhw", num_classes=len(names),
                             class_names=names, pad_to=pad_to, source_indices=z["indices"])


# --------------------------------------------------------------------------------------------
# Entry point

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
            raise UserError(f"dataset kind {kind!r} needs a path (--data PATH)")
        path = os.path.expanduser(os.fspath(path))
    return loader(path, split, **options)
