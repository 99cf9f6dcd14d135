"""An image's samples over ranks (certify/blocks.py): every rank runs every job on its block of each
request, the counts summed at each look, and the results are one process's, for every job kind, batch,
window, static or dynamic batches and 2 to 4 ranks. The ranks are threads here (their merge a barrier);
tests/engine/runs/test_sample_ranks.py runs real gloo ranks."""

import threading

import numpy as np
import pytest
import torch
from test_scheduler import INDICES, SHAPE, TemplateClassifier, images, jobs, packed_results, pipeline

from diffsmooth.engine.backends.torch_backend import TorchBackend
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.torch_stages import build_torch_stages
from diffsmooth.engine.certify.blocks import SampleBlocks
from diffsmooth.engine.certify.scheduler import Scheduler, Work


@pytest.fixture(scope="module")
def rs_stages():
    return build_torch_stages(MethodConfig("rs", 0.5), TemplateClassifier().eval(), None, TorchBackend(), SHAPE, 10)


class ThreadRanks:
    """The all-reduce of `ranks` threads: each hands in its counts, all get the sum."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.barrier = threading.Barrier(ranks, timeout=60)
        self.parts = [None] * ranks
        self.merges = [0] * ranks

    def blocks(self, rank: int) -> SampleBlocks:
        return ThreadBlocks(rank, self.ranks, self)


class ThreadBlocks(SampleBlocks):
    def merge(self, counts, bad, stop):
        world = self.group
        world.parts[self.rank] = (counts.numpy().copy(), bad.numpy().copy(), stop)
        world.merges[self.rank] += 1
        world.barrier.wait()
        parts = list(world.parts)
        world.barrier.wait()            # every rank has read the parts before any hands in its next
        return (sum(p[0] for p in parts), sum(p[1] for p in parts), any(p[2] for p in parts))


def ranked_results(stages, ranks, batch, window, static, stop_rank=None):
    """Each thread rank's results and scheduler stats."""
    world = ThreadRanks(ranks)
    out, errors = [None] * ranks, []

    def rank_main(rank):
        try:
            results, finished = {}, []
            works = [Work(index, x, make()) for (index, x), make in zip(images(), jobs())]

            def stop():                 # one rank asks to stop once two images finished (Ctrl-C on one rank)
                return rank == stop_rank and len(finished) >= 2

            def on_finish(done):
                finished.append(done.work.index)
                results[done.work.index] = done.result[0]
            stats = Scheduler(pipeline(stages, static_batch=static), batch, window, world.blocks(rank)).run(
                works, on_finish, stop=stop)
            out[rank] = (results, stats, finished)
        except BaseException as exc:    # noqa: BLE001 - reported below
            errors.append(exc)
            world.barrier.abort()
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out, world


@pytest.fixture(scope="module")
def one_process(rs_stages):
    results, _ = packed_results(pipeline(rs_stages), 64, None)
    predictions = [r if isinstance(r, int) else r.prediction for r in results.values()]
    assert len(set(predictions) - {-1}) >= 3, f"votes do not spread: {predictions}"
    return results


@pytest.mark.parametrize("ranks,batch,window,static", [(2, 64, None, False), (3, 7, 2, True), (4, 64, None, True),
                                                       (2, 1, None, False), (3, 300, 1, False)])
def test_ranks_sharing_every_image_give_one_processes_results(rs_stages, one_process, ranks, batch, window, static):
    torch.set_num_threads(1)
    out, world = ranked_results(rs_stages, ranks, batch, window, static)
    for results, stats, _ in out:
        assert results == one_process
    counted = [stats.samples_counted for _, stats, _ in out]
    _, one_stats = packed_results(pipeline(rs_stages), 64, None)
    assert sum(counted) == one_stats.samples_counted            # each sample counted by exactly one rank
    assert max(counted) <= 1.15 * (sum(counted) / ranks)
    assert len(set(world.merges)) == 1 and world.merges[0] >= len(INDICES)   # every rank at every merge


def test_a_block_is_an_equal_share_whose_padding_makes_every_rank_plan_the_same_rows():
    for num in (1, 2, 7, 100, 4001):
        for ranks in (2, 3, 8):
            blocks = [SampleBlocks(r, ranks).block(50, num) for r in range(ranks)]
            assert len({b.rows for b in blocks}) == 1
            covered = [s for b in blocks for s in range(b.first, b.first + b.samples)]
            assert covered == list(range(50, 50 + num))
            assert max(b.samples for b in blocks) - min(b.samples for b in blocks) <= blocks[0].rows


def test_one_ranks_stop_reaches_every_rank_at_the_next_merge(rs_stages):
    torch.set_num_threads(1)
    out, _ = ranked_results(rs_stages, 2, 7, 2, False, stop_rank=1)
    finished = [set(f) for _, _, f in out]
    assert finished[0] == finished[1]                  # the same images admitted and finished on both ranks
    assert 2 <= len(finished[0]) < len(INDICES)


def test_padding_rows_vote_for_no_request(rs_stages):
    """A request of 5 samples over 4 ranks: blocks of 2 rows; ranks 2 and 3 hold 1 and 0 samples."""
    torch.set_num_threads(1)
    world = ThreadRanks(4)
    got = [None] * 4
    x = images()[0][1]

    def rank_main(rank):
        got[rank] = pipeline(rs_stages).run_one(x, 9, _count(3, 5), 64, world.blocks(rank))
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    expected = pipeline(rs_stages).count(x, 9, 3, 5, 64)
    for counts in got:
        assert np.array_equal(counts, expected) and counts.sum() == 5


def _count(first, num):
    from diffsmooth.engine.certify.jobs import count_job
    return count_job(first, num)


class DoublingBlocks(ThreadBlocks):
    """A rank that hands in its block twice at its third merge (a planted duplicate)."""

    def merge(self, counts, bad, stop):
        merged = super().merge(counts, bad, stop)
        if self.rank == 1 and self.group.merges[1] == 3:
            return (merged[0] + counts.numpy(), merged[1], merged[2])
        return merged


def test_a_block_counted_twice_is_refused_before_any_result(rs_stages):
    from diffsmooth.engine.certify.scheduler import MiscountedSamples
    torch.set_num_threads(1)
    world = ThreadRanks(2)
    errors, results = [], []

    def rank_main(rank):
        try:
            blocks = DoublingBlocks(rank, 2, world)
            results.append(pipeline(rs_stages).scheduler(64, None, blocks).run(
                [Work(index, x, make()) for (index, x), make in zip(images(), jobs())], lambda done: None))
        except MiscountedSamples as exc:
            errors.append(str(exc))
            world.barrier.abort()
        except threading.BrokenBarrierError:
            pass
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(errors) == 1 and "counted twice or lost" in errors[0], errors
