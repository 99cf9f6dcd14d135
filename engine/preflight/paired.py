"""The preflight's comparisons as paired tests on the same images: is a variant (another normalisation, the
channels swapped, half the noise, the labels permuted, another schedule) better than the set-up given by at least
the effect that matters? Each test has a stated level and its power for the sample at hand, so a check that cannot
see the effect says "inconclusive: N more images" instead of passing (docs/cli.md#preflight)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats

LEVEL = 0.01            # each test's false-alarm rate on a correct set-up (a preflight runs about ten of them)
BOUND = 0.05            # a check passes when the gain's upper (1 - BOUND) confidence bound is below the effect
POWER = 0.80            # "N more images": where the test would have this chance of seeing the effect
MAX_IMAGES = 1_000_000  # "N more images" is searched up to this sample size

DIFFERS, SAME, INCONCLUSIVE = "differs", "same", "inconclusive"


@dataclass(frozen=True)
class PairedResult:
    """A paired test's outcome: the estimated gain of the variant (fraction of images, or the mean difference), its
    one-sided p-value, the gain's upper confidence bound, the power to see `effect` at LEVEL and the images that
    power needs."""

    name: str
    gain: float
    p_value: float
    upper: float
    power: float
    effect: float
    images: int
    needed: int

    @property
    def verdict(self) -> str:
        """`differs`: significant at LEVEL with a gain of at least half the effect; `same`: the data rule out a gain
        of `effect` (its upper 1 - BOUND bound is below it); `inconclusive`: neither, too few images to tell."""
        if self.p_value < LEVEL and self.gain >= self.effect / 2:
            return DIFFERS
        return SAME if self.upper < self.effect else INCONCLUSIVE

    @property
    def more(self) -> int:
        """Images to add before the test has power POWER (0: enough)."""
        return max(0, self.needed - self.images)

    def text(self) -> str:
        """`NAME: gain -60.0 points (p = 1), at most -52.1 (95% bound) against the 10.0 that matter`, and for an
        inconclusive test the images it needs."""
        head = (f"{self.name}: gain {100 * self.gain:+.1f} points (p = {self.p_value:.2g}), at most "
                f"{100 * self.upper:+.1f} ({100 * (1 - BOUND):.0f}% bound) against the {100 * self.effect:.1f} that "
                f"matter")
        if self.verdict != INCONCLUSIVE:
            return head
        return head + f"; inconclusive: {self.more:,} more images (power {self.power:.2f} now, {POWER:.2f} wanted)"

    def as_dict(self) -> dict:
        return {"gain": self.gain, "p_value": self.p_value, "upper": self.upper, "power": self.power, "effect": self.effect,
                "images": self.images, "verdict": self.verdict, "more_images": self.more}


def _critical_counts(discordant: np.ndarray) -> np.ndarray:
    """Per number of discordant pairs d: the fewest wins of the variant that reject "no gain" at LEVEL."""
    k = stats.binom.isf(LEVEL, discordant, 0.5) + 1          # smallest k with P(Bin(d, 1/2) >= k) <= LEVEL
    while True:                                               # isf's floating point: step until the tail is below
        tail = stats.binom.sf(k - 1, discordant, 0.5)
        low = tail > LEVEL
        if not low.any():
            return k
        k = np.where(low, k + 1, k)


def sign_test_power(pairs: int, discordance: float, effect: float) -> float:
    """Power of the exact sign (McNemar) test at LEVEL with `pairs` images of which a fraction `discordance` differ,
    when the variant's gain is `effect` (wins (d + effect) / 2, losses (d - effect) / 2)."""
    if pairs < 1 or effect <= 0:
        return 0.0
    psi = min(1.0, max(discordance, effect))
    d = np.arange(pairs + 1)
    weight = stats.binom.pmf(d, pairs, psi)
    win = (psi + effect) / (2 * psi)
    reject = stats.binom.sf(_critical_counts(d) - 1, d, win)
    return float(np.sum(weight * reject))


