"""Triton's own Python client examples (examples/triton-clients, unchanged) against Tessera.

Each script runs as a user would run it (`python simple_http_infer_client.py -u HOST:PORT`)
against a server on a repository of the models they call: Triton's `simple` family
(model_repository/simple, simple_int8, simple_identity, simple_string), `simple_sequence` and
`repeat_int32`, seven models in all, as simple_http_model_control.py counts. The server runs with
`--server-name triton`, since the health-and-metadata examples check that name. A script passes
when it exits 0 and prints its PASS line where it has one.

The image examples (image_client.py, grpc_image_client.py, ensemble_image_client.py) run against
a second server on `text_orientation` (an ONNX image classifier: is a text line upright or upside
down?), `preprocess_image` (Wasm: PNG/JPEG decoding, in the place of Triton's DALI) and
`text_orientation_ensemble`, on images of a line of text drawn here, upright and turned over.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import MODEL_REPOSITORY, REPO_ROOT, binary, launch, stop

EXAMPLES = REPO_ROOT / "examples" / "triton-clients"
PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
MODELS = ("simple", "simple_int8", "simple_identity", "simple_string", "simple_sequence",
          "repeat_int32", "add_sub")

# SHA-256 of the files as they are upstream (triton-inference-server/client 58a44ca,
# src/python/examples/).
UPSTREAM = {
    "ensemble_image_client.py": "7ff5c7bf5c0e6c71d4cca7386799dc825fc5e61663ed9af4eaa61c2051e7fe7e",
    "grpc_image_client.py": "59b6bf4d91115febf19ea7114334bd23c247615553216932ecac7c77ec243415",
    "image_client.py": "d39b7e14b3af9d028ceb8fd2e99edf78cdec8312c6731d5a77c7d1ab904759c0",
    "grpc_explicit_byte_content_client.py": "08d989e8c7db0ee400b6f42f0b804fc2c1d503e8d80d6a54f66feb87ffd74615",
    "grpc_explicit_int8_content_client.py": "fac201c4a642cdca113f1968704729a7e40d8329fa9aba2bb006c14aaee25027",
    "grpc_explicit_int_content_client.py": "b5c16236daaec40b389d75baa465d802499dea66ef717cc068b69d07d09a7c60",
    "reuse_infer_objects_client.py": "006b3bbd63852ab48f65e0973afc6d9ba6414042d90c531706c58039863b9e84",
    "simple_grpc_aio_infer_client.py": "250e80fe9412836a69a711a687dc2059cd59ff82e1aa4dd48724292b74bd850b",
    "simple_grpc_aio_sequence_stream_infer_client.py": "df5caa5ebe80ac722146a4120ea5aaac089817063138926bedd9ebd1f2860c36",
    "simple_grpc_async_infer_client.py": "a8700c620e7f6936be2f927bc45b834f7068861279cceed780c51a8fa5c700ff",
    "simple_grpc_custom_args_client.py": "6584dc82da651c5336371ee0486bb2b5973d383390d9e865397cc99f1b8fba50",
    "simple_grpc_custom_repeat.py": "16e881e657909a4ae5d6852672d4c2ea5063dde5d1b2a8512794036fb2200e03",
    "simple_grpc_health_metadata.py": "6dfde1aec3496af96af86bb22d5c99d06ddd4cd4392903f320e1f995e576f013",
    "simple_grpc_infer_client.py": "86c00e2efde5882a63168452e707d5c8e29fa4c32c747c4730aeb197bbd58d12",
    "simple_grpc_keepalive_client.py": "9cc45174196c140ad0086c9e04abcce640599397f1c8134ab1e44d37ee2d6f54",
    "simple_grpc_sequence_stream_infer_client.py": "2e39808ec05d8dc70499e42c4ff292c4c1d7f3d35e4929f3c3c5180dde872417",
    "simple_grpc_sequence_sync_infer_client.py": "769dfa0723aa978e2cf6eaed59dc60301b9623e0e449ec66adf47db4f6e4b293",
    "simple_grpc_shm_client.py": "907d962e4f6f3e6abff4e94aed0f21bdc85b31f6403e9b32af0123408188af77",
    "simple_grpc_shm_string_client.py": "4b5b2ce9101e0aade24b7210a561686a27059dd9740070108614a9f378582640",
    "simple_grpc_string_infer_client.py": "adc9585cda96ff300f4ad869155f9716ceed2fea9c8865ebcb86d61dc77ac21f",
    "simple_http_aio_infer_client.py": "5c2a676dd77f01bc021d1125d36eab432a9e704d5ea0f0aae4f17693d847f994",
    "simple_http_async_infer_client.py": "2e5bae4e181c8eb075a3856f94fae0b9f69ed0a6c00c8527637f8c5cc477644e",
    "simple_http_health_metadata.py": "9ea635a18dbff91644a965860608175c36ac4104f204b22b90b5a40470a88ee5",
    "simple_http_infer_client.py": "c48cb6f3687341e0b157bf357b53cf95143092c3d23f1d0675dec384f1dc1284",
    "simple_http_model_control.py": "9845021ec5cf38e3b70f7cf239fd8343dc68d6f754de1c97f98124e013c21e3f",
    "simple_http_sequence_sync_infer_client.py": "84e69440904d72b5b7ee0b87b7492cef15eb2206e72e48603bff48009258e5fe",
    "simple_http_shm_client.py": "1ca9e9be952e6042badb74110015eb7c3a2530a0d6281235df43100e42d7bb5b",
    "simple_http_shm_string_client.py": "df9ebfd750f45142179a66c95434c5f47d7dd18bed5aa971efd412b51e3df442",
    "simple_http_string_infer_client.py": "d53c954432d0deb1df9b8226f11b9f754ec35868377b50ad3485abcd705923a1",}

# What each script prints last when it passes (None: it prints no PASS line; exit 0 is all).
PASSES = {
    "grpc_explicit_byte_content_client.py": "PASS: explicit string",
    "grpc_explicit_int8_content_client.py": "PASS: explicit int8",
    "simple_grpc_aio_infer_client.py": "PASS: grpc aio infer",
    "simple_grpc_aio_sequence_stream_infer_client.py": "PASS: grpc aio sequence stream",
    "simple_grpc_async_infer_client.py": "PASS: Async infer",
    "simple_grpc_custom_args_client.py": "PASS: CustomArgs",
    "simple_grpc_custom_repeat.py": "PASS: Decoupled API",
    "simple_grpc_infer_client.py": "PASS: infer",
    "simple_grpc_keepalive_client.py": "PASS: KeepAlive",
    "simple_grpc_sequence_stream_infer_client.py": "PASS: Sequence",
    "simple_grpc_sequence_sync_infer_client.py": "PASS: Sequence",
    "simple_grpc_shm_client.py": "PASS: system shared memory",
    "simple_grpc_shm_string_client.py": "PASS: system shared memory",
    "simple_grpc_string_infer_client.py": "PASS: string",
    "simple_http_aio_infer_client.py": "PASS: infer",
    "simple_http_sequence_sync_infer_client.py": "PASS: Sequence",
    "simple_http_shm_client.py": "PASS: system shared memory",
    "simple_http_shm_string_client.py": "PASS: system shared memory",
    "simple_http_string_infer_client.py": "PASS: string",
    "grpc_explicit_int_content_client.py": None,
    "simple_grpc_health_metadata.py": None,
    "simple_http_async_infer_client.py": None,
    "simple_http_health_metadata.py": None,
    "simple_http_infer_client.py": None,
}


@pytest.fixture(scope="module")
def examples_server(request):
    repo = Path(tempfile.mkdtemp(prefix="tessera-triton-examples-"))
    for model in MODELS:
        shutil.copytree(MODEL_REPOSITORY / model, repo / model)
    srv, proc, log = launch(binary(), ["--model-repository", str(repo), "--server-name", "triton"])
    failed_before = request.session.testsfailed
    yield srv
    stop(proc, log, keep=request.session.testsfailed > failed_before)
    shutil.rmtree(repo, ignore_errors=True)


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(PYTHON), str(EXAMPLES / script), *args], capture_output=True,
                          text=True, timeout=120, cwd=EXAMPLES)


def test_the_examples_are_upstream_byte_for_byte():
    here = {p.name for p in EXAMPLES.glob("*.py")}
    assert here == set(UPSTREAM)
    for name, digest in UPSTREAM.items():
        assert hashlib.sha256((EXAMPLES / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("script", sorted(PASSES))
def test_a_triton_client_example_passes(examples_server, script):
    url = (f"127.0.0.1:{examples_server.grpc_port}" if "grpc" in script
           else examples_server.url)
    done = run(script, "-u", url)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if PASSES[script]:
        assert PASSES[script] in done.stdout.splitlines()[-1], done.stdout[-2000:]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_reuse_infer_objects_passes(examples_server, protocol):
    url = (f"127.0.0.1:{examples_server.grpc_port}" if protocol == "grpc"
           else examples_server.url)
    done = run("reuse_infer_objects_client.py", "-i", protocol, "-u", url)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 + 1 = 1" in done.stdout and "15 - 2 = 13" in done.stdout


def test_model_control_passes_last(examples_server):
    # It unloads `simple` at its end: after every other example.
    done = run("simple_http_model_control.py", "-u", examples_server.url)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "PASS: model control"


def test_simple_string_refuses_text_that_is_no_int32(examples_server):
    import json

    body = {"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "BYTES",
         "data": ["1", "x1"] + ["0"] * 14},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "BYTES", "data": ["1"] * 16}]}
    status, _, answer = examples_server.post_json("/v2/models/simple_string/infer", body)
    assert status == 400, answer
    assert "INPUT0[1]" in json.loads(answer)["error"], answer
    # INT32's wrap-around, as Triton's graph adds.
    body["inputs"][0]["data"] = ["2147483647"] + ["0"] * 15
    status, _, answer = examples_server.post_json("/v2/models/simple_string/infer", body)
    assert status == 200, answer
    outputs = {o["name"]: o["data"] for o in json.loads(answer)["outputs"]}
    assert outputs["OUTPUT0"][0] == "-2147483648" and outputs["OUTPUT1"][:2] == ["2147483646", "-1"]


IMAGE_MODELS = ("text_orientation", "preprocess_image", "text_orientation_ensemble")


@pytest.fixture(scope="module")
def image_server(request):
    repo = Path(tempfile.mkdtemp(prefix="tessera-triton-images-"))
    for model in IMAGE_MODELS:
        shutil.copytree(MODEL_REPOSITORY / model, repo / model)
    srv, proc, log = launch(binary(), ["--model-repository", str(repo)])
    failed_before = request.session.testsfailed
    yield srv
    stop(proc, log, keep=request.session.testsfailed > failed_before)
    shutil.rmtree(repo, ignore_errors=True)


@pytest.fixture(scope="module")
def text_line_images():
    """A folder with a JPEG of a line of text upright (a.jpg) and a PNG of it upside down
    (b.png): the classifier's labels are 0 and 180."""
    from PIL import Image, ImageDraw, ImageFont

    folder = Path(tempfile.mkdtemp(prefix="tessera-text-lines-"))
    image = Image.new("RGB", (384, 96), "white")
    ImageDraw.Draw(image).text((10, 12), "Hello 2026", fill="black",
                               font=ImageFont.load_default(size=56))
    image.save(folder / "a.jpg")
    image.rotate(180).save(folder / "b.png")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def top_classes(stdout: str) -> list[str]:
    """The label of each first class line ("    <score> (<index>) = <label>") after a
    heading, in order."""
    labels, take = [], True
    for line in stdout.splitlines():
        if line.startswith("    ") and "=" in line:
            if take:
                labels.append(line.rsplit("=", 1)[1].strip())
            take = False
        else:
            take = True
    return labels


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_image_client_classifies_text_lines(image_server, text_line_images, protocol):
    url = f"127.0.0.1:{image_server.grpc_port}" if protocol == "grpc" else image_server.url
    for image, label in (("a.jpg", "0"), ("b.png", "180")):
        done = run("image_client.py", "-m", "text_orientation", "-s", "INCEPTION", "-c", "2",
                   "-i", protocol, "-u", url, str(text_line_images / image))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.splitlines()[-1] == "PASS", done.stdout
        assert top_classes(done.stdout) == [label], done.stdout
    # A folder, as one batch of two.
    done = run("image_client.py", "-m", "text_orientation", "-s", "INCEPTION", "-b", "2",
               "-i", protocol, "-u", url, str(text_line_images))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    classes = [line.rsplit("=", 1)[1].strip() for line in done.stdout.splitlines()
               if line.startswith("    ")]
    assert "batch size 2" in done.stdout and classes == ["0", "180"], done.stdout


