"""The built-in digits competition and reading Kaggle-style folders."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from jobs.data import CompetitionError, load_competition, split_folds, write_digits


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    return write_digits(tmp_path_factory.mktemp("digits"))


def test_write_digits_layout(digits_dir):
    for name in ("train.csv", "test.csv", "sample_submission.csv", "solution.csv"):
        assert (digits_dir / name).is_file()
    train = pd.read_csv(digits_dir / "train.csv")
    test = pd.read_csv(digits_dir / "test.csv")
    sample = pd.read_csv(digits_dir / "sample_submission.csv")
    solution = pd.read_csv(digits_dir / "solution.csv")
    assert list(train.columns) == ["id", *[f"px{i}" for i in range(64)], "label"]
    assert list(test.columns) == ["id", *[f"px{i}" for i in range(64)]]
    assert list(sample.columns) == ["id", "label"] and list(solution.columns) == ["id", "label"]
    assert (len(train), len(test)) == (1437, 360)
    assert sorted([*train.id, *test.id]) == list(range(1797))
    assert list(sample.id) == list(test.id) == list(solution.id)

    digits = load_digits()
    assert (train.label.to_numpy() == digits.target[train.id]).all()
    assert (solution.label.to_numpy() == digits.target[solution.id]).all()
    assert (train[[f"px{i}" for i in range(64)]].to_numpy() == digits.data[train.id]).all()
    # stratified: every class is about 20 % test
    share = solution.label.value_counts() / pd.Series(digits.target).value_counts()
    assert share.between(0.17, 0.23).all()


def test_digits_pngs_are_8x8_gray_scaled_to_255(digits_dir):
    digits = load_digits()
    assert len(list((digits_dir / "train").glob("*.png"))) == 1437
    assert len(list((digits_dir / "test").glob("*.png"))) == 360
    i = int(pd.read_csv(digits_dir / "test.csv").id.iloc[0])
    with Image.open(digits_dir / "test" / f"{i}.png") as im:
        assert im.mode == "L" and im.size == (8, 8)
        a = np.asarray(im)
    assert a.dtype == np.uint8
    assert (a == np.rint(digits.images[i] * 255 / 16)).all()


def test_write_digits_is_deterministic(digits_dir, tmp_path):
    again = write_digits(tmp_path)
    assert (pd.read_csv(again / "test.csv").id == pd.read_csv(digits_dir / "test.csv").id).all()


def test_load_digits_competition(digits_dir):
    comp = load_competition(digits_dir)
    assert comp.id_col == "id" and comp.target_col == "label"
    assert comp.classes == [str(i) for i in range(10)]  # labels are text, in their numeric order
    # every pixel column is typed; those that are 0 in every train image are left out as constant, and said so
    assert [c.name for c in comp.columns] == [f"px{i}" for i in range(64)]
    constant = [c.name for c in comp.columns if c.became == "left out"]
    assert constant == ["px0", "px24", "px32", "px39"] and all(c.why == "constant: one value ('0')" for c in comp.columns
                                                      if c.became == "left out")
    assert comp.feature_cols == [f"px{i}" for i in range(64) if f"px{i}" not in constant]
    assert comp.has_images
    assert [p.name for p in comp.train_images[:3]] == [f"{i}.png" for i in comp.train.id[:3]]
    assert [p.name for p in comp.test_images[-2:]] == [f"{i}.png" for i in comp.test.id[-2:]]
    assert (comp.y == comp.train.label.astype(int).to_numpy()).all()  # class indices of the text labels "0".."9"
    assert comp.solution is not None and len(comp.solution) == 360


@pytest.mark.parametrize("missing", ["train.csv", "test.csv", "sample_submission.csv"])
def test_a_missing_file_is_named(digits_dir, tmp_path, missing):
    for name in ("train.csv", "test.csv", "sample_submission.csv"):
        if name != missing:
            (tmp_path / name).write_bytes((digits_dir / name).read_bytes())
    with pytest.raises(ValueError, match=missing):
        load_competition(tmp_path)


def test_a_missing_image_is_named(tmp_path):
    write_digits(tmp_path)
    victim = next((tmp_path / "test").glob("*.png"))
    victim.unlink()
    with pytest.raises(CompetitionError, match=f"no image for id {victim.stem}"):
        load_competition(tmp_path)


def _frames(tmp_path, train, test, sample):
    for name, frame in (("train.csv", train), ("test.csv", test), ("sample_submission.csv", sample)):
        pd.DataFrame(frame).to_csv(tmp_path / name, index=False)


def test_one_column_per_class_folder(tmp_path):
    _frames(tmp_path,
            {"image_id": ["a", "b", "c"], "w": [1.0, 2.0, 3.0], "name": ["x", "y", "z"], "species": ["dog", "cat", "dog"]},
            {"image_id": ["d"], "w": [4.0], "name": ["q"]},
            {"image_id": ["d"], "dog": [0.5], "cat": [0.5]})
    comp = load_competition(tmp_path)
    assert comp.id_col == "image_id" and comp.target_col == "species"
    assert comp.classes == ["dog", "cat"]  # the submission's column order
    assert comp.feature_cols == ["w", "name"] and comp.category_cols == ["name"]  # text with few values: a category
    assert list(comp.y) == [0, 1, 0]
    assert comp.train_images is None


def test_numeric_class_columns_map_to_the_labels(tmp_path):
    _frames(tmp_path, {"id": [1, 2], "f": [0, 1], "y": [0, 1]}, {"id": [3], "f": [1]},
            {"id": [3], "0": [0.5], "1": [0.5]})
    assert load_competition(tmp_path).classes == ["0", "1"]  # the labels as train.csv spells them


def test_path_column(tmp_path):
    (tmp_path / "imgs").mkdir()
    for n in ("a", "b", "c"):
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "imgs" / f"{n}.jpg")
    _frames(tmp_path, {"id": [1, 2], "path": ["imgs/a.jpg", "imgs/b.jpg"], "label": [0, 1]},
            {"id": [3], "path": ["imgs/c.jpg"]}, {"id": [3], "label": [0]})
    comp = load_competition(tmp_path)
    assert [p.name for p in comp.train_images] == ["a.jpg", "b.jpg"] and comp.test_images[0].name == "c.jpg"


def test_missing_id_and_target_columns_are_named(tmp_path):
    _frames(tmp_path, {"id": [1], "label": [0]}, {"key": [2]}, {"id": [2], "label": [0]})
    with pytest.raises(ValueError, match=r"test\.csv: no id column 'id'"):
        load_competition(tmp_path)
    _frames(tmp_path, {"id": [1], "y": [0]}, {"id": [2]}, {"id": [2], "label": [0]})
    with pytest.raises(ValueError, match=r"train\.csv: no target column 'label'"):
        load_competition(tmp_path)


def test_split_folds_stratified_and_disjoint():
    y = np.repeat(np.arange(3), 10)
    folds = split_folds(y, 5, seed=1)
    assert len(folds) == 5
    val = np.concatenate([va for _, va in folds])
    assert sorted(val) == list(range(30))
    for tr, va in folds:
        assert not set(tr) & set(va)
        assert (np.bincount(y[va], minlength=3) == 2).all()
    (tr, va), = split_folds(y, 1, seed=1)
    assert len(va) == 6 and not set(tr) & set(va)


# --- the folder is checked before anything trains: one `error:` line per fault, with counts, exit status 2 ----------


LGBM_PLAN = """name: p
hardware: A100-40GB
jobs:
  - {name: lgbm, kind: lightgbm}
