"""An image's samples over ranks (certify/blocks.py): every rank runs every job on its own samples of each
request (sample s is rank s mod ranks's), computing ahead as one process does, the ranks meeting once per batch,
and the results are one process's, for every job kind, batch, window, static or dynamic batches, two lanes,
and 2 to 4 ranks. The ranks are threads here (their collectives a barrier); tests/engine/runs/test_sharding.py
and tests/engine/test_api_on_ranks.py run real gloo ranks."""

import threading

import numpy as np
import pytest
import torch
from test_scheduler import INDICES, SHAPE, TemplateClassifier, TwoLanes, images, jobs, packed_results, pipeline

from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.agreement import RankFailed
from diffsmooth.engine.certify.blocks import SampleBlocks
from diffsmooth.engine.certify.jobs import count_job
from diffsmooth.engine.certify.scheduler import MiscountedSamples, Scheduler, Work


@pytest.fixture(scope="module")
def rs_stages():
    return build_torch_stages(MethodConfig("rs", 0.5), TemplateClassifier().eval(), None, TorchRunner(), SHAPE, 10)


class ThreadRanks:
    """The all-reduce of `ranks` threads: each hands in its numbers, all get the sum."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.barrier = threading.Barrier(ranks, timeout=60)
        self.parts = [None] * ranks
        self.merges = [0] * ranks
        self.steps = [0] * ranks

    def exchange(self, rank: int, value) -> list:
        """Every rank's `value`, in rank order."""
        self.parts[rank] = value
        self.barrier.wait()
        parts = list(self.parts)
        self.barrier.wait()            # every rank has read the parts before any hands in its next
        return parts

    def all_reduce(self, rank: int, value: np.ndarray, reduce=sum) -> np.ndarray:
        parts = self.exchange(rank, value.copy())
        assert len({p.shape for p in parts}) == 1, [p.shape for p in parts]    # the ranks met at the same point
        return reduce(parts)


class ThreadBlocks(SampleBlocks):
    """SampleBlocks whose collectives are ThreadRanks' (its `group`); the meeting's logic is SampleBlocks' own."""

    def reduce_max(self, values, device):
        self.group.steps[self.rank] += 1
        return self.group.all_reduce(self.rank, values, lambda parts: np.max(np.stack(parts), axis=0))

    def merge(self, counts, bad):
        self.group.merges[self.rank] += 1
        flat = self.group.all_reduce(self.rank, np.concatenate([counts.numpy().ravel(), bad.numpy().ravel()]))
        return flat[:counts.numel()].reshape(counts.shape), flat[counts.numel():].reshape(bad.shape)

    def gather(self, value):
        return self.group.exchange(self.rank, value)


def on_threads(ranks: int, main):
    """main(rank, blocks) on `ranks` threads; their results in rank order (the first error raised)."""
    world = ThreadRanks(ranks)
    out, errors = [None] * ranks, []

    def rank_main(rank):
        try:
            out[rank] = main(rank, ThreadBlocks(rank, ranks, world))
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:    # noqa: BLE001 - raised below
            errors.append(exc)
            world.barrier.abort()
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(ranks)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    if errors:
        raise errors[0]
    return out, world


def ranked_results(stages, ranks, batch, window, static, lanes=None, stop_rank=None):
    """Each thread rank's (results, stats, finished indices)."""
    def main(rank, blocks):
        results, finished = {}, []

        def on_finish(done):
            finished.append(done.work.index)
            results[done.work.index] = done.result[0]
        pipe = pipeline(stages, static_batch=static)
        if lanes is not None:
            pipe.lanes = lanes()
        works = [Work(index, x, make()) for (index, x), make in zip(images(), jobs())]
        stats = Scheduler(pipe, batch, window, blocks).run(
            works, on_finish, stop=lambda: rank == stop_rank and len(finished) >= 2)    # one rank's Ctrl-C
        return results, stats, finished
    return on_threads(ranks, main)


@pytest.fixture(scope="module")
def one_process(rs_stages):
    results, stats = packed_results(pipeline(rs_stages), 64, None)
    predictions = [r if isinstance(r, int) else r.prediction for r in results.values()]
    assert len(set(predictions) - {-1}) >= 3, f"votes do not spread: {predictions}"
    return results, stats.samples_counted


@pytest.mark.parametrize("ranks,batch,window,static,lanes", [
    (2, 64, None, False, None), (3, 7, 2, True, None), (4, 64, None, True, None), (2, 1, None, False, None),
    (3, 300, 1, False, None), (2, 64, None, True, TwoLanes), (3, 16, 3, True, TwoLanes)])
