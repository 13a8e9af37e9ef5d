"""Triton Python models (model.py), unchanged, built by `tessera build` and served sandboxed.

Triton's own python_backend examples (examples/triton-python, byte for byte upstream) are built
with componentize-py into Wasm components and served by the real binary; Triton's own clients
and tritonclient (HTTP and gRPC) check the answers. The BLS examples reach a Python model, an
ONNX model and a Rust handler through the server's queue. A probe model.py checks that the
sandbox holds for Python exactly as for Rust guests: a `while True`, a memory bomb and
`open('/etc/passwd')` are each contained, and the model serves again after each.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import urllib.request
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import (
    COMPONENTIZE_PY, REPO_ROOT, add_rust_add_sub, add_sub_inputs, binary, launch, metric, probe,
    sse_events, stop, tessera_build,
)

EXAMPLES = REPO_ROOT / "examples" / "triton-python"

# SHA-256 of the files as they are upstream (triton-inference-server/python_backend f9088ff).
UPSTREAM = {
    "repository/add_sub/1/model.py": "967a1df810d9e24e7cbb9c65aacc12778e3020d7525c1e8196c7fb669bf1ce05",
    "repository/bls_sync/1/model.py": "bd0987773ba0ac43fa218e3cac39dfc5947b0423e11d9ae65385efb4200721f5",
    "repository/bls_async/1/model.py": "5c8fa77e676567f87f9b8044f1e7bbb3041b9cd86211c8f92f0f439445af15be",
    "clients/add_sub_client.py": "5609f82cebe6fc1b562aed228dbe791a24db3a7e0087706380624c9ecb3b7810",
    "clients/sync_client.py": "74ed6e3fb2522cdf89fbbc27c0dbb71f0cd467fde9027401576172776decd3c8",
    "clients/async_client.py": "20d82530417b19e89fb52628799521a1b7f32dd01eaecbfad51987af4522e00e",
    # examples/decoupled: square_model.py, repeat_model.py, their configs and clients.
    "repository/square_int32/1/model.py": "8a6b6f82ddea3fcec7a0a47c67490780ef0d7aba588e44606da8edbae9df4288",
    "repository/repeat_int32/1/model.py": "c4eead9d61829b993e17aa2e631c5acf10f3df9342ae611e227184f2253d5725",
    "repository/square_int32/config.pbtxt": "cd68891b174ef23f2515187ae3ca97bb014e38a751ad62ad8d1eb8959f8531e0",
    "repository/repeat_int32/config.pbtxt": "d5e673f285a628d78a9e0cb12d4e994bff57180916c443bc8992a196cc27d18a",
    "clients/square_client.py": "d4a678870f8ed629a8065b97bd5eca1686987febcbe3b77bfebfae315e191c30",
    "clients/repeat_client.py": "3f274e597fd271dfa18e0c3d93b76cb45dc6ea0e6e5b10bbee3d39e6aef3fcb0",
    # examples/bls_decoupled: the synchronous BLS call of a decoupled model (square_int32).
    "repository/bls_decoupled_sync/1/model.py": "b7716703e97f2973f29ae94bdc1a771e32121dcc6a443651fea6750ee7e72a33",
    "repository/bls_decoupled_sync/config.pbtxt": "fecf9f2ed7c0314a40a0dcf01c03cb042b6e353b2608fc76c522d1fdd71830a1",
    "clients/bls_decoupled_sync_client.py": "8fd19ada23d53fe6fcd1dc46837a996b0072b48fb5146c60b1632d5fc6b1d14b",
    # examples/custom_metrics: pb_utils.MetricFamily, read back from /metrics by the client.
    "repository/custom_metrics/1/model.py": "961d115b7bd18876c0eaa9117b41fa4122643c8669d32292855d813f288d8015",
    "repository/custom_metrics/config.pbtxt": "b5ef232d7afd41b16f8699a4aa3f37c0a817651a57f3e1c9d8847cb9beea8af8",
    "clients/custom_metrics_client.py": "5287880bcbd2e0fd3a147923d78491308ad023a38b66e784767fc64c98d29da1",
    # examples/auto_complete: models without config.pbtxt, completed by auto_complete_config.
    "repository/nobatch_auto_complete/1/model.py": "aa7f4f6b7b3a6df1b2ba7c00c0f242eae759cca3aabd991a8c8fd5be540f3da4",
    "repository/batch_auto_complete/1/model.py": "ee45461e087cf3ad4d2ae1070d1e27b8a25afdcf175de91490c33b670ed4e1d5",
    "clients/auto_complete_client.py": "210ba85d9d01f49b44c493061d49c9ba30cb46b5ad2b812086aa355d9c9e658b",
}

# A Triton-style model.py that misbehaves on request: MODE picks how.
PROBE = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            # Mistakes in what execute returns: each an error answer, the instance kept.
            if mode == "not_a_list":
                return pb_utils.InferenceResponse(output_tensors=[])
            if mode == "base_exception":
                raise BaseException("not an Exception")
            if mode == "huge_parameter":
                responses.append(pb_utils.InferenceResponse(parameters={"a": 2**70}))
                continue
            if mode == "object_parameter":
                responses.append(pb_utils.InferenceResponse(parameters={"a": object()}))
                continue
            if mode == "tensor_named_5":
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(5, np.ones(1))]))
                continue
            if mode == "count":
                self.count = getattr(self, "count", 0) + 1
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", np.array([str(self.count).encode()], dtype=np.object_))]))
                continue
            if mode == "loop":
                while True:
                    pass
            if mode == "memory":
                hoard = []
                while True:
                    hoard.append(bytearray(16 << 20))
            if mode == "numpy":
                # What pre/post-processing does, with the sandbox's numpy.
                logits = np.array([[1.0, 3.0, 2.0, -1.0], [0.5, 0.5, 4.0, 1.0]], dtype=np.float32)
                e = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
                probs = e / np.sum(e, axis=-1, keepdims=True)
                both = np.concatenate([logits, probs], axis=0)
                out = json.dumps({"probs": probs.tolist(), "dtype": str(probs.dtype),
                                  "argmax": np.argmax(probs, axis=-1).tolist(),
                                  "shape": list(both.shape),
                                  "has_linalg": hasattr(np, "linalg")}).encode()
            elif mode == "metrics":
                family = pb_utils.MetricFamily
                gauge = family("probe_py_queue", "Queue depth", family.GAUGE).Metric(
                    labels={"stage": "pre"})
                gauge.set(7)
                gauge.increment(-2)
                sizes = family("probe_py_sizes", "Sizes", family.HISTOGRAM).Metric(buckets=[1, 10])
                sizes.observe(3)
                self.held = [gauge, sizes]  # on /metrics while held
                attempts = {
                    "reserved": lambda: family("nv_inference_count", "x", family.COUNTER),
                    "kind": lambda: family("probe_py_queue", "x", family.COUNTER),
                    "negative": lambda: family("probe_py_total", "t", family.COUNTER).Metric()
                    .increment(-1),
                    "no_buckets": lambda: family("probe_py_sizes", "Sizes", family.HISTOGRAM)
                    .Metric(),
                    "set_counter": lambda: family("probe_py_total", "t", family.COUNTER).Metric()
                    .set(3),
                }
                refused = {}
                for name, attempt in attempts.items():
                    try:
                        attempt()
                        refused[name] = "accepted"
                    except pb_utils.TritonModelException as e:
                        refused[name] = str(e)
                out = json.dumps({"gauge": gauge.value(), "refused": refused}).encode()
            elif mode == "file":
                with open("/etc/passwd") as f:
                    text = f.read()
                out = text.encode()
            else:
                out = b"ok:" + mode.encode()
            tensor = pb_utils.Tensor("OUT", np.array([out], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
'''
# A decoupled model.py whose MODE picks how its stream ends.
DECOUPLED_PROBE = '''
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def text(s):
    tensor = pb_utils.Tensor("OUT", np.array([s.encode()], dtype=np.object_))
    return pb_utils.InferenceResponse(output_tensors=[tensor])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            sender = request.get_response_sender()
            if mode == "raise":
                sender.send(text("before"))
                raise pb_utils.TritonModelException("raised on purpose")
            if mode == "no-final":
                sender.send(text("only"))
                continue
            if mode == "error":
                error = pb_utils.TritonError("bad value", pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            for word in mode.split():
                sender.send(text(word))
            sender.send(flags=FINAL)
            try:
                sender.send(text("after the final"))
            except pb_utils.TritonModelException as e:
                pb_utils.Logger.log_info(f"refused: {e}")
        return None
'''
DECOUPLED_PROBE_CONFIG = '''
name: "decoupled_probe"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
'''
# A decoupled `async def execute`, as Triton runs it since 24.04: in the background, so the next
# batch starts while this one awaits. MODE: words sent half a second apart, or how it fails.
ASYNC_PROBE = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def text(s):
    tensor = pb_utils.Tensor("OUT", np.array([s.encode()], dtype=np.object_))
    return pb_utils.InferenceResponse(output_tensors=[tensor])


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(self.stream(request) for request in requests))

    async def stream(self, request):
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        sender = request.get_response_sender()
        if mode == "raise":
            sender.send(text("before"))
            await asyncio.sleep(0.01)
            raise pb_utils.TritonModelException("raised on purpose")
        if mode == "no-final":
            sender.send(text("only"))
            return
        for word in mode.split():
            await asyncio.sleep(0.5)
            sender.send(text(word))
        sender.send(flags=FINAL)
'''
ASYNC_PROBE_CONFIG = '''
name: "async_probe"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''
# The same with Tessera's own API: an async generator, one instance.
ASYNC_WORDS = '''
import asyncio

import tessera


class Words(tessera.Handler):
    async def execute(self, request):
        [text] = request.strings("TEXT")
        for word in text.split():
            await asyncio.sleep(0.5)
            yield {"OUT": [word]}
'''
ASYNC_WORDS_CONFIG = '''
name: "async_words"
backend: "wasm"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''
# Returns N zeros: each returned buffer stays in the guest's memory (componentize-py 0.25 frees
# no returned list<u8>), so the server replaces the instance before it reaches its limit.
BIG_OUTPUT = '''
import numpy as np
import tessera


class Big(tessera.Handler):
    def execute(self, request):
        return {"F": np.zeros((int(request.numpy("N")[0]),), dtype=np.float32)}
'''
BIG_OUTPUT_CONFIG = '''
name: "big_output"
backend: "wasm"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "F" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters: { key: "max_memory_bytes" value: { string_value: "67108864" } }
'''
# A model.py whose auto_complete_config misbehaves as its configuration's `mode` parameter says;
# with mode "ok" it completes its configuration and serves.
COMPLETION_PROBE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        settings = config.as_dict()
        mode = settings["parameters"]["mode"]["string_value"]
        if mode == "loop":
            while True:
                pass
        if mode == "raise":
            raise RuntimeError("refused on purpose")
        if mode == "call":
            request = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", np.zeros(4, dtype=np.float32))])
            response = request.exec()
            raise RuntimeError(response.error().message() if response.has_error() else "it called")
        if mode == "escalate":
            settings["instance_group"] = [{"count": 64, "kind": "KIND_CPU"}]
        if mode == "none":
            return None
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [3]})
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]})
        if mode == "stream":  # decoupled: the same component streams
            config.set_model_transaction_policy({"decoupled": True})
            return config
        config.set_max_batch_size(2)
        config.set_dynamic_batching()
        return config

    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if self.decoupled:
                sender = request.get_response_sender()
                for factor in (2, 3):
                    out = pb_utils.Tensor("OUT", (x * factor).astype(np.float32))
                    flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if factor == 3 else 0
                    sender.send(pb_utils.InferenceResponse(output_tensors=[out]), flags=flags)
                continue
            out = pb_utils.Tensor("OUT", (x * 2).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return None if self.decoupled else responses
'''
PROBE_CONFIG = '''
name: "sandbox_probe"
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters: { key: "execute_deadline_ms" value: { string_value: "2000" } }
parameters: { key: "max_memory_bytes" value: { string_value: "134217728" } }
'''


@pytest.fixture(scope="module")
def python_server():
    if not COMPONENTIZE_PY.exists():
        pytest.fail(f"{COMPONENTIZE_PY} missing: run scripts/setup-python.sh", pytrace=False)
    work = Path(tempfile.mkdtemp(prefix="tessera-python-models-"))
    repo = work / "repository"
    shutil.copytree(EXAMPLES / "repository", repo,
                    ignore=shutil.ignore_patterns("model.wasm", "__pycache__"))
    (repo / "sandbox_probe" / "1").mkdir(parents=True)
    (repo / "sandbox_probe" / "config.pbtxt").write_text(PROBE_CONFIG)
    (repo / "sandbox_probe" / "1" / "model.py").write_text(PROBE)
    (repo / "decoupled_probe" / "1").mkdir(parents=True)
    (repo / "decoupled_probe" / "config.pbtxt").write_text(DECOUPLED_PROBE_CONFIG)
    (repo / "decoupled_probe" / "1" / "model.py").write_text(DECOUPLED_PROBE)
    for name, source, config in (("async_probe", ASYNC_PROBE, ASYNC_PROBE_CONFIG),
                                 ("async_words", ASYNC_WORDS, ASYNC_WORDS_CONFIG),
                                 ("big_output", BIG_OUTPUT, BIG_OUTPUT_CONFIG)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(source)
    add_rust_add_sub(repo)
    # A Python model nobody built: refused at load, naming the command that builds it.
    shutil.copytree(repo / "add_sub", repo / "unbuilt")
    config = (repo / "unbuilt" / "config.pbtxt").read_text()
    (repo / "unbuilt" / "config.pbtxt").write_text(config.replace('"add_sub"', '"unbuilt"'))
    # Handlers written against Tessera's own Python API (backend "wasm").
    for model in ("add_sub_py", "bls_py", "count_py"):
        shutil.copytree(REPO_ROOT / "examples" / "python" / model, repo / model,
                        ignore=shutil.ignore_patterns("model.wasm", "__pycache__"))
    # Served by a server of its own (tests load it with configurations of their own).
    completion = work / "completion"
    (completion / "completion_probe" / "1").mkdir(parents=True)
    (completion / "completion_probe" / "1" / "model.py").write_text(COMPLETION_PROBE)
    models = ("add_sub", "bls_sync", "bls_async", "sandbox_probe", "add_sub_py", "bls_py",
              "count_py", "square_int32", "repeat_int32", "decoupled_probe", "bls_decoupled_sync",
              "custom_metrics", "nobatch_auto_complete", "batch_auto_complete", "async_probe",
              "async_words", "big_output")
    folders = [repo / m for m in models] + [completion / "completion_probe"]
    # Two builds at a time: componentize-py works mostly on one core.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        builds = dict(zip(folders, pool.map(tessera_build, folders)))
    for folder, built in builds.items():
        assert built.returncode == 0, built.stderr
        assert (folder / "1" / "model.wasm").is_file()
        assert not (folder / "1" / "__pycache__").exists(), "the build left __pycache__"
    assert not (repo / "batch_auto_complete" / "config.pbtxt").exists()
    srv, proc, log = launch(binary(), ["--model-repository", str(repo)],
                            # Eleven Python models: the first compiles CPython (~16 s on 2 cores),
                            # the next reuse most of it (--wasm-function-cache-bytes).
                            ready_path="/v2/models/add_sub/ready", ready_timeout=600)
    ok = False
    try:
        for model in ("add_sub", "bls_sync", "sandbox_probe", "add_sub_rust", "pytorch",
                      "add_sub_py", "bls_py", "count_py", "square_int32", "repeat_int32",
                      "decoupled_probe", "bls_decoupled_sync", "custom_metrics",
                      "nobatch_auto_complete", "batch_auto_complete", "async_probe",
                      "async_words", "big_output"):
            assert srv.request("GET", f"/v2/models/{model}/ready")[0] == 200, model
        srv.repo = repo  # the built models, for the deploy test
        srv.completion_repo = completion
        yield srv
        ok = True
    finally:
        stop(proc, log, keep=not ok)
        shutil.rmtree(work, ignore_errors=True)


def test_the_triton_files_are_upstream_byte_for_byte():
    for relative, digest in UPSTREAM.items():
        assert hashlib.sha256((EXAMPLES / relative).read_bytes()).hexdigest() == digest, relative


# add_sub: Triton's model.py on pb_utils (backend "python"); add_sub_py: the tessera module
# (backend "wasm").
@pytest.mark.parametrize("model,backend", [("add_sub", "python"), ("add_sub_py", "wasm")])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_add_sub_model_py_answers_through_tritonclient(python_server, protocol, model, backend):
    rng = np.random.default_rng(7)
    a, b = rng.random(4, dtype=np.float32), rng.random(4, dtype=np.float32)
    if protocol == "http":
        module, client = httpclient, httpclient.InferenceServerClient(python_server.url)
    else:
        module = grpcclient
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{python_server.grpc_port}")
    result = client.infer(model, add_sub_inputs(module, a, b))
    assert result.as_numpy("OUTPUT0").dtype == np.float32
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    only = client.infer(model, add_sub_inputs(module, a, b),
                        outputs=[module.InferRequestedOutput("OUTPUT0")])
    assert only.as_numpy("OUTPUT1") is None
    config = client.get_model_config(model)
    configured = config["backend"] if protocol == "http" else config.config.backend
    assert configured == backend


@pytest.mark.parametrize("callee", ["add_sub", "pytorch", "add_sub_rust"])
def test_bls_sync_model_py_reaches_python_onnx_and_rust(python_server, callee):
    client = httpclient.InferenceServerClient(python_server.url)
    a = np.array([1.5, -2.0, 3.25, 0.0], dtype=np.float32)
    b = np.array([0.5, 4.0, -1.25, 7.0], dtype=np.float32)
    result = client.infer("bls_sync", add_sub_inputs(httpclient, a, b, callee))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_sync_names_the_callee_error(python_server):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{python_server.grpc_port}")
    a = np.ones(4, dtype=np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("bls_sync", add_sub_inputs(grpcclient, a, a, "no_such_model"))
    assert "no_such_model" in e.value.message()


def test_bls_async_model_py_gathers_two_models(python_server):
    client = httpclient.InferenceServerClient(python_server.url)
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([10, 20, 30, 40], dtype=np.float32)
    result = client.infer("bls_async", add_sub_inputs(httpclient, a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)  # from "pytorch"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)  # from "add_sub"


@pytest.mark.parametrize("script,passed", [("add_sub_client.py", "PASS: add_sub"),
                                           ("sync_client.py", "PASS: BLS Sync"),
                                           ("async_client.py", "PASS: BLS Async"),
                                           # decoupled: gRPC streams, threads in the model
                                           ("square_client.py", "PASS: square_int32"),
                                           ("repeat_client.py", "PASS: repeat_int32"),
                                           # BLS to a decoupled model: exec(decoupled=True)
                                           ("bls_decoupled_sync_client.py",
                                            "PASS: BLS Decoupled Sync"),
                                           # pb_utils.MetricFamily, read back from /metrics
                                           ("custom_metrics_client.py", "PASS: custom_metrics"),
                                           # no config.pbtxt: auto_complete_config fills it in
                                           ("auto_complete_client.py", "PASS: auto_complete")])
def test_tritons_own_clients_pass(python_server, script, passed, tmp_path):
    # Triton's client, with only its server addresses changed (localhost:8000, :8001, :8002).
    source = (EXAMPLES / "clients" / script).read_text()
    ports = {'"localhost:8000"': python_server.http_port, '"localhost:8001"': python_server.grpc_port,
             '"http://localhost:8002/metrics"': python_server.metrics_port}
    assert 1 <= sum(source.count(address) for address in ports) <= 2
    patched = tmp_path / script
    for address, port in ports.items():
        scheme = "http://" if address.startswith('"http') else ""
        path = "/metrics" if address.endswith('/metrics"') else ""
        source = source.replace(address, f'"{scheme}127.0.0.1:{port}{path}"')
    patched.write_text(source)
    run = subprocess.run([sys.executable, str(patched)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert passed in run.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_auto_completed_models_serve_as_completed(python_server, protocol):
    """Triton's auto_complete models have no config.pbtxt: their inputs, outputs and batching
    come from auto_complete_config, and they serve by them (batch_auto_complete in batches)."""
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.float32)
    b = np.array([[0.5, 0.5, 0.5, 0.5], [1, 1, 1, 1]], dtype=np.float32)
    if protocol == "http":
        module, client = httpclient, httpclient.InferenceServerClient(python_server.url)
    else:
        module = grpcclient
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{python_server.grpc_port}")
    for model, x, y in [("batch_auto_complete", a, b), ("nobatch_auto_complete", a[0], b[0])]:
        result = client.infer(model, add_sub_inputs(module, x, y))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + y)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), x - y)
    config = httpclient.InferenceServerClient(python_server.url).get_model_config(
        "batch_auto_complete")
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    # Over the completed batch size: refused as any other model's would be.
    with pytest.raises(InferenceServerException) as e:
        big = np.ones((5, 4), dtype=np.float32)
        client.infer("batch_auto_complete", add_sub_inputs(module, big, big))
    assert "batch" in e.value.message().lower()


def test_a_misbehaving_auto_complete_config_fails_only_its_model(python_server):
    """auto_complete_config runs in the sandbox, bounded like execute: a loop, an exception, a
    call to another model, a contradiction of the configuration and a change to what it may
    not set each fail the load with the reason; the server serves on, and the model loads once
    its configuration lets it."""
    srv, proc, log = launch(binary(), ["--model-repository", str(python_server.completion_repo),
                                       "--model-control-mode", "explicit"])
    try:
        client = httpclient.InferenceServerClient(srv.url, network_timeout=120)

        def load(mode: str, **extra) -> str:
            config = {"backend": "python",
                      "parameters": {"mode": {"string_value": mode},
                                     "execute_deadline_ms": {"string_value": "1500"}}, **extra}
            try:
                client.load_model("completion_probe", config=json.dumps(config))
            except InferenceServerException as e:
                return e.message()
            return "loaded"

        contradicting = {"input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [3]}]}
        for mode, extra, reason in [
            ("loop", {}, "exceeded its deadline"),
            ("raise", {}, "refused on purpose"),
            ("call", {}, "models cannot be called from auto_complete_config"),
            ("ok", contradicting, "configuration expects datatype TYPE_INT32 for input 'IN'"),
            ("escalate", {}, "changed instance_group"),
            ("none", {}, "must return the pb_utils.ModelConfig"),
        ]:
            message = load(mode, **extra)
            assert reason in message, (mode, message)
            assert "auto_complete_config" in message, (mode, message)
            index = {m["name"]: m for m in client.get_model_repository_index()}
            assert index["completion_probe"]["state"] == "UNAVAILABLE", mode
        # Decoupled by its auto_complete_config: the same component streams.
        assert load("stream") == "loaded"
        assert client.get_model_config("completion_probe")["model_transaction_policy"] == {
            "decoupled": True}
        streamed = queue.Queue()
        stream = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        stream.start_stream(callback=lambda result, error: streamed.put((result, error)))
        inp = grpcclient.InferInput("IN", [3], "FP32")
        inp.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
        stream.async_stream_infer("completion_probe", [inp])
        for factor in (2, 3):
            result, error = streamed.get(timeout=60)
            assert error is None, error
            np.testing.assert_array_equal(result.as_numpy("OUT"), np.array([1, 2, 3]) * factor)
        stream.stop_stream()
        assert load("ok") == "loaded"
        config = client.get_model_config("completion_probe")
        assert [i["name"] for i in config["input"]] == ["IN"]
        assert config["max_batch_size"] == 2
        x = np.array([[1, 2, 3]], dtype=np.float32)
        inp = httpclient.InferInput("IN", [1, 3], "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("completion_probe", [inp])
        np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2)
    finally:
        stop(proc, log)


def _probe(srv, mode: str):
    return probe(srv, "sandbox_probe", mode)


def test_the_tessera_api_counts_into_a_custom_metric(python_server):
    def elements() -> float:
        return metric(python_server, "add_sub_py_elements_total", model="add_sub_py")

    before = elements()
    client = httpclient.InferenceServerClient(python_server.url)
    a = np.ones(4, dtype=np.float32)
    client.infer("add_sub_py", add_sub_inputs(httpclient, a, a))
    assert elements() == before + 4


def test_pb_utils_metric_families_reach_metrics_and_misuse_is_an_exception(python_server):
    answer = json.loads(_probe(python_server, "metrics"))
    assert answer["gauge"] == 5.0
    refused = answer["refused"]
    assert "server's own" in refused["reserved"], refused
    assert "exists as a gauge" in refused["kind"], refused
    assert "only grows" in refused["negative"], refused
    assert "needs buckets" in refused["no_buckets"], refused
    assert "not set" in refused["set_counter"], refused
    url = f"http://{python_server.host}:{python_server.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for line in ['probe_py_queue{stage="pre"} 5', 'probe_py_sizes_bucket{le="1"} 0',
                 'probe_py_sizes_bucket{le="10"} 1', "probe_py_sizes_sum 3", "probe_py_sizes_count 1",
                 "# TYPE probe_py_sizes histogram"]:
        assert line in text.splitlines(), line


@pytest.mark.parametrize("mode,expected", [
    ("loop", "deadline"),
    ("memory", "memory"),  # MemoryError: the guest's linear memory is capped
    ("file", "error: [errno"),  # no file system at all: open() fails inside the guest
])
def test_the_sandbox_contains_a_misbehaving_model_py(python_server, mode, expected):
    with pytest.raises(InferenceServerException) as e:
        _probe(python_server, mode)
    message = e.value.message()
    assert expected in message.lower(), message
    assert "root:" not in message, "the guest read the host's /etc/passwd"
    # The model serves again, and so does everything else.
    assert _probe(python_server, "again") == b"ok:again"
    client = httpclient.InferenceServerClient(python_server.url)
    a = np.ones(4, dtype=np.float32)
    result = client.infer("add_sub", add_sub_inputs(httpclient, a, a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


@pytest.mark.parametrize("mode,expected", [
    ("not_a_list", "execute returned a InferenceResponse; a model must return a list"),
    ("base_exception", "BaseException: not an Exception"),
    ("huge_parameter", "does not fit a 64-bit integer"),
    ("object_parameter", "Expect parameters values to have type bool/int/str/float"),
    ("tensor_named_5", "Tensor name must be a str, not int"),
])
def test_a_model_py_returning_the_wrong_thing_is_told_so_and_keeps_its_state(python_server, mode,
                                                                            expected):
    before = int(_probe(python_server, "count"))
    with pytest.raises(InferenceServerException) as e:
        _probe(python_server, mode)
    assert expected in e.value.message(), e.value.message()
    assert "trapped" not in e.value.message()
    # The same instance answers next: its state is there (a trap would have replaced it).
    assert int(_probe(python_server, "count")) == before + 1


def test_a_model_py_computes_with_the_sandboxs_numpy(python_server):
    got = json.loads(_probe(python_server, "numpy"))
    logits = np.array([[1.0, 3.0, 2.0, -1.0], [0.5, 0.5, 4.0, 1.0]], dtype=np.float32)
    e = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
    probs = e / np.sum(e, axis=-1, keepdims=True)
    assert got["dtype"] == "float32" and got["shape"] == [4, 4]
    np.testing.assert_allclose(np.array(got["probs"], dtype=np.float32), probs, rtol=1e-6)
    assert got["argmax"] == np.argmax(probs, axis=-1).tolist()
    assert got["has_linalg"] is False


def test_an_unbuilt_model_py_is_refused_with_the_command_that_builds_it(python_server):
    status, _, body = python_server.request("POST", "/v2/repository/index", b"{}")
    assert status == 200
    entry = next(m for m in json.loads(body) if m["name"] == "unbuilt")
    assert entry["state"] == "UNAVAILABLE"
    assert "tessera build" in entry["reason"], entry


def test_a_python_model_deploys_to_the_running_server(python_server, tmp_path):
    model = tmp_path / "add_sub_deployed"
    shutil.copytree(python_server.repo / "add_sub", model)
    config = (model / "config.pbtxt").read_text().replace('"add_sub"', '"add_sub_deployed"')
    (model / "config.pbtxt").write_text(config)
    run = subprocess.run([str(binary()), "deploy", str(model), "--server", python_server.url],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    client = httpclient.InferenceServerClient(python_server.url)
    a = np.array([3, 1, 4, 1], dtype=np.float32)
    result = client.infer("add_sub_deployed", add_sub_inputs(httpclient, a, a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros(4, dtype=np.float32))
    # Triton's auto_complete layout, no config.pbtxt: its auto_complete_config completes it.
    auto = tmp_path / "auto_deployed"
    shutil.copytree(python_server.repo / "batch_auto_complete", auto)
    run = subprocess.run([str(binary()), "deploy", str(auto), "--server", python_server.url],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert client.get_model_config("auto_deployed")["max_batch_size"] == 4
    batch = np.ones((3, 4), dtype=np.float32)
    result = client.infer("auto_deployed", add_sub_inputs(httpclient, batch, batch))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), batch * 2)


def test_deploy_builds_a_model_py_first_when_its_component_is_missing_or_stale(python_server,
                                                                              tmp_path):
    """`tessera deploy` of Triton's add_sub as it comes (model.py, no model.wasm) builds it
    first; after model.py changes, the next deploy builds again; `--no-build` deploys as is."""
    model = tmp_path / "add_sub_source"
    shutil.copytree(EXAMPLES / "repository" / "add_sub", model, ignore=shutil.ignore_patterns("model.wasm"))
    env = {**os.environ, "COMPONENTIZE_PY": str(COMPONENTIZE_PY)}

    def deploy(*flags):
        return subprocess.run([str(binary()), "deploy", str(model), "--name", "add_sub_source",
                               "--server", python_server.url, *flags],
                              capture_output=True, text=True, timeout=300, env=env)

    refused = deploy("--no-build")
    assert refused.returncode != 0 and "tessera build" in refused.stderr, refused.stderr
    first = deploy()
    assert first.returncode == 0, first.stdout + first.stderr
    assert "building first: " in first.stdout and "has no model.wasm" in first.stdout, first.stdout
    client = httpclient.InferenceServerClient(python_server.url)
    a, b = np.array([3, 1, 4, 1], dtype=np.float32), np.array([1, 5, 9, 2], dtype=np.float32)
    result = client.infer("add_sub_source", add_sub_inputs(httpclient, a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    # Unchanged: deployed as built.
    again = deploy()
    assert again.returncode == 0 and "building first" not in again.stdout, again.stdout
    # model.py edited (its outputs swapped): built again, and the new code serves.
    source = model / "1" / "model.py"
    edited = source.read_text().replace("in_0.as_numpy() + in_1.as_numpy(),\n",
                                        "in_0.as_numpy() * in_1.as_numpy(),\n")
    assert edited != source.read_text()
    time.sleep(0.01)
    source.write_text(edited)
    changed = deploy()
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "model.py is newer than" in changed.stdout, changed.stdout
    result = client.infer("add_sub_source", add_sub_inputs(httpclient, a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * b)


@pytest.mark.parametrize("callee", ["pytorch", "add_sub_rust", "add_sub", "add_sub_py"])
def test_a_tessera_module_bls_reaches_onnx_rust_and_python(python_server, callee):
    client = httpclient.InferenceServerClient(python_server.url)
    a = np.array([1.0, 2.5, -3.0, 0.25], dtype=np.float32)
    b = np.array([4.0, -0.5, 3.0, 8.0], dtype=np.float32)
    result = client.infer("bls_py", add_sub_inputs(httpclient, a, b, callee))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_a_tessera_module_bls_answers_with_the_callees_status(python_server):
    client = httpclient.InferenceServerClient(python_server.url)
    a = np.ones(4, dtype=np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("bls_py", add_sub_inputs(httpclient, a, a, "no_such_model"))
    assert e.value.status() == "404" and "no_such_model" in e.value.message()


def test_a_model_py_without_a_handler_class_fails_the_build_saying_so(tmp_path):
    model = tmp_path / "no_handler"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "no_handler"\nbackend: "wasm"\n')
    (model / "1" / "model.py").write_text("import tessera\n\nclass NotAHandler:\n    pass\n")
    built = tessera_build(model)
    assert built.returncode != 0
    assert "exactly one class deriving from tessera.Handler (found: none)" in built.stderr, \
        built.stderr
    assert "Stack backtrace" not in built.stderr
    assert not (model / "1" / "model.wasm").exists()


def test_a_model_py_that_never_ends_at_import_stops_the_build_saying_so(tmp_path):
    # componentize-py runs the module to snapshot it: a loop at module level held the build
    # (and `tessera deploy`) forever.
    model = tmp_path / "loops_at_import"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "loops_at_import"\nbackend: "python"\n')
    (model / "1" / "model.py").write_text("while True:\n    pass\n")
    started = time.monotonic()
    built = tessera_build(model, "--timeout-secs", "20")
    assert built.returncode != 0
    assert time.monotonic() - started < 120
    assert "did not finish building" in built.stderr and "module level" in built.stderr, \
        built.stderr
    assert not (model / "1" / "model.wasm").exists()
    assert not (model / "1" / ".model.wasm.partial").exists()


def _stream(srv, mode: str, model: str = "decoupled_probe", input_name: str = "MODE",
            on_response=None) -> list:
    """A probe's stream for MODE: ("OUT" text | "error: ..."), until the final."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        tensor = grpcclient.InferInput(input_name, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
        client.async_stream_infer(model, [tensor], enable_empty_final_response=True)
        got = []
        while True:
            result, error = answers.get(timeout=30)
            if error is not None:
                got.append(f"error: {error.message()}")
                return got
            response = result.get_response()
            out = result.as_numpy("OUT")
            if out is not None:
                got.append(out[0].decode())
                if on_response is not None:
                    on_response(got[-1])
            if response.parameters["triton_final_response"].bool_param:
                return got
    finally:
        client.stop_stream()
        client.close()


