"""Samples a demo table's rows count (summary.json, as separate runs draw them) and the samples drawn
when the lines' first runs at each sigma were one pass (an image's pass draws until its last line's
row stops: the largest of its first-run rows' `samples`). Usage: python drawn.py TABLE_DIR [--shared]"""

import json
import sys
from pathlib import Path

from diffsmooth.engine.runs.results import read_rows

out = Path(sys.argv[1])
summary = json.loads((out / "summary.json").read_text())
total = summary["samples"]["total"]
drawn = total
if "--shared" in sys.argv:
    for sigma in summary["spec"]["sigmas"]:
        first = [p for p in sorted((out / "runs").glob(f"*_s{sigma:g}.tsv")) if not p.name.startswith("rs_")]
        per_image = {}
        for path in first:
            for row in read_rows(path):
                per_image.setdefault(int(row["idx"]), []).append(int(row["samples"]))
        drawn -= sum(sum(s) - max(s) for s in per_image.values())
print(json.dumps({"rows_count": total, "drawn": drawn, "fixed_n": summary["samples"]["fixed_n"],
                  "shared_passes": summary.get("shared_passes"), "builds": summary["builds"],
                  "measured_seconds": summary["seconds"]["measured"]}))
