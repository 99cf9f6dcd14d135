"""One pass, many certificates: each noisy sample is denoised ONCE and then voted on by every
configuration (classifier x sigma' x m x method) at one sigma.

Why it is exact: every configuration sees the same smoothing noise (it depends only on seed,
image and sample index), the same local noises (fixed: the reference's seed-42 draw, whose first
m rows equal the m-row draw — checked, else drawn separately; fresh: Philox prefixes), and the
same classifier arithmetic as a single run. So each configuration's rows are the rows a
separate single-configuration run with the same seed writes; the sweep is only faster.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from diffsmooth.engine.backends.base import Stage
from diffsmooth.engine.base_classifier.local_smoothing import LocalProbabilities, LogitsHead
from diffsmooth.engine.certify.core import Request, certify_from_counts, check_certify_parameters, count_job
from diffsmooth.engine.certify.lanes import SerialLanes
from diffsmooth.engine.certify.noise import STREAM_LOCAL, STREAM_SMOOTHING, NoiseKeys, fixed_local_noise, gaussian_rows
from diffsmooth.engine.certify.scheduler import BatchRows, Finished, Scheduler, Work
from diffsmooth.engine.certify.sequential import SequentialRule, sequential_many_job
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.dataset_run import image_works, stop_after_current_image
from diffsmooth.engine.runs.results import CERTIFY_COLUMNS, ResultWriter, format_radius, format_time


@dataclass(frozen=True)
class SweepEntry:
    """One configuration of the sweep: its own votes and its own result file."""

    method: str                     # rs | dds | diffsmooth
    classifier: str                 # the classifier's name (file stem)
    local_sigma: Optional[float] = None
    m: Optional[int] = None

    @property
    def name(self) -> str:
        base = f"{self.method}__{self.classifier}"
        return base if self.method != "diffsmooth" else f"{base}__ls{self.local_sigma:g}__m{self.m}"


def plan_entries(methods: Sequence[str], classifiers_for, local_sigmas: Sequence[float],
                 ms: Sequence[int]) -> List[SweepEntry]:
    """Every (method, classifier, sigma', m) asked for; `classifiers_for(method, sigma')` names
    the classifiers a method uses at that local sigma (None for rs/dds)."""
    entries = []
    for method in methods:
        if method == "diffsmooth":
            entries += [SweepEntry(method, clf, float(ls), int(m))
                        for ls in local_sigmas for clf in classifiers_for(method, ls) for m in ms]
        else:
            entries += [SweepEntry(method, clf) for clf in classifiers_for(method, None)]
    if len(set(e.name for e in entries)) != len(entries):
        raise UserError("two sweep configurations would share a result file: give classifiers distinct file names")
    return entries


class SweepPipeline:
    """The scheduler's voter for a sweep: every entry votes on the same noisy samples, and the
    denoiser runs once per batch (one stream)."""

    lanes = SerialLanes()

    def __init__(self, entries: Sequence[SweepEntry], classifiers: Dict[str, torch.nn.Module], purify: Optional[Stage],
                 backend, sigma: float, image_shape: Tuple[int, ...], num_classes: int,
                 local_noise: str = "fixed", local_noise_seed: int = 42, seed: int = 0,
                 static_batch: bool = False, compiled_noise: bool = False):
        self.entries = list(entries)
        self.sigma, self.seed, self.num_classes = float(sigma), int(seed), int(num_classes)
        self.num_configs = len(self.entries)
        self.image_shape = tuple(image_shape)
        self.local_noise = local_noise
        self.static_batch, self.compiled_noise = bool(static_batch), bool(compiled_noise)
        self.purify = purify
        self.device = backend.device
        self.logits = {name: backend.stage(LogitsHead(c), f"classifier {name}") for name, c in classifiers.items()}
        self.local = {(e.classifier, e.local_sigma): backend.stage(LocalProbabilities(classifiers[e.classifier], e.local_sigma),
                                                                   f"local {e.classifier} sigma'={e.local_sigma:g}")
                      for e in self.entries if e.method == "diffsmooth"}
        self.groups = self._noise_groups(local_noise_seed)
        self.smoothing_keys = NoiseKeys(self.seed, STREAM_SMOOTHING, self.device)
        self.local_keys = NoiseKeys(self.seed, STREAM_LOCAL, self.device)

    def _noise_groups(self, local_noise_seed: int) -> List[Tuple[int, List[int], Optional[torch.Tensor]]]:
        """Sets of m served by one classifier call on the first M local noises (M = their max)."""
        ms = sorted({e.m for e in self.entries if e.method == "diffsmooth"})
        if not ms:
            return []
        if self.local_noise == "fresh":                 # Philox: prefixes are exact by construction
            return [(ms[-1], ms, None)]
        full = fixed_local_noise(ms[-1], self.image_shape, local_noise_seed)
        shared = [m for m in ms if torch.equal(full[:m], fixed_local_noise(m, self.image_shape, local_noise_seed))]
        groups = [(ms[-1], shared, full.to(self.device))]
        groups += [(m, [m], fixed_local_noise(m, self.image_shape, local_noise_seed).to(self.device))
                   for m in ms if m not in shared]
        return groups

    def describe_config(self, config: int) -> str:
        return f"configuration {self.entries[config].name}"

    def unpack(self, counts: np.ndarray) -> Dict[SweepEntry, np.ndarray]:
        """What a job is sent: {entry: counts [K]}."""
        return {e: counts[i] for i, e in enumerate(self.entries)}

    def produce(self, x_rows: torch.Tensor, rows: BatchRows):
        """(x_rs, x_hat): the noisy samples and, when an entry needs them, their denoised form."""
        eps = gaussian_rows(self.smoothing_keys, rows.image, rows.sample, x_rows.shape[1:], self.compiled_noise)
        x_rs = x_rows + self.sigma * eps
        x_hat = self.purify(x_rs) if self.purify is not None and any(e.method != "rs" for e in self.entries) else None
        return x_rs, x_hat

    def classify(self, produced, rows: BatchRows):
        """(votes [E, B], finite [E, B]) of every entry on one batch of noisy samples."""
        x_rs, x_hat = produced
        votes, finite = [], []
        probs_cache = {}
        for e in self.entries:
            if e.method == "rs":
                scores = self.logits[e.classifier](x_rs)
            elif e.method == "dds":
                scores = self.logits[e.classifier](x_hat)
            else:
                big_m, members, fixed = next(g for g in self.groups if e.m in g[1])
                key = (e.classifier, e.local_sigma, big_m)
                if key not in probs_cache:
                    delta = (fixed.unsqueeze(0) if fixed is not None else
                             gaussian_rows(self.local_keys, rows.image, rows.sample, (big_m, *self.image_shape),
                                           self.compiled_noise))
                    probs_cache[key] = self.local[(e.classifier, e.local_sigma)](x_hat, delta)
                probs = probs_cache[key]
                scores = probs.mean(dim=1) if e.m == big_m else probs[:, :e.m].contiguous().mean(dim=1)
            votes.append(scores.argmax(dim=1))
            finite.append(torch.isfinite(scores).all(dim=1))
        return torch.stack(votes), torch.stack(finite)

    def count(self, x: torch.Tensor, image_index: int, first: int, num: int, batch: int) -> Dict[SweepEntry, np.ndarray]:
        """Vote counts per entry over samples first..first+num-1 of one image."""
        results = []
        Scheduler(self, batch, window=1).run([Work(image_index, x, count_job(first, num))],
                                             lambda done: results.append(done.result))
        return results[0]


def sweep_certify_job(entries: Sequence[SweepEntry], n0: int, n: int, alpha: float, sigma: float):
    """CERTIFY of every entry on one shared sample stream: {entry: (prediction, radius)}."""
    selection, estimation = yield Request(0, n0), Request(n0, n)
    return {e: certify_from_counts([int(c) for c in selection[e]], [int(c) for c in estimation[e]], alpha, sigma)
            for e in entries}


def run_sweep(pipeline: SweepPipeline, dataset, indices: Sequence[int], out_dir, *, n0: int, n: int,
              alpha: float, batch: int, settings: dict, progress: bool = True,
              sequential: Optional[SequentialRule] = None, window: Optional[int] = None) -> dict:
    """CERTIFY every selected image for every entry; one reference TSV per entry plus index.json.
    The time column is the image's share of the compute time (all entries together). With
    `sequential`, sampling continues while any entry is undecided; each entry records its own
    stopping point (trailing `samples` column), the same row its single run writes."""
    check_certify_parameters(n0, n, alpha, batch)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    index = {"settings": settings, "entries": [dict(asdict(e), file=f"{e.name}.tsv") for e in pipeline.entries]}
    index_path = out / "index.json"
    if index_path.exists() and json.loads(index_path.read_text()) != json.loads(json.dumps(index)):
        raise UserError(f"{out} holds a sweep with other settings or configurations: use another `out`")
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    columns = CERTIFY_COLUMNS + (("samples",) if sequential is not None else ())
    writers = {e: ResultWriter(out / f"{e.name}.tsv", columns) for e in pipeline.entries}
    todo = [i for i in indices if any(i not in w.done for w in writers.values())]
    if sequential is not None:
        make_job = lambda: sequential_many_job(n0, sequential)                                   # noqa: E731
    else:
        make_job = lambda: sweep_certify_job(pipeline.entries, n0, n, alpha, pipeline.sigma)     # noqa: E731
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(indices), initial=len(indices) - len(todo), unit="img",
                   desc=f"sweep {len(pipeline.entries)} configs", dynamic_ncols=True)
    written = 0

    def finished(done: Finished) -> None:
        nonlocal written
        i, label, elapsed = done.work.index, done.work.tag, format_time(done.seconds)
        for e, w in writers.items():
            if i in w.done:
                continue
            pred, radius = done.result[e][:2]
            extra = {"samples": done.result[e][2]} if sequential is not None else {}
            w.write(idx=i, label=label, predict=pred, radius=format_radius(radius),
                    correct=int(pred == label), time=elapsed, **extra)
        written += 1
        if bar is not None:
            bar.update(1)

    try:
        with stop_after_current_image() as flag:
            Scheduler(pipeline, batch, window).run(image_works(dataset, todo, make_job), finished,
                                                   stop=lambda: flag.stop)
    finally:
        for w in writers.values():
            w.close()
        if bar is not None:
            bar.close()
    return {"written": written, "skipped_done": len(indices) - len(todo), "interrupted": flag.stop,
            "path": str(out), "files": [str(out / f"{e.name}.tsv") for e in pipeline.entries]}
