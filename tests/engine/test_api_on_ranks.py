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
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.results import merge_results

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


def build(**execution):
    _, denoiser, _ = build_tiny_stages()
    return DiffSmooth(denoiser=denoiser, classifier=spread_classifier(2), sigma=0.12, local_sigma=0.06, m=3,
                      local_noise="fresh", batch=32, **execution)      # the tiny classifier's votes spread at this sigma


def _environ(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))


def _free_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def _rank(rank: int, world: int, port: int, folder: str) -> None:
    _environ(rank, world, port)
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


def _own_images_rank(rank: int, world: int, port: int, folder: str) -> None:
    """The usual evaluation loop (each rank its own images) with the default mode, then with ranks="independent"."""
    _environ(rank, world, port)
    torch.set_num_threads(1)
    mine = IMAGES[rank::world]
    shared, refused = build(), None
    try:
        shared.certify(mine[0][1], n0=20, n=150, alpha=0.01, image_index=mine[0][0])
    except UserError as exc:
        refused = str(exc)
    alone = build(ranks="independent")
    got = [alone.certify(x, n0=20, n=150, alpha=0.01, image_index=i) for i, x in mine]
    alone.certify_dataset(Images(), Path(folder, "own.tsv"), n0=20, n=150, alpha=0.01)
    Path(folder, f"own{rank}.json").write_text(json.dumps({
        "refused": refused, "indices": [i for i, _ in mine], "certificates": [(c.prediction, c.radius) for c in got],
        "ranks": alone.shards.num_shards}))


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_each_rank_certifying_its_own_images_is_refused_when_shared_and_one_processes_when_independent(tmp_path):
    whole = build()
    alone = {i: whole.certify(x, n0=20, n=150, alpha=0.01, image_index=i) for i, x in IMAGES}
    assert len({c.prediction for c in alone.values()} - {-1}) >= 3, alone           # the votes spread
    whole.certify_dataset(Images(), tmp_path / "whole.tsv", n0=20, n=150, alpha=0.01)
    mp.spawn(_own_images_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    lines = set()
    for rank in range(2):
        got = json.loads((tmp_path / f"own{rank}.json").read_text())
        lines.add(got["refused"])
        assert got["certificates"] == [[alone[i].prediction, alone[i].radius] for i in got["indices"]], rank
        assert got["ranks"] == 2
    assert len(lines) == 1 and "the ranks differ in the image's index (rank 0: 0; rank 1: 1)" in lines.pop()
    shards = [tmp_path / f"own.shard-{r}-of-2.tsv" for r in range(2)]
    assert merge_results(shards, tmp_path / "own.tsv") == len(IMAGES)
    assert rows_without_time(tmp_path / "own.tsv") == rows_without_time(tmp_path / "whole.tsv")


def test_an_unknown_rank_mode_is_refused_in_one_line():
    with pytest.raises(UserError, match="`ranks` must be one of shared, independent, got 'each'"):
        build(ranks="each")
