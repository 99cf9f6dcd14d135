"""The order the suite hands modules to its workers (tests/conftest.py applies it)."""

# The heaviest modules start first (per-module seconds of a full run on 2 cores, `--durations=0`): with
# `--dist loadfile` a module runs whole on one worker, and a long one handed out last keeps that worker busy
# while the other has nothing left (longest first packs two workers closest to even). The rest keep their order.
HEAVY_FIRST = (
    "tests/engine/table/test_table_ranks.py",        # ~170 s: torchrun tables, killed and restarted
    "tests/engine/table/test_paper_specs.py",        # ~100 s
    "tests/engine/runs/test_rank_faults.py",         # ~60 s: torchrun ranks with a planted fault each
    "tests/test_readme_python.py",                   # ~75 s
    "tests/export/test_export.py",                   # ~65 s
    "tests/engine/base_classifier/test_densepure.py",  # ~55 s
    "tests/engine/models/test_triton_conv.py",       # ~50 s
    "tests/export/test_export_densepure.py",         # ~20 s
    "tests/fuzz/test_faults.py",
    "tests/engine/table/test_one_pass.py",
    "tests/engine/runs/test_sharding.py",
    "tests/engine/test_api_on_ranks.py",             # ~20 s: the API on two spawned gloo ranks
    "tests/engine/runs/test_sweep.py",
    "tests/engine/table/test_race_ends.py",
    "tests/engine/test_env_report.py",
)


def heavy_first(items) -> None:
    """Run HEAVY_FIRST's modules first, in that order (a stable sort: tests keep their order within a module)."""
    rank = {path: k for k, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