def test_image_client_streams_over_grpc(image_server, text_line_images):
    done = run("image_client.py", "-m", "text_orientation", "-s", "INCEPTION", "-i", "grpc",
               "--streaming", "-a", "-u", f"127.0.0.1:{image_server.grpc_port}",
               str(text_line_images))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(top_classes(done.stdout)) == ["0", "180"], done.stdout


def test_grpc_image_client_classifies_text_lines(image_server, text_line_images):
    done = run("grpc_image_client.py", "-m", "text_orientation", "-s", "INCEPTION", "-c", "2",
               "-u", f"127.0.0.1:{image_server.grpc_port}", str(text_line_images))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert top_classes(done.stdout) == ["0", "180"], done.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_image_client_decodes_in_the_sandbox(image_server, text_line_images, protocol):
    url = f"127.0.0.1:{image_server.grpc_port}" if protocol == "grpc" else image_server.url
    done = run("ensemble_image_client.py", "-m", "text_orientation_ensemble", "-c", "2",
               "-i", protocol, "-u", url, str(text_line_images))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "PASS", done.stdout
    assert top_classes(done.stdout) == ["0", "180"], done.stdout


def test_an_ensemble_input_that_is_no_image_is_refused_by_name(image_server, text_line_images):
    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(image_server.url)
    files = np.array([[(text_line_images / "a.jpg").read_bytes()], [b"GIF89a not an image"]],
                     dtype=np.object_)
    images = httpclient.InferInput("IMAGE", list(files.shape), "BYTES")
    images.set_data_from_numpy(files, binary_data=True)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("text_orientation_ensemble", [images])
    assert refused.value.status() == "400", refused.value
    assert "IMAGE[1]" in refused.value.message() and "not a PNG or JPEG" in refused.value.message()
    # A 50,000,000 × 1 PNG of a few KB (its resizing overflowed the sandbox's 32-bit address
    # space: a trap and a 500 before) and a JPEG declaring 10,000 × 10,000: refused by name.
    import io
    from PIL import Image

    bombs = []
    for image, fmt in ((Image.new("L", (50_000_000, 1)), "PNG"),
                       (Image.new("RGB", (10_000, 10_000)), "JPEG")):
        encoded = io.BytesIO()
        image.save(encoded, fmt)
        bombs.append(encoded.getvalue())
    for bomb in bombs:
        files = np.array([[bomb]], dtype=np.object_)
        images = httpclient.InferInput("IMAGE", [1, 1], "BYTES")
        images.set_data_from_numpy(files, binary_data=True)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("text_orientation_ensemble", [images])
        assert refused.value.status() == "400", refused.value
        assert "IMAGE[0]" in refused.value.message(), refused.value.message()
    # The server goes on serving.
    ok = run("ensemble_image_client.py", "-m", "text_orientation_ensemble", "-u",
             image_server.url, str(text_line_images / "a.jpg"))
    assert ok.returncode == 0 and top_classes(ok.stdout) == ["0"], ok.stdout + ok.stderr
