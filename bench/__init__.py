"""`diffsmooth bench` (time per certified image, stage by stage) and the GPU check's scripts (bench/gpu_check.sh).
One-off studies live in studies/ at the repository root, outside the wheel (studies/README.md)."""