def test_a_decoupled_model_py_streams_through_its_response_sender(python_server):
    assert _stream(python_server, "one two three") == ["one", "two", "three"]


@pytest.mark.parametrize("mode,expected", [
    ("raise", ["before", "error: raised on purpose"]),
    ("no-final", ["only", "error: execute returned before the final response was sent"]),
    ("error", ["error: bad value"]),
])
def test_a_decoupled_model_py_ends_its_stream_with_the_error(python_server, mode, expected):
    got = _stream(python_server, mode)
    assert got[:-1] == expected[:-1] and got[-1].startswith(expected[-1]), got
    # The model serves the next stream as before.
    assert _stream(python_server, "again") == ["again"]


def test_a_tessera_module_generator_streams_each_yield(python_server):
    events = sse_events(python_server, "count_py", {"TEXT": "héllo wide 世界"})
    assert [(e["WORD"], e["INDEX"]) for e in events] == [("héllo", 0), ("wide", 1), ("世界", 2)]
    # Over gRPC too, as a decoupled model's stream.
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{python_server.grpc_port}")
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        text = grpcclient.InferInput("TEXT", [1], "BYTES")
        text.set_data_from_numpy(np.array(["a b".encode()], dtype=np.object_))
        client.async_stream_infer("count_py", [text])
        got = [answers.get(timeout=30) for _ in range(2)]
        assert [r.as_numpy("WORD")[0] for r, e in got] == [b"a", b"b"], got
    finally:
        client.stop_stream()
        client.close()


