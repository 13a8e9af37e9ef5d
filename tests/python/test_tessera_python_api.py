"""Tessera's Python API for new handlers (guest-sdk-python/src/tessera.py), on the host with
real numpy: tensors of every datatype through the host's wire form, requests, responses,
errors and their kinds, calls to other models (with the host's `infer` replaced by a fake).
tests/python/test_python_models.py builds and serves handlers written against it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "guest-sdk-python" / "src"))

import tessera  # noqa: E402
import tessera_wire as wire  # noqa: E402

DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
             "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
             "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_a_tensor_round_trips_through_the_wire_form(datatype):
    array = (np.arange(6).reshape(2, 3) % 2).astype(DATATYPES[datatype])
    tensor = tessera.Tensor("X", array)
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", datatype, [2, 3])
    back = tessera.Tensor._from_wire(wire.WireTensor("X", datatype, [2, 3], raw=tensor._wire.raw))
    assert back.numpy().dtype == array.dtype
    np.testing.assert_array_equal(back.numpy(), array)


def test_strings_are_bytes_tensors():
    tensor = tessera.Tensor("T", ["héllo", b"w\xc3\xb6rld", "🚀"])
    assert (tensor.datatype, tensor.shape) == ("BYTES", [3])
    assert tensor.strings() == ["héllo", "wörld", "🚀"]
    assert list(tensor.numpy()) == ["héllo".encode(), b"w\xc3\xb6rld", "🚀".encode()]
    assert tessera.Tensor("U", np.array(["a", "bc"])).datatype == "BYTES"


def test_strings_of_another_datatype_or_bad_utf8_are_invalid_input():
    with pytest.raises(tessera.InvalidInput, match="is FP32, not BYTES"):
        tessera.Tensor("X", np.zeros(2, np.float32)).strings()
    with pytest.raises(tessera.InvalidInput, match="not UTF-8"):
        tessera.Tensor("T", [b"\xff"]).strings()


def test_datatype_converts_and_unknown_data_is_refused():
    assert tessera.Tensor("X", np.arange(3), "FP16").numpy().dtype == np.float16
    with pytest.raises(ValueError, match="unknown datatype 'FP8'"):
        tessera.Tensor("X", np.arange(3), "FP8")
    with pytest.raises(TypeError, match="numpy array or a list of strings"):
        tessera.Tensor("X", 3.0)
    with pytest.raises(TypeError, match="no KServe datatype"):
        tessera.Tensor("X", np.zeros(2, np.complex64))


def test_a_missing_input_names_what_the_request_has():
    request = tessera.Request({"A": tessera.Tensor("A", np.zeros(1, np.float32))})
    with pytest.raises(tessera.InvalidInput, match=r"input 'B' is missing \(the request has: A\)"):
        request.input("B")


def test_a_response_takes_a_dict_or_tensors_and_renames():
    a = tessera.Tensor("A", np.ones(2, np.int32))
    response = tessera.Response({"OUT": a, "TXT": ["x"], "ARR": np.zeros(1)})
    assert [t.name for t in response.outputs] == ["OUT", "TXT", "ARR"]
    np.testing.assert_array_equal(response.numpy("OUT"), np.ones(2, np.int32))
    assert tessera.Response([a]).outputs[0] is a
    with pytest.raises(TypeError, match="Tensors or a dict"):
        tessera.Response([np.zeros(1)])


class _Doubler(tessera.Handler):
    def execute(self, request):
        x = request.numpy("X")
        if (x < 0).any():
            raise tessera.InvalidInput("negative")
        if (x == 0).all():
            raise ZeroDivisionError("all zero")
        return {"Y": x * 2}


def test_one_requests_error_answers_only_that_request():
    requests = [tessera.Request({"X": tessera.Tensor("X", np.array(v, np.float32))})
                for v in ([1.0], [-1.0], [0.0], [2.0])]
    answers = _Doubler().execute_batch(requests)
    assert [type(a).__name__ for a in answers] == ["dict", "InvalidInput", "Internal", "dict"]
    assert answers[2].message == "ZeroDivisionError: all zero" and answers[2].kind == "internal"
    np.testing.assert_array_equal(tessera._answer(answers[3]).numpy("Y"), [4.0])
    assert isinstance(tessera._answer(42), tessera.Internal)


def test_infer_passes_tensors_on_and_raises_the_callees_error_kind():
    calls = []

    def fake_infer(model, version, request):
        calls.append((model, version, [t.name for t in request.inputs],
                      request.requested_outputs, request.parameters))
        if model == "missing":
            raise wire.InferError("model-not-found", "no model 'missing'")
        if model == "busy":
            raise wire.InferError("quota-exceeded", "too deep")
        return [request.inputs[0].renamed("Y")], {"served_by": model}

    real, wire.infer = wire.infer, fake_infer
    try:
        x = tessera.Tensor("IN", np.arange(3, dtype=np.int64))
        answer = tessera.infer("m", {"X": x}, outputs=["Y"], version=2, parameters={"k": 1})
        assert calls[-1] == ("m", 2, ["X"], ["Y"], {"k": 1})
        np.testing.assert_array_equal(answer.numpy("Y"), [0, 1, 2])
        assert answer.parameters == {"served_by": "m"}
        with pytest.raises(tessera.ModelNotFound, match="no model 'missing'") as e:
            tessera.infer("missing", {"X": x})
        assert e.value.kind == "model-not-found"
        with pytest.raises(tessera.QuotaExceeded):
            tessera.infer("busy", {"X": np.zeros(1)})
    finally:
        wire.infer = real


def test_metrics_pass_labels_and_buckets_on_and_a_refusal_is_internal():
    calls = []

    def fake_update(series, operation, value):
        calls.append((series, operation, value))
        if operation == "increment" and value < 0:
            raise wire.MetricError("counter 'c' only grows")

    fakes = {
        "metric_family": lambda name, description, kind: ("family", name, kind),
        "metric": lambda family, labels, buckets: (family, tuple(labels), buckets),
        "metric_update": fake_update,
        "metric_value": lambda series: 7.0,
    }
    real = {name: getattr(wire, name) for name in fakes}
    for name, fake in fakes.items():
        setattr(wire, name, fake)
    try:
        c = tessera.counter("c", "Count", {"model": "m", "n": 1})
        assert c._series == (("family", "c", "counter"), (("model", "m"), ("n", "1")), None)
        c.increment()
        assert calls[-1][1:] == ("increment", 1.0)
        with pytest.raises(tessera.Internal, match="only grows"):
            c.increment(-2)
        h = tessera.histogram("h", "Sizes", [1, 10])
        assert h._series[2] == [1.0, 10.0]
        h.observe(3)
        assert tessera.gauge("g", "G").value() == 7.0
    finally:
        for name, fn in real.items():
            setattr(wire, name, fn)
