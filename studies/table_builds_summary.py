"""MEASURED: the figures of bench/results/table_builds_cpu/README.md from the files its run.sh wrote: wall and
compile seconds, graphs compiled, builds, the timing probe's samples and the predicted / measured seconds of each
main run."""

import argparse
import json
import re
from pathlib import Path

HERE = Path("bench/results/table_builds_cpu")


def figures(which: str, here: Path = HERE) -> dict:
    log = (here / f"{which}.log").read_text()
    measure = json.loads(re.search(r"^MEASURE (.*)$", log, re.M).group(1))
    summary = json.loads((here / f"{which}.summary.json").read_text())
    cost = json.loads((here / f"{which}.cost.json").read_text())
    probes = len(re.findall(r"^table: timing probe", log, re.M))
    batch = 1000                                        # the CPU default batch the demo runs at
    ratios = {key: round(m["seconds"] / cost["runs"][key]["seconds"], 2)
              for key, m in cost.get("measured", {}).items() if cost["runs"][key]["seconds"]}
    return {"wall_seconds": measure["wall_seconds"], "compile_seconds": measure["compile_seconds"],
            "compiled_graphs": measure["compiled_graphs"], "builds": summary.get("builds"),
            "fast_path_checks": len(re.findall(r"^# fast path vs eager", log, re.M)),
            "probe_samples": probes * (1 + 2) * batch, "pilot_samples": summary["samples"]["pilot"],
            "main_samples": summary["samples"]["main"],
            "main_measured_over_predicted": ratios,
            "load": [(here / f"{which}.load_{when}.txt").read_text().split("load average:")[1].strip()
                     for when in ("before", "after")]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("which", nargs="*", default=["before", "after"])
    parser.add_argument("--dir", type=Path, default=HERE, help=f"run.sh's folder (default: {HERE})")
    args = parser.parse_args(argv)
    for which in args.which:
        print(which, json.dumps(figures(which, args.dir), indent=1))


if __name__ == "__main__":
    main()