"""


@pytest.fixture
def broken(tmp_path, digits_dir):
    """A copy of the digits folder (CSV files only) to break, and a function that dry-runs a plan on it."""
    import shutil

    folder = tmp_path / "comp"
    folder.mkdir()
    for name in ("train.csv", "test.csv", "sample_submission.csv"):
        shutil.copy(digits_dir / name, folder / name)
    plan = tmp_path / "p.yaml"
    plan.write_text(LGBM_PLAN)

    def dry_run(run_cli, plan_text=None):
        if plan_text:
            plan.write_text(plan_text)
        code, out, err = run_cli("submit", plan, "--data", folder, "--dry-run")
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (code, err)
        return err.removeprefix("error: ").strip()

    return folder, dry_run


def _edit(path, fn):
    frame = pd.read_csv(path, dtype={"id": str})
    fn(frame).to_csv(path, index=False)


def test_test_ids_that_do_not_match_the_sample(broken, run_cli):
    folder, dry_run = broken
    _edit(folder / "test.csv", lambda f: f.assign(id=[str(int(i) + 5000) for i in f["id"]]))
    err = dry_run(run_cli)
    first = pd.read_csv(folder / "sample_submission.csv")["id"].tolist()[:3]
    assert f"{folder / 'test.csv'}: 360 ids of sample_submission.csv are missing from test.csv " \
           f"(e.g. {', '.join(map(str, first))})" in err
    assert "360 ids are not in sample_submission.csv" in err


def test_half_the_test_rows_missing(broken, run_cli):
    folder, dry_run = broken
    _edit(folder / "test.csv", lambda f: f.iloc[::2])
    assert "180 ids of sample_submission.csv are missing from test.csv" in dry_run(run_cli)


def test_test_ids_the_sample_lacks(broken, run_cli):
    folder, dry_run = broken
    _edit(folder / "sample_submission.csv", lambda f: f.iloc[10:])
    assert f"{folder / 'test.csv'}: 10 ids are not in sample_submission.csv" in dry_run(run_cli)


def test_duplicated_ids(broken, run_cli):
    folder, dry_run = broken
    _edit(folder / "test.csv", lambda f: pd.concat([f, f.iloc[:4]]))
    assert f"{folder / 'test.csv'}: 4 ids appear more than once in 'id'" in dry_run(run_cli)


def test_a_label_column_with_empty_values(broken, run_cli):
    folder, dry_run = broken
    _edit(folder / "train.csv", lambda f: f.assign(label=f["label"].where(f.index % 100 != 0)))
    assert f"{folder / 'train.csv'}: target column 'label' has 15 empty values" in dry_run(run_cli)


def test_classes_without_a_column(broken, run_cli):
    folder, dry_run = broken
    _edit(folder / "sample_submission.csv",
          lambda f: pd.DataFrame({"id": f["id"], **{str(c): 0.1 for c in range(8)}}))  # no column for 8 and 9
    assert "2 labels of 'label' have no column in sample_submission.csv (e.g. 8, 9)" in dry_run(run_cli)


def test_missing_images_are_counted(tmp_path, run_cli):
    folder = write_digits(tmp_path / "comp")
    for i in (3, 17, 42):
        (folder / "test" / f"{pd.read_csv(folder / 'test.csv')['id'][i]}.png").unlink()
    plan = tmp_path / "p.yaml"
    plan.write_text(LGBM_PLAN)
    code, out, err = run_cli("submit", plan, "--data", folder, "--dry-run")
    assert code == 2 and f"{folder / 'test'}: no image for 3 of 360 ids of test.csv" in err


def test_an_image_job_on_a_folder_without_images(broken, run_cli):
    folder, dry_run = broken
    err = dry_run(run_cli, LGBM_PLAN + "  - {name: r, kind: timm, model: resnet18, resources: {gpu_memory: 4GB}}\n")
    assert err.startswith("job 'r' (timm) needs images") and "train/ and test/ folders" in err


def test_image_folders_of_mle_bench(tmp_path):
    # train_images/ and test_images/ named by id; or one images/ folder whose file names are the ids themselves
    for sub, names in (("train_images", ["a", "b"]), ("test_images", ["c"])):
        (tmp_path / sub).mkdir()
        for n in names:
            Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / sub / f"{n}.jpg")
    _frames(tmp_path, {"image_id": ["a", "b"], "label": [0, 1]}, {"image_id": ["c"]}, {"image_id": ["c"], "label": [0]})
    comp = load_competition(tmp_path)
    assert [p.parent.name for p in comp.train_images + comp.test_images] == ["train_images"] * 2 + ["test_images"]
    other = tmp_path / "other"
    (other / "images").mkdir(parents=True)
    for n in ("1.png", "2.png", "3.png"):
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(other / "images" / n)
    _frames(other, {"name": ["1.png", "2.png"], "label": [0, 1]}, {"name": ["3.png"]}, {"name": ["3.png"], "label": [0]})
    comp = load_competition(other)
    assert comp.id_col == "name" and comp.test_images == [other / "images" / "3.png"]
