"""A table builds each model architecture once: the rows of a table whose runs reuse built stages
(weights and sigma inputs copied in) equal those of a table that builds every run's models anew."""

import json
import tomllib

import pytest
from table_fixtures import small_table_spec

from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.runs.model_set import ModelSet
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table import build as table_build
from diffsmooth.engine.table import runner as table_runner
from diffsmooth.engine.table.spec import parse_spec

needs_demo = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")

# the small RS table plus a DDS line: the UNet's purifier moves between sigmas (t*, scale factors),
# RS and DDS share the classifier's architecture, each sigma has its own demo classifier weights; four
# images (labels 9, 1, 0, 8) at n-max 100 fill every pilot and main file
SPEC = small_table_spec(n_max=100, skip=140) + """
[[line]]
name = "DDS"
method = "dds"
"""


class BuildsEveryRun(ModelSet):
    """The behaviour before the model set: every run builds its own stages."""

    def stage(self, runner, module, name):
        self.builds += 1
        return runner.stage(module, name)


def _build(out, monkeypatch, model_set=ModelSet):
    monkeypatch.setattr(table_runner, "ModelSet", model_set)
    spec = parse_spec(tomllib.loads(SPEC))
    table_build.TableBuilder(spec, out, table_build.TablePlanning("auto", pilot=2), log=lambda line: None,
                             progress=False).build()
    rows = {p.name: [{k: v for k, v in r.items() if k != "time"} for r in read_rows(p)]
            for p in sorted((out / "runs").glob("*.tsv"))}
    return rows, json.loads((out / "summary.json").read_text())


@needs_demo
@pytest.mark.slow
def test_rows_with_reused_models_equal_rows_with_models_built_for_every_run(tmp_path, monkeypatch):
    reused, summary = _build(tmp_path / "reused", monkeypatch)
    fresh, summary_fresh = _build(tmp_path / "fresh", monkeypatch, BuildsEveryRun)
    assert len(reused) == 8 and reused == fresh                                    # pilot and main: 2 lines x 2 sigmas
    # one classifier architecture (RS and DDS, every sigma) and one purifier: two builds in all
    assert (summary["builds"], summary["compiles"]) == (2, 0)
    assert summary_fresh["builds"] > 2 * summary["builds"]
    rows = [r for file in reused.values() for r in file]
    assert len({r["predict"] for r in rows}) >= 3                                  # predictions spread over classes
    assert any(0 < int(r["top_votes"]) < int(r["samples"]) - 20 for r in rows)     # and the votes within an image
