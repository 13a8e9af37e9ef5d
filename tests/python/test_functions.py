"""The example functions over real HTTP, from Python: orient_image with real images rendered by
Pillow (PNG and JPEG, upright and upside down), classify_text, and hello.

A module-scoped tessera serves model_repository/ and functions/.
"""
from __future__ import annotations

import io
import json

import pytest
from PIL import Image, ImageDraw, ImageFont

from conftest import binary, launch, stop


@pytest.fixture(scope="module")
def srv(request):
    server, proc, log = launch(binary(), ["--model-repository", "model_repository",
                                          "--functions", "functions"])
    failed_before = request.session.testsfailed
    yield server
    stop(proc, log, keep=request.session.testsfailed > failed_before)


def text_line(text: str, fmt: str, upside_down: bool) -> bytes:
    font = ImageFont.load_default(size=28)
    image = Image.new("RGB", (360, 48), "white")
    ImageDraw.Draw(image).text((6, 6), text, fill="black", font=font)
    if upside_down:
        image = image.rotate(180)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("upside_down,angle", [(False, 0), (True, 180)])
def test_orient_image(srv, fmt, upside_down, angle):
    body = text_line("Tessera reads this line", fmt, upside_down)
    status, headers, answer = srv.request("POST", "/v1/functions/orient_image/", body)
    assert status == 200, answer
    assert headers["content-type"] == "application/json"
    result = json.loads(answer)
    assert result["angle"] == angle, result
    assert result["score"] > 0.9, result


def test_orient_image_refuses_what_is_not_an_image(srv):
    status, _, answer = srv.request("POST", "/v1/functions/orient_image/", b"GIF89a...")
    assert status == 400
    assert "not a PNG or JPEG" in json.loads(answer)["error"]


def test_classify_text(srv):
    status, _, answer = srv.post_json(
        "/v1/functions/classify_text/",
        {"text": "I need a faster laptop with more memory",
         "labels": ["computers", "gardening", "cooking"]})
    assert status == 200, answer
    assert json.loads(answer)["label"] == "computers"


def test_hello_and_the_function_list(srv):
    assert srv.request("GET", "/v1/functions/hello/")[2] == b"Hello from Tessera!\n"
    status, _, listing = srv.request("GET", "/v1/functions")
    names = {f["name"]: f["state"] for f in json.loads(listing)}
    assert names == {"hello": "READY", "classify_text": "READY", "orient_image": "READY"}
