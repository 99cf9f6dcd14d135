"""bench/table_gpu.py (the GPU check's table part) on the CPU: variants, row comparison, the run."""

import json

import click
import pytest

from diffsmooth.bench.table_gpu import compare, parse_variant
from diffsmooth.engine.demo import shipped as demo_assets


def test_variants_parse_and_a_wrong_one_is_refused():
    assert parse_variant("cuda:fp16+compile") == ("cuda", "fp16", True)
    assert parse_variant("cpu") == ("cpu", "fp32", False)
    with pytest.raises(click.BadParameter):
        parse_variant("tpu:fp32")


def test_rows_are_compared_by_run_and_image():
    reference = {("a.tsv", 1): ("3", "0.5", "600"), ("a.tsv", 2): ("1", "0.25", "300"), ("b.tsv", 1): ("3", "0", "200")}
    other = dict(reference)
    other[("a.tsv", 2)] = ("1", "0.249", "300")
    del other[("b.tsv", 1)]
    got = compare(reference, other)
    assert (got["rows"], got["equal"], got["differ"], got["only_reference"], got["only_this"]) == (2, 1, 1, 1, 0)
    assert got["first_differences"][0]["idx"] == 2


@pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")
@pytest.mark.slow
def test_the_same_variant_twice_gives_equal_rows(tmp_path):
    from click.testing import CliRunner

    from diffsmooth.bench.table_gpu import main
    result = CliRunner().invoke(main, ["--out", str(tmp_path), "--variant", "cpu:fp32", "--variant", "cpu:fp32",
                                       "--images", "3", "--n-max", "200", "--rows", "rs", "--plan", "all"])
    assert result.exit_code == 0, result.output
    first, second = json.loads((tmp_path / "table_gpu.json").read_text())
    assert second["against_first"]["rows"] == 9 and second["against_first"]["differ"] == 0
    assert first["samples"] == second["samples"] > 0 and first["name"] != second["name"]   # drawn twice
