"""The command table: every command loads and its listed help is its own; a command whose module
cannot be imported says so in one line (exit 2) instead of vanishing; options use the engine's names."""

import importlib
import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.cli.group import COMMANDS, Command
from diffsmooth.engine import choices


def _load(name):
    entry = COMMANDS[name]
    return getattr(importlib.import_module(entry.module), entry.attribute)


def test_every_command_loads_under_its_name_with_its_listed_help():
    for name, entry in COMMANDS.items():
        command = _load(name)
        assert isinstance(command, click.Command) and command.name == name
        assert command.get_short_help_str(limit=1000) == entry.short_help, name


def test_help_lists_every_command_without_importing_torch():
    code = ("import sys, json; from click.testing import CliRunner; from diffsmooth.cli import main; "
            "r = CliRunner().invoke(main, ['--help']); print(json.dumps([r.output, 'torch' in sys.modules]))")
    output, torch_loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                     check=True).stdout)
    assert not torch_loaded
    for name in COMMANDS:
        assert f"  {name} " in output


def test_a_command_that_cannot_import_says_so(monkeypatch):
    missing = Command("diffsmooth.cli.not_a_module", "nothing", "Never importable.")
    monkeypatch.setitem(COMMANDS, "broken", missing)
    assert "broken" in CliRunner().invoke(main, ["--help"]).output
    for args in (["broken"], ["broken", "--out", "x", "--help"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: `diffsmooth broken` is unavailable"), lines
        assert "diffsmooth.cli.not_a_module" in lines[0]


def _choices(command, option):
    return tuple(next(p for p in command.params if p.name == option).type.choices)


def test_options_offer_the_engines_names():
    certify, export = _load("certify"), _load("export")
    for command in (certify, export):
        assert _choices(command, "method") == choices.METHODS
        assert _choices(command, "preset") == choices.PRESETS
        assert _choices(command, "normalization") == choices.NORMALIZATIONS
        assert _choices(command, "stats") == choices.STATS
        assert _choices(command, "schedule") == choices.SCHEDULES
        assert _choices(command, "local_noise") == choices.LOCAL_NOISE_MODES
    assert _choices(certify, "dataset") == choices.DATASET_KINDS
    assert _choices(certify, "backend") == choices.BACKENDS
    assert _choices(certify, "precision") == choices.RUN_PRECISIONS
    assert _choices(_load("build-engine"), "precisions") == choices.GRAPH_PRECISIONS


def test_the_engines_tables_cover_exactly_the_names():
    from diffsmooth.engine.backends.torch.runner import AUTOCAST_DTYPES
    from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES
    from diffsmooth.engine.models.resnet import DATASET_STATS, DEFAULT_NORMALIZATION
    from diffsmooth.engine.models.unet import PRESETS
    from diffsmooth.engine.runs.sources import DATASET_STATS as KIND_STATS
    from diffsmooth.engine.runs.sources import PRESET_STATS
    assert set(PRESETS) == set(PRESET_SCHEDULES) == set(PRESET_STATS) == set(choices.PRESETS)
    assert set(DATASET_STATS) == set(DEFAULT_NORMALIZATION) == set(choices.STATS)
    assert set(AUTOCAST_DTYPES) == set(choices.RUN_PRECISIONS)
    assert set(KIND_STATS) == set(choices.DATASET_KINDS)
    assert set(PRESET_STATS.values()) | set(KIND_STATS.values()) <= set(choices.STATS)


def test_engine_errors_name_settings_and_the_cli_shows_flags(tmp_path):
    """The engine speaks of its settings (`radii`); the CLI turns those it has into flags (--radii)."""
    from click.testing import CliRunner

    from diffsmooth.cli import main
    from diffsmooth.engine.errors import UserError
    from diffsmooth.engine.runs.request import parse_radii
    with pytest.raises(UserError) as engine_error:
        parse_radii("a,b")
    assert "`radii`" in str(engine_error.value) and "--" not in str(engine_error.value)
    result = CliRunner().invoke(main, ["certify", "--sequential", "--radii", "a,b", "--out", str(tmp_path / "x.tsv")])
    assert result.exit_code == 2
    assert result.output.startswith("error: --radii must be comma-separated numbers"), result.output
