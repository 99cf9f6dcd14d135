"""Tests of the data layer: IDX parser, restricted CIFAR unpickler, npz layouts, image folders,
the embedded Fashion-MNIST subset, Cohen-style selection and the error messages."""

from __future__ import annotations

import collections
import gzip
import hashlib
import os
import pickle
import re
import struct
from importlib import resources

import numpy as np
import pytest
import torch
from PIL import Image

from diffsmooth.engine import data
from diffsmooth.engine.data import DATASET_KINDS, ImageDataset, load_arrays, load_dataset, read_idx, restricted_load
from diffsmooth.engine.errors import UserError

FMNIST_DIR = "/usr/share/datasets/fashion-mnist"


# ------------------------------------------------------------------------------------------
# IDX


def idx_bytes(arr: np.ndarray) -> bytes:
    """Encode an array as IDX: 0,0,dtype code,ndim, big-endian uint32 dims, big-endian data."""
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(np.int16): 0x0B,
             np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D, np.dtype(np.float64): 0x0E}
    code = codes[arr.dtype]
    head = bytes([0, 0, code, arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    return head + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_idx(path, arr, gz=False):
    b = idx_bytes(arr)
    with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
        f.write(b)
    return str(path)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32,
                                   np.float64])
def test_idx_roundtrip(tmp_path, gz, dtype):
    rng = np.random.default_rng(0)
    arr = (rng.integers(-100, 100, size=(4, 3, 5)) if np.dtype(dtype).kind in "if"
           else rng.integers(0, 255, size=(4, 3, 5))).astype(dtype)
    if np.dtype(dtype) == np.uint8:
        arr = np.abs(arr.astype(np.int64)).astype(np.uint8)
    out = read_idx(write_idx(tmp_path / "a.idx", arr, gz))
    assert out.shape == arr.shape and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, arr)


def test_idx_big_endian_dims_and_data(tmp_path):
    arr = np.array([1, 256, 65536, -2], dtype=np.int32)
    p = write_idx(tmp_path / "x", arr)
    raw = open(p, "rb").read()
    assert raw[:8] == bytes([0, 0, 0x0C, 1, 0, 0, 0, 4])
    assert raw[8:12] == b"\x00\x00\x00\x01"
    np.testing.assert_array_equal(read_idx(p), arr)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_bad_magic(tmp_path, gz):
    b = bytearray(idx_bytes(np.zeros((2, 2), np.uint8)))
    b[0] = 7
    p = tmp_path / "bad"
    with (gzip.open(p, "wb") if gz else open(p, "wb")) as f:
        f.write(bytes(b))
    with pytest.raises(UserError, match="magic"):
        read_idx(str(p))
    b[0], b[2] = 0, 0x42          # unknown dtype code
    p.write_bytes(bytes(b))
    with pytest.raises(UserError, match="magic"):
        read_idx(str(p))


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("cut", [2, 6, 20])
def test_idx_truncated(tmp_path, gz, cut):
    b = idx_bytes(np.arange(30, dtype=np.uint8).reshape(3, 10))     # 12-byte header + 30
    p = tmp_path / "t"
    with (gzip.open(p, "wb") if gz else open(p, "wb")) as f:
        f.write(b[:cut])
    with pytest.raises(UserError, match="truncated"):
        read_idx(str(p))


