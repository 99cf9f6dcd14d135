"""Runs one main run of the table in ./auto beside the table command (the same request the table
makes, so the table finds the file finished): python run_one_phase.py SIGMA."""
import sys
import time
from pathlib import Path

from diffsmooth.engine.table.build import Phase, TableBuilder, TablePlanning
from diffsmooth.engine.table.planning import TablePlan
from diffsmooth.engine.table.spec import demo_spec

sigma = float(sys.argv[1])
out = Path("auto")
spec = demo_spec(("diffsmooth",), images=100, n_max=10000, device="cpu", threads=1, batch=500, compile=True)
builder = TableBuilder(spec, out, TablePlanning("auto", pilot=10, margin=0.05), progress=False)
plan = TablePlan.read(out / "plan.json")
line = spec.lines[0]
start = time.perf_counter()
result = builder.run_phase(Phase(line, sigma, plan.main, plan.radii_for(sigma), builder.phase_path(line, sigma, "main"), "main"))
print(f"sigma {sigma:g} main: {result.samples:,} samples, {result.seconds:.1f} s of compute "
      f"({time.perf_counter() - start:.1f} s with the model build)")
