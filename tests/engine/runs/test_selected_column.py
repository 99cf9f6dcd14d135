"""Sequential rows record the selected class (`selected`), also where they abstain; a run with the wrong-class
stop writes a row that says so; a result file written before `selected` existed resumes as it is."""

import torch

from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.base_classifier.local_smoothing import LogitsModule
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.runs.dataset_run import Images, Jobs, run_dataset
from diffsmooth.engine.runs.results import CERTIFY_COLUMNS, SEQUENTIAL_EXTRA_BEFORE_SELECTED, read_result
from diffsmooth.engine.runs.row_states import read_states, states_path
from diffsmooth.engine.stages.base import BaseClassifierStages
from tests.stage_fixtures import spread_classifier

N0 = 20
RULE = SequentialRule((0.0, 0.25), 0.12, 0.01, 400)


class Dataset:
    """10 random 3x8x8 images, labelled 0..9 (most not the class the classifier picks)."""

    num_classes = 10

    def __getitem__(self, i):
        return torch.rand((3, 8, 8), generator=torch.Generator().manual_seed(i)), i % 10

    def __len__(self):
        return 10


def run(out, stop_wrong_class, indices=range(10)):
    stage = TorchRunner().stage(LogitsModule(spread_classifier(2)), "classifier")
    pipe = MonteCarloPipeline(BaseClassifierStages("rs", None, stage, 10), 0.12, seed=3)
    jobs = Jobs("certify", N0, 0, 0.01, 0.12, RULE, keep_states=True, stop_wrong_class=stop_wrong_class)
    return run_dataset(pipe, Images(Dataset(), list(indices), batch=100, window=2, progress=False), [out], jobs)


def test_rows_record_the_selected_class_and_the_wrong_class_stop_leaves_the_other_rows_alone(tmp_path):
    run(tmp_path / "all.tsv", stop_wrong_class=False)
    run(tmp_path / "stop.tsv", stop_wrong_class=True)
    columns, every = read_result(tmp_path / "all.tsv")
    assert columns[-1] == "selected"
    assert all(r["selected"] == r["predict"] for r in every if r["predict"] != "-1")
    wrong = [r for r in every if r["selected"] != r["label"]]
    right = [r for r in every if r["selected"] == r["label"]]
    assert len(wrong) >= 3 and len(right) >= 2                       # both kinds, over several classes
    assert len({r["selected"] for r in every}) >= 3
    assert any(r["predict"] != "-1" for r in wrong)                 # without the stop, wrong classes get certified
    stopped = {r["idx"]: r for r in read_result(tmp_path / "stop.tsv")[1]}
    for r in right:
        assert {k: v for k, v in stopped[r["idx"]].items() if k != "time"} == {k: v for k, v in r.items() if k != "time"}
    for r in wrong:
        s = stopped[r["idx"]]
        assert (s["predict"], s["radius"], s["correct"], s["samples"], s["top_votes"], s["selected"]) == \
            ("-1", "0.0", "0", str(N0), "0", r["selected"])
    states = read_states(states_path(tmp_path / "stop.tsv"))
    assert all(states[int(r["idx"])].selected == int(r["selected"]) for r in wrong)


def test_a_file_without_the_selected_column_resumes_with_its_own_columns(tmp_path):
    out = tmp_path / "old.tsv"
    run(out, stop_wrong_class=False, indices=range(4))
    old = CERTIFY_COLUMNS + SEQUENTIAL_EXTRA_BEFORE_SELECTED
    lines = out.read_text().splitlines()
    out.write_text("".join("\t".join(line.split("\t")[:len(old)]) + "\n" for line in lines))   # as written before
    run(out, stop_wrong_class=False)
    columns, rows = read_result(out)
    assert columns == old and sorted(int(r["idx"]) for r in rows) == list(range(10))


def test_a_run_killed_between_a_state_and_its_row_leaves_no_row_without_its_state(tmp_path, monkeypatch):
    """The state is written before its row: killed in between, the file holds a state without a row (the image
    runs again), never a row the race would have to rerun from its first sample; the resumed run gives every
    row with its state, equal to an uninterrupted run's."""
    import pytest

    import diffsmooth.engine.runs.dataset_run as dataset_run
    from diffsmooth.engine.runs.row_states import state_of
    whole = tmp_path / "whole.tsv"
    run(whole, stop_wrong_class=False)
    out, calls, append = tmp_path / "killed.tsv", [], dataset_run.append_state

    def killed_on_the_fourth(path, index, state):
        append(path, index, state)
        calls.append(index)
        if len(calls) == 4:
            raise KeyboardInterrupt                 # as a kill between the state and its row
    monkeypatch.setattr(dataset_run, "append_state", killed_on_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        run(out, stop_wrong_class=False)
    monkeypatch.setattr(dataset_run, "append_state", append)
    _, rows = read_result(out)
    states = read_states(states_path(out))
    assert len(rows) == 3 and len(states) == 4
    assert all(state_of(r, states, N0) is not None for r in rows)
    run(out, stop_wrong_class=False)
    _, rows = read_result(out)
    states = read_states(states_path(out))
    assert all(state_of(r, states, N0) is not None for r in rows)
    strip = lambda rs: sorted(({k: v for k, v in r.items() if k != "time"} for r in rs), key=lambda r: int(r["idx"]))
    assert strip(rows) == strip(read_result(whole)[1])
    assert len({r["selected"] for r in rows}) >= 3                  # the rows spread over several classes


def test_a_state_appended_after_a_torn_line_is_read_whole(tmp_path):
    """A kill mid-line leaves a torn last line; the next state starts on a line of its own and is read."""
    from diffsmooth.engine.runs.row_states import append_state
    run(tmp_path / "a.tsv", stop_wrong_class=False, indices=range(3))
    states = read_states(states_path(tmp_path / "a.tsv"))
    torn = tmp_path / "torn.states.jsonl"
    torn.write_text('{"idx": 0, "state": {"selec')
    append_state(torn, 1, states[1])
    assert read_states(torn) == {1: states[1]}
