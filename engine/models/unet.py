"""Diffusion UNet that loads OpenAI's improved-diffusion (CIFAR-10) and guided-diffusion (ImageNet) checkpoints.

One implementation covers both: module names, parameter shapes and numerics follow the official
code (GroupNorm in float32, cos-then-sin timestep embedding, legacy per-head [q;k;v] attention with
a float32 softmax), while attention uses plain batched matmuls so the model exports to ONNX without
Einsum and without any gradient-checkpointing wrapper. `with_fused_attention()` gives a copy, sharing
the weights, whose attention runs through torch's scaled_dot_product_attention (the GPU fast path).
`eps_only()` gives an independent inference copy whose output convolution computes only the noise
estimate (the first in_channels outputs of a learned-sigma model); `lean_unet` in the fast path.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import MISSING, dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn

from diffsmooth.engine.errors import UserError

__all__ = [
    "UNetConfig",
    "PRESETS",
    "UNetModel",
    "unet_config",
    "timestep_embedding",
    "qkv_attention_legacy",
    "qkv_attention_fused",
]

_GROUPS = 32  # GroupNorm groups used by both reference UNets


def _int_tuple(value, name: str) -> tuple:
    """Accept a tuple/list of numbers or a comma-separated string ("16,8") for tuple-valued fields."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        try:
            return tuple(int(p) for p in parts)
        except ValueError:
            raise UserError(f"UNet config {name}={value!r}: expected comma-separated integers like '16,8'") from None
    if isinstance(value, (int, float)):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        raise UserError(f"UNet config {name}={value!r}: expected a tuple of integers") from None


