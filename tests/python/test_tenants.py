"""Tenants with the real tritonclient: a tenant's key in a header is all a client needs. A tenant
deploys a model and an ensemble of its own model and a shared (granted) operator model with
`load_model`; another tenant's calls find none of it, exactly as for names that do not exist; no
key is refused.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import MODEL_REPOSITORY, binary, launch, stop, wait_for

ADMIN_KEY = "pytest-admin-key-0123456789"

ENSEMBLE = {
    "name": "twice",
    "platform": "ensemble",
    "max_batch_size": 8,
    "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [16]},
              {"name": "B", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "TWICE_A", "data_type": "TYPE_FP32", "dims": [16]},
               {"name": "TWICE_B", "data_type": "TYPE_FP32", "dims": [16]}],
    "ensemble_scheduling": {"step": [
        # The operator's add_sub, granted to the tenant, then the tenant's own Wasm handler.
        {"model_name": "add_sub", "model_version": -1,
         "input_map": {"INPUT0": "A", "INPUT1": "B"},
         "output_map": {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}},
        {"model_name": "mine", "model_version": -1,
         "input_map": {"INPUT0": "SUM", "INPUT1": "DIFF"},
         "output_map": {"OUTPUT0": "TWICE_A", "OUTPUT1": "TWICE_B"}},
    ]},
}

A = np.arange(16, dtype=np.float32)
B = np.ones(16, dtype=np.float32)


def admin(srv, method: str, path: str, body=None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    status, _, answer = srv.request(method, path, data,
                                    {"Authorization": f"Bearer {ADMIN_KEY}",
                                     "Content-Type": "application/json"})
    assert status in (200, 201), (status, answer)
    return json.loads(answer)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def infer(client, model: str, headers, names=("INPUT0", "INPUT1"), outputs=("OUTPUT0", "OUTPUT1")):
    inputs = []
    for name, value in zip(names, (A, B)):
        tensor = httpclient.InferInput(name, [1, 16], "FP32")
        tensor.set_data_from_numpy(value.reshape(1, 16))
        inputs.append(tensor)
    result = client.infer(model, inputs, headers=headers)
    assert result.get_response()["model_name"] == model
    return [result.as_numpy(o).reshape(16) for o in outputs]


def refusal(call) -> tuple[int | None, str]:
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value.status(), e.value.message()


@pytest.fixture(scope="module")
def tenancy(request):
    repo = Path(tempfile.mkdtemp(prefix="tessera-tenants-"))
    for name in ("add_sub", "add_sub_wasm"):
        shutil.copytree(MODEL_REPOSITORY / name, repo / name)
    key_file = repo.parent / f"{repo.name}.key"
    key_file.write_text(ADMIN_KEY)
    srv, proc, log = launch(binary(), ["--model-repository", str(repo),
                                       "--admin-key-file", str(key_file)])
    client = httpclient.InferenceServerClient(url=srv.url, network_timeout=60)
    keys = {}
    for name in ("acme", "beta"):
        admin(srv, "POST", "/v1/tenants", {"name": name})
        keys[name] = admin(srv, "POST", f"/v1/tenants/{name}/keys")["key"]
    admin(srv, "POST", "/v1/tenants/acme/grants/add_sub")
    failed_before = request.session.testsfailed
    yield srv, client, keys
    client.close()
    stop(proc, log, keep=request.session.testsfailed > failed_before)
    shutil.rmtree(repo, ignore_errors=True)
    key_file.unlink(missing_ok=True)


def test_a_tenant_deploys_and_calls_with_a_header(tenancy):
    _, client, keys = tenancy
    acme = bearer(keys["acme"])
    # The shared model, granted: visible and callable.
    assert client.is_model_ready("add_sub", headers=acme)
    total, diff = infer(client, "add_sub", acme)
    np.testing.assert_allclose(total, A + B)
    # Its own handler and an ensemble over the shared model and its own.
    config = client.get_model_config("add_sub_wasm", headers=bearer(ADMIN_KEY))
    config["name"] = "mine"
    wasm = (MODEL_REPOSITORY / "add_sub_wasm" / "1" / "model.wasm").read_bytes()
    client.load_model("mine", config=json.dumps(config), files={"file:1/model.wasm": wasm},
                      headers=acme)
    client.load_model("twice", config=json.dumps(ENSEMBLE), files={"file:1/ensemble.txt": b"an ensemble has no model file"},
                      headers=acme)
    assert client.is_model_ready("twice", headers=acme)
    twice_a, twice_b = infer(client, "twice", acme, names=("A", "B"),
                             outputs=("TWICE_A", "TWICE_B"))
    np.testing.assert_allclose(twice_a, 2 * A)
    np.testing.assert_allclose(twice_b, 2 * B)
    assert client.get_model_metadata("twice", headers=acme)["name"] == "twice"
    names = {row["name"] for row in client.get_model_repository_index(headers=acme)}
    assert {"add_sub", "mine", "twice"} <= names and "add_sub_wasm" not in names
    stats = client.get_inference_statistics("mine", headers=acme)["model_stats"]
    assert stats[0]["name"] == "mine" and stats[0]["inference_count"] >= 1


def test_another_tenant_finds_nothing_of_it(tenancy):
    _, client, keys = tenancy
    beta = bearer(keys["beta"])
    # Deployed by acme (if the test before ran) or shared but not granted: like a missing name.
    for name, absent in (("twice", "other"), ("mine", "nope"), ("add_sub", "sub_add")):
        assert not client.is_model_ready(name, headers=beta)
        theirs = refusal(lambda: infer(client, name, beta))
        nobodys = refusal(lambda: infer(client, absent, beta))
        assert (theirs[0], theirs[1].replace(name, "X")) == \
            (nobodys[0], nobodys[1].replace(absent, "X")), (theirs, nobodys)
        assert "not found" in theirs[1]
        theirs = refusal(lambda: client.get_model_metadata(name, headers=beta))
        nobodys = refusal(lambda: client.get_model_metadata(absent, headers=beta))
        assert theirs[1].replace(name, "X") == nobodys[1].replace(absent, "X")
        theirs = refusal(lambda: client.unload_model(name, headers=beta))
        nobodys = refusal(lambda: client.unload_model(absent, headers=beta))
        assert theirs[1].replace(name, "X") == nobodys[1].replace(absent, "X")
    assert client.get_model_repository_index(headers=beta) == []


def test_no_key_is_refused(tenancy):
    _, client, _ = tenancy
    status, message = refusal(lambda: client.get_model_metadata("add_sub"))
    assert "API key" in message
    assert client.is_server_live()  # health stays open


def test_grpc_takes_the_same_keys(tenancy):
    import tritonclient.grpc as grpcclient

    srv, _, keys = tenancy
    grpc = grpcclient.InferenceServerClient(url=f"{srv.host}:{srv.grpc_port}")
    try:
        # gRPC metadata keys are lower case.
        acme = {"authorization": f"Bearer {keys['acme']}"}
        assert grpc.is_model_ready("add_sub", headers=acme)
        inputs = []
        for name, value in (("INPUT0", A), ("INPUT1", B)):
            t = grpcclient.InferInput(name, [1, 16], "FP32")
            t.set_data_from_numpy(value.reshape(1, 16))
            inputs.append(t)
        result = grpc.infer("add_sub", inputs, headers=acme)
        np.testing.assert_allclose(result.as_numpy("OUTPUT0").reshape(16), A + B)
        # beta was not granted add_sub: NOT_FOUND, as for a model that does not exist.
        with pytest.raises(InferenceServerException) as e:
            grpc.infer("add_sub", inputs, headers={"authorization": f"Bearer {keys['beta']}"})
        assert str(e.value.status()) == "StatusCode.NOT_FOUND"
        with pytest.raises(InferenceServerException) as e:
            grpc.infer("add_sub", inputs)
        assert str(e.value.status()) == "StatusCode.UNAUTHENTICATED"
        assert grpc.is_server_live()  # health stays open
    finally:
        grpc.close()


def test_a_grpc_caller_without_a_key_holds_no_buffered_bytes(tenancy):
    """The key is read before any message: a call without a valid one that begins a 3 MB
    message ends with UNAUTHENTICATED at its prefix, holding nothing, while the same message
    from a tenant is held as it is read (and ends with the call)."""
    import http.client

    from test_hardening import _H2Grpc

    srv, _, keys = tenancy

    def buffered() -> float:
        conn = http.client.HTTPConnection(srv.host, srv.metrics_port, timeout=10)
        conn.request("GET", "/metrics", headers=bearer(ADMIN_KEY))
        text = conn.getresponse().read().decode()
        conn.close()
        return next(float(line.split()[1]) for line in text.splitlines()
                    if line.startswith("tessera_buffered_bytes "))

    h2c = _H2Grpc(srv)
    try:
        for metadata in ((), (("authorization", "Bearer tsk_nobody_x"),)):
            sid = h2c.start_message(3_000_000, 1_000, metadata=metadata)
            answer = h2c.status(sid, timeout=10)
            assert answer.get("grpc-status") == "16", answer
            assert buffered() == 0
        tenant = (("authorization", f"Bearer {keys['acme']}"),)
        sid = h2c.start_message(3_000_000, 1_000, metadata=tenant)
        wait_for(lambda: buffered() >= 3_000_000, timeout=10)
        assert "grpc-status" not in h2c.headers[sid]
    finally:
        h2c.close()
    wait_for(lambda: buffered() == 0, timeout=10)


def test_shared_memory_is_the_operators(tenancy):
    srv, _, keys = tenancy
    body = json.dumps({"key": "/dev-shm-anything", "offset": 0, "byte_size": 64}).encode()
    status, _, answer = srv.request("POST", "/v2/systemsharedmemory/region/r/register", body,
                                    {**bearer(keys["acme"]), "Content-Type": "application/json"})
    assert status == 403, answer
    status, _, _ = srv.request("GET", "/v2/systemsharedmemory/status", None, bearer(ADMIN_KEY))
    assert status == 200


def test_a_tenant_named_function_calls_in_its_own_namespace(tenancy):
    # A function's calls are marked in the call chain; a tenant whose name reads like that
    # mark must still have its handler's calls resolve among its own models (it has no grant).
    srv, client, _ = tenancy
    admin(srv, "POST", "/v1/tenants", {"name": "function"})
    key = bearer(admin(srv, "POST", "/v1/tenants/function/keys")["key"])
    config = (MODEL_REPOSITORY / "bls_branch" / "config.pbtxt").read_text()
    wasm = (MODEL_REPOSITORY / "bls_branch" / "1" / "model.wasm").read_bytes()
    status, _, body = srv.request(
        "POST", "/v2/repository/models/bls_branch/load",
        json.dumps({"parameters": {"config": _config_json(config),
                                   "file:1/model.wasm": _b64(wasm)}}).encode(),
        {**key, "Content-Type": "application/json"})
    assert status == 200, body
    code, message = refusal(lambda: infer(client, "bls_branch", key, outputs=("OUTPUT",)))
    # The operator's add_sub is not the tenant's to call: as if it did not exist.
    assert "add_sub" in message and "unknown model" in message.lower(), (code, message)


def _config_json(pbtxt: str) -> str:
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    return json.dumps(json_format.MessageToDict(
        text_format.Parse(pbtxt, model_config_pb2.ModelConfig()), preserving_proto_field_name=True))


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def test_deployments_sent_at_once_stay_within_the_tenants_quota(tenancy):
    srv, client, _ = tenancy
    admin(srv, "POST", "/v1/tenants", {"name": "gamma"})
    key = bearer(admin(srv, "POST", "/v1/tenants/gamma/keys")["key"])
    admin(srv, "PUT", "/v1/tenants/gamma/quotas", {"max_models": 2})
    config = (MODEL_REPOSITORY / "add_sub_wasm" / "config.pbtxt").read_text()
    wasm = _b64((MODEL_REPOSITORY / "add_sub_wasm" / "1" / "model.wasm").read_bytes())

    def deploy(i: int) -> int:
        body = {"parameters": {"config": _config_json(config.replace('"add_sub_wasm"',
                                                                     f'"q{i}"')),
                               "file:1/model.wasm": wasm}}
        status, _, _ = srv.request("POST", f"/v2/repository/models/q{i}/load",
                                   json.dumps(body).encode(),
                                   {**key, "Content-Type": "application/json"}, timeout=120)
        return status

    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        statuses = list(pool.map(deploy, range(6)))
    assert sorted(statuses) == [200, 200, 403, 403, 403, 403], statuses
    names = {row["name"] for row in client.get_model_repository_index(headers=key)}
    assert len(names) == 2, names


def test_a_refusal_before_the_body_is_read_says_the_connection_closes(tenancy):
    srv, _, keys = tenancy
    big = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                  "data": [0.0] * 16}], "pad": "x" * 65536}).encode()
    status, headers, _ = srv.request("POST", "/v2/models/add_sub/infer", big)
    assert status == 401 and headers.get("connection") == "close", (status, headers)
    # An answer after the body was read keeps the connection.
    body = json.dumps({"inputs": [
        {"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
        for n in ("INPUT0", "INPUT1")]}).encode()
    status, headers, _ = srv.request("POST", "/v2/models/add_sub/infer", body,
                                     bearer(keys["acme"]))
    assert status == 200 and "connection" not in headers, (status, headers)
