"""Prints the figures of README.md from the files run.sh wrote: wall and compile seconds, graphs
compiled, builds, the timing probe's samples and the predicted / measured seconds of each main run."""

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def figures(which: str) -> dict:
    log = (HERE / f"{which}.log").read_text()
    measure = json.loads(re.search(r"^MEASURE (.*)$", log, re.M).group(1))
    summary = json.loads((HERE / f"{which}.summary.json").read_text())
    cost = json.loads((HERE / f"{which}.cost.json").read_text())
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
            "load": [(HERE / f"{which}.load_{when}.txt").read_text().split("load average:")[1].strip()
                     for when in ("before", "after")]}


if __name__ == "__main__":
    for which in sys.argv[1:] or ["before", "after"]:
        print(which, json.dumps(figures(which), indent=1))
