"""Model control with the real tritonclient: explicit mode (`--load-model`, load with a config
override and with files, unload with and without dependents, ensembles loading their steps) and
poll mode (added and removed versions, changed and broken configs).

Each mode runs its own tessera on a temporary copy of a few models of model_repository/.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import MODEL_REPOSITORY, binary, launch, stop

ENSEMBLE = """
name: "add_sub_twice"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "TWICE_A" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "TWICE_B" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    { model_name: "add_sub" model_version: -1
      input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "DIFF" } },
    { model_name: "add_sub_wasm" model_version: -1
      input_map { key: "INPUT0" value: "SUM" } input_map { key: "INPUT1" value: "DIFF" }
      output_map { key: "OUTPUT0" value: "TWICE_A" } output_map { key: "OUTPUT1" value: "TWICE_B" } }
  ]
}
"""


def wait_until(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting until {what}")


def infer_add_sub(client, model: str, a, b, names=("INPUT0", "INPUT1"),
                  outputs=("OUTPUT0", "OUTPUT1")):
    inputs = []
    for name, value in zip(names, (a, b)):
        tensor = httpclient.InferInput(name, [1, 16], "FP32")
        tensor.set_data_from_numpy(value.reshape(1, 16))
        inputs.append(tensor)
    result = client.infer(model, inputs)
    return [result.as_numpy(o).reshape(16) for o in outputs]


def states(client) -> dict[str, str]:
    """name -> state of its newest row ('' for a model never loaded)."""
    out = {}
    for row in client.get_model_repository_index():
        out[row["name"]] = row.get("state", "")
    return out


@pytest.fixture(scope="module")
def explicit(request):
    repo = Path(tempfile.mkdtemp(prefix="tessera-control-"))
    for name in ("add_sub", "add_sub_wasm"):
        shutil.copytree(MODEL_REPOSITORY / name, repo / name)
    (repo / "add_sub_twice" / "1").mkdir(parents=True)
    (repo / "add_sub_twice" / "config.pbtxt").write_text(ENSEMBLE)
    srv, proc, log = launch(binary(), ["--model-repository", str(repo),
                                       "--model-control-mode", "explicit",
                                       "--load-model", "add_sub"])
    client = httpclient.InferenceServerClient(url=srv.url, network_timeout=60)
    failed_before = request.session.testsfailed
    yield srv, client
    client.close()
    stop(proc, log, keep=request.session.testsfailed > failed_before)
    shutil.rmtree(repo, ignore_errors=True)


A = np.arange(16, dtype=np.float32)
B = np.ones(16, dtype=np.float32)


def test_explicit_mode_loads_only_the_named_models(explicit):
    _, client = explicit
    assert states(client) == {"add_sub": "READY", "add_sub_wasm": "", "add_sub_twice": ""}
    assert client.is_model_ready("add_sub")
    assert not client.is_model_ready("add_sub_wasm")


def test_load_and_unload(explicit):
    _, client = explicit
    client.load_model("add_sub_wasm")
    assert client.is_model_ready("add_sub_wasm")
    total, diff = infer_add_sub(client, "add_sub_wasm", A, B)
    np.testing.assert_allclose(total, A + B)
    client.unload_model("add_sub_wasm")
    assert not client.is_model_ready("add_sub_wasm")
    rows = [r for r in client.get_model_repository_index() if r["name"] == "add_sub_wasm"]
    assert rows and rows[0]["state"] == "UNAVAILABLE" and rows[0]["reason"] == "unloaded"
    with pytest.raises(InferenceServerException):
        infer_add_sub(client, "add_sub_wasm", A, B)


def test_an_ensemble_loads_its_steps_and_unloads_those_it_loaded(explicit):
    _, client = explicit
    client.load_model("add_sub_twice")
    assert client.is_model_ready("add_sub_twice")
    assert client.is_model_ready("add_sub_wasm"), "a step loads with the ensemble"
    twice_a, twice_b = infer_add_sub(client, "add_sub_twice", A, B, names=("A", "B"),
                                     outputs=("TWICE_A", "TWICE_B"))
    np.testing.assert_allclose(twice_a, 2 * A)
    np.testing.assert_allclose(twice_b, 2 * B)
    client.unload_model("add_sub_twice")
    assert not client.is_model_ready("add_sub_twice")
    assert not client.is_model_ready("add_sub_wasm"), "loaded only for the ensemble"
    assert client.is_model_ready("add_sub"), "loaded on request, so it stays"


def test_unload_dependents(explicit):
    _, client = explicit
    client.load_model("add_sub_twice")
    client.unload_model("add_sub", unload_dependents=True)
    assert not client.is_model_ready("add_sub")
    assert not client.is_model_ready("add_sub_twice")
    client.load_model("add_sub")
    assert client.is_model_ready("add_sub")


def test_an_ensemble_whose_step_is_unloaded_is_unavailable_until_the_step_returns(explicit):
    """Unloading a step without its dependents leaves the ensemble UNAVAILABLE, saying which
    step is missing (as Triton), rather than READY and failing at the step; loading the step
    again brings the ensemble back without being asked."""
    _, client = explicit
    client.load_model("add_sub_twice")
    client.unload_model("add_sub")
    assert not client.is_model_ready("add_sub_twice")
    rows = [r for r in client.get_model_repository_index() if r["name"] == "add_sub_twice"]
    assert rows and rows[0]["state"] == "UNAVAILABLE", rows
    assert rows[0]["reason"] == "ensemble contains models that are not available: add_sub", rows
    with pytest.raises(InferenceServerException) as refused:
        infer_add_sub(client, "add_sub_twice", A, B, names=("A", "B"),
                      outputs=("TWICE_A", "TWICE_B"))
    assert "not available: add_sub" in refused.value.message(), refused.value
    assert client.is_server_ready(), "a model unloaded on request does not make it unready"
    client.load_model("add_sub")
    assert client.is_model_ready("add_sub_twice")
    twice_a, _ = infer_add_sub(client, "add_sub_twice", A, B, names=("A", "B"),
                               outputs=("TWICE_A", "TWICE_B"))
    np.testing.assert_allclose(twice_a, 2 * A)
    # With both steps unloaded, loading one leaves the other unloaded (planning the ensemble
    # again would load it): the ensemble waits, naming the step still missing.
    client.unload_model("add_sub")
    client.unload_model("add_sub_wasm")
    client.load_model("add_sub")
    assert not client.is_model_ready("add_sub_wasm"), "a step unloaded on request came back"
    rows = [r for r in client.get_model_repository_index() if r["name"] == "add_sub_twice"]
    assert rows[0]["reason"].endswith("not available: add_sub_wasm"), rows
    client.load_model("add_sub_wasm")
    assert client.is_model_ready("add_sub_twice")
    client.unload_model("add_sub_twice")


def test_load_with_a_config_override(explicit):
    _, client = explicit
    config = client.get_model_config("add_sub")
    assert int(config["max_batch_size"]) == 8
    config["max_batch_size"] = 2
    client.load_model("add_sub", config=json.dumps(config))
    assert int(client.get_model_config("add_sub")["max_batch_size"]) == 2
    total, _ = infer_add_sub(client, "add_sub", A, B)
    np.testing.assert_allclose(total, A + B)
    # Loading without a config goes back to the repository's config.pbtxt.
    client.load_model("add_sub")
    assert int(client.get_model_config("add_sub")["max_batch_size"]) == 8


def test_load_with_files_deploys_a_new_model(explicit):
    _, client = explicit
    config = client.get_model_config("add_sub")
    config["name"] = "add_sub_copy"
    onnx = (MODEL_REPOSITORY / "add_sub" / "1" / "model.onnx").read_bytes()
    client.load_model("add_sub_copy", config=json.dumps(config),
                      files={"file:1/model.onnx": onnx})
    assert client.is_model_ready("add_sub_copy")
    total, diff = infer_add_sub(client, "add_sub_copy", A, B)
    np.testing.assert_allclose(total, A + B)
    np.testing.assert_allclose(diff, A - B)
    assert states(client)["add_sub_copy"] == "READY"


def test_a_broken_reload_keeps_the_old_version_serving(explicit):
    _, client = explicit
    config = client.get_model_config("add_sub")
    assert config["input"][0]["dims"] == [16]  # numbers, as Triton writes them
    config["input"][0]["dims"] = ["15"]  # does not match the ONNX file (strings are taken too)
    with pytest.raises(InferenceServerException, match="unchanged"):
        client.load_model("add_sub", config=json.dumps(config))
    assert client.is_model_ready("add_sub")
    assert client.get_model_config("add_sub")["input"][0]["dims"] == [16]
    total, _ = infer_add_sub(client, "add_sub", A, B)
    np.testing.assert_allclose(total, A + B)


def test_unknown_models(explicit):
    _, client = explicit
    with pytest.raises(InferenceServerException, match="no model directory"):
        client.load_model("no_such_model")
    with pytest.raises(InferenceServerException, match="no model"):
        client.unload_model("no_such_model")


def test_index_of_ready_models(explicit):
    srv, _ = explicit
    status, _, body = srv.post_json("/v2/repository/index", {"ready": True})
    assert status == 200
    rows = json.loads(body)
    assert rows and all(r["state"] == "READY" for r in rows)
    assert "add_sub_twice" not in {r["name"] for r in rows}


@pytest.fixture(scope="module")
def polled(request):
    repo = Path(tempfile.mkdtemp(prefix="tessera-poll-"))
    model = repo / "polled"
    shutil.copytree(MODEL_REPOSITORY / "add_sub_wasm", model)
    config = (model / "config.pbtxt").read_text().replace('"add_sub_wasm"', '"polled"')
    (model / "config.pbtxt").write_text(config + "\nversion_policy: { all: {} }\n")
    srv, proc, log = launch(binary(), ["--model-repository", str(repo),
                                       "--model-control-mode", "poll",
                                       "--repository-poll-secs", "1"])
    client = httpclient.InferenceServerClient(url=srv.url, network_timeout=60)
    failed_before = request.session.testsfailed
    yield client, model
    client.close()
    stop(proc, log, keep=request.session.testsfailed > failed_before)
    shutil.rmtree(repo, ignore_errors=True)


def test_poll_picks_up_an_added_version(polled):
    client, model = polled
    assert client.is_model_ready("polled", "1")
    assert not client.is_model_ready("polled", "2")
    shutil.copytree(model / "1", model / "2")
    wait_until(lambda: client.is_model_ready("polled", "2"), "version 2 is READY")
    assert client.is_model_ready("polled", "1")


def test_poll_picks_up_a_removed_version(polled):
    client, model = polled
    shutil.rmtree(model / "1")
    wait_until(lambda: not client.is_model_ready("polled", "1"), "version 1 is gone")
    assert client.is_model_ready("polled", "2")
    total, _ = infer_add_sub(client, "polled", A, B)
    np.testing.assert_allclose(total, A + B)


def test_poll_picks_up_a_changed_config(polled):
    client, model = polled
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 4"))
    wait_until(lambda: int(client.get_model_config("polled")["max_batch_size"]) == 4,
               "the new config serves")


def test_poll_keeps_serving_through_a_broken_config(polled):
    client, model = polled
    config = model / "config.pbtxt"
    good = config.read_text()
    config.write_text(good + "\nthis is not a config\n")
    time.sleep(2.5)  # two polls
    assert client.is_model_ready("polled", "2")
    assert int(client.get_model_config("polled")["max_batch_size"]) == 4
    total, _ = infer_add_sub(client, "polled", A, B)
    np.testing.assert_allclose(total, A + B)
    config.write_text(good)


def test_poll_mode_refuses_load_and_unload(polled):
    client, _ = polled
    with pytest.raises(InferenceServerException, match="polling"):
        client.load_model("polled")
    with pytest.raises(InferenceServerException, match="polling"):
        client.unload_model("polled")
