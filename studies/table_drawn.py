"""MEASURED from a demo table's folder: the samples its rows count (summary.json, as separate runs draw them)
and, with --shared, the samples drawn when the lines' first runs at each sigma were one pass (an image's pass
draws until its last line's row stops: the largest of its first-run rows' `samples`)."""

import argparse
import json
from pathlib import Path

from diffsmooth.engine.runs.results import read_rows


def drawn(out: Path, shared: bool) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    total = summary["samples"]["total"]
    drawn = total
    if shared:
        for sigma in summary["spec"]["sigmas"]:
            first = [p for p in sorted((out / "runs").glob(f"*_s{sigma:g}.tsv")) if not p.name.startswith("rs_")]
            per_image = {}
            for path in first:
                for row in read_rows(path):
                    per_image.setdefault(int(row["idx"]), []).append(int(row["samples"]))
            drawn -= sum(sum(s) - max(s) for s in per_image.values())
    return {"rows_count": total, "drawn": drawn, "fixed_n": summary["samples"]["fixed_n"],
            "shared_passes": summary.get("shared_passes"), "builds": summary["builds"],
            "measured_seconds": summary["seconds"]["measured"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("table", type=Path)
    parser.add_argument("--shared", action="store_true", help="the first runs at each sigma were one pass")
    args = parser.parse_args(argv)
    print(json.dumps(drawn(args.table, args.shared)))


if __name__ == "__main__":
    main()