def test_ranks_sharing_every_image_give_one_processes_results(rs_stages, one_process, ranks, batch, window, static,
                                                             lanes):
    torch.set_num_threads(1)
    expected, counted_alone = one_process
    out, world = ranked_results(rs_stages, ranks, batch, window, static, lanes)
    for results, _, finished in out:
        assert results == expected
        assert finished == out[0][2]                           # the same completion order on every rank
    counted = [stats.samples_counted for _, stats, _ in out]
    if not static:                                             # no look-ahead: each sample counted by one rank
        assert sum(counted) == counted_alone
        assert max(counted) <= 1.15 * (sum(counted) / ranks)
    assert len(set(world.steps)) == 1 and len(set(world.merges)) == 1     # every rank at every meeting


def test_a_ranks_samples_are_every_ranks_th_in_its_own_order():
    for ranks in (1, 2, 3, 8):
        owners = [SampleBlocks(r, ranks) for r in range(ranks)]
        for first, num in ((0, 1), (50, 7), (13, 100), (99, 4001)):
            mine = [b.global_samples(np.arange(b.local(first), b.local(first + num))) for b in owners]
            assert sorted(np.concatenate(mine).tolist()) == list(range(first, first + num))
            assert max(len(m) for m in mine) - min(len(m) for m in mine) <= 1
            assert all((m % ranks == r).all() for r, m in enumerate(mine))


def test_one_ranks_stop_reaches_every_rank_at_the_next_meeting(rs_stages):
    torch.set_num_threads(1)
    out, _ = ranked_results(rs_stages, 2, 7, 2, False, stop_rank=1)
    finished = [set(f) for _, _, f in out]
    assert finished[0] == finished[1]                  # the same images admitted and finished on both ranks
    assert 2 <= len(finished[0]) < len(INDICES)


def test_a_request_smaller_than_the_ranks_leaves_some_ranks_no_sample(rs_stages):
    """Samples 3..7 over 4 ranks: rank 3 holds samples 3 and 7, the others one each; 2 samples over 4 ranks
    (below) leave two ranks none. Every rank's job gets every sample's vote."""
    torch.set_num_threads(1)
    x = images()[0][1]
    out, _ = on_threads(4, lambda rank, blocks: pipeline(rs_stages).run_one(x, 9, count_job(3, 5), 64, blocks))
    expected = pipeline(rs_stages).count(x, 9, 3, 5, 64)
    for counts in out:
        assert np.array_equal(counts, expected) and counts.sum() == 5
    out, _ = on_threads(4, lambda rank, blocks: pipeline(rs_stages).run_one(x, 9, count_job(0, 2), 64, blocks))
    assert all(np.array_equal(c, pipeline(rs_stages).count(x, 9, 0, 2, 64)) for c in out)


def test_look_ahead_on_ranks_serves_later_looks_from_votes_already_computed(rs_stages):
    """Static batches of 64 on 2 ranks, one sequential image: each rank's free rows compute its own next samples,
    which later looks count without computing them again (fewer batches than looks)."""
    torch.set_num_threads(1)
    index, x = images()[0]
    make = jobs()[2]

    def main(rank, blocks):
        results = []
        scheduler = Scheduler(pipeline(rs_stages, static_batch=True), 64, 1, blocks)
        scheduler.run([Work(index, x, make())], lambda done: results.append(done.result[0]))
        return results[0], scheduler.stats
    out, world = on_threads(2, main)
    alone = []
    Scheduler(pipeline(rs_stages), 64, 1).run([Work(index, x, make())], lambda done: alone.append(done.result[0]))
    assert out[0][0] == out[1][0] == alone[0]
    assert alone[0].samples > 500 and world.merges[0] >= 4               # several looks
    assert out[0][1].batches < world.merges[0]                           # looks served from look-ahead votes


class DoublingBlocks(ThreadBlocks):
    """A rank that hands in its counts twice at its third merge (a planted duplicate)."""

    def merge(self, counts, bad):
        merged = super().merge(counts, bad)
        if self.rank == 1 and self.group.merges[1] == 3:
            return merged[0] + counts.numpy(), merged[1]
        return merged


def test_a_sample_counted_twice_is_refused_before_any_result(rs_stages):
    torch.set_num_threads(1)
    world, errors = ThreadRanks(2), []

    def rank_main(rank):
        try:
            pipeline(rs_stages).scheduler(64, None, DoublingBlocks(rank, 2, world)).run(
                [Work(index, x, make()) for (index, x), make in zip(images(), jobs())], lambda done: None)
        except (MiscountedSamples, RankFailed) as exc:      # the rank that saw it, and the other at the same meeting
            errors.append((rank, type(exc), str(exc)))
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    by_rank = {rank: (kind, text) for rank, kind, text in errors}
    assert by_rank[1][0] is MiscountedSamples and "counted twice or lost" in by_rank[1][1], errors
    assert by_rank[0][0] is RankFailed and by_rank[0][1].startswith("rank 1 failed (MiscountedSamples: "), errors
