"""studies/serve_load.py on a tiny load: a real server, two concurrency levels, the offline rate, the table."""

import pytest

pytest.importorskip("fastapi")

from studies import serve_load  # noqa: E402


def test_a_tiny_load_prints_the_table(tmp_path, capsys):
    out = tmp_path / "load.md"
    serve_load.main(["--model", "rs", "--cases", "predict:20,certify:40", "--n0", "10", "--concurrency", "1,2",
                     "--requests", "2", "--batch", "20", "--out", str(out)])
    table = out.read_text()
    assert table.startswith("`python -m studies.serve_load") and "| 2 | 2 |" in table and "requests per batch" in table
    assert "PREDICT n=20" in table and "sequential CERTIFY n0=10 n-max=40" in table and "load average" in table
    assert "MEASURED" in capsys.readouterr().out
