"""Where timm's benchmark folder is not at hand (an installed gpupack, a clone away from shared/data), the time model
falls back on its built-in rows for the default shortlist, says so in each figure's source, and ``advise`` still
plans; where the folder is present, the built-in rows are exactly the file's."""

import pytest

from conftest import SHARED_DATA


@pytest.fixture
def no_benchmark_folder(tmp_path, monkeypatch):
    from scheduler.policy.timing import timemodel as tm

    monkeypatch.setenv("GPUPACK_TIMM_BENCHMARKS", str(tmp_path / "absent"))
    tm.load.cache_clear()
    yield tm
    tm.load.cache_clear()


def test_without_the_folder_the_shortlist_is_timed_from_the_built_in_rows(no_benchmark_folder):
    from scheduler.policy.planning.advise import SHORTLIST

    tm = no_benchmark_folder
    assert set(tm.load()) == {tm.BUILTIN_FILE}
    for model in SHORTLIST:
        row, source = tm.base_row(model)
        assert row.model == model and "built-in rows" in source
    s = tm.speed("resnet50", 224, 64, card="A10-24GB")
    assert s.images_per_s > 0 and any("built-in rows" in p.source for p in s.parts)


def test_advise_plans_without_the_folder(no_benchmark_folder, run_cli, tmp_path):
    import yaml

    out = tmp_path / "advised.yaml"
    code, stdout, stderr = run_cli("advise", "--hardware", "A10-24GB", "--budget", "20m", "--out", str(out))
    assert code == 0, stdout + stderr
    plan = yaml.safe_load(out.read_text())
    assert any(j["kind"] == "timm" for j in plan["jobs"])


@pytest.mark.skipif(not (SHARED_DATA / "timm-benchmarks").is_dir(), reason="timm's benchmark files are absent")
def test_the_built_in_rows_are_the_files_rows():
    from scheduler.policy.timing import timemodel as tm

    table = tm.load(str(SHARED_DATA / "timm-benchmarks"))[tm.BENCH_FILES[0]]
    for row in tm.BUILTIN_ROWS:
        want = table[row.model]
        assert (row.images_per_s, row.step_ms, row.batch, row.image_size, row.params_m) == \
            (want.images_per_s, want.step_ms, want.batch, want.image_size, want.params_m)


def test_a_gain_measured_on_this_card_calibrates_its_occupancy_and_answers_for_its_models(tmp_path, monkeypatch):
    """doctor records the card as NVML names it ('NVIDIA A10'); the advisor asks for the profile (A10-24GB): both are
    one card, so the measurement is used for those models as is, and for any other set through the occupancy."""
    from scheduler.policy.timing import colocation, packgain

    monkeypatch.setenv("GPUPACK_CACHE_DIR", str(tmp_path))
    before = colocation.occupancy("A10-24GB")
    packgain.remember(packgain.Measurement("NVIDIA A10", (("resnet50", 64), ("efficientnet_b0", 64)), 1.5,
                                           source="doctor"))
    found = colocation.measured_gain([("resnet50", 64), ("efficientnet_b0", 64)], "A10-24GB")
    assert found is not None and found["gain"] == 1.5
    occ = colocation.occupancy("A10-24GB")
    busy = [colocation._busy(m, b, "A10-24GB") for m, b in (("resnet50", 64), ("efficientnet_b0", 64))]
    assert occ.value == round(2 / (1.5 * sum(busy)), 3) != before.value
    assert "measured on A10-24GB" in occ.source
