"""Continuous batching: packed batches give exactly the counts of a serial oracle, for every job kind,
batch size, window and static/dynamic batches; padding only at the end; time shares; stop;
every tensor made and used on one lane, or handed across."""

import contextlib

import numpy as np
import pytest
import torch
from stage_fixtures import make_pipeline
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.cohen import certify_job, predict_job
from diffsmooth.engine.certify.jobs import drive
from diffsmooth.engine.certify.lanes import SerialLanes
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.certify.scheduler import NonFiniteScores, Scheduler, Work, default_window
from diffsmooth.engine.certify.sequential import SequentialRule, sequential_job

SHAPE = (3, 8, 8)
INDICES = [0, 3, 5, 8, 13, 21, 34, 55]        # dataset indices key the noise: not 0..k-1


TEMPLATES = torch.rand((4, *SHAPE), generator=torch.Generator().manual_seed(11))


class TemplateClassifier(torch.nn.Module):
    """Scores -||x - T_k||^2 for four template images (classes 0-3 of 10): an image between two
    templates votes for both, with a vote share set by how close it is to each."""

    def forward(self, x):
        scores = torch.full((x.shape[0], 10), -1e4)
        scores[:, :4] = -((x.flatten(1)[:, None, :] - TEMPLATES.flatten(1)[None]) ** 2).sum(-1)
        return scores


@pytest.fixture(scope="module")
def rs_stages():
    return build_torch_stages(MethodConfig("rs", 0.5), TemplateClassifier().eval(), None, TorchRunner(), SHAPE, 10)


def pipeline(stages, **kw):
    return MonteCarloPipeline(stages, 0.5, seed=3, **kw)


def images():
    """Blends of two templates, from near the midpoint (votes split) to near one template (all agree)."""
    weights = torch.linspace(0.55, 0.95, len(INDICES))
    return [(i, w * TEMPLATES[k % 4] + (1 - w) * TEMPLATES[(k + 1) % 4])
            for k, (i, w) in enumerate(zip(INDICES, weights))]


def jobs():
    """A mix of every request kind: CERTIFY, PREDICT, sequential looks (images stop at different looks)."""
    rule = SequentialRule((0.25, 0.5, 0.75, 1.0), sigma=0.5, alpha=0.001, n_max=2000)
    kinds = [lambda: certify_job(10, 60, 0.001, 0.5), lambda: predict_job(50, 0.001),
             lambda: sequential_job(10, rule)]
    return [kinds[k % 3] for k in range(len(INDICES))]


def oracle_results(pipe):
    """Each image's job driven one request at a time by serial per-sample scores (no scheduler)."""
    out = {}
    for (index, x), make in zip(images(), jobs()):
        def count(first, num, x=x, index=index):
            votes = pipe.all_scores(x, index, first, num, num)[:, 0].argmax(1)
            return np.bincount(votes.numpy(), minlength=10)[None]
        out[index], = drive(make(), count)
    return out


def packed_results(pipe, batch, window):
    results = {}
    works = [Work(index, x, make()) for (index, x), make in zip(images(), jobs())]
    stats = Scheduler(pipe, batch, window).run(works, lambda done: results.__setitem__(done.work.index, *done.result))
    return results, stats


@pytest.fixture(scope="module")
def oracle(rs_stages):
    results = oracle_results(pipeline(rs_stages))
    predictions = [r if isinstance(r, int) else r.prediction for r in results.values()]
    radii = {round(r.radius, 6) for r in results.values() if not isinstance(r, int) and r.radius > 0}
    assert len(set(predictions) - {-1}) >= 3, f"fixture votes do not spread: {predictions}"
    assert len(radii) >= 3, f"fixture radii do not differ: {radii}"
    samples = {r.samples for r in results.values() if not isinstance(r, int) and r.samples != 70}
    assert len(samples) >= 2, f"sequential images should stop at different looks: {samples}"
    return results


@pytest.mark.parametrize("batch,window,static", [(1, None, False), (7, 1, False), (7, 3, True), (64, None, False),
                                                 (64, None, True), (64, 1, True), (2000, None, True),
                                                 (2000, 2, False)])
def test_packed_rows_equal_the_serial_oracle(rs_stages, oracle, batch, window, static):
    got, stats = packed_results(pipeline(rs_stages, static_batch=static), batch, window)
    assert got == oracle
    assert stats.max_window <= (window or len(INDICES))
    if window is None and 1 < batch < 2000:
        assert stats.max_window >= 2                      # images really shared batches


