"""The dataset interface every loader returns: items are float32 [C,H,W] tensors in [0,1] plus int
labels; ArrayDataset for images held in memory, optional centred zero-padding (`pad_to`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from diffsmooth.engine.errors import UserError


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

    def labels(self) -> np.ndarray | None:
        """Every image's label without decoding an image (int64 [N]), or None where only loading tells."""
        return None

    def verify(self, indices: Sequence[int]) -> None:
        """UserError naming the first of `indices` whose image cannot be read. Images held in memory were
        checked when loaded; datasets decoding files lazily check each one here, before a run starts."""

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

    def labels(self) -> np.ndarray:
        return self._labels.numpy().copy()

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
