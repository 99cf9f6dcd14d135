"""The command line's number types: a finite float within bounds and an integer count within bounds,
each refusing a bad value with one line that names the option; and the numbers the commands share, each
with the range the engine can take (engine/choices.py)."""

from __future__ import annotations

import math

import click

from diffsmooth.engine.choices import (
    MAX_BATCH,
    MAX_DIFFUSION_STEPS,
    MAX_LOCAL_NOISES,
    MAX_SAMPLES,
    MAX_SEED,
    MAX_THREADS,
    METHODS,
)


class Number(click.ParamType):
    """A finite float (`float()` also takes 'nan' and 'inf') within [low, high] (open ends: low_open /
    high_open); `label` names it in the message ('sigma must be > 0, got -1.0')."""

    name = "number"

    def __init__(self, low=None, high=None, low_open=False, high_open=False, label=None):
        self.low, self.high, self.low_open, self.high_open, self.label = low, high, low_open, high_open, label

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        label = self.label or (param.name.replace("_", " ") if param is not None else "the value")
        if not math.isfinite(number):
            self.fail(f"{label} must be a finite number, got {value!r}", param, ctx)
        below = self.low is not None and (number <= self.low if self.low_open else number < self.low)
        above = self.high is not None and (number >= self.high if self.high_open else number > self.high)
        if below or above:
            if self.low is not None and self.high is not None:
                where = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
            elif self.low is not None:
                where = f"{'>' if self.low_open else '>='} {self.low:g}"
            else:
                where = f"{'<' if self.high_open else '<='} {self.high:g}"
            self.fail(f"{label} must be {where}, got {number!r}", param, ctx)
        return number + 0.0                     # -0.0 -> 0.0: one spelling in recorded settings


class MethodName(click.Choice):
    """A registered method's name (engine/base_classifier/methods/): the built-in ones in the help, any registered
    one accepted, read from the registry when the option is parsed (so `--help` loads no torch)."""

    def __init__(self):
        super().__init__(METHODS)

    def convert(self, value, param, ctx):
        from diffsmooth.engine.base_classifier.methods import method_names
        shown, self.choices = self.choices, method_names()      # the registry's names for this value only
        try:
            return super().convert(value, param, ctx)
        finally:
            self.choices = shown


class Count(click.ParamType):
    """An integer in [low, high]; `why` says where the upper bound comes from."""

    name = "integer"

    def __init__(self, low=1, high=None, why=None, label=None):
        self.low, self.high, self.why, self.label = low, high, why, label

    def convert(self, value, param, ctx):
        number = click.INT.convert(value, param, ctx)
        label = f"{self.label} " if self.label else ""
        if self.low is not None and number < self.low:
            self.fail(f"{label}must be >= {self.low}, got {number}", param, ctx)
        if self.high is not None and number > self.high:
            self.fail(f"{label}must be <= {self.high:,}{f' ({self.why})' if self.why else ''}, got {number}", param, ctx)
        return number


SIGMA = Number(0, low_open=True, label="sigma")
LOCAL_SIGMA = Number(0, label="local sigma")
ALPHA = Number(0, 1, low_open=True, high_open=True, label="alpha")
SEED = Count(0, MAX_SEED, "seeds are 64-bit noise keys")
SAMPLES = Count(1, MAX_SAMPLES, "Monte Carlo sample indices are 32-bit")
BATCH = Count(1, MAX_BATCH, "buffers of the batch size are allocated up front")
THREADS = Count(1, MAX_THREADS)
LOCAL_NOISES = Count(1, MAX_LOCAL_NOISES, "m classifier calls per sample", label="m (local noises)")
DIFFUSION_STEPS = Count(1, MAX_DIFFUSION_STEPS)
METHOD = MethodName()
