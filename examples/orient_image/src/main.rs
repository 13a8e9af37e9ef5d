//! `orient_image`: is this text line upside down?
//!
//! `POST` a PNG or JPEG of a line of text; the answer is `{"angle": 0 | 180, "score": ...}`. The
//! image is decoded and resized inside the sandbox (the `image` crate), as PP-OCR's text
//! classifier expects it — RGB, height 48, width kept in proportion up to 192, right-padded,
//! scaled to [-1, 1], CHW — and classified by the `text_orientation` ONNX model.

use tessera_guest::{Request as InferRequest, Tensor};
use wstd::http::{Body, Error, Request, Response, StatusCode};

use text_line_image::{HEIGHT, WIDTH, classifier_input};

#[wstd::http_server]
async fn main(request: Request<Body>) -> Result<Response<Body>, Error> {
    if request.method() != "POST" {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "POST a PNG or JPEG image".into(),
        );
    }
    let bytes = request.into_body().bytes_contents().await?;
    let pixels = match classifier_input(&bytes) {
        Ok(pixels) => pixels,
        Err(e) => return reply(StatusCode::BAD_REQUEST, e),
    };
    let input = Tensor::from_f32("x", vec![1, 3, HEIGHT as i64, WIDTH as i64], &pixels);
    let mut answer =
        match tessera_guest::infer("text_orientation", None, InferRequest::new(vec![input])) {
            Ok(a) => a,
            Err(e) => {
                return reply(
                    StatusCode::BAD_GATEWAY,
                    format!("text_orientation failed: {e}"),
                );
            }
        };
    let probabilities = answer
        .take_output("save_infer_model/scale_0.tmp_1")?
        .as_f32()?
        .to_vec();
    let (upright, flipped) = (
        probabilities.first().copied().unwrap_or(0.0),
        probabilities.get(1).copied().unwrap_or(0.0),
    );
    let (angle, score) = if flipped > upright {
        (180, flipped)
    } else {
        (0, upright)
    };
    Ok(Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_json(
            &serde_json::json!({ "angle": angle, "score": score }),
        )?)?)
}

fn reply(status: StatusCode, error: String) -> Result<Response<Body>, Error> {
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from_json(&serde_json::json!({ "error": error }))?)?)
}
