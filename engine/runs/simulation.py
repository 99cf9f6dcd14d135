"""The sequential-rule simulator's core: Binomial vote paths shared by every rule, cut at every rule's looks,
and a rule's radii on them (the engine's vectorised `run_rule`), so differences between rules are paired. A
model of a measurement, not a measurement: votes are i.i.d. given each image's rate. The table command
predicts its cost with it; studies/replay.py replays result rows through it.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from diffsmooth.engine.certify.sequential import SequentialRule, radius_from_lower, run_rule


def shared_paths(p: np.ndarray, rules, n: int, rng) -> Tuple[np.ndarray, np.ndarray]:
    """(cut points, votes per segment): one Binomial vote path per rate p, cut at every look of every
    rule and at n, so each rule's chunk votes and the fixed-n count (their total) share the path."""
    cuts = sorted({n, *(int(t) for rule in rules for t in rule.looks())})
    sizes = np.diff(np.concatenate([[0], cuts]))
    return np.asarray(cuts), rng.binomial(sizes[None, :], np.asarray(p, dtype=np.float64)[:, None])


def chunk_votes(cuts: np.ndarray, segments: np.ndarray, rule: SequentialRule) -> np.ndarray:
    """The votes of each chunk of rule.chunks(), summed from the shared segments."""
    cumulative = np.cumsum(segments, axis=1)
    at_looks = cumulative[:, np.searchsorted(cuts, rule.looks())]
    return np.diff(np.concatenate([np.zeros((len(segments), 1), dtype=at_looks.dtype), at_looks], axis=1), axis=1)


def simulate_sequential(p: np.ndarray, rule: SequentialRule, rng, votes=None):
    """(radii, estimation samples) of `rule` on Binomial vote paths with rates p (1-D); `votes`,
    shape (len(p), len(rule.chunks())), fixes the per-chunk votes instead."""
    if votes is None:
        votes = rng.binomial(np.asarray(rule.chunks())[None, :], np.asarray(p, dtype=np.float64)[:, None])
    lower, used = run_rule(rule, votes)
    return radius_from_lower(lower, rule.sigma), used
