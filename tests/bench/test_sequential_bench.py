"""bench/sequential.py: its one-pass replay equals real `certify` runs (fixed-n and --sequential)."""

import json

import pytest
from cli_helpers import invoke_ok, rows_without_time

from diffsmooth.engine.demo import shipped as demo_assets

pytestmark = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")


@pytest.mark.slow
def test_replay_equals_real_runs(tmp_path):
    from diffsmooth.bench.sequential import run
    common = dict(n=500, n0=20, alpha=0.01, radii="0.25,0.5,0.75,1.0", batch=256, sigma=0.5)
    report = run(images=4, device="cpu", precision="fp32", method="rs", m=5, local_sigma=0.25, seed=0,
                 out=tmp_path / "bench", progress=False, **common)
    assert report["images"] == 4 and report["fixed"]["samples"] == 4 * 520
    used = report["sequential"]["samples_per_image"]
    assert report["sequential"]["samples"] == sum(used) and len(set(used)) >= 2
    assert len(report["fixed"]["votes_for_cA_of_n"]) == 4 and all(0 <= v <= 500 for v in report["fixed"]["votes_for_cA_of_n"])
    cli = ["certify", "--method", "rs", "--sigma", "0.5", "--n0", "20", "--alpha", "0.01", "--batch", "100",
           "--skip", "125", "--quiet"]                      # indices 0, 125, 250, 375 = the bench's 4 images
    invoke_ok([*cli, "--n", "500", "--out", tmp_path / "fixed.tsv"])
    invoke_ok([*cli, "--sequential", "--radii", "0.25,0.5,0.75,1.0", "--n-max", "500", "--out", tmp_path / "seq.tsv"])
    assert rows_without_time(tmp_path / "bench" / "fixed.tsv") == rows_without_time(tmp_path / "fixed.tsv")
    assert rows_without_time(tmp_path / "bench" / "sequential.tsv") == rows_without_time(tmp_path / "seq.tsv")
    assert len({r["predict"] for r in rows_without_time(tmp_path / "fixed.tsv")}) >= 2     # votes spread
    saved = json.loads((tmp_path / "bench" / "sequential.json").read_text())
    assert saved["speedup"] == pytest.approx(4 * 520 / sum(used))
    assert "fixed-n CERTIFY n=500" in (tmp_path / "bench" / "sequential.md").read_text()


def test_replay_refuses_a_different_schedule():
    from diffsmooth.bench.sequential import replay_counter
    count = replay_counter({(0, 10): [1, 2]})
    assert count(0, 10) == [1, 2]
    with pytest.raises(RuntimeError, match="not a recorded chunk"):
        count(10, 100)


def test_a_terminated_run_reports_the_images_it_finished(tmp_path, monkeypatch):
    """`timeout` sends SIGTERM: the table and JSON still come out, over the finished images only."""
    import os
    import signal

    from diffsmooth.bench import sequential
    real, calls = sequential.certify_both, []

    def certify_then_terminate(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kw)

    monkeypatch.setattr(sequential, "certify_both", certify_then_terminate)
    report = sequential.run(images=5, n=60, n0=10, alpha=0.01, radii="0.25,0.5", batch=32, device="cpu",
                            precision="fp32", method="rs", sigma=0.5, m=1, local_sigma=0.25, seed=0,
                            out=tmp_path, progress=False)
    assert report["images"] == 2 and "after 2 of 5 images" in report["stopped_early"]
    assert report["fixed"]["samples"] == 2 * 70
    assert "after 2 of 5 images" in (tmp_path / "sequential.md").read_text()
    assert len((tmp_path / "fixed.tsv").read_text().splitlines()) == 3            # header + 2 rows
    assert signal.getsignal(signal.SIGTERM) is not sequential._stop_on_sigterm
