"""The 500-image Fashion-MNIST test subset shipped in engine/demo/assets (the demo's data)."""

from __future__ import annotations

import io
from importlib import resources

from diffsmooth.engine.data.base import ArrayDataset
from diffsmooth.engine.data.npz import Classes, arrays_to_dataset, read_npz
from diffsmooth.engine.errors import UserError

EMBEDDED_RESOURCE = "assets/fashion_mnist_test_subset.npz"


def load_embedded(path: str | None = None, split: str = "test", *, pad_to=32) -> ArrayDataset:
    """The shipped 500-image Fashion-MNIST test subset (see engine/demo/assets/DATA.md); padded to 32x32."""
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
    z = read_npz(io.BytesIO(blob), EMBEDDED_RESOURCE)
    names = [str(c) for c in z["class_names"]]
    return arrays_to_dataset(z["images"], z["labels"], name="fashion-mnist-subset",
                             where=EMBEDDED_RESOURCE, layout="nhw", classes=Classes(len(names), names),
                             pad_to=pad_to, source_indices=z["indices"])