@dataclass(frozen=True, kw_only=True)
class UNetConfig:
    """Hyper-parameters of the UNet, named as in the official training flags.

    attention_resolutions are feature-map RESOLUTIONS (e.g. (16, 8) at image_size 32), converted
    internally to downsampling rates image_size // res as the official scripts do.
    """

    image_size: int
    in_channels: int = 3
    model_channels: int
    num_res_blocks: int
    attention_resolutions: tuple[int, ...]
    dropout: float = 0.0
    channel_mult: tuple[int, ...]
    num_heads: int = 4
    num_head_channels: int = -1
    num_heads_upsample: int = -1
    use_scale_shift_norm: bool = True
    resblock_updown: bool = False
    learn_sigma: bool = False
    conv_resample: bool = True

    def __post_init__(self):
        object.__setattr__(self, "attention_resolutions", _int_tuple(self.attention_resolutions, "attention_resolutions"))
        object.__setattr__(self, "channel_mult", _int_tuple(self.channel_mult, "channel_mult"))
        self._validate()

    @property
    def out_channels(self) -> int:
        """Output channels: the noise estimate, plus the variance interpolation when learn_sigma."""
        return 2 * self.in_channels if self.learn_sigma else self.in_channels

    @property
    def downsample_factor(self) -> int:
        """Total spatial downsampling; input height and width must be multiples of it."""
        return 2 ** (len(self.channel_mult) - 1)

    @property
    def attention_ds(self) -> frozenset[int]:
        """Downsampling rates (1, 2, 4, ...) at which attention blocks are inserted."""
        return frozenset(self.image_size // r for r in self.attention_resolutions)

    def heads_for(self, channels: int, upsample: bool = False) -> int:
        """Number of attention heads for a block with `channels` channels (official rule)."""
        if self.num_head_channels != -1:
            return channels // self.num_head_channels
        if upsample and self.num_heads_upsample != -1:
            return self.num_heads_upsample
        return self.num_heads

    def _validate(self) -> None:
        def bad(msg: str):
            raise UserError(f"invalid UNet config: {msg}")

        for name in ("image_size", "in_channels", "model_channels", "num_res_blocks"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(f"{name} must be a positive integer, got {v!r}")
        if not self.channel_mult or any((not isinstance(m, (int, float))) or m <= 0 for m in self.channel_mult):
            bad(f"channel_mult must be a non-empty tuple of positive numbers, got {self.channel_mult!r}")
        if not 0.0 <= float(self.dropout) < 1.0:
            bad(f"dropout must be in [0, 1), got {self.dropout!r}")
        for mult in self.channel_mult:
            ch = int(mult * self.model_channels)
            if ch % _GROUPS:
                bad(f"channel count {ch} (model_channels {self.model_channels} x mult {mult}) is not a multiple of "
                    f"{_GROUPS} (GroupNorm groups)")
        reachable = {2**level for level in range(len(self.channel_mult))}
        for res in self.attention_resolutions:
            if not isinstance(res, int) or res < 1 or self.image_size % res or self.image_size // res not in reachable:
                bad(
                    f"attention resolution {res!r} is not a feature-map size of this UNet "
                    f"(image_size {self.image_size}, sizes {sorted((self.image_size // d for d in reachable), reverse=True)})"
                )
        if self.num_head_channels != -1 and self.num_head_channels < 1:
            bad(f"num_head_channels must be -1 or positive, got {self.num_head_channels}")
        if self.num_heads < 1:
            bad(f"num_heads must be positive, got {self.num_heads}")
        if self.num_heads_upsample != -1 and self.num_heads_upsample < 1:
            bad(f"num_heads_upsample must be -1 or positive, got {self.num_heads_upsample}")
        attn_levels = [lvl for lvl in range(len(self.channel_mult)) if 2**lvl in self.attention_ds]
        attn_channels = {int(self.channel_mult[lvl] * self.model_channels) for lvl in attn_levels}
        attn_channels.add(int(self.channel_mult[-1] * self.model_channels))  # middle block
        for ch in sorted(attn_channels):
            for up in (False, True):
                heads = self.heads_for(ch, up)
                if heads < 1 or ch % heads or (self.num_head_channels != -1 and ch % self.num_head_channels):
                    bad(f"{ch} attention channels cannot be split into heads (num_heads {self.num_heads}, "
                        f"num_head_channels {self.num_head_channels})")


PRESETS: dict[str, UNetConfig] = {
    # improved-diffusion cifar10_uncond_50M_500K.pt (cosine schedule, T=4000, rescaled float timesteps).
    "cifar10": UNetConfig(
        image_size=32,
        in_channels=3,
        model_channels=128,
        num_res_blocks=3,
        attention_resolutions=(16, 8),
        dropout=0.3,
        channel_mult=(1, 2, 2, 2),
        num_heads=4,
        use_scale_shift_norm=True,
        learn_sigma=True,
    ),
    # guided-diffusion 256x256_diffusion_uncond.pt (linear schedule, T=1000, integer timesteps).
    "imagenet": UNetConfig(
        image_size=256,
        in_channels=3,
        model_channels=256,
        num_res_blocks=2,
        attention_resolutions=(32, 16, 8),
        dropout=0.0,
        channel_mult=(1, 1, 2, 2, 4, 4),
        num_heads=4,
        num_head_channels=64,
        use_scale_shift_norm=True,
        resblock_updown=True,
        learn_sigma=True,
    ),
    # Small 1-channel denoiser trained by the project's demo trainer (Fashion-MNIST padded to 32x32);
    # 877k parameters (3.5 MB fp32), sized for ~20 minutes of CPU training (engine/demo/training.py).
    "demo": UNetConfig(
        image_size=32,
        in_channels=1,
        model_channels=32,
        num_res_blocks=1,
        attention_resolutions=(8,),
        dropout=0.0,
        channel_mult=(1, 1, 2),
        num_heads=4,
        use_scale_shift_norm=True,
        learn_sigma=False,
    ),
}


def unet_config(preset: str | None = "cifar10", **overrides) -> UNetConfig:
    """Build a UNetConfig from a preset name plus field overrides (preset None: overrides give every field)."""
    names = [f.name for f in fields(UNetConfig)]
    unknown = [k for k in overrides if k not in names]
    if unknown:
        raise UserError(f"unknown UNet config key(s) {', '.join(unknown)}; valid keys: {', '.join(names)}")
    if preset is None:
        required = [f.name for f in fields(UNetConfig) if f.default is MISSING and f.default_factory is MISSING]
        missing = [k for k in required if k not in overrides]
        if missing:
            raise UserError(f"UNet config without a preset needs {', '.join(missing)} (or pick a preset: {', '.join(PRESETS)})")
        return UNetConfig(**overrides)
    if preset not in PRESETS:
        raise UserError(f"unknown UNet preset {preset!r}; known presets: {', '.join(PRESETS)}")
    return replace(PRESETS[preset], **overrides) if overrides else PRESETS[preset]


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


class GroupNorm32(nn.GroupNorm):
    """GroupNorm(32) evaluated in float32 and cast back to the input dtype, as in the references.

    The affine parameters are also used in float32, so a model cast to half/bfloat16 still works.
    """

    def __init__(self, channels: int):
        super().__init__(_GROUPS, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.group_norm(x.float(), self.num_groups, self.weight.float(), self.bias.float(), self.eps)
        return y.to(x.dtype)


def _zeroed(module: nn.Module) -> nn.Module:
    """Zero a module's parameters (the references zero-initialise output convolutions)."""
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
    return module


def timestep_embedding(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding [B, dim] of (possibly fractional) timesteps: cos half, then sin half, in float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32, device=timesteps.device) / half)
    args = timesteps[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


def qkv_attention_legacy(qkv: torch.Tensor, num_heads: int, head_channels: int | None = None) -> torch.Tensor:
    """Self-attention on [B, heads*3*ch, T] laid out per head as [q;k;v]; returns [B, heads*ch, T].

    q and k are each scaled by ch**-0.25 before the product and the softmax runs in float32, as
    in the references; batched matmuls replace einsum so ONNX export has no Einsum node.
    Passing head_channels (known when the block is built) keeps traced exports free of shape math.
    """
    length = qkv.shape[-1]
    ch = head_channels if head_channels is not None else qkv.shape[1] // (3 * num_heads)
    q, k, v = qkv.reshape(-1, 3 * ch, length).split(ch, dim=1)  # [B*heads, ch, T] each
    scale = 1.0 / math.sqrt(math.sqrt(ch))
    weight = torch.bmm((q * scale).transpose(1, 2), k * scale)  # [B*heads, T(query), S(key)]
    weight = torch.softmax(weight.float(), dim=-1).to(weight.dtype)
    out = torch.bmm(v, weight.transpose(1, 2))  # [B*heads, ch, T]
    return out.reshape(-1, num_heads * ch, length)


def qkv_attention_fused(qkv: torch.Tensor, num_heads: int, head_channels: int) -> torch.Tensor:
    """qkv_attention_legacy's maths on token-major input [B, T, heads*3*ch] (per head [q;k;v]),
    returning [B, T, heads*ch], through F.scaled_dot_product_attention (its scale 1/sqrt(ch) equals
    the two ch**-0.25 factors). q, k and v are views whose last dimension has stride 1, which the
    flash / memory-efficient CUDA kernels require (otherwise SDPA falls back to its unfused maths);
    they never write the [heads, T, T] weights to memory."""
    batch, length, _ = qkv.shape
    q, k, v = qkv.reshape(batch, length, num_heads, 3 * head_channels).split(head_channels, dim=-1)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2).reshape(batch, length, num_heads * head_channels)


class _TakesEmbedding(nn.Module):
    """Marker base: modules whose forward takes (x, emb)."""


class EmbedSequential(nn.Sequential):
    """Sequential container that hands the timestep embedding to the children that take one."""

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        for layer in self:
            x = layer(x, emb) if isinstance(layer, _TakesEmbedding) else layer(x)
        return x


def _is_compiling() -> bool:
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(fn()) if fn is not None else False


def _upsample2x(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, scale_factor=2, mode="nearest")


def _downsample2x(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x, kernel_size=2, stride=2)


class Upsample(nn.Module):
    """Nearest-neighbour 2x upsampling, optionally followed by a 3x3 conv (parameter `conv`)."""

    def __init__(self, channels: int, use_conv: bool):
        super().__init__()
        self.use_conv = use_conv
        if use_conv:
            self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _upsample2x(x)
        return self.conv(x) if self.use_conv else x


class Downsample(nn.Module):
    """2x downsampling: a stride-2 3x3 conv (parameter `op`) or 2x2 average pooling."""

    def __init__(self, channels: int, use_conv: bool):
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1) if use_conv else nn.AvgPool2d(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class ResBlock(_TakesEmbedding):
    """Residual block conditioned on the timestep embedding (additive or scale-shift), optionally resampling.

    With up/down (guided-diffusion's resblock_updown) both branches are resampled without
    parameters (nearest / average pool) between the first norm+SiLU and the first conv.
    """

    def __init__(
        self,
        channels: int,
        emb_channels: int,
        dropout: float,
        out_channels: int | None = None,
        use_scale_shift_norm: bool = True,
        up: bool = False,
        down: bool = False,
    ):
        super().__init__()
        out_channels = out_channels or channels
        self.use_scale_shift_norm = use_scale_shift_norm
        self.resample = _upsample2x if up else _downsample2x if down else None
        self.in_layers = nn.Sequential(GroupNorm32(channels), nn.SiLU(), nn.Conv2d(channels, out_channels, 3, padding=1))
        self.emb_layers = nn.Sequential(
            nn.SiLU(), nn.Linear(emb_channels, 2 * out_channels if use_scale_shift_norm else out_channels)
        )
        self.out_layers = nn.Sequential(
            GroupNorm32(out_channels),
            nn.SiLU(),
            nn.Dropout(p=dropout),
            _zeroed(nn.Conv2d(out_channels, out_channels, 3, padding=1)),
        )
        self.skip_connection = nn.Identity() if out_channels == channels else nn.Conv2d(channels, out_channels, 1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        norm_in, act_in, conv_in = self.in_layers
        if self.resample is not None:
            h = conv_in(self.resample(act_in(norm_in(x))))
            x = self.resample(x)
        else:
            h = conv_in(act_in(norm_in(x)))
        e = self.emb_layers(emb).to(h.dtype)[:, :, None, None]
        norm_out, act_out, drop, conv_out = self.out_layers
        if self.use_scale_shift_norm:
            scale, shift = torch.chunk(e, 2, dim=1)
            h = norm_out(h) * (1 + scale) + shift
        else:
            h = norm_out(h + e)
        h = conv_out(drop(act_out(h)))
        return self.skip_connection(x) + h


class AttentionBlock(nn.Module):
    """Spatial self-attention with a residual connection; qkv and proj_out are 1x1 Conv1d as in the checkpoints."""

    fused = False       # True: qkv_attention_fused (set on copies made by UNetModel.with_fused_attention)

    def __init__(self, channels: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_channels = channels // num_heads
        self.norm = GroupNorm32(channels)
        self.qkv = nn.Conv1d(channels, 3 * channels, 1)
        self.proj_out = _zeroed(nn.Conv1d(channels, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, height, width = x.shape
        x = x.reshape(b, c, height * width)
        if self.fused:
            return (x + self._fused_attention(self.norm(x))).reshape(b, c, height, width)
        h = qkv_attention_legacy(self.qkv(self.norm(x)), self.num_heads, self.head_channels)
        h = self.proj_out(h)
        return (x + h).reshape(b, c, height, width)

    def _fused_attention(self, h: torch.Tensor) -> torch.Tensor:
        """[B, C, T] -> [B, C, T]: the 1x1 convolutions as linear maps on tokens, so that q, k, v
        come out token-major for qkv_attention_fused."""
        tokens = F.linear(h.transpose(1, 2), self.qkv.weight.squeeze(-1), self.qkv.bias)
        out = qkv_attention_fused(tokens, self.num_heads, self.head_channels)
        return F.linear(out, self.proj_out.weight.squeeze(-1), self.proj_out.bias).transpose(1, 2)


# ---------------------------------------------------------------------------------------------
# The UNet
# ---------------------------------------------------------------------------------------------


class UNetModel(nn.Module):
    """Timestep-conditioned UNet predicting noise (and the variance interpolation when learn_sigma).

    forward(x [B, C, H, W], timesteps [B] float or int) -> [B, out_channels, H, W]; H and W must be
    multiples of config.downsample_factor (224 works with the ImageNet preset). Timesteps of shape [1]
    serve every image: the time embedding and each ResBlock's projection of it are computed once, at
    batch 1, and broadcast (the same numbers as [B] equal timesteps, up to the last bit of a matmul).
    """

    def __init__(self, config: UNetConfig):
        super().__init__()
        if not isinstance(config, UNetConfig):
            raise UserError(f"UNetModel needs a UNetConfig, got {type(config).__name__}")
        self.config = cfg = config
        mc = cfg.model_channels
        emb_dim = 4 * mc
        attn_ds = cfg.attention_ds
        dropout = float(cfg.dropout)

        def res(ch_in, ch_out=None, **kw):
            return ResBlock(ch_in, emb_dim, dropout, ch_out, cfg.use_scale_shift_norm, **kw)

        self.time_embed = nn.Sequential(nn.Linear(mc, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))

        ch = int(cfg.channel_mult[0] * mc)
        self.input_blocks = nn.ModuleList([EmbedSequential(nn.Conv2d(cfg.in_channels, ch, 3, padding=1))])
        skip_channels = [ch]
        ds = 1
        last_level = len(cfg.channel_mult) - 1
        for level, mult in enumerate(cfg.channel_mult):
            for _ in range(cfg.num_res_blocks):
                layers: list[nn.Module] = [res(ch, int(mult * mc))]
                ch = int(mult * mc)
                if ds in attn_ds:
                    layers.append(AttentionBlock(ch, cfg.heads_for(ch)))
                self.input_blocks.append(EmbedSequential(*layers))
                skip_channels.append(ch)
            if level != last_level:
                down = res(ch, ch, down=True) if cfg.resblock_updown else Downsample(ch, cfg.conv_resample)
                self.input_blocks.append(EmbedSequential(down))
                skip_channels.append(ch)
                ds *= 2

        self.middle_block = EmbedSequential(res(ch), AttentionBlock(ch, cfg.heads_for(ch)), res(ch))

        self.output_blocks = nn.ModuleList()
        for level, mult in reversed(list(enumerate(cfg.channel_mult))):
            for i in range(cfg.num_res_blocks + 1):
                layers = [res(ch + skip_channels.pop(), int(mult * mc))]
                ch = int(mult * mc)
                if ds in attn_ds:
                    layers.append(AttentionBlock(ch, cfg.heads_for(ch, upsample=True)))
                if level and i == cfg.num_res_blocks:
                    layers.append(res(ch, ch, up=True) if cfg.resblock_updown else Upsample(ch, cfg.conv_resample))
                    ds //= 2
                self.output_blocks.append(EmbedSequential(*layers))

        self.out = nn.Sequential(
            GroupNorm32(ch), nn.SiLU(), _zeroed(nn.Conv2d(ch, cfg.out_channels, 3, padding=1))
        )

    def with_fused_attention(self) -> "UNetModel":
        """A copy that shares this model's parameters and buffers (no memory for weights) and runs
        its attention blocks through scaled_dot_product_attention; this model is left unchanged."""
        shared = {id(t): t for t in itertools.chain(self.parameters(), self.buffers())}
        clone = copy.deepcopy(self, shared)
        for block in clone.modules():
            if isinstance(block, AttentionBlock):
                block.fused = True
        return clone

    def eps_only(self) -> "UNetModel":
        """An inference copy that computes only the noise estimate: for a learned-sigma model the output
        convolution keeps the first in_channels of its 2 x in_channels filters (the variance
        interpolation is never computed); otherwise the same outputs. It shares no tensor and no module
        with this model (its sliced filters are copies), so nothing done to one reaches the other."""
        clone = copy.deepcopy(self)
        conv = clone.out[2]
        keep = self.config.in_channels
        if conv.out_channels != keep:
            sliced = nn.Conv2d(conv.in_channels, keep, conv.kernel_size, conv.stride, conv.padding,
                               device=conv.weight.device, dtype=conv.weight.dtype)
            with torch.no_grad():
                sliced.weight.copy_(conv.weight[:keep])
                sliced.bias.copy_(conv.bias[:keep])
            clone.out[2] = sliced
        clone.output_channels = keep
        return clone

    @property
    def computes_channels(self) -> int:
        """Output channels this module computes (config.out_channels, or in_channels after eps_only)."""
        return getattr(self, "output_channels", self.config.out_channels)

    def _check_input(self, x: torch.Tensor, timesteps: torch.Tensor) -> None:
        cfg = self.config
        if x.dim() != 4 or x.shape[1] != cfg.in_channels:
            raise UserError(f"UNet expects images [B, {cfg.in_channels}, H, W], got shape {tuple(x.shape)}")
        f = cfg.downsample_factor
        if x.shape[2] % f or x.shape[3] % f:
            raise UserError(
                f"UNet input size {x.shape[2]}x{x.shape[3]} is not a multiple of {f} "
                f"({len(cfg.channel_mult)} resolution levels); resize or pad the images"
            )
        if timesteps.dim() != 1 or timesteps.shape[0] not in (x.shape[0], 1):
            raise UserError(f"UNet timesteps must have shape [{x.shape[0]}] (or [1]: one timestep for every "
                            f"image), got {tuple(timesteps.shape)}")

    def forward(self, x: torch.Tensor, timesteps) -> torch.Tensor:
        if not isinstance(timesteps, torch.Tensor):
            timesteps = torch.as_tensor(timesteps, device=x.device)
        if timesteps.dim() == 0:
            timesteps = timesteps.reshape(1).expand(x.shape[0])
        if not (torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or _is_compiling()):
            self._check_input(x, timesteps)
        weight = self.time_embed[0].weight
        emb = self.time_embed(timestep_embedding(timesteps, self.config.model_channels).to(weight.dtype))
        h = x.to(self.input_blocks[0][0].weight.dtype)
        skips = []
        for block in self.input_blocks:
            h = block(h, emb)
            skips.append(h)
        h = self.middle_block(h, emb)
        for block in self.output_blocks:
            h = block(torch.cat([h, skips.pop()], dim=1), emb)
        return self.out(h).to(x.dtype)