class TwoLanes(SerialLanes):
    """Lanes that report overlap, so the scheduler plans batch k+1 before counting batch k (as on
    CUDA with two streams): requests and look-ahead samples are in flight while others complete."""

    overlapping = True


@pytest.mark.parametrize("batch,window", [(7, None), (64, None), (64, 2), (300, None)])
def test_two_batches_in_flight_give_the_oracle_rows(rs_stages, oracle, batch, window):
    pipe = pipeline(rs_stages, static_batch=True)
    pipe.lanes = TwoLanes()
    got, stats = packed_results(pipe, batch, window)
    assert got == oracle
    assert stats.max_window >= 2


class AuditedLanes(SerialLanes):
    """Two lanes on the CPU that remember, per storage, which lane wrote it last and which storages
    were handed to the consumer: what two CUDA streams need to be race-free, checked op by op."""

    overlapping = True

    def __init__(self):
        self.current, self.running = None, False
        self.owner, self.handed, self.violations = {}, set(), []

    def begin(self):
        self.running = True

    def end(self):
        self.running = False

    @contextlib.contextmanager
    def _lane(self, name):
        before, self.current = self.current, name
        try:
            yield
        finally:
            self.current = before

    def producer(self):
        return self._lane("producer")

    def consumer(self):
        return self._lane("consumer")

    def handoff(self, tensors):
        return [t.untyped_storage().data_ptr() for t in tensors]

    def accept(self, token, tensors):
        """Handed across: marked ready on the producer (handoff) and recorded for the consumer (here)."""
        self.handed.update(set(token) & {t.untyped_storage().data_ptr() for t in tensors})


class LaneAudit(TorchDispatchMode):
    """Every op between begin() and end() runs on a lane; a storage written on one lane is read on
    the other only after it was handed across (on CUDA: an event wait and record_stream)."""

    def __init__(self, lanes: AuditedLanes):
        super().__init__()
        self.lanes = lanes
        self.alive = []         # every output kept: no storage address is reused while audited


    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        lanes = self.lanes
        if not lanes.running:
            return out
        lane = lanes.current
        if lane is None:
            lanes.violations.append(f"{func} ran outside both lanes")
            return out
        reads = [] if func is torch.ops.aten.lift_fresh.default else tree_flatten((args, kwargs))[0]   # from host
        for t in reads:
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                writer = lanes.owner.get(ptr)
                if writer not in (None, lane) and not (lane == "consumer" and ptr in lanes.handed):
                    lanes.violations.append(f"{func} on the {lane} lane read a tensor the {writer} lane wrote")
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.alive.append(t)
                ptr = t.untyped_storage().data_ptr()
                lanes.owner[ptr] = lane
                if lane == "producer":
                    lanes.handed.discard(ptr)
        return out


@pytest.mark.parametrize("stages_name", ["rs_stages", "tiny_stages"])
def test_every_op_of_a_two_lane_run_stays_on_its_lane_or_is_handed_across(stages_name, request):
    """The scheduler's own ops (window, count rows, batch keys, votes) included: a batch's keys copied
    on the default stream raced the producer stream on a GPU and spoiled the votes."""
    stages = request.getfixturevalue(stages_name)
    pipe = pipeline(stages, static_batch=True) if stages_name == "rs_stages" else make_pipeline(stages, static_batch=True)
    pipe.lanes = lanes = AuditedLanes()
    works = [Work(index, x, make()) for (index, x), make in zip(images()[:5], jobs()[:5])]
    results = []
    with LaneAudit(lanes):
        Scheduler(pipe, 48, None).run(works, lambda done: results.append(done.result))
    assert len(results) == 5
    assert not lanes.violations, lanes.violations[:5]
    assert {"producer", "consumer"} <= set(lanes.owner.values())


def test_kept_look_ahead_longer_than_a_batch_is_counted_whole(rs_stages):
    """Look-ahead kept over several batches serves a request larger than one batch."""
    from diffsmooth.engine.certify.jobs import Request
    from diffsmooth.engine.certify.scheduler import _Slot
    sched = Scheduler(pipeline(rs_stages, static_batch=True), 8, window=2)
    x = images()[0][1]
    sched._allocate(x)
    slot = _Slot(0, Work(0, x, iter(())))
    votes = torch.tensor([[3, 1, 3, 2, 3, 0, 0, 3, 1, 2, 3, 3, 2, 1, 0, 3, 3, 2, 1, 3]])
    slot.ahead_first, slot.ahead = 5, [(votes[:, :12], torch.ones(1, 12, dtype=torch.bool)),
                                        (votes[:, 12:], torch.ones(1, 8, dtype=torch.bool))]
    sched._set_ask(slot, Request(5, 20))
    (p,) = slot.pending
    assert p.complete and not slot.ahead
    np.testing.assert_array_equal(sched._counts[0, p.row].numpy(), np.bincount(votes[0].numpy(), minlength=10))


