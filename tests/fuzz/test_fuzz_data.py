"""Data files fuzzed, through `diffsmooth certify --dataset KIND --data PATH`: .npz arrays, IDX files,
CIFAR-10 pickles and image folders with the wrong dtype or shape, NaN pixels, labels out of range,
truncated files, pickles that would run code. Each example starts from a valid file and applies one
damage (or none): a damaged file is refused in one line before anything is written; a valid one is
accepted (certify reaches its model-building step, stubbed)."""

import gzip
import io
import os
import pickle
import struct

import numpy as np
import pytest
from fuzz_helpers import DEMO_CLASSIFIER, FUZZ, check
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

pytestmark = pytest.mark.usefixtures("stub_heavy_steps")


def certify_args(kind, path, folder):
    return ["certify", "--method", "rs", "--classifier", DEMO_CLASSIFIER, "--stats", "fashion-mnist",
            "--dataset", kind, "--data", path, "--out", folder / "out" / "r.tsv"]


def truncate(path, fraction):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * fraction)])


class Marker:
    """A pickle that would run code when loaded: it creates the file `path`."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


# -- .npz -------------------------------------------------------------------------------------------

NPZ_DAMAGE = ["none", "nan_pixel", "inf_pixel", "float_above_1", "float_below_0", "bad_dtype", "labels_negative",
              "labels_float", "labels_too_few", "labels_2d", "no_images", "no_labels", "zero_images", "truncated",
              "object_array", "ambiguous_layout", "rank_5", "rank_2", "num_classes_too_small", "num_classes_float",
              "class_names_count", "not_npz"]


@pytest.mark.parametrize("damage", NPZ_DAMAGE)
@settings(FUZZ, max_examples=6)
@given(n=st.integers(1, 6), h=st.integers(1, 12), w=st.integers(1, 12),
       layout=st.sampled_from(["nhw", "nhwc", "nchw"]), channels=st.sampled_from([1, 3]),
       floats=st.booleans(), label_dtype=st.sampled_from(["int64", "int32", "uint8", "int16"]),
       seed=st.integers(0, 2 ** 16), cut=st.floats(0.0, 0.95))
def test_npz_files(tmp_path_factory, damage, n, h, w, layout, channels, floats, label_dtype, seed, cut):
    folder = tmp_path_factory.mktemp("npz")
    rng = np.random.default_rng(seed)
    shape = {"nhw": (n, h, w), "nhwc": (n, h, w, channels), "nchw": (n, channels, h, w)}[layout]
    if layout == "nhwc" and h in (1, 3):        # keep the layout unambiguous (channels are 1 or 3)
        shape = (n, h + 4, w, channels)
    elif layout == "nchw" and w in (1, 3):
        shape = (n, channels, h, w + 4)
    images = rng.random(shape, dtype=np.float32) if floats else rng.integers(0, 256, shape, dtype=np.uint8)
    labels = rng.integers(0, 10, n).astype(label_dtype)
    arrays = {"images": images, "labels": labels}
    valid = damage == "none"
    if damage in ("nan_pixel", "inf_pixel", "float_above_1", "float_below_0"):
        images = images.astype(np.float32) / (255 if images.dtype == np.uint8 else 1)
        images.flat[rng.integers(images.size)] = {"nan_pixel": np.nan, "inf_pixel": np.inf, "float_above_1": 1.5,
                                                  "float_below_0": -0.25}[damage]
        arrays["images"] = images
    elif damage == "bad_dtype":
        arrays["images"] = images.astype(rng.choice(["int64", "uint16", "bool", "complex64", "int8"]))
    elif damage == "labels_negative":
        arrays["labels"] = labels.astype(np.int64)
        arrays["labels"][rng.integers(n)] = -1
    elif damage == "labels_float":
        arrays["labels"] = labels.astype(np.float64) + 0.5
    elif damage == "labels_too_few":
        arrays["labels"] = labels[:-1]
    elif damage == "labels_2d":
        arrays["labels"] = labels[:, None]
    elif damage == "no_images":
        del arrays["images"]
    elif damage == "no_labels":
        del arrays["labels"]
    elif damage == "zero_images":
        arrays = {"images": images[:0], "labels": labels[:0]}
    elif damage == "object_array":
        arrays["labels"] = np.array([Marker(folder / "ran")] * n, dtype=object)
    elif damage == "ambiguous_layout":
        arrays["images"] = rng.integers(0, 256, (n, 3, 5, 3), dtype=np.uint8)
    elif damage == "rank_5":
        arrays["images"] = images.reshape(images.shape + (1,) * (5 - images.ndim))
    elif damage == "rank_2":
        arrays["images"] = images.reshape(n, -1)
    elif damage == "num_classes_too_small":
        arrays["labels"] = np.full(n, 7, dtype=np.int64)
        arrays["num_classes"] = np.array(7)
    elif damage == "num_classes_float":
        arrays["num_classes"] = np.array(10.0)
    elif damage == "class_names_count":
        arrays["num_classes"] = np.array(10)
        arrays["class_names"] = np.array(["a", "b"])
    path = folder / "data.npz"
    if damage == "not_npz":
        path.write_bytes(b"PK\x03\x04 not really a zip" + bytes(rng.integers(0, 256, 40, dtype=np.uint8)))
    else:
        np.savez(path, **arrays)
    if damage == "truncated":
        truncate(path, cut)
    check(f"data npz {damage}", certify_args("npz", path, folder), valid, folder)
    assert not (folder / "ran").exists(), "loading the data ran code"


# -- IDX --------------------------------------------------------------------------------------------

def idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    return bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(
        {0x08: ">u1", 0x0D: ">f4", 0x0C: ">i4"}[code]).tobytes()


IDX_DAMAGE = ["none", "gzip", "truncated_images", "truncated_labels", "bad_magic", "float_images", "count_mismatch",
              "labels_2d", "too_large_for_padding", "extra_bytes", "empty_file", "corrupt_gzip", "missing_labels",
              "labels_above_classes"]


@pytest.mark.parametrize("damage", IDX_DAMAGE)
@settings(FUZZ, max_examples=6)
@given(n=st.integers(1, 5), size=st.integers(1, 32), seed=st.integers(0, 999),
       cut=st.floats(0.0, 0.99))
def test_idx_files(tmp_path_factory, damage, n, size, seed, cut):
    folder = tmp_path_factory.mktemp("idx")
    root = folder / "fashion"
    root.mkdir()
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, size, size), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    image_blob, label_blob = idx_bytes(images), idx_bytes(labels)
    if damage == "float_images":
        image_blob = idx_bytes(images.astype(np.float32) / 255, 0x0D)
    elif damage == "count_mismatch":
        label_blob = idx_bytes(np.concatenate([labels, labels[:1]]))
    elif damage == "labels_2d":
        label_blob = idx_bytes(labels[:, None])
    elif damage == "too_large_for_padding":
        image_blob = idx_bytes(rng.integers(0, 256, (n, 33 + size, 33), dtype=np.uint8))
    elif damage == "extra_bytes":
        image_blob += b"\x00" * int(1 + 7 * cut)
    elif damage == "bad_magic":
        image_blob = bytes([0, 1]) + image_blob[2:]
    elif damage == "empty_file":
        label_blob = b""
    elif damage == "labels_above_classes":
        labels[0] = 10 + int(200 * cut)
        label_blob = idx_bytes(labels)
    if damage == "truncated_images":
        image_blob = image_blob[:int(len(image_blob) * cut)] if len(image_blob) > 1 else b""
    if damage == "truncated_labels":
        label_blob = label_blob[:min(int(len(label_blob) * cut), len(label_blob) - 1)]
    suffix = ""
    if damage in ("gzip", "corrupt_gzip"):
        image_blob, label_blob, suffix = gzip.compress(image_blob), gzip.compress(label_blob), ".gz"
        if damage == "corrupt_gzip":
            image_blob = image_blob[:10] + bytes(b ^ 0x5A for b in image_blob[10:-8]) + image_blob[-8:]
    (root / f"t10k-images-idx3-ubyte{suffix}").write_bytes(image_blob)
    if damage != "missing_labels":
        (root / f"t10k-labels-idx1-ubyte{suffix}").write_bytes(label_blob)
    check(f"data idx {damage}", certify_args("idx", root, folder), damage in ("none", "gzip"), folder)


# -- CIFAR-10 pickles -----------------------------------------------------------------------------

CIFAR_DAMAGE = ["none", "protocol_2", "code", "truncated", "not_a_dict", "no_data", "no_labels", "data_shape",
                "data_float", "labels_count", "labels_negative", "labels_above_classes", "not_a_pickle", "empty"]


@pytest.mark.parametrize("damage", CIFAR_DAMAGE)
@settings(FUZZ, max_examples=6)
@given(n=st.integers(1, 5), seed=st.integers(0, 999), cut=st.floats(0.05, 0.95))
def test_cifar_pickles(tmp_path_factory, damage, n, seed, cut):
    folder = tmp_path_factory.mktemp("cifar")
    root = folder / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(seed)
    batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": [int(v) for v in rng.integers(0, 10, n)]}
    obj = batch
    if damage == "code":
        obj = {b"data": batch[b"data"], b"labels": batch[b"labels"], b"x": Marker(folder / "ran")}
    elif damage == "not_a_dict":
        obj = [batch[b"data"], batch[b"labels"]]
    elif damage in ("no_data", "no_labels"):
        obj = {k: v for k, v in batch.items() if k != (b"data" if damage == "no_data" else b"labels")}
    elif damage == "data_shape":
        obj = {**batch, b"data": batch[b"data"][:, :3000]}
    elif damage == "data_float":
        obj = {**batch, b"data": batch[b"data"].astype(np.float32)}
    elif damage == "labels_count":
        obj = {**batch, b"labels": batch[b"labels"] + [1]}
    elif damage == "labels_negative":
        obj = {**batch, b"labels": [-1] + batch[b"labels"][1:]}
    elif damage == "labels_above_classes":
        obj = {**batch, b"labels": [10 + seed] + batch[b"labels"][1:]}
    path = root / "test_batch"
    path.write_bytes(pickle.dumps(obj, protocol=2 if damage == "protocol_2" else pickle.HIGHEST_PROTOCOL))
    if damage == "truncated":
        truncate(path, cut)
    elif damage == "not_a_pickle":
        path.write_bytes(b"\x00garbage" * n)
    elif damage == "empty":
        path.write_bytes(b"")
    check(f"data cifar {damage}", certify_args("cifar10", folder, folder), damage in ("none", "protocol_2"), folder)
    assert not (folder / "ran").exists(), "loading the data ran code"


# -- image folders ------------------------------------------------------------------------------------

FOLDER_DAMAGE = ["none", "truncated_image", "text_as_image", "empty_image", "empty_class", "no_classes", "grey_16bit",
                 "palette", "tiny", "jpeg_truncated"]


def png_bytes(array: np.ndarray, mode=None, fmt="PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.mark.parametrize("damage", FOLDER_DAMAGE)
@settings(FUZZ, max_examples=6)
@given(classes=st.integers(1, 3), per_class=st.integers(1, 2),
       seed=st.integers(0, 999), cut=st.floats(0.1, 0.9))
def test_image_folders(tmp_path_factory, damage, classes, per_class, seed, cut):
    folder = tmp_path_factory.mktemp("images")
    root = folder / "val"
    rng = np.random.default_rng(seed)
    files = []
    for k in range(classes):
        (root / f"class{k}").mkdir(parents=True)
        for j in range(per_class):
            path = root / f"class{k}" / f"img{j}.png"
            path.write_bytes(png_bytes(rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)))
            files.append(path)
    victim = files[int(rng.integers(len(files)))]
    valid = damage in ("none", "palette", "tiny")
    if damage == "truncated_image":
        truncate(victim, cut)
    elif damage == "text_as_image":
        victim.write_text("not an image")
    elif damage == "empty_image":
        victim.write_bytes(b"")
    elif damage == "empty_class":
        (root / "zzz_empty").mkdir()
    elif damage == "no_classes":
        for f in files:
            f.unlink()
        for d in root.iterdir():
            d.rmdir()
    elif damage == "grey_16bit":
        victim.write_bytes(png_bytes(rng.integers(0, 65536, (9, 7), dtype=np.uint16)))     # clipped to 8 bits: refused
    elif damage == "palette":
        Image.open(io.BytesIO(png_bytes(rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)))).convert("P").save(victim)
    elif damage == "tiny":
        victim.write_bytes(png_bytes(rng.integers(0, 256, (1, 1, 3), dtype=np.uint8)))
    elif damage == "jpeg_truncated":
        jpeg = root / "class0" / "photo.jpg"
        data = png_bytes(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), fmt="JPEG")
        jpeg.write_bytes(data[:int(len(data) * cut)])
    check(f"data imagefolder {damage}", certify_args("imagenet", folder, folder), valid, folder)
