"""The one probe of a backend's built stages: a blank sample through them, so a shape the models cannot take
becomes one line before a run instead of a stack trace mid-run (every backend's stages and a sweep's are probed
here)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from diffsmooth.engine.certify.noise import STREAM_PURIFY, NoiseKeys, RowNoise
from diffsmooth.engine.errors import UserError, first_line
from diffsmooth.engine.stages.base import BaseClassifierStages


def probe(stages: BaseClassifierStages, image_shape: Tuple[int, ...]) -> int:
    """Run one blank sample through the stages: a shape the models cannot take becomes one clear
    error here instead of a stack trace mid-run. Returns the number of classes scored.
    Compiled stages are probed through their eager form, so no graph is compiled for batch 1."""
    blank = x = torch.full((1, *image_shape), 0.5, device=stages.device)
    purify = getattr(stages.purify, "eager", stages.purify)
    score = getattr(stages.score, "eager", stages.score)
    try:
        if purify is not None:
            x = purify(x, RowNoise(NoiseKeys(0, STREAM_PURIFY, stages.device), *[torch.zeros(1, dtype=torch.int64,
                       device=stages.device)] * 2)) if stages.purify_noise else purify(x)
            want = tuple(stages.purified_shape or image_shape)
            if tuple(x.shape[1:]) != want:
                raise UserError(f"the denoiser returned shape {tuple(x.shape[1:])} for input {tuple(image_shape)}")
        inputs = [x if name == "denoised" else blank for name in stages.inputs]
        if stages.local_noise_shape is not None:
            inputs.append(torch.zeros((1, *stages.local_noise_shape), device=stages.device))
        out = score(*inputs)
    except RuntimeError as exc:
        raise UserError(f"the models cannot take images of shape {tuple(image_shape)} "
                        f"({stages.describe()}): {first_line(exc)}") from exc
    if out.dim() != (2 if not stages.configs else 3):
        want = "[B, classes]" if not stages.configs else "[B, configurations, classes]"
        raise UserError(f"the classifier stage returned shape {tuple(out.shape)}, expected {want}")
    return int(out.shape[-1])


def refuse_too_few_classes(what: str, scored: Optional[int], num_classes: Optional[int]) -> None:
    """One line when `what` scores fewer classes than the data's labels need (nothing where either is unknown): the
    one class-count check of every backend, a sweep and an exported graph's manifest."""
    if num_classes is not None and scored is not None and int(scored) < int(num_classes):
        raise UserError(f"the data has labels up to {int(num_classes) - 1} but {what} scores only {int(scored)} classes")


def probed(stages: BaseClassifierStages, image_shape: Tuple[int, ...], num_classes: Optional[int],
           what: str = "the classifier") -> BaseClassifierStages:
    """The stages, probed once (probe) with the classes they score recorded and checked against the data's."""
    stages.num_classes = probe(stages, tuple(image_shape))
    refuse_too_few_classes(what, stages.num_classes, num_classes)
    return stages
