"""DensePure (Xiao et al., ICLR 2023): each noisy sample is purified K times by a short reverse diffusion chain
(reverse_chains_purifier.py: its settings reverse_runs K and steps S), the classifier labels each of the K results,
and their majority votes (majority_vote_head.py). docs/methods.md."""

from __future__ import annotations

from diffsmooth.engine.base_classifier.methods.base import Method
from diffsmooth.engine.base_classifier.methods.majority_vote_head import MajorityVoteHead
from diffsmooth.engine.base_classifier.methods.reverse_chains_purifier import ReverseChainsPurifier


class DensePureMethod(Method):
    name = "densepure"
    line_name = "DensePure"
    purifier = ReverseChainsPurifier
    head = MajorityVoteHead
    # Estimated, not measured: DDS's measured rates (a clean-trained classifier behind the same UNet) doubled for the
    # chain's extra UNet calls; a majority of K runs flips less often than one run. To measure: bench.agreement.
    flip_rates = {"fp16": 2.2e-3, "bf16": 3.4e-2}