def test_a_tessera_module_generator_ends_its_stream_with_its_error(python_server):
    assert sse_events(python_server, "count_py", {"TEXT": "   "}) == [{"error": "TEXT has no words"}]
    assert [e["WORD"] for e in sse_events(python_server, "count_py", {"TEXT": "still here"})] == \
        ["still", "here"]


def _two_streams(srv, model: str, input_name: str) -> list:
    """Starts a stream of three words, and a second once the first has answered: every word in
    the order it arrived."""
    arrived, first_came = [], threading.Event()

    def record(word):
        arrived.append(word)
        first_came.set()

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        a = pool.submit(_stream, srv, "a1 a2 a3", model, input_name, record)
        assert first_came.wait(30), "the first stream did not answer"
        b = pool.submit(_stream, srv, "b1 b2 b3", model, input_name, arrived.append)
        assert (a.result(60), b.result(60)) == (["a1", "a2", "a3"], ["b1", "b2", "b3"])
    return arrived


@pytest.mark.parametrize("model,input_name", [("async_probe", "MODE"), ("async_words", "TEXT")])
def test_an_async_decoupled_model_interleaves_streams_on_one_instance(python_server, model,
                                                                      input_name):
    # One instance: the second stream's words come while the first still awaits between its
    # own, where a model that held the instance would start the second after the first ended.
    arrived = _two_streams(python_server, model, input_name)
    assert arrived.index("b1") < arrived.index("a3"), arrived


@pytest.mark.parametrize("mode,expected", [
    ("raise", ["before", "error: raised on purpose"]),
    ("no-final", ["only", "error: execute returned before the final response was sent"]),
])
def test_an_async_decoupled_model_ends_its_stream_with_the_error(python_server, mode, expected):
    got = _stream(python_server, mode, "async_probe")
    assert got[:-1] == expected[:-1] and got[-1].startswith(expected[-1]), got
    assert _stream(python_server, "again", "async_probe") == ["again"]


def test_an_instance_whose_memory_only_grows_is_replaced_before_its_limit(python_server):
    # 160 outputs of 1 MiB against a 64 MiB limit: every one answered.
    body = {"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [262144]}],
            "outputs": [{"name": "F", "parameters": {"binary_data": True}}]}
    for i in range(160):
        status, _, answer = python_server.post_json("/v2/models/big_output/infer", body)
        assert status == 200, (i, answer[:300])
    assert metric(python_server, "tessera_wasm_memory_replacements_total", model="big_output") >= 1
    assert metric(python_server, "tessera_wasm_memory_kills_total", model="big_output") == 0
