"""ImageNet-style class folders (torchvision ImageFolder order), Resize 256 + CenterCrop 224,
decoded lazily one image at a time."""

from __future__ import annotations

import os

import numpy as np
import torch
from PIL import Image

from diffsmooth.engine.data.base import ImageDataset
from diffsmooth.engine.errors import UserError

# torchvision's ImageFolder extensions (case-insensitive), so file order and indices match it.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# PIL modes with 8 bits per channel (or fewer): convert("RGB") keeps their values; 16-bit and float modes
# (I;16, I, F) would be clipped to 255.
EIGHT_BIT_MODES = ("1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV")


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

    def labels(self) -> np.ndarray:
        return np.array([label for _, label in self.samples], dtype=np.int64)

    def verify(self, indices) -> None:
        """Decode every selected image once (truncated or non-image files, sizes that differ), so a
        damaged file is refused before the run writes a row, not after hours of other images."""
        for i in indices:
            self._load(int(i))

    def _load(self, i: int):
        path, label = self.samples[i]
        try:
            with Image.open(path) as im:
                mode = im.mode
                if mode not in EIGHT_BIT_MODES:
                    raise UserError(f"{path}: a {mode} image (16-bit or float pixels), which would be clipped to "
                                    f"8 bits per channel; convert the folder's images to 8-bit RGB or greyscale")
                im = im.convert("RGB")
        except UserError:
            raise
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
