"""run_dataset's signal handling in-process: SIGTERM stops at once (Terminated), but never inside an
image's row writes; the previous handlers come back afterwards. The same on real runs (subprocesses):
tests/fuzz/test_faults.py; the table stopping as a whole: tests/engine/table/test_table.py."""

import json
import os
import signal
import time

import pytest

from diffsmooth.engine.errors import Terminated, UserError
from diffsmooth.engine.runs.dataset_run import stop_after_current_image
from diffsmooth.engine.runs.results import check_or_record_settings, settings_path


def _sigterm_self():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)                             # the handler runs at the next bytecode boundary


def test_sigterm_raises_terminated_at_once_and_restores_the_handlers():
    before_term, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(Terminated):
        with stop_after_current_image():
            _sigterm_self()
            pytest.fail("SIGTERM did not stop the run")
    assert signal.getsignal(signal.SIGTERM) is before_term and signal.getsignal(signal.SIGINT) is before_int


def test_sigterm_waits_for_the_rows_of_the_image_being_written():
    written = []
    with pytest.raises(Terminated):
        with stop_after_current_image() as flag:
            with flag.rows():
                written.append("configuration 1")
                _sigterm_self()                 # arrives between two configurations' rows
                written.append("configuration 2")
            pytest.fail("Terminated was not raised once the rows were written")
    assert written == ["configuration 1", "configuration 2"] and flag.stop and flag.terminated


def test_first_sigint_only_asks_to_stop():
    with stop_after_current_image() as flag:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        assert flag.stop and not flag.terminated


def test_settings_files_are_strict_json(tmp_path):
    """A NaN or inf in recorded settings is refused (one UserError), never written as non-standard JSON."""
    out = tmp_path / "r.tsv"
    for bad in (float("nan"), float("inf")):
        with pytest.raises(UserError, match="JSON cannot store"):
            check_or_record_settings(out, {"sigma": bad, "n": 10})
        assert not settings_path(out).exists() and list(tmp_path.iterdir()) == []
    check_or_record_settings(out, {"sigma": 0.5, "n": 10})
    assert json.loads(settings_path(out).read_text(), parse_constant=lambda c: pytest.fail(c)) == {"sigma": 0.5, "n": 10}
