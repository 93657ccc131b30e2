import json


def test_estimate_json_has_peak_and_parts(run_cli):
    code, out, err = run_cli("estimate", "--model", "resnet18", "--image-size", "64", "--batch-size", "32", "--json")
    assert code == 0, err
    body = json.loads(out)
    parts = ("weights_mib", "gradients_mib", "optimizer_mib", "activations_mib", "workspace_mib", "cuda_context_mib")
    assert all(k in body for k in ("peak_mib", *parts))
    assert body["peak_mib"] >= sum(body[k] for k in parts) - 1


def test_estimate_fit_answers_the_largest_batch_under_the_limit(run_cli):
    code, out, err = run_cli("estimate", "--model", "resnet18", "--image-size", "224", "--fit", "4GB", "--json")
    assert code == 0, err
    body = json.loads(out)
    peaks = {e["batch_size"]: e["peak_mib"] for e in body["estimates"]}
    fit = body["largest_batch_that_fits"]
    assert fit == 192  # the table's own figures: 192 fits 4 GiB, the next rung does not
    assert peaks[192] <= 4096 < peaks[256]
    code, out, err = run_cli("estimate", "--model", "resnet18", "--image-size", "224", "--fit", "4GB")
    assert code == 0, err
    assert "largest batch on the ladder that fits 4GB: 192" in out


def test_estimate_fit_beyond_the_ladder_says_its_top(run_cli):
    code, out, err = run_cli("estimate", "--model", "resnet18", "--image-size", "64", "--fit", "4GB", "--json")
    assert code == 0, err
    body = json.loads(out)
    assert body["largest_batch_that_fits"] == 512 and max(e["peak_mib"] for e in body["estimates"]) <= 4096


def test_estimate_unknown_model_is_a_clean_error(run_cli):
    code, out, err = run_cli("estimate", "--model", "resnet5O", "--batch-size", "8")
    assert code == 2 and "resnet50" in err and "Traceback" not in err
