"""Reading a diffusers denoiser folder: which files, which configs, which kind, and its identity.

A pipeline folder (`model_index.json` with `unet/` and `scheduler/`, as `save_pretrained` writes it)
or a UNet folder (`config.json` + safetensors) with its scheduler folder given separately. The
engine takes pixel-space, unconditional `UNet2DModel`s with a DDPM-family scheduler (`DDPMScheduler`,
`DDIMScheduler`) or a consistency model's `CMStochasticIterativeScheduler`; everything else is
refused here in one line, before any weight is read. Weights come from safetensors files only (a
pickle could run code). Nothing in this module imports torch or diffusers.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional, Tuple

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.hashing import sha256_file

__all__ = ["DiffusersFolder", "read_diffusers_folder", "is_diffusers_folder", "denoiser_identity", "folder_identity", "SUPPORTED"]

UNET_CLASS = "UNet2DModel"
DDPM_SCHEDULERS = ("DDPMScheduler", "DDIMScheduler")
CONSISTENCY_SCHEDULERS = ("CMStochasticIterativeScheduler",)
LEARNED_VARIANCE = ("learned", "learned_range")
WEIGHTS = "diffusion_pytorch_model.safetensors"
WEIGHTS_INDEX = "diffusion_pytorch_model.safetensors.index.json"
PICKLE_WEIGHTS = ("diffusion_pytorch_model.bin", "pytorch_model.bin", "diffusion_pytorch_model.ckpt")
# Pipeline components that mean latent or text-conditioned diffusion (the smoothing noise would not be
# the noise the model removes: it lives in pixel space, the latents do not).
LATENT_OR_TEXT = ("vae", "vqvae", "text_encoder", "text_encoder_2", "tokenizer", "image_encoder", "prior")
SUPPORTED = (f"a pixel-space, unconditional {UNET_CLASS} with {', '.join(DDPM_SCHEDULERS)} or "
             f"{CONSISTENCY_SCHEDULERS[0]}")
WHY = "the smoothing noise lives in pixel space, so the denoiser must be a pixel-space model that takes no condition"


def _refuse(what: str) -> UserError:
    return UserError(f"{what}; the engine takes {SUPPORTED} ({WHY})")


@dataclass(frozen=True)
class DiffusersFolder:
    """A checked diffusers denoiser: where its UNet and scheduler are, their configs and weight files."""

    path: Path
    unet_dir: Path
    scheduler_dir: Path
    unet_config: dict
    scheduler_config: dict
    weights: Tuple[Path, ...]

    @property
    def scheduler_class(self) -> str:
        return self.scheduler_config["_class_name"]

    @property
    def kind(self) -> str:
        """'ddpm' (DDPM family, one-shot x0 at t*) or 'consistency' (one consistency-function call)."""
        return "consistency" if self.scheduler_class in CONSISTENCY_SCHEDULERS else "ddpm"

    @property
    def channels(self) -> int:
        return int(self.unet_config.get("in_channels", 3))

    @property
    def image_shape(self) -> Tuple[int, int, int]:
        """C,H,W the UNet was trained at (`in_channels`, `sample_size`: an int or [H, W])."""
        size = self.unet_config.get("sample_size") or 32
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        return self.channels, int(h), int(w)

    @property
    def format(self) -> str:
        """The format a run records: the classes the folder was saved with."""
        return f"diffusers {UNET_CLASS} + {self.scheduler_class}"

    def describe(self) -> str:
        return f"{self.format} from {self.path}"


def is_diffusers_folder(path) -> bool:
    """A denoiser given as a folder is a diffusers folder (checkpoints are files)."""
    return path is not None and Path(path).is_dir()


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise _refuse(f"{path.parent} has no {path.name} ({what})")
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read {what} ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); "
                        f"save the model again with save_pretrained") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: {what} is a JSON {type(value).__name__}, not an object; save the model again")
    return value


def _component(index: dict, name: str, folder: Path) -> Optional[str]:
    """The class model_index.json names for a component (None when absent or null)."""
    entry = index.get(name)
    if entry is None or (isinstance(entry, (list, tuple)) and (len(entry) < 2 or entry[1] is None)):
        return None
    if isinstance(entry, (list, tuple)) and isinstance(entry[1], str):
        return entry[1]
    raise UserError(f"{folder / 'model_index.json'}: entry {name!r} is {entry!r}, not [library, class]")


def _scheduler_dir(scheduler) -> Path:
    """--scheduler: a folder holding scheduler_config.json, or a pipeline folder with scheduler/."""
    p = Path(scheduler)
    if not p.is_dir():
        raise UserError(f"scheduler folder not found: {p} (give the folder that holds scheduler_config.json)")
    if not (p / "scheduler_config.json").is_file() and (p / "scheduler" / "scheduler_config.json").is_file():
        return p / "scheduler"
    return p


def _locate(folder: Path, scheduler) -> Tuple[Path, Path, Optional[dict]]:
    """(unet folder, scheduler folder, model_index or None)."""
    if (folder / "model_index.json").is_file():
        if scheduler is not None:
            raise UserError(f"{folder} is a pipeline folder with its own scheduler/; leave out `scheduler` "
                            f"(it is for a UNet folder saved on its own)")
        index = _read_json(folder / "model_index.json", "the pipeline's index")
        found = sorted(k for k in LATENT_OR_TEXT if _component(index, k, folder))
        if found:
            raise _refuse(f"{folder} is a {index.get('_class_name', 'pipeline')} with {', '.join(found)}: a latent "
                          f"or text-conditioned pipeline")
        for name in ("unet", "scheduler"):
            if _component(index, name, folder) is None:
                raise _refuse(f"{folder / 'model_index.json'} names no {name!r} component")
        return folder / "unet", folder / "scheduler", index
    if (folder / "config.json").is_file():
        if scheduler is None:
            raise UserError(f"{folder} is a UNet folder without a scheduler: give its scheduler folder as `scheduler` "
                            f"(the folder with scheduler_config.json)")
        return folder, _scheduler_dir(scheduler), None
    raise UserError(f"{folder} is a folder but not a diffusers model (no model_index.json or config.json); "
                    f"give a pipeline folder saved with save_pretrained, or a checkpoint file")


def _check_unet_config(config: dict, where: Path) -> None:
    name = config.get("_class_name")
    if name != UNET_CLASS:
        raise _refuse(f"{where} holds {name or 'a model without _class_name'}")
    if config.get("num_class_embeds") is not None or config.get("class_embed_type") is not None:
        raise _refuse(f"{where} is a class-conditional {UNET_CLASS} (num_class_embeds / class_embed_type set)")
    c_in, c_out = config.get("in_channels", 3), config.get("out_channels", 3)
    if not isinstance(c_in, int) or not isinstance(c_out, int) or c_in < 1:
        raise UserError(f"{where}: in_channels={c_in!r}, out_channels={c_out!r} are not channel counts; save the model again")
    if c_out != c_in and c_out != 2 * c_in:
        raise UserError(f"{where}: out_channels={c_out} is neither in_channels={c_in} nor 2 x {c_in} (learned "
                        f"variance): the model does not predict an image-shaped output")


def _check_scheduler_config(config: dict, where: Path, unet_config: dict) -> None:
    name = config.get("_class_name")
    if name not in DDPM_SCHEDULERS + CONSISTENCY_SCHEDULERS:
        raise _refuse(f"{where} holds {name or 'a scheduler without _class_name'}")
    c_in, c_out = unet_config.get("in_channels", 3), unet_config.get("out_channels", 3)
    if c_out == 2 * c_in and name in DDPM_SCHEDULERS and config.get("variance_type") not in LEARNED_VARIANCE:
        raise UserError(f"{where}: the UNet has {c_out} = 2 x {c_in} output channels (learned variance) but the "
                        f"scheduler's variance_type is {config.get('variance_type')!r}, not one of "
                        f"{', '.join(LEARNED_VARIANCE)}: the configs do not belong together")


def _weight_files(unet_dir: Path) -> Tuple[Path, ...]:
    single = unet_dir / WEIGHTS
    if single.is_file():
        return (single,)
    index = unet_dir / WEIGHTS_INDEX
    if index.is_file():
        mapping = _read_json(index, "the weights' shard index").get("weight_map")
        if not isinstance(mapping, dict) or not mapping:
            raise UserError(f"{index}: no weight_map; save the model again")
        shards = tuple(unet_dir / name for name in sorted(set(mapping.values())))
        missing = [s.name for s in shards if not s.is_file()]
        if missing:
            raise UserError(f"{unet_dir}: weight shard(s) {', '.join(missing[:3])} named in {index.name} are missing")
        return shards
    variants = sorted(unet_dir.glob("diffusion_pytorch_model.*.safetensors"))
    if len(variants) == 1:
        return (variants[0],)
    if variants:
        raise UserError(f"{unet_dir} holds several weight variants ({', '.join(v.name for v in variants)}) and no "
                        f"{WEIGHTS}: keep one of them")
    pickles = [name for name in PICKLE_WEIGHTS if (unet_dir / name).is_file()]
    if pickles:
        raise UserError(f"{unet_dir} holds only pickle weights ({pickles[0]}): the engine reads safetensors only, "
                        f"since a pickle can run code; re-save with save_pretrained(..., safe_serialization=True)")
    raise UserError(f"{unet_dir} has no weights ({WEIGHTS}); save the model with save_pretrained")


def read_diffusers_folder(path, scheduler=None) -> DiffusersFolder:
    """Check a diffusers denoiser folder (configs, kind, weight files) without reading any weight."""
    folder = Path(path)
    if not folder.exists():
        raise UserError(f"denoiser not found: {folder}")
    unet_dir, scheduler_dir, index = _locate(folder, scheduler)
    unet_config = _read_json(unet_dir / "config.json", "the UNet's config")
    scheduler_config = _read_json(scheduler_dir / "scheduler_config.json", "the scheduler's config")
    if index is not None:
        for name, config, where in (("unet", unet_config, unet_dir / "config.json"),
                                    ("scheduler", scheduler_config, scheduler_dir / "scheduler_config.json")):
            named = _component(index, name, folder)
            if config.get("_class_name") != named:
                raise UserError(f"{folder / 'model_index.json'} names {name} {named} but {where} holds "
                                f"{config.get('_class_name')}: the folder's configs do not match; save it again")
    _check_unet_config(unet_config, unet_dir / "config.json")
    _check_scheduler_config(scheduler_config, scheduler_dir / "scheduler_config.json", unet_config)
    return DiffusersFolder(folder, unet_dir, scheduler_dir, unet_config, scheduler_config, _weight_files(unet_dir))


@lru_cache(maxsize=8)
def _weights_sha256(files: Tuple[str, ...], stamps: Tuple[Tuple[int, int], ...]) -> str:
    """sha256 of the weight file, or of the shards' names and hashes (cached while the files are unchanged)."""
    if len(files) == 1:
        return sha256_file(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(f"{Path(f).name} {sha256_file(f)}\n".encode())
    return h.hexdigest()


def _configs_sha256(folder: DiffusersFolder) -> str:
    configs = {k: v for k, v in folder.unet_config.items() if k != "_diffusers_version"}
    schedule = {k: v for k, v in folder.scheduler_config.items() if k != "_diffusers_version"}
    text = json.dumps({"unet": configs, "scheduler": schedule}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def denoiser_identity(path, scheduler=None) -> dict:
    """What a run records of a diffusers denoiser, so a resume with another model is refused: the format
    and the sha256 of its weights and of its two configs. {} for checkpoint files (their runs recorded
    the path only, and keep resuming)."""
    return folder_identity(read_diffusers_folder(path, scheduler)) if is_diffusers_folder(path) else {}


def folder_identity(folder: DiffusersFolder) -> dict:
    """denoiser_identity of a folder already read (a run's sources hold it: the folder is read once)."""
    files = tuple(str(f.resolve()) for f in folder.weights)
    stamps = tuple((os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files)
    return {"denoiser_format": folder.format, "denoiser_sha256": _weights_sha256(files, stamps),
            "denoiser_config_sha256": _configs_sha256(folder)}