def images_needed(power_at: Callable[[int], float], start: int) -> int:
    """The fewest images (from `start`, doubling then bisecting) at which `power_at` reaches POWER."""
    if power_at(start) >= POWER:
        return start
    low, high = start, max(2 * start, 2)
    while power_at(high) < POWER:
        low, high = high, 2 * high
        if high > MAX_IMAGES:
            return MAX_IMAGES
    while high - low > max(1, low // 100):          # to 1%: the count is advice, not a bound
        middle = (low + high) // 2
        low, high = (low, middle) if power_at(middle) >= POWER else (middle, high)
    return high


def _with_needed(result: PairedResult, power_at: Callable[[int], float]) -> PairedResult:
    """The result with the images it needs, searched only where it is inconclusive (the search costs a power
    computation per step)."""
    if result.verdict != INCONCLUSIVE:
        return result
    return dataclasses.replace(result, needed=images_needed(power_at, max(result.images, 1)))


def _upper_gain(a: np.ndarray, b: np.ndarray) -> float:
    """An upper 1 - BOUND confidence bound on the mean of b - a: for 0/1 scores P(b right, a wrong)'s upper
    Clopper-Pearson bound minus P(a right, b wrong)'s lower one, each at BOUND / 2; else the t bound."""
    n = len(a)
    if n == 0:
        return 1.0
    if np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all():
        wins, losses = int(np.sum(b > a)), int(np.sum(b < a))
        high = 1.0 if wins >= n else float(stats.beta.ppf(1 - BOUND / 2, wins + 1, n - wins))
        low = 0.0 if losses == 0 else float(stats.beta.ppf(BOUND / 2, losses, n - losses + 1))
        return high - low
    d = b - a
    if n < 2:
        return 1.0
    return float(np.mean(d) + stats.t.isf(BOUND, n - 1) * np.std(d, ddof=1) / np.sqrt(n))


def sign_test(name: str, given: Sequence[float], variant: Sequence[float], effect: float) -> PairedResult:
    """Does the variant score higher than the set-up given on the same images? Per image a score (1/0 correct, or
    the fraction of an image's noise samples right); the exact sign test on the images where they differ (McNemar's
    test when the scores are 0/1), one-sided. `effect`: the gain, in fraction of images, that matters."""
    a, b = np.asarray(given, dtype=float), np.asarray(variant, dtype=float)
    n = len(a)
    wins, losses = int(np.sum(b > a)), int(np.sum(b < a))
    p = float(stats.binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue) if wins + losses else 1.0
    psi = (wins + losses) / n if n else 0.0
    power_at = lambda size: sign_test_power(size, psi, effect)
    return _with_needed(PairedResult(name, float(np.mean(b - a)) if n else 0.0, p, _upper_gain(a, b), power_at(n),
                                     effect, n, n), power_at)


def mean_test(name: str, differences: Sequence[float], effect: float, null: float = 0.0) -> PairedResult:
    """Is the mean per-image difference (variant minus given) above `null`? The one-sided paired t-test; its power
    for a true mean of `null + effect` from the noncentral t with the sample's spread. `gain` is the mean above
    `null`."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    spread = float(np.std(d, ddof=1)) if n > 1 else 0.0
    if n < 2:
        return PairedResult(name, 0.0, 1.0, 1.0, 0.0, effect, n, 2)
    mean = float(np.mean(d)) - null
    if spread == 0.0:               # every image the same difference: the sign of it decides
        return PairedResult(name, mean, 0.0 if mean > 0 else 1.0, mean, 1.0, effect, n, n)
    p = float(stats.t.sf(mean / (spread / np.sqrt(n)), n - 1))
    upper = mean + float(stats.t.isf(BOUND, n - 1)) * spread / np.sqrt(n)

    def power_at(size: int) -> float:
        if size < 2:
            return 0.0
        critical = stats.t.isf(LEVEL, size - 1)
        return float(stats.nct.sf(critical, size - 1, effect / (spread / np.sqrt(size))))

    return _with_needed(PairedResult(name, mean, p, upper, power_at(n), effect, n, n), power_at)