def test_diffsmooth_fresh_local_noise_packs_exactly(tiny_stages):
    """The denoiser and per-row fresh local noise (keyed by each row's image and sample index)."""
    pipe = make_pipeline(tiny_stages, static_batch=True)
    imgs = images()[:4]
    packed = pipe.count_many(imgs, 5, 40, 32)
    serial = [np.bincount(make_pipeline(tiny_stages).all_scores(x, i, 5, 40, 40)[:, 0].argmax(1).numpy(), minlength=10)
              for i, x in imgs]
    assert all((c > 0).sum() >= 2 for c in serial)
    for a, b in zip(packed, serial):
        np.testing.assert_array_equal(a[0], b)


def test_free_rows_of_a_static_batch_compute_look_ahead_samples(rs_stages, monkeypatch):
    """Rows no request fills compute the next samples of images in flight; those counted by a later
    request are not computed again, so a packed run computes less than one image at a time, which
    computes less than padding would."""
    packed, stats = packed_results(pipeline(rs_stages, static_batch=True), 64, None)
    one_at_a_time, alone = packed_results(pipeline(rs_stages, static_batch=True), 64, 1)
    assert packed == one_at_a_time
    assert alone.samples_counted == stats.samples_counted
    assert stats.samples_computed - stats.samples_counted < 64
    assert stats.samples_computed < alone.samples_computed
    monkeypatch.setattr(Scheduler, "_look_ahead", lambda self, slots, space, segments: space)    # pad instead
    padded, without = packed_results(pipeline(rs_stages, static_batch=True), 64, 1)
    assert padded == packed and without.samples_computed > alone.samples_computed


def test_every_image_finishes_once_with_time_shares_summing_to_the_run(rs_stages):
    finished = []
    works = [Work(index, x, make()) for (index, x), make in zip(images(), jobs())]
    stats = Scheduler(pipeline(rs_stages), 64).run(works, finished.append)
    assert sorted(f.work.index for f in finished) == INDICES
    assert sum(f.seconds for f in finished) == pytest.approx(stats.seconds, rel=1e-9)
    assert all(f.seconds > 0 for f in finished)
    assert sum(f.samples for f in finished) == stats.samples_counted


def test_stop_admits_no_new_image_and_finishes_those_in_flight(rs_stages):
    finished = []
    works = [Work(index, x, certify_job(10, 200, 0.001, 0.5)) for index, x in images()]
    Scheduler(pipeline(rs_stages), 64, window=2).run(works, finished.append, stop=lambda: len(finished) >= 1)
    done = [f.work.index for f in finished]
    assert done == INDICES[:2]           # the two in flight when the first finished; none after


def test_nan_scores_of_one_image_name_it_and_keep_the_rows_before(rs_stages):
    pipe = pipeline(rs_stages)
    scores_of = pipe.scores_of

    def poisoned(h, rows):
        s = scores_of(h, rows).clone()
        s[rows.image == 34] = float("nan")
        return s
    pipe.scores_of = poisoned
    finished = []
    works = [Work(index, x, predict_job(50, 0.001)) for index, x in images()]
    with pytest.raises(NonFiniteScores, match="image 34"):
        Scheduler(pipe, 64, window=1).run(works, finished.append)
    assert [f.work.index for f in finished] == INDICES[:INDICES.index(34)]


def test_the_per_batch_path_makes_no_tensor_from_python_values(rs_stages, monkeypatch):
    """torch.tensor(v, device=cuda) is a blocking host-to-device copy: none per batch."""
    calls = []
    for name in ("tensor", "as_tensor"):
        original = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _o=original, _n=name, **k: calls.append(_n) or _o(*a, **k))
    pipe = pipeline(rs_stages, static_batch=True)
    pipe.count_many(images(), 0, 300, 64)
    assert calls == []


def test_default_window_is_bounded_by_batch_and_memory():
    assert default_window(2000, 3 * 32 * 32) == 4002
    assert default_window(32, 3 * 224 * 224) == 66
    assert default_window(2000, 3 * 256 * 256) * 4 * 3 * 256 * 256 <= 512 * 2 ** 20
    assert default_window(1, 10) == 4
