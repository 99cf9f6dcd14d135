"""The torchrun path's merge on the device's own collective: under torchrun (one rank or more), every rank
counts the demo DiffSmooth votes of a few images once alone and once sharing every image's samples with the
other ranks (certify/blocks.py: each look's counts all-reduced as device tensors, nccl on CUDA, gloo on the
CPU; the meetings on a gloo group of the same ranks under nccl), and the counts must be equal. Prints the
ranks' meetings (one per batch), their mean cost and the backend.

    torchrun --nproc-per-node 1 -m diffsmooth.bench.nccl_smoke [--device cuda] [--images 4] [--samples 300]
"""

from __future__ import annotations

import os
import time

import click
import numpy as np
import torch


@click.command()
@click.option("--device", default="cuda", show_default=True, help="cuda (nccl) or cpu (gloo).")
@click.option("--images", default=4, show_default=True)
@click.option("--samples", "num", default=300, show_default=True, help="Samples counted per image.")
@click.option("--batch", default=128, show_default=True)
def main(device: str, images: int, num: int, batch: int) -> None:
    import torch.distributed as dist

    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.certify.blocks import SampleBlocks
    from diffsmooth.engine.certify.jobs import count_job
    from diffsmooth.engine.certify.scheduler import Work
    from diffsmooth.engine.data import load_dataset
    from diffsmooth.engine.runs.assemble import ModelSources
    from diffsmooth.engine.runs.sharding import join_process_group, meeting_group
    from diffsmooth.engine.runs.stage_build import build_smooth

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        device = f"cuda:{local}"
        torch.cuda.set_device(device)
    join_process_group("nccl" if device.startswith("cuda") else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = load_dataset("embedded")
    config = MethodConfig("diffsmooth", 0.5, local_sigma=0.25, m=5)
    pipe = build_smooth(config, ModelSources.demo(), tuple(dataset.image_shape), dataset.num_classes,
                        device=device).pipeline
    chosen = [(i, dataset[i][0]) for i in range(images)]
    alone = pipe.count_many(chosen, 0, num, batch)
    shared = {}
    scheduler = pipe.scheduler(batch, None, SampleBlocks(rank, world, meeting_group=meeting_group()))
    start = time.perf_counter()
    scheduler.run([Work(i, x, count_job(0, num), tag=k) for k, (i, x) in enumerate(chosen)],
                  lambda done: shared.__setitem__(done.work.tag, done.result))
    seconds = time.perf_counter() - start
    equal = all(np.array_equal(alone[k], shared[k]) for k in range(images))
    classes = {int(np.argmax(c)) for c in alone}
    stats = scheduler.stats
    print(f"rank {rank}/{world} on {device} ({dist.get_backend()}): counts shared over the ranks "
          f"{'EQUAL' if equal else 'DIFFERENT'} to one rank's alone ({images} images x {num} samples, top classes "
          f"{sorted(classes)}); {stats.meetings} meetings, {1e3 * stats.meeting_seconds / max(1, stats.meetings):.2f} ms each; "
          f"{seconds:.2f} s", flush=True)
    dist.destroy_process_group()
    if not equal:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
