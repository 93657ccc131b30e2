"""The run folder's outputs, written and read back: what ``ensemble RUN``, ``--resume`` and the last-resort
submission read is what the job produced, ids included (text ids such as "007" keep their zeros)."""

import numpy as np

from jobs.contract import FoldOutput, JobOutput
from scheduler.store import outputs


def job_output(partial: bool = False) -> JobOutput:
    rng = np.random.default_rng(0)
    test_ids = np.array(["007", "010", "100"])
    folds = []
    for k, ids in enumerate((np.array(["001", "002"]), np.array(["003", "004"]))):
        folds.append(FoldOutput(k, ids, rng.dirichlet([1, 1, 1], 2), rng.dirichlet([1, 1, 1], 3), 0.5 + k / 10,
                                epochs=3))
    cut = FoldOutput(2, np.array([]), np.zeros((0, 3)), rng.dirichlet([1, 1, 1], 3), 0.4, epochs=1)
    return JobOutput("b0", ["cat", "dog", "eel"], test_ids, [] if partial else folds, "accuracy",
                     partial=cut if partial else None)


def test_save_then_load_gives_back_the_folds_predictions(tmp_path):
    out = job_output()
    outputs.save(out, tmp_path / "b0")
    back = outputs.load(tmp_path / "b0")
    ids, pred = out.oof()
    assert list(back.oof_ids) == list(ids) == ["001", "002", "003", "004"]
    np.testing.assert_allclose(back.oof_pred, pred)
    assert list(back.test_ids) == ["007", "010", "100"] and back.classes == ["cat", "dog", "eel"]
    np.testing.assert_allclose(back.test_pred, out.test_mean())
    assert outputs.from_output(out).classes == back.classes


def test_a_job_with_no_finished_fold_loads_as_none_but_its_cut_fold_is_kept(tmp_path):
    out = job_output(partial=True)
    outputs.save(out, tmp_path / "b0")
    assert outputs.load(tmp_path / "b0") is None
    score, pred = outputs.load_partial(tmp_path / "b0")
    assert score == 0.4 and list(pred.test_ids) == ["007", "010", "100"]
    np.testing.assert_allclose(pred.test_pred, out.partial.test_pred)
    assert outputs.load_partial(tmp_path / "nothing") is None
