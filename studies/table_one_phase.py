"""MEASURED: one main run of a demo table drawn beside the table command (the same request the table makes,
through its own `TableBuilder.run_phase`, so the table finds the file finished), to save wall time."""
import argparse
import time
from pathlib import Path

from diffsmooth.engine.table.build import Phase, TableBuilder, TablePlanning
from diffsmooth.engine.table.planning import TablePlan
from diffsmooth.engine.table.spec import demo_spec


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sigma", type=float)
    parser.add_argument("--out", type=Path, default=Path("auto"), help="the table's folder (default: auto)")
    args = parser.parse_args(argv)
    sigma, out = args.sigma, args.out
    spec = demo_spec(("diffsmooth",), images=100, n_max=10000, device="cpu", threads=1, batch=500, compile=True)
    builder = TableBuilder(spec, out, TablePlanning("auto", pilot=10, margin=0.05), progress=False)
    plan = TablePlan.read(out / "plan.json")
    line = spec.lines[0]
    start = time.perf_counter()
    phase = Phase(line, sigma, plan.main, plan.radii_for(sigma), builder.phase_path(line, sigma, "main"), "main")
    result = builder.run_phase(phase)
    print(f"sigma {sigma:g} main: {result.samples:,} samples, {result.seconds:.1f} s of compute "
          f"({time.perf_counter() - start:.1f} s with the model build)")


if __name__ == "__main__":
    main()
