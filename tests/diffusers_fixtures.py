"""Tiny randomly initialised diffusers models (fixed seeds), saved with save_pretrained: the
diffusers denoisers of the tests. Nothing is downloaded."""

import torch

TINY = dict(sample_size=8, block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=8)


def tiny_unet(seed: int = 0, channels: int = 3, out_channels=None, **overrides):
    """A UNet2DModel with ~45k parameters; its output is image-sized (or 2C with learned variance)."""
    from diffusers import UNet2DModel
    torch.manual_seed(seed)
    config = dict(TINY, in_channels=channels, out_channels=out_channels or channels)
    config.update(overrides)
    return UNet2DModel(**config).eval()


def save_pipeline(path, unet, scheduler):
    """A pipeline folder (model_index.json, unet/, scheduler/) as save_pretrained writes it."""
    from diffusers import CMStochasticIterativeScheduler, ConsistencyModelPipeline, DDPMPipeline
    cls = ConsistencyModelPipeline if isinstance(scheduler, CMStochasticIterativeScheduler) else DDPMPipeline
    cls(unet=unet, scheduler=scheduler).save_pretrained(str(path))
    return path
