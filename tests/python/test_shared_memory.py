"""System shared memory with the real tritonclient, over HTTP and gRPC: regions made with
`tritonclient.utils.shared_memory`, registered, used for inputs and outputs of add_sub (and BYTES
of preprocess_text), and every wrong region, offset and size refused cleanly while the server
keeps serving.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(params=["http", "grpc"])
def proto(request, server):
    """(module, client) for one protocol; regions it registers are unregistered afterwards."""
    module = PROTOCOLS[request.param]
    if request.param == "grpc":
        if server.grpc_port is None:
            pytest.skip("external server: gRPC port unknown")
        client = module.InferenceServerClient(url=f"{server.host}:{server.grpc_port}")
    else:
        client = module.InferenceServerClient(url=server.url)
    yield module, client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def regions():
    """Shared-memory objects made here; destroyed afterwards."""
    made = []

    def make(name: str, size: int):
        key = f"/tessera-pytest-{os.getpid()}-{name}"
        handle = shm.create_shared_memory_region(name, key, size)
        made.append(handle)
        return handle, key

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def add_sub_inputs(module, region: str, offset: int = 0):
    inputs = []
    for i, name in enumerate(("INPUT0", "INPUT1")):
        t = module.InferInput(name, [1, 16], "FP32")
        t.set_shared_memory(region, 64, offset=offset + 64 * i)
        inputs.append(t)
    return inputs


def shm_outputs(module, region: str, size: int = 64):
    outputs = []
    for i, name in enumerate(("OUTPUT0", "OUTPUT1")):
        o = module.InferRequestedOutput(name)
        o.set_shared_memory(region, size, offset=64 * i)
        outputs.append(o)
    return outputs


def assert_still_serving(module, client) -> None:
    a = np.ones((1, 16), np.float32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = module.InferInput(name, [1, 16], "FP32")
        t.set_data_from_numpy(a)
        inputs.append(t)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)


def test_inputs_and_outputs_through_shared_memory(proto, regions):
    module, client = proto
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 0.5, np.float32)
    # The inputs start 32 bytes into the object, to use a region offset too.
    input_handle, input_key = regions("in", 32 + 128)
    shm.set_shared_memory_region(input_handle, [a, b], offset=32)
    output_handle, output_key = regions("out", 128)
    client.register_system_shared_memory("in", input_key, 128, offset=32)
    client.register_system_shared_memory("out", output_key, 128)
    status = client.get_system_shared_memory_status()
    names = {r["name"] for r in status} if isinstance(status, list) else set(status.regions)
    assert {"in", "out"} <= names

    result = client.infer("add_sub", add_sub_inputs(module, "in"),
                          outputs=shm_outputs(module, "out"))
    total = shm.get_contents_as_numpy(output_handle, np.float32, [1, 16], offset=0)
    diff = shm.get_contents_as_numpy(output_handle, np.float32, [1, 16], offset=64)
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(diff, a - b)
    out = result.get_output("OUTPUT0")
    if isinstance(out, dict):
        # HTTP: no data, and no parameters (Triton's C++ client reads any as binary data).
        assert "data" not in out and "parameters" not in out, out
    else:
        assert out.parameters["shared_memory_region"].string_param == "out"

    # Mixed: one input in shared memory, one sent in the request; outputs in the response.
    inputs = add_sub_inputs(module, "in")
    inputs[1] = module.InferInput("INPUT1", [1, 16], "FP32")
    inputs[1].set_data_from_numpy(np.full((1, 16), 2.0, np.float32))
    mixed = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(mixed.as_numpy("OUTPUT0"), a + 2.0)

    client.unregister_system_shared_memory("in")
    with pytest.raises(InferenceServerException):
        client.infer("add_sub", add_sub_inputs(module, "in"))
    assert_still_serving(module, client)


@pytest.mark.parametrize("case", ["unknown region", "past the region", "output too small",
                                  "offset overflow"])
def test_wrong_regions_offsets_and_sizes_are_refused(proto, regions, case):
    module, client = proto
    handle, key = regions("r", 128)
    shm.set_shared_memory_region(handle, [np.ones((2, 16), np.float32)])
    client.register_system_shared_memory("r", key, 128)
    inputs, outputs = add_sub_inputs(module, "r"), None
    if case == "unknown region":
        inputs = add_sub_inputs(module, "nope")
    elif case == "past the region":
        inputs = add_sub_inputs(module, "r", offset=32)  # the second input ends at 160 > 128
    elif case == "output too small":
        outputs = shm_outputs(module, "r", size=32)
    else:
        inputs[0].set_shared_memory("r", 64, offset=2**62)
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", inputs, outputs=outputs)
    assert str(e.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT"), e.value
    assert e.value.message().strip()
    assert_still_serving(module, client)


def test_bad_registrations_are_refused(proto, regions):
    module, client = proto
    handle, key = regions("small", 64)
    with pytest.raises(InferenceServerException):
        client.register_system_shared_memory("big", key, 128)  # past the object's end
    with pytest.raises(InferenceServerException):
        client.register_system_shared_memory("ghost", "/tessera-no-such-object", 64)
    client.register_system_shared_memory("small", key, 64)
    with pytest.raises(InferenceServerException):
        client.register_system_shared_memory("small", key, 64)  # the name is taken
    # Unregistering a name never registered succeeds, as in Triton (its L0_shared_memory
    # test_unregister_before_register).
    client.unregister_system_shared_memory("never-registered")
    # CUDA: no region can exist (status empty, cleanup succeeds), registering is refused.
    # (The handle is base64, as tritonclient.grpc expects; it is never used.)
    status = client.get_cuda_shared_memory_status()
    assert len(status if isinstance(status, list) else status.regions) == 0
    client.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException) as e:
        client.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 64)
    assert "not supported" in e.value.message()
    assert_still_serving(module, client)


def test_bytes_through_shared_memory(proto, regions, server):
    module, client = proto
    status, _, _ = server.request("GET", "/v2/models/preprocess_text")
    if status != 200:
        pytest.skip("preprocess_text is not in the model repository")
    from tritonclient.utils import serialize_byte_tensor, serialized_byte_size

    text = np.array([["tessera".encode()], ["é∙한".encode()]], dtype=np.object_)
    serialized = serialize_byte_tensor(text)
    size = serialized_byte_size(serialized)
    handle, key = regions("text", size)
    shm.set_shared_memory_region(handle, [serialized])
    client.register_system_shared_memory("text", key, size)
    inp = module.InferInput("TEXT", [2, 1], "BYTES")
    inp.set_shared_memory("text", size)
    direct = module.InferInput("TEXT", [2, 1], "BYTES")
    direct.set_data_from_numpy(text)
    via_shm = client.infer("preprocess_text", [inp]).as_numpy("INPUT_IDS")
    np.testing.assert_array_equal(via_shm, client.infer("preprocess_text", [direct]).as_numpy("INPUT_IDS"))