def test_idx_truncated_gzip_stream_and_trailing_bytes(tmp_path):
    gzb = gzip.compress(idx_bytes(np.arange(4000, dtype=np.int32)))
    p = tmp_path / "t.gz"
    p.write_bytes(gzb[: len(gzb) // 2])
    with pytest.raises(UserError, match=re.escape(str(p))):
        read_idx(str(p))
    p2 = tmp_path / "long"
    p2.write_bytes(idx_bytes(np.zeros(3, np.uint8)) + b"\x00")
    with pytest.raises(UserError, match="longer"):
        read_idx(str(p2))


def make_idx_dir(root, n_train=6, n_test=4, hw=(28, 28), gz=True):
    """Write the four MNIST-style IDX files with known content."""
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    sets = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        imgs = rng.integers(0, 256, size=(n, *hw), dtype=np.uint8)
        labs = (np.arange(n) % 10).astype(np.uint8)
        ext = ".gz" if gz else ""
        write_idx(root / f"{prefix}-images-idx3-ubyte{ext}", imgs, gz)
        write_idx(root / f"{prefix}-labels-idx1-ubyte{ext}", labs, gz)
        sets[prefix] = (imgs, labs)
    return sets


@pytest.mark.parametrize("gz", [False, True])
def test_load_idx_dir_pads_to_32(tmp_path, gz):
    sets = make_idx_dir(tmp_path / "mnist", gz=gz)
    ds = load_dataset("idx", str(tmp_path / "mnist"))
    assert len(ds) == 4 and ds.image_shape == (1, 32, 32) and ds.num_classes == 10
    x, y = ds[1]
    assert x.dtype == torch.float32 and x.shape == (1, 32, 32) and y == 1
    imgs = sets["t10k"][0]
    torch.testing.assert_close(x[0, 2:30, 2:30], torch.from_numpy(imgs[1]).float() / 255,
                               rtol=0, atol=0)
    assert x[:, :2].abs().sum() == 0 and x[:, 30:].abs().sum() == 0
    assert x[:, :, :2].abs().sum() == 0 and x[:, :, 30:].abs().sum() == 0
    tr = load_dataset("idx", str(tmp_path / "mnist"), split="train", pad_to=None)
    assert len(tr) == 6 and tr.image_shape == (1, 28, 28)
    torch.testing.assert_close(tr[5][0][0], torch.from_numpy(sets["train"][0][5]).float() / 255)


def test_load_idx_missing_file(tmp_path):
    make_idx_dir(tmp_path / "m")
    os.remove(tmp_path / "m" / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(UserError, match="t10k-labels-idx1-ubyte"):
        load_dataset("idx", str(tmp_path / "m"))
    with pytest.raises(UserError, match="split"):
        load_dataset("idx", str(tmp_path / "m"), split="val")


def test_pad_rejects_larger_images(tmp_path):
    make_idx_dir(tmp_path / "m", hw=(40, 40))
    with pytest.raises(UserError, match="pad_to"):
        load_dataset("idx", str(tmp_path / "m"))
    ds = load_dataset("idx", str(tmp_path / "m"), pad_to=(41, 44))
    x, _ = ds[0]
    assert x.shape == (1, 41, 44)
    assert x[0, 40].abs().sum() == 0 and x[0, :, :2].abs().sum() == 0


@pytest.mark.skipif(not os.path.isdir(FMNIST_DIR), reason="needs the system's Fashion-MNIST (dataset-fashion-mnist)")
def test_real_fashion_mnist_idx_and_embedded_rebuild(tmp_path):
    """The one test that reads the system copy: its IDX files, and the shipped subset rebuilt from them."""
    full = load_dataset("idx", FMNIST_DIR)
    assert len(full) == 10000 and full.image_shape == (1, 32, 32)
    assert full.class_names[0] == "T-shirt/top" and full[0][1] == 9   # first test item: ankle boot
    from diffsmooth.engine.demo.make_data import build_embedded_subset
    out = tmp_path / "subset.npz"
    blob = resources.files("diffsmooth.engine.demo").joinpath(data.EMBEDDED_RESOURCE).read_bytes()
    assert build_embedded_subset(FMNIST_DIR, str(out)) == hashlib.sha256(blob).hexdigest()
    sub = load_dataset("embedded")
    labels = full._labels.numpy()
    expect = np.sort(np.concatenate([np.flatnonzero(labels == c)[:50] for c in range(10)]))
    np.testing.assert_array_equal(sub.source_indices, expect)
    x, _ = load_arrays(full, expect[::50].tolist())
    torch.testing.assert_close(x, load_arrays(sub, range(0, 500, 50))[0], rtol=0, atol=0)


# ------------------------------------------------------------------------------------------
# CIFAR-10 pickles


class Py2Pickle:
    """Emit a protocol-2 pickle the way Python 2's cPickle wrote the official CIFAR batches
    (str keys/bytes as BINSTRING, numpy.core.multiarray._reconstruct)."""

    def __init__(self):
        self.out = bytearray(b"\x80\x02")

    def s(self, b: bytes):
        self.out += (b"U" + bytes([len(b)]) + b) if len(b) < 256 else \
            (b"T" + struct.pack("<i", len(b)) + b)

    def i(self, v: int):
        self.out += (b"K" + bytes([v])) if 0 <= v < 256 else (b"J" + struct.pack("<i", v))

    def glob(self, module: str, name: str):
        self.out += b"c" + module.encode() + b"\n" + name.encode() + b"\n"

    def array_u8(self, a: np.ndarray):
        self.glob("numpy.core.multiarray", "_reconstruct")
        self.glob("numpy", "ndarray")
        self.i(0)
        self.out += b"\x85"                       # TUPLE1 (0,)
        self.s(b"b")
        self.out += b"\x87R("                     # TUPLE3, REDUCE, MARK (state tuple)
        self.i(1)
        self.out += b"("
        for d in a.shape:
            self.i(d)
        self.out += b"t"                          # shape tuple
        self.glob("numpy", "dtype")
        self.s(b"u1")
        self.i(0)
        self.i(1)
        self.out += b"\x87R("                     # dtype('u1', 0, 1) + its state
        self.i(3)
        self.s(b"|")
        self.out += b"NNN"
        self.i(-1)
        self.i(-1)
        self.i(0)
        self.out += b"tb"                         # BUILD dtype
        self.out += b"\x89"                       # is_fortran False
        self.s(a.tobytes())
        self.out += b"tb"                         # BUILD array

    def batch(self, data: np.ndarray, labels: list[int]) -> bytes:
        self.out += b"}("
        self.s(b"batch_label")
        self.s(b"testing batch 1 of 1")
        self.s(b"data")
        self.array_u8(data)
        self.s(b"labels")
        self.out += b"]("
        for v in labels:
            self.i(v)
        self.out += b"e"
        self.out += b"u."
        return bytes(self.out)


def cifar_arrays(n=7, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8), [int(v) for v in
                                                                    rng.integers(0, 10, n)]


def test_py2_style_pickle_is_read(tmp_path):
    d, labels = cifar_arrays()
    p = tmp_path / "cifar-10-batches-py" / "test_batch"
    p.parent.mkdir()
    p.write_bytes(Py2Pickle().batch(d, labels))
    obj = restricted_load(str(p))
    np.testing.assert_array_equal(obj[b"data"], d)
    assert obj[b"labels"] == labels
    for root in (p.parent, tmp_path, p):                  # batches dir, its parent, the file
        ds = load_dataset("cifar10", str(root))
        assert len(ds) == 7 and ds.image_shape == (3, 32, 32) and ds.num_classes == 10
        x, y = ds[3]
        assert y == labels[3]
        torch.testing.assert_close(x, torch.from_numpy(d[3].reshape(3, 32, 32)).float() / 255,
                                   rtol=0, atol=0)
    assert ds.class_names[0] == "airplane"


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_py3_pickles_and_train_split(tmp_path, protocol):
    parts = []
    for k in range(1, 6):
        d, labels = cifar_arrays(3, seed=k)
        parts.append((d, labels))
        (tmp_path / f"data_batch_{k}").write_bytes(
            pickle.dumps({b"data": d, b"labels": labels, b"batch_label": b"x"}, protocol))
    d, labels = cifar_arrays(2, seed=9)
    (tmp_path / "test_batch").write_bytes(pickle.dumps({"data": d, "labels": labels}, protocol))
    tr = load_dataset("cifar10", str(tmp_path), split="train")
    assert len(tr) == 15
    x, y = load_arrays(tr, [0, 14])
    np.testing.assert_array_equal((x[1] * 255).round().to(torch.uint8).numpy().reshape(-1),
                                  parts[4][0][2])
    assert y.tolist() == [parts[0][1][0], parts[4][1][2]]
    assert len(load_dataset("cifar10", str(tmp_path))) == 2


class Evil:
    def __reduce__(self):
        return (os.getcwd, ())


def test_malicious_pickle_refused(tmp_path, monkeypatch):
    called = []
    p = tmp_path / "test_batch"
    p.write_bytes(pickle.dumps({b"data": Evil(), b"labels": [0]}, protocol=2))
    monkeypatch.setattr(os, "getcwd", lambda: called.append(1) or "/")
    with pytest.raises(UserError, match=r"refusing to unpickle (posix|os|nt)\.getcwd"):
        load_dataset("cifar10", str(tmp_path))
    assert not called
    p.write_bytes(pickle.dumps([os.system], protocol=4))
    with pytest.raises(UserError, match="refusing"):
        restricted_load(str(p))


def test_cifar_bad_inputs(tmp_path):
    with pytest.raises(UserError, match="test_batch"):
        load_dataset("cifar10", str(tmp_path))
    p = tmp_path / "test_batch"
    p.write_bytes(pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(UserError, match="3072"):
        load_dataset("cifar10", str(tmp_path))
    p.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}))
    with pytest.raises(UserError, match="labels"):
        load_dataset("cifar10", str(tmp_path))
    p.write_bytes(Py2Pickle().batch(*cifar_arrays(2))[:-40])
    with pytest.raises(UserError, match="test_batch"):
        load_dataset("cifar10", str(tmp_path))
    with pytest.raises(UserError, match="no such directory"):
        load_dataset("cifar10", str(tmp_path / "nope"))


# ------------------------------------------------------------------------------------------
# npz


def save_npz(tmp_path, name="d.npz", **arrays):
    p = tmp_path / name
    np.savez(p, **arrays)
    return str(p)


def test_npz_layouts(tmp_path):
    rng = np.random.default_rng(2)
    chw = rng.integers(0, 256, size=(5, 3, 8, 6), dtype=np.uint8)
    labels = np.array([0, 1, 2, 1, 0])
    expect = torch.from_numpy(chw).float() / 255
    for images in (chw, chw.transpose(0, 2, 3, 1)):
        ds = load_dataset("npz", save_npz(tmp_path, images=images, labels=labels))
        assert ds.image_shape == (3, 8, 6) and ds.num_classes == 3
        x, y = load_arrays(ds, range(5))
        torch.testing.assert_close(x, expect, rtol=0, atol=0)
        assert y.dtype == torch.long and y.tolist() == labels.tolist()
    grey = rng.integers(0, 256, size=(5, 9, 7), dtype=np.uint8)
    ds = load_dataset("npz", save_npz(tmp_path, images=grey, labels=labels, num_classes=10))
    assert ds.image_shape == (1, 9, 7) and ds.num_classes == 10
    ds = load_dataset("npz", save_npz(tmp_path, images=grey, labels=labels), pad_to=12)
    assert ds.image_shape == (1, 12, 12) and ds[0][0].shape == (1, 12, 12)
    f = rng.random((5, 4, 4, 1))
    ds = load_dataset("npz", save_npz(tmp_path, images=f, labels=labels))
    assert ds.image_shape == (1, 4, 4)
    torch.testing.assert_close(ds[2][0][0], torch.from_numpy(f[2, :, :, 0]).float())


def test_npz_ambiguous_and_override(tmp_path):
    amb = np.zeros((2, 3, 5, 3), np.uint8)
    p = save_npz(tmp_path, images=amb, labels=np.array([0, 1]))
    with pytest.raises(UserError, match="layout"):
        load_dataset("npz", p)
    assert load_dataset("npz", p, layout="nchw").image_shape == (3, 5, 3)
    assert load_dataset("npz", p, layout="nhwc").image_shape == (3, 3, 5)


@pytest.mark.parametrize("images,labels,msg", [
    (np.full((2, 4, 4), 1.5), np.array([0, 1]), r"\[0, 1\]"),
    (np.full((2, 4, 4), -0.1, np.float32), np.array([0, 1]), r"\[0, 1\]"),
    (np.full((2, 4, 4), np.nan), np.array([0, 1]), "NaN"),
    (np.zeros((2, 4, 4), np.int64), np.array([0, 1]), "uint8 or float"),
    (np.zeros((2, 4), np.uint8), np.array([0, 1]), "shape"),
    (np.zeros((2, 2, 4, 4, 1), np.uint8), np.array([0, 1]), "shape"),
    (np.zeros((2, 9, 9, 9), np.uint8), np.array([0, 1]), "layout"),
    (np.zeros((2, 4, 4), np.uint8), np.array([0, 1, 2]), "labels"),
    (np.zeros((2, 4, 4), np.uint8), np.array([0.0, 1.0]), "integers"),
    (np.zeros((2, 4, 4), np.uint8), np.array([0, -1]), ">= 0"),
])
def test_npz_invalid(tmp_path, images, labels, msg):
    p = save_npz(tmp_path, images=images, labels=labels)
    with pytest.raises(UserError, match=msg) as e:
        load_dataset("npz", p)
    assert "\n" not in str(e.value) and "d.npz" in str(e.value)


def test_npz_missing_keys_pickles_and_num_classes(tmp_path):
    with pytest.raises(UserError, match="'labels'"):
        load_dataset("npz", save_npz(tmp_path, images=np.zeros((1, 4, 4), np.uint8)))
    obj = np.empty(2, dtype=object)
    p = save_npz(tmp_path, images=obj, labels=np.array([0, 1]))
    with pytest.raises(UserError, match="d.npz"):
        load_dataset("npz", p)
    p = save_npz(tmp_path, images=np.zeros((2, 4, 4), np.uint8), labels=np.array([0, 5]))
    with pytest.raises(UserError, match="num_classes"):
        load_dataset("npz", p, num_classes=3)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(UserError, match="junk.npz"):
        load_dataset("npz", str(tmp_path / "junk.npz"))
    with pytest.raises(UserError, match="no such file"):
        load_dataset("npz", str(tmp_path / "none.npz"))


# ------------------------------------------------------------------------------------------
# ImageNet-style folders


def expected_resize_crop(img: Image.Image) -> torch.Tensor:
    """Independent spelling of Resize(256) + CenterCrop(224) + ToTensor."""
    img = img.convert("RGB")
    w, h = img.size
    if w <= h:
        size = (256, int(256 * h / w))
    else:
        size = (int(256 * w / h), 256)
    img = img.resize(size, Image.BILINEAR)
    w, h = img.size
    top, left = int(round((h - 224) / 2.0)), int(round((w - 224) / 2.0))
    a = np.asarray(img.crop((left, top, left + 224, top + 224)), dtype=np.float32) / 255
    return torch.from_numpy(a).permute(2, 0, 1)


@pytest.fixture
def folder(tmp_path):
    rng = np.random.default_rng(3)
    root = tmp_path / "imnet" / "val"
    files = {"n02_b": [("z.png", (300, 400), "RGB"), ("a.PNG", (500, 260), "L")],
             "n01_a": [("img.png", (256, 256), "RGBA")],
             "n03_c": [("sub/deep.png", (301, 333), "RGB"), ("x.jpeg.txt", None, None)]}
    for cls, items in files.items():
        for name, size, mode in items:
            p = root / cls / name
            p.parent.mkdir(parents=True, exist_ok=True)
            if size is None:
                p.write_text("not an image")
                continue
            ch = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
            a = rng.integers(0, 256, size=(size[1], size[0], ch), dtype=np.uint8)
            Image.fromarray(a[..., 0] if ch == 1 else a, mode).save(p)
    return root


def test_imagenet_folder(folder):
    for path in (folder, folder.parent):
        ds = load_dataset("imagenet", str(path))
        assert ds.class_names == ("n01_a", "n02_b", "n03_c") and ds.num_classes == 3
        assert len(ds) == 4 and ds.image_shape == (3, 224, 224)
        names = [os.path.relpath(p, folder) for p, _ in ds.samples]
        assert names == ["n01_a/img.png", "n02_b/a.PNG", "n02_b/z.png", "n03_c/sub/deep.png"]
        assert [ds[i][1] for i in range(4)] == [0, 1, 1, 2]
    for i in range(4):
        x, _ = ds[i]
        assert x.shape == (3, 224, 224) and x.dtype == torch.float32
        torch.testing.assert_close(x, expected_resize_crop(Image.open(ds.samples[i][0])),
                                   rtol=0, atol=0)
    x, y = load_arrays(ds, [1, 3])
    assert x.shape == (2, 3, 224, 224) and y.tolist() == [1, 2]
    assert load_dataset("imagenet", str(folder), num_classes=1000).num_classes == 1000


def test_imagenet_sizes_and_errors(folder, tmp_path):
    im = Image.new("RGB", (300, 400))
    assert data.resize_shorter(im, 256).size == (256, 341)
    assert data.resize_shorter(Image.new("RGB", (500, 260)), 256).size == (492, 256)
    c = data.center_crop(Image.new("RGB", (256, 341)), 224)
    assert c.size == (224, 224)
    ds = load_dataset("imagenet", str(folder), resize=64, crop=32)
    assert ds.image_shape == (3, 32, 32) and ds[2][0].shape == (3, 32, 32)
    with pytest.raises(UserError, match="crop"):
        load_dataset("imagenet", str(folder.parent), crop=300)
    (folder / "n04_empty").mkdir()
    with pytest.raises(UserError, match="n04_empty"):
        load_dataset("imagenet", str(folder))
    (tmp_path / "flat").mkdir()
    with pytest.raises(UserError, match="class subfolders"):
        load_dataset("imagenet", str(tmp_path / "flat"))


def test_imagenet_bad_image(tmp_path):
    p = tmp_path / "v" / "cls" / "broken.png"
    p.parent.mkdir(parents=True)
    p.write_bytes(b"\x89PNG garbage")
    ds = load_dataset("imagenet", str(tmp_path / "v"))
    with pytest.raises(UserError, match="broken.png"):
        ds[0]


# ------------------------------------------------------------------------------------------
# Embedded subset


def test_embedded_subset():
    ds = load_dataset("embedded")
    assert isinstance(ds, ImageDataset)
    assert len(ds) == 500 and ds.num_classes == 10 and ds.image_shape == (1, 32, 32)
    x, y = load_arrays(ds, range(500))
    assert x.shape == (500, 1, 32, 32) and x.dtype == torch.float32
    assert 0 <= x.min() and x.max() <= 1 and x.max() > 0.9
    assert collections.Counter(y.tolist()) == {c: 50 for c in range(10)}
    border = torch.ones(32, 32, dtype=torch.bool)
    border[2:30, 2:30] = False
    assert x[:, 0, border].abs().sum() == 0
    idx = ds.source_indices
    assert len(idx) == 500 and np.all(np.diff(idx) > 0) and idx[0] == 0 and idx.max() < 10000
    xi, yi = ds[7]
    torch.testing.assert_close(xi, x[7], rtol=0, atol=0)
    assert yi == int(y[7])
    assert ds.class_names[9] == "Ankle boot"
    assert load_dataset("embedded", pad_to=None).image_shape == (1, 28, 28)


def test_embedded_matches_data_md():
    blob = resources.files("diffsmooth.engine.demo").joinpath(data.EMBEDDED_RESOURCE).read_bytes()
    md = resources.files("diffsmooth.engine.demo").joinpath("assets/DATA.md").read_text()
    assert hashlib.sha256(blob).hexdigest() in md and f"{len(blob):,} bytes" in md


# ------------------------------------------------------------------------------------------
# Selection and generic errors


def test_indices_selected():
    ds = load_dataset("embedded")
    assert ds.indices_selected(100) == [0, 100, 200, 300, 400]
    assert ds.indices_selected(100, 300) == [0, 100, 200]
    assert ds.indices_selected(100, 301) == [0, 100, 200, 300]
    assert ds.indices_selected(1, -1) == list(range(500))
    assert ds.indices_selected(7, None)[-1] == 497
    assert ds.indices_selected(1000) == [0]
    with pytest.raises(UserError, match="selects no images"):
        ds.indices_selected(10, 0)
    for bad in (0, -3, 1.5):
        with pytest.raises(UserError, match="skip"):
            ds.indices_selected(bad)
    with pytest.raises(UserError, match="max"):
        ds.indices_selected(1, -5)


def test_load_dataset_errors(tmp_path):
    assert DATASET_KINDS == ("cifar10", "imagenet", "npz", "idx", "embedded")
    with pytest.raises(UserError, match="unknown"):
        load_dataset("mnist-ish", "x")
    for kind in ("cifar10", "imagenet", "npz", "idx"):
        with pytest.raises(UserError, match="needs a path"):
            load_dataset(kind)
    with pytest.raises(UserError, match="no option 'colour'"):
        load_dataset("embedded", colour=True)
    with pytest.raises(UserError, match="no path"):
        load_dataset("embedded", str(tmp_path))
    with pytest.raises(UserError, match="split"):
        load_dataset("embedded", split="train")
    ds = load_dataset("embedded")
    with pytest.raises(UserError, match="out of range"):
        load_arrays(ds, [500])
    with pytest.raises(IndexError):
        ds[500]
    assert ds[-1][0].shape == (1, 32, 32)
    x, y = load_arrays(ds, [])
    assert x.shape == (0, 1, 32, 32) and y.shape == (0,)
