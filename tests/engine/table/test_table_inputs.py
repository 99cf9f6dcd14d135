"""A table hands its runs real objects: the radii as numbers, the images it chose, the dataset opened once per
table (its selection checked once) and each line's model sources opened once (issue 67)."""

import tomllib

import pytest
from table_fixtures import small_table_spec

from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.runs import resolve
from diffsmooth.engine.table import build as table_build
from diffsmooth.engine.table import runner as table_runner
from diffsmooth.engine.table.phases import Phase
from diffsmooth.engine.table.spec import parse_spec

needs_demo = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")


def _builder(tmp_path, radii=(0.25, 0.5, 0.75), **planning):
    spec = parse_spec(tomllib.loads(small_table_spec(radii=radii, n_max=100, skip=140)))
    return table_build.TableBuilder(spec, tmp_path / "t", table_build.TablePlanning(**planning), log=lambda line: None,
                                    progress=False)


def test_a_phase_hands_its_radii_as_numbers(tmp_path):
    builder = _builder(tmp_path)
    line = builder.spec.lines[0]
    radius = 0.1234567891                   # more digits than text written with %g keeps
    request = builder.request(Phase(line, 0.25, (0, 140), (radius, 0.5), builder.phase_path(line, 0.25, "main"), "main"))
    assert request.sequential.radii == (radius, 0.5)
    assert request.sequential.schedule_radii == builder.spec.radii


@needs_demo
def test_the_runs_share_the_data_and_sources_opened_once(tmp_path, monkeypatch):
    opened, resolved = [], []
    monkeypatch.setattr(resolve, "open_dataset", lambda request: opened.append(request) or open_dataset(request))
    monkeypatch.setattr(table_runner, "resolve_sources", lambda *a: resolved.append(a) or resolve_sources(*a))
    builder = _builder(tmp_path)
    line = builder.spec.lines[0]
    probe = builder.probe_run()
    runs = [builder.runner.planned(Phase(line, sigma, indices, None, builder.phase_path(line, sigma, kind), kind))
            for sigma in builder.spec.sigmas for kind, indices in (("pilot", probe.indices[:2]), ("main", probe.indices))]
    assert len(opened) == 1                 # one dataset for every run, its selection checked once
    assert {id(run.dataset) for run in runs} == {id(probe.dataset)}
    assert [run.indices for run in runs[:2]] == [probe.indices[:2], probe.indices]
    assert not resolved and {id(run.sources) for run in runs} == {id(probe.sources)}   # the same model options
    other = builder.runner.inputs.of(probe.request.replace(normalization="center"))     # a line of its own input layer
    assert len(resolved) == 1 and other.sources.normalization == "center" and other.dataset is probe.dataset
    assert builder.runner.inputs.of(probe.request.replace(normalization="center")).sources is other.sources
    assert len(opened) == 1


open_dataset, resolve_sources = resolve.open_dataset, table_runner.resolve_sources
