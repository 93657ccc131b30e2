import json


def test_estimate_json_has_peak_and_parts(run_cli):
    code, out, err = run_cli("estimate", "--model", "resnet18", "--image-size", "64", "--batch-size", "32", "--json")
    assert code == 0, err
    body = json.loads(out)
    parts = ("weights_mib", "gradients_mib", "optimizer_mib", "activations_mib", "workspace_mib", "cuda_context_mib")
    assert all(k in body for k in ("peak_mib", *parts))
    assert body["peak_mib"] >= sum(body[k] for k in parts) - 1


def test_estimate_fit_and_table(run_cli):
    code, out, err = run_cli("estimate", "--model", "resnet18", "--image-size", "64", "--fit", "4GB")
    assert code == 0, err
    assert "largest batch on the ladder that fits 4GB" in out and "512" in out


def test_estimate_unknown_model_is_a_clean_error(run_cli):
    code, out, err = run_cli("estimate", "--model", "resnet5O", "--batch-size", "8")
    assert code == 2 and "resnet50" in err and "Traceback" not in err
