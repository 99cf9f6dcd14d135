"""The Python API under torchrun's environment (gloo ranks, spawned here): every rank computes its share of each
image's samples and every call returns one process's result on every rank (certify, sequential, predict);
certify_dataset's file, written by rank 0, equals one process's. The tiny models of stage_fixtures spread
their votes over several classes."""

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from cli_helpers import assert_rows_spread, rows_without_time
from stage_fixtures import build_tiny_stages, image, spread_classifier

from diffsmooth import DiffSmooth
from diffsmooth.engine.certify.sequential import SequentialRule

IMAGES = [(i, image(i)) for i in range(5)]
RULE = SequentialRule((0.02, 0.05, 0.1), sigma=0.12, alpha=0.01, n_max=300)


class Images:
    """A dataset of the tiny images (what certify_dataset reads)."""

    name, image_shape, num_classes = "tiny", tuple(IMAGES[0][1].shape), 10

    def __len__(self):
        return len(IMAGES)

    def __getitem__(self, index):
        return IMAGES[index][1], index % 3

    def indices_selected(self, skip, max_index):
        return list(range(0, len(IMAGES) if max_index is None else max_index, skip))


def results(model, out: Path) -> dict:
    """What every call of the API gives, as plain values; certify_dataset writes `out`."""
    got = {"certify": [], "sequential": [], "predict": []}
    smooth = model.smooth_for(tuple(IMAGES[0][1].shape))
    for i, x in IMAGES:
        c = model.certify(x, n0=20, n=150, alpha=0.01, image_index=i)
        got["certify"].append((c.prediction, c.radius))
        s = smooth.certify_sequential(x, 20, RULE, 32, image_index=i)
        got["sequential"].append((s.prediction, s.radius, s.samples))
        got["predict"].append(model.predict(x, n=50, alpha=0.01, image_index=i))
    model.certify_dataset(Images(), out, n0=20, n=150, alpha=0.01)
    return got


def build():
    _, denoiser, _ = build_tiny_stages()
    return DiffSmooth(denoiser=denoiser, classifier=spread_classifier(2), sigma=0.12, local_sigma=0.06, m=3,
                      local_noise="fresh", batch=32)          # the tiny classifier's votes spread at this sigma


def _rank(rank: int, world: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    model = build()
    got = results(model, Path(folder, "ranks.tsv"))
    Path(folder, f"rank{rank}.json").write_text(json.dumps(dict(got, ranks=model.shards.num_shards)))


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_every_call_of_the_api_on_two_ranks_returns_one_processes_result(tmp_path):
    whole = results(build(), tmp_path / "whole.tsv")
    assert len({p for p, _ in whole["certify"]} - {-1}) >= 3, whole["certify"]          # the votes spread
    assert len({s for *_, s in whole["sequential"]}) >= 2, whole["sequential"]          # stopped at different looks
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    mp.spawn(_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    expected = json.loads(json.dumps(whole))                # tuples as JSON lists
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got.pop("ranks") == 2
        assert got == expected, rank
    assert_rows_spread(tmp_path / "whole.tsv")
    assert rows_without_time(tmp_path / "ranks.tsv") == rows_without_time(tmp_path / "whole.tsv")
