"""Ranks that prove they agree (certify/agreement.py, certify/blocks.py): every image's identity (its pixels, index,
request, the run's settings and weights) is compared across ranks before any of its votes are summed, and a planted
divergence on one rank is refused on every rank with the same line, before any result; a rank that raises stops the
others at the same meeting with its line; a SIGTERM on one rank drops the images in flight on all. The ranks are
threads (tests/engine/certify/test_blocks.py's ThreadRanks); tests/engine/runs/test_rank_faults.py runs gloo ranks."""

import dataclasses

import pytest
import torch
from test_blocks import on_threads
from test_scheduler import TemplateClassifier, images, pipeline

from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.agreement import RankFailed, RanksDisagree
from diffsmooth.engine.certify.blocks import TERMINATE
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.certify.scheduler import Scheduler, Work
from diffsmooth.engine.errors import Terminated
from diffsmooth.engine.runs.dataset_run import Jobs

JOBS = Jobs("certify", 10, 60, 0.001, 0.5)
SHAPE = (3, 8, 8)


@pytest.fixture(scope="module")
def rs_stages():
    return build_torch_stages(MethodConfig("rs", 0.5), TemplateClassifier().eval(), None, TorchRunner(), SHAPE, 10)


def works(jobs=JOBS, swap=None, other_image=None):
    """The test images as scheduler work; `swap` (k, j): images k and j trade places (each keeps its own index);
    `other_image` k: image k replaced by another picture under the same index."""
    items = list(images())
    if swap is not None:
        k, j = swap
        items[k], items[j] = items[j], items[k]
    if other_image is not None:
        index, x = items[other_image]
        items[other_image] = (index, x.flip(-1))
    return [Work(index, x, jobs(index, index % 3), tag=index % 3, recipe=jobs.recipe(index, index % 3))
            for index, x in items]


def run_ranks(stages, ranks=2, batch=16, window=None, plant=None):
    """Each thread rank's (results, merges, error or None); `plant(rank)` -> (pipeline, works) overrides a rank's."""
    def main(rank, blocks):
        pipe, work = pipeline(stages), works()
        if plant is not None:
            pipe, work = plant(rank, pipe, work)
        results = []
        try:
            Scheduler(pipe, batch, window, blocks).run(work, lambda done: results.append((done.work.index,
                                                                                         done.result[0])))
        except Exception as exc:            # noqa: BLE001 - each rank's error is the test's subject
            return results, blocks.group.merges[rank], exc
        return results, blocks.group.merges[rank], None
    out, _ = on_threads(ranks, main)
    return out


class ShiftedClassifier(TemplateClassifier):
    """The template classifier with one weight (a score offset): a checkpoint's worth of state."""

    def __init__(self, shift: float):
        super().__init__()
        self.register_buffer("shift", torch.full((10,), shift))

    def forward(self, x):
        return super().forward(x) + self.shift


def shifted_stages(shift: float):
    """rs stages of a ShiftedClassifier (shift 0.01 on one rank: a stale checkpoint on one node)."""
    return build_torch_stages(MethodConfig("rs", 0.5), ShiftedClassifier(shift).eval(), None, TorchRunner(), SHAPE, 10)


def with_settings(pipe, settings: str):
    pipe.settings = settings
    return pipe


PLANTS = {
    "image": lambda stages: lambda rank, pipe, work: (pipe, works(other_image=2) if rank == 1 else work),
    "index": lambda stages: lambda rank, pipe, work: (pipe, works(swap=(1, 2)) if rank == 1 else work),
    "n": lambda stages: lambda rank, pipe, work: (pipe, works(dataclasses.replace(JOBS, n=61)) if rank == 1 else work),
    "alpha": lambda stages: lambda rank, pipe, work: (pipe, works(dataclasses.replace(JOBS, alpha=0.01))
                                                      if rank == 1 else work),
    "sigma": lambda stages: lambda rank, pipe, work: (MonteCarloPipeline(stages, 0.25, seed=3) if rank == 1 else pipe,
                                                      work),
    "seed": lambda stages: lambda rank, pipe, work: (MonteCarloPipeline(stages, 0.5, seed=4) if rank == 1 else pipe,
                                                     work),
    "method setting": lambda stages: lambda rank, pipe, work: (with_settings(pipe, "m=5" if rank == 1 else "m=3"), work),
    "weights": lambda stages: lambda rank, pipe, work: (
        MonteCarloPipeline(shifted_stages(0.01 if rank == 1 else 0.0), 0.5, seed=3), work),
}
SAYS = {"image": "the image's pixels (image 5: rank 0 vs rank 1)", "index": "the image's index (ranks 0, 2: 3; rank 1: 5)",
        "n": "the request", "alpha": "the request", "sigma": "the settings", "seed": "the settings",
        "method setting": "the settings", "weights": "the model weights (ranks 0, 2 vs rank 1)"}


