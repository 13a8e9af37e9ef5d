"""JavaScript and TypeScript handlers (model.js / model.ts with @tessera/guest), built by
`tessera build` with componentize-qjs (QuickJS; TypeScript's types stripped by typescript first)
and served by the real binary: answers through tritonclient HTTP and
gRPC, BLS from JavaScript to an ONNX model and a Rust handler, errors with their status codes,
and the sandbox's limits holding for a misbehaving model.js as for Rust guests.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import (
    COMPONENTIZE_QJS, REPO_ROOT, add_rust_add_sub, add_sub_inputs, binary, launch, probe, sse_events,
    stop, tessera_build,
)


PROBE = """
import { asStrings, fromStrings, inferStream, input, metricFamily, model, utf8Decode, utf8Encode }
  from "@tessera/guest";
const held = [];

/** count_ts (decoupled) on `text`: its responses as a stream. */
const count = (text) => inferStream("count_ts", { inputs: [fromStrings("TEXT", [1], [text])] });
const word = (response) => asStrings(response.outputs.find((t) => t.name === "WORD"))[0];

export const handler = model({
  executeRequest(request) {
    const [mode] = asStrings(input(request, "MODE"));
    if (mode === "metrics") {
      const gauge = metricFamily("probe_js_depth", "Depth", "gauge").metric({ stage: "post" });
      gauge.set(4);
      gauge.increment(1.5);
      const sizes = metricFamily("probe_js_sizes", "Sizes", "histogram").metric({}, [2, 20]);
      sizes.observe(5);
      held.push(gauge, sizes);
      let refused = "accepted";
      try {
        metricFamily("probe_js_total", "Total", "counter").metric().increment(-3);
      } catch (e) {
        refused = e.message;
      }
      return { outputs: [fromStrings("OUT", [1], [`${gauge.value()}|${refused}`])] };
    }
    if (mode === "stream") {
      const words = [...count("one two three")].map(word);
      return { outputs: [fromStrings("OUT", [1], [words.join("|")])] };
    }
    if (mode === "poll") {
      // tryNext as a streaming handler's resume uses it, busy here: undefined until a response.
      const stream = count("four five");
      const words = [];
      for (let r = stream.tryNext(); r !== null; r = stream.tryNext()) {
        if (r !== undefined) words.push(word(r));
      }
      return { outputs: [fromStrings("OUT", [1], [words.join("|")])] };
    }
    if (mode === "stream-first") {
      let first = "";
      for (const r of count("six seven eight")) { first = word(r); break; }
      const again = [...count("nine ten")].map(word);
      return { outputs: [fromStrings("OUT", [1], [`${first};${again.join("|")}`])] };
    }
    if (mode === "stream-error") {
      try {
        [...count("   ")];
        return { outputs: [fromStrings("OUT", [1], ["no error"])] };
      } catch (e) {
        return { outputs: [fromStrings("OUT", [1], [`${e.kind}: ${e.message}`])] };
      }
    }
    if (mode === "loop") { for (;;) {} }
    if (mode === "memory") { const hoard = []; for (;;) hoard.push(new Uint8Array(16 << 20)); }
    if (mode === "throw") { throw new TypeError("thrown on purpose"); }
    if (mode === "outputs_str") { return { outputs: "nope" }; }
    if (mode === "outputs_plain") { return { outputs: [{ name: "OUT" }] }; }
    if (mode === "bad_datatype") {
      return { outputs: [{ ...fromStrings("OUT", [1], ["x"]), datatype: "fp99" }] };
    }
    if (mode === "bad_parameter") { return { outputs: [], parameters: [{ key: "a", value: 5 }] }; }
    if (mode === "fetch") { return { outputs: [fromStrings("OUT", [1], [typeof fetch])] }; }
    // UTF-8 both ways, without TextEncoder (QuickJS has none).
    const echoed = utf8Decode(utf8Encode(mode));
    return { outputs: [fromStrings("OUT", [1], [`ok:${echoed}`])] };
  },
});
"""
PROBE_CONFIG = """
name: "js_probe"
backend: "wasm"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters: { key: "execute_deadline_ms" value: { string_value: "2000" } }
parameters: { key: "max_memory_bytes" value: { string_value: "134217728" } }
"""


@pytest.fixture(scope="module")
def js_server():
    if not COMPONENTIZE_QJS.exists():
        pytest.fail(f"{COMPONENTIZE_QJS} missing: run scripts/prepare.sh (npm ci in guest-sdk-js)",
                    pytrace=False)
    work = Path(tempfile.mkdtemp(prefix="tessera-js-models-"))
    repo = work / "repository"
    repo.mkdir()
    for name in ("add_sub_js", "bls_js", "add_sub_ts", "bls_ts", "count_ts"):
        shutil.copytree(REPO_ROOT / "examples" / "js" / name, repo / name,
                        ignore=shutil.ignore_patterns("model.wasm"))
    shutil.copytree(REPO_ROOT / "examples" / "triton-python" / "repository" / "pytorch",
                    repo / "pytorch")
    add_rust_add_sub(repo)
    (repo / "js_probe" / "1").mkdir(parents=True)
    (repo / "js_probe" / "config.pbtxt").write_text(PROBE_CONFIG)
    (repo / "js_probe" / "1" / "model.js").write_text(PROBE)
    for model in ("add_sub_js", "bls_js", "add_sub_ts", "bls_ts", "count_ts", "js_probe"):
        built = tessera_build(repo / model)
        assert built.returncode == 0, built.stdout + built.stderr
    srv, proc, log = launch(binary(), ["--model-repository", str(repo)], ready_timeout=120)
    srv.repo = repo  # the built models, for the deploy test
    ok = False
    try:
        yield srv
        ok = True
    finally:
        stop(proc, log, keep=not ok)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("model", ["add_sub_js", "add_sub_ts"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_add_sub_in_javascript_and_typescript(js_server, protocol, model):
    rng = np.random.default_rng(11)
    a, b = rng.random(4, dtype=np.float32), rng.random(4, dtype=np.float32)
    if protocol == "http":
        module, client = httpclient, httpclient.InferenceServerClient(js_server.url)
    else:
        module = grpcclient
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{js_server.grpc_port}")
    result = client.infer(model, add_sub_inputs(module, a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    only = client.infer(model, add_sub_inputs(module, a, b),
                        outputs=[module.InferRequestedOutput("OUTPUT1")])
    assert only.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("bls", ["bls_js", "bls_ts"])
@pytest.mark.parametrize("callee", ["pytorch", "add_sub_rust", "add_sub_js"])
def test_bls_in_javascript_reaches_onnx_rust_and_javascript(js_server, callee, bls):
    client = httpclient.InferenceServerClient(js_server.url)
    a = np.array([1.5, -2.0, 3.25, 0.0], dtype=np.float32)
    b = np.array([0.5, 4.0, -1.25, 7.0], dtype=np.float32)
    result = client.infer(bls, add_sub_inputs(httpclient, a, b, callee))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_in_javascript_passes_the_callee_error_on(js_server):
    client = httpclient.InferenceServerClient(js_server.url)
    a = np.ones(4, dtype=np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("bls_js", add_sub_inputs(httpclient, a, a, "no_such_model"))
    assert e.value.status() == "404" and "no_such_model" in e.value.message()


@pytest.mark.parametrize("source", ["bls_ts", "bls_js"])
def test_a_typescript_or_javascript_handler_deploys_to_the_running_server(js_server, tmp_path,
                                                                          source):
    """`tessera build` then `tessera deploy`: the built handler serves beside the models the
    server started with, and its BLS calls reach them."""
    name = f"{source}_deployed"
    model = tmp_path / name
    shutil.copytree(js_server.repo / source, model)
    config = (model / "config.pbtxt").read_text().replace(f'"{source}"', f'"{name}"')
    (model / "config.pbtxt").write_text(config)
    run = subprocess.run([str(binary()), "deploy", str(model), "--server", js_server.url],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    client = httpclient.InferenceServerClient(js_server.url)
    a = np.array([2.0, -1.0, 0.5, 8.0], dtype=np.float32)
    b = np.array([1.0, 1.0, 0.25, -8.0], dtype=np.float32)
    result = client.infer(name, add_sub_inputs(httpclient, a, b, "add_sub_ts"))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    # The handler the server started with still answers as before.
    assert client.get_model_metadata(source)["name"] == source


def _probe(srv, mode: str):
    return probe(srv, "js_probe", mode)


def test_javascript_strings_round_trip_utf8(js_server):
    assert _probe(js_server, "héllo 世界 🚀").decode() == "ok:héllo 世界 🚀"


def test_javascript_has_no_network(js_server):
    # Built without wasi:http (a handler cannot import it): no fetch in the sandbox.
    assert _probe(js_server, "fetch") == b"undefined"


@pytest.mark.parametrize("mode,expected", [
    ("loop", "deadline"),
    ("memory", "out of memory"),  # QuickJS's InternalError: the linear memory is capped
    ("throw", "typeerror: thrown on purpose"),
    # Malformed answers: named, not a trap of the instance ("unreachable executed").
    ("outputs_str", "outputs is an array of tensors"),
    ("outputs_plain", "has datatype undefined"),
    ("bad_datatype", "has datatype \"fp99\""),
    ("bad_parameter", "returned a parameter that is not"),
])
def test_the_sandbox_contains_a_misbehaving_model_js(js_server, mode, expected):
    with pytest.raises(InferenceServerException) as e:
        _probe(js_server, mode)
    assert expected in e.value.message().lower(), e.value.message()
    assert _probe(js_server, "again") == b"ok:again"


def test_the_typescript_examples_type_check_against_the_sdk_types():
    tsc = REPO_ROOT / "guest-sdk-js" / "node_modules" / ".bin" / "tsc"
    run = subprocess.run([str(tsc), "-p", str(REPO_ROOT / "guest-sdk-js")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_js_sdks_own_tests_pass_under_node():
    # tests/js: the SDK's streaming under node, its WIT imports stubbed (tests/js/wit-stubs.mjs).
    node = shutil.which("node")
    assert node, "node is missing (scripts/prepare.sh installs it with the JS tools)"
    run = subprocess.run([node, "--import", "./tests/js/wit-stubs.mjs", "--test", "tests/js/"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "# fail 0" in run.stdout and "# pass 0" not in run.stdout, run.stdout[-2000:]


def test_a_typescript_syntax_error_fails_the_build_with_its_line(tmp_path):
    model = tmp_path / "broken_ts"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "broken_ts"\nbackend: "wasm"\n')
    (model / "1" / "model.ts").write_text("export const handler = {\n  execute(: number) {}\n};\n")
    built = tessera_build(model)
    assert built.returncode != 0
    assert "TypeScript could not be transpiled" in built.stderr and "model.ts:2" in built.stderr, built.stderr
    assert not (model / "1" / "model.wasm").exists()


def test_javascript_metric_families_reach_metrics(js_server):
    value, refused = probe(js_server, "js_probe", "metrics").decode().split("|", 1)
    assert float(value) == 5.5
    assert "only grows" in refused, refused
    url = f"http://{js_server.host}:{js_server.metrics_port}/metrics"
    lines = urllib.request.urlopen(url, timeout=10).read().decode().splitlines()
    for line in ['probe_js_depth{stage="post"} 5.5', 'probe_js_sizes_bucket{le="20"} 1',
                 "probe_js_sizes_count 1", "# TYPE probe_js_sizes histogram"]:
        assert line in lines, line


@pytest.mark.parametrize("mode, expected", [
    ("stream", "one|two|three"),
    ("poll", "four|five"),
    ("stream-first", "six;nine|ten"),
    ("stream-error", "invalid-input: TEXT has no words"),
])
def test_javascript_reads_a_decoupled_models_stream(js_server, mode, expected):
    """inferStream from JavaScript: every response of a decoupled model (count_ts), waited for
    in turn or polled with tryNext; leaving the loop early cancels the call and the next one
    runs; the callee's error throws a HandlerError of its kind."""
    assert probe(js_server, "js_probe", mode).decode() == expected


def test_a_typescript_generator_streams_each_yield(js_server):
    events = sse_events(js_server, "count_ts", {"TEXT": "héllo wide 世界"})
    assert [(e["WORD"], e["INDEX"]) for e in events] == [("héllo", 0), ("wide", 1), ("世界", 2)]
    # A thrown error ends the stream with it; the model streams the next request as before.
    assert sse_events(js_server, "count_ts", {"TEXT": "   "}) == [{"error": "TEXT has no words"}]
    again = sse_events(js_server, "count_ts", {"TEXT": "still here"})
    assert [e["WORD"] for e in again] == ["still", "here"]
