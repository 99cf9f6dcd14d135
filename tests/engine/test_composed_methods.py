"""A method is a pairing of parts (docs/extending.md): a fifth method made of existing parts in this file alone
(DDS with a majority of K one-shot denoisings) certifies through the command line and the Python API, and a toy
purifier defined here composes with every head."""

import inspect
import json

import pytest
from cli_helpers import assert_rows_spread, invoke_ok, rows_without_time
from torch import nn

from diffsmooth.engine.base_classifier.denoise import load_denoiser
from diffsmooth.engine.base_classifier.methods import BUILT_IN, Method, register, unregister
from diffsmooth.engine.base_classifier.methods.config import MethodOption
from diffsmooth.engine.base_classifier.methods.head import Head
from diffsmooth.engine.base_classifier.methods.majority_vote_head import MajorityVoteHead
from diffsmooth.engine.base_classifier.methods.no_purifier import NoPurifier
from diffsmooth.engine.base_classifier.methods.one_shot_purifier import OneShotPurifier
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.pipelines import smoothed_classifier

FAST = ["--n0", "8", "--n", "40", "--batch", "16", "--quiet"]


# ---- the fifth method: one file's worth, parts that exist -------------------------------------------------------
class Denoisings(OneShotPurifier):
    """One-shot denoising with a setting K: its one sample handed over K times."""

    options = (MethodOption("denoisings", int, 3, 1, 64, "one-shot denoisings K that vote"),)
    copies_option = "denoisings"


class MajorityOfDenoisings(Method):
    """DDS with a majority of K one-shot denoisings: a one-shot denoising is deterministic, so its K labels agree
    and every vote is DDS's (what the test below checks)."""

    name = "dds-majority"
    line_name = "DDS (majority of K denoisings)"
    purifier = Denoisings
    head = MajorityVoteHead
    flip_rates = BUILT_IN[1].flip_rates                 # DDS's: the same classifier behind the same denoiser
# -----------------------------------------------------------------------------------------------------------------


# ---- a toy purifier, one file's worth: the noisy sample clipped to [0, 1] ----------------------------------------
class Clip(nn.Module):
    def forward(self, x):
        return x.clamp(0.0, 1.0)


class ClipPurifier(NoPurifier):
    """A purify stage of its own: x_rs clipped to the image range; it reads no UNet, so its run needs no denoiser."""

    purifies = True
    denoises = False

    def stage(self, sigma, denoiser, backend, fast=None):
        return backend.stage(Clip(), "clip")

    def key(self, sigma):
        return ("clip", float(sigma))

    def noise_left(self, sigma):
        return 0.0          # the demo classifiers aside: the tests give their classifier


def _heads():
    """Every head class the built-in methods use."""
    return list(dict.fromkeys(cls.head for cls in BUILT_IN))


@pytest.fixture
def methods():
    made = [MajorityOfDenoisings]
    for head in _heads():
        made.append(type(f"Clip{head.__name__}", (Method,), {
            "name": f"clip-{head.__name__.lower()}", "purifier": ClipPurifier, "head": head,
            "flip_rates": {"fp16": 1e-3, "bf16": 1e-2}}))
    for cls in made:
        register(cls)
    yield [cls.name for cls in made]
    for cls in made:
        unregister(cls.name)


def test_the_fifth_method_certifies_through_the_cli_and_the_api_as_dds(methods, tiny_models, tiny_cli_args, tmp_path):
    """K = 3 one-shot denoisings of one noisy sample agree, so the majority's rows are DDS's; the CLI's and the
    API's rows are equal; the votes spread over classes."""
    dds, majority, api_rows = tmp_path / "dds.tsv", tmp_path / "majority.tsv", tmp_path / "api.tsv"
    invoke_ok(["certify", *tiny_cli_args, "--method", "dds", *FAST, "--out", dds])
    invoke_ok(["certify", *tiny_cli_args, "--method", "dds-majority", "--option", "denoisings=3", *FAST,
               "--out", majority])
    assert_rows_spread(majority, min_classes=3)
    assert rows_without_time(majority) == rows_without_time(dds)
    model = smoothed_classifier("dds-majority", denoiser=load_denoiser(
        tiny_models["unet"], "cifar10", **json.loads(tiny_models["unet_config"])),
        classifier=load_classifier(tiny_models["classifier"], dataset="cifar10"), sigma=float(tiny_models["sigma"]),
        batch=16, denoisings=3)
    model.certify_dataset(load_dataset("npz", str(tiny_models["data"])), api_rows, n0=8, n=40, alpha=0.001)
    assert rows_without_time(api_rows) == rows_without_time(majority)
    assert len(inspect.getsourcelines(MajorityOfDenoisings)[0]) <= 60       # a method from existing parts: one file


def test_a_toy_purifier_composes_with_every_head(methods, tiny_models, tiny_cli_args, tmp_path):
    """The clip purifier behind each head: logits, a majority of its one sample, and local smoothing with one
    noise of sigma' 0 all vote the clipped sample's argmax, so their rows are equal (and not RS's: the clip ran).
    It reads no UNet (`denoises = False`): no `--denoiser` is given, through the CLI or the API."""
    assert len(_heads()) == 3 and all(issubclass(head, Head) for head in _heads())
    at = tiny_cli_args.index("--denoiser")
    no_denoiser = tiny_cli_args[:at] + tiny_cli_args[at + 2:]
    rows = {}
    for name in methods[1:]:
        out = tmp_path / f"{name}.tsv"
        invoke_ok(["certify", *no_denoiser, "--method", name, "--m", "1", "--local-sigma", "0", *FAST,
                   "--out", out])
        rows[name] = rows_without_time(out)
    invoke_ok(["certify", *no_denoiser, "--method", "rs", *FAST, "--out", tmp_path / "rs.tsv"])
    first = next(iter(rows.values()))
    assert all(r == first for r in rows.values()), list(rows)
    assert_rows_spread(tmp_path / f"{methods[1]}.tsv", min_classes=3)
    assert first != rows_without_time(tmp_path / "rs.tsv")
    api_rows = tmp_path / "api.tsv"
    model = smoothed_classifier(methods[1], classifier=load_classifier(tiny_models["classifier"], dataset="cifar10"),
                                sigma=float(tiny_models["sigma"]), batch=16)
    model.certify_dataset(load_dataset("npz", str(tiny_models["data"])), api_rows, n0=8, n=40, alpha=0.001)
    assert rows_without_time(api_rows) == rows_without_time(tmp_path / f"{methods[1]}.tsv")