def test_ranks_holding_the_same_work_give_one_processes_results_with_votes_over_several_classes(rs_stages):
    torch.set_num_threads(1)
    results = []
    Scheduler(pipeline(rs_stages), 16).run(works(), lambda done: results.append((done.work.index, done.result[0])))
    assert len({c.prediction for _, c in results} - {-1}) >= 3, results          # the votes spread
    for got, merges, error in run_ranks(rs_stages, ranks=3):
        assert error is None and merges > 0
        assert sorted(got, key=lambda r: r[0]) == sorted(results, key=lambda r: r[0])


@pytest.mark.parametrize("what", sorted(PLANTS))
def test_a_rank_holding_other_work_is_refused_on_every_rank_before_any_vote_is_summed(rs_stages, what):
    torch.set_num_threads(1)
    out = run_ranks(rs_stages, ranks=3 if what in ("index", "weights") else 2, plant=PLANTS[what](rs_stages))
    lines = {str(error) for _, _, error in out}
    assert all(isinstance(error, RanksDisagree) for _, _, error in out), [repr(e) for *_, e in out]
    assert len(lines) == 1, lines                               # the same line on every rank
    assert SAYS[what] in lines.pop()
    for results, merges, _ in out:
        assert results == [] and merges == 0                    # no vote summed, no result handed out


class FailingPipeline(MonteCarloPipeline):
    """A pipeline that raises at its third batch (an out-of-memory on one rank, say)."""

    def produce(self, x_rows, rows):
        self.batches = getattr(self, "batches", 0) + 1
        if self.batches == 3:
            raise RuntimeError("planted failure: CUDA out of memory")
        return super().produce(x_rows, rows)


def test_a_rank_that_raises_stops_every_rank_at_the_same_meeting_with_its_line(rs_stages):
    torch.set_num_threads(1)
    meetings = {}

    def main(rank, blocks):
        pipe, work = (FailingPipeline(rs_stages, 0.5, seed=3) if rank == 2 else pipeline(rs_stages)), works()
        try:
            Scheduler(pipe, 16, None, blocks).run(work, lambda done: None)
        except Exception as exc:            # noqa: BLE001
            meetings[rank] = blocks.group.steps[rank]
            return exc
    out, _ = on_threads(3, main)
    assert isinstance(out[2], RuntimeError) and "planted failure" in str(out[2])
    for rank in (0, 1):
        assert isinstance(out[rank], RankFailed), repr(out[rank])
        assert str(out[rank]).startswith("rank 2 failed (RuntimeError: planted failure: CUDA out of memory)")
    assert len(set(meetings.values())) == 1, meetings          # every rank left at the same meeting


def test_a_sigterm_on_one_rank_drops_the_images_in_flight_on_every_rank(rs_stages):
    torch.set_num_threads(1)

    def main(rank, blocks):
        finished = []
        try:
            Scheduler(pipeline(rs_stages), 16, 3, blocks).run(
                works(), lambda done: finished.append(done.work.index),
                stop=lambda: TERMINATE if rank == 1 and len(finished) >= 2 else 0)
        except Terminated as exc:
            return finished, str(exc)
        return finished, None
    out, _ = on_threads(2, main)
    assert out[0][1] is not None and out[1][1] is not None, out
    assert out[0][0] == out[1][0] and 2 <= len(out[0][0]) < len(images())      # the same images, then none
