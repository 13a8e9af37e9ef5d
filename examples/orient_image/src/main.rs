//! `orient_image`: is this text line upside down?
//!
//! `POST` a PNG or JPEG of a line of text; the answer is `{"angle": 0 | 180, "score": ...}`. The
//! image is decoded and resized inside the sandbox (the `image` crate), as PP-OCR's text
//! classifier expects it — RGB, height 48, width kept in proportion up to 192, right-padded,
//! scaled to [-1, 1], CHW — and classified by the `text_orientation` ONNX model.

use image::imageops::FilterType;
use tessera_guest::{Request as InferRequest, Tensor};
use wstd::http::{Body, Error, Request, Response, StatusCode};

const HEIGHT: u32 = 48;
const WIDTH: u32 = 192;

#[wstd::http_server]
async fn main(request: Request<Body>) -> Result<Response<Body>, Error> {
    if request.method() != "POST" {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "POST a PNG or JPEG image".into(),
        );
    }
    let bytes = request.into_body().bytes_contents().await?;
    let image = match image::load_from_memory(&bytes) {
        Ok(i) => i.to_rgb8(),
        Err(e) => {
            return reply(
                StatusCode::BAD_REQUEST,
                format!("not a PNG or JPEG image: {e}"),
            );
        }
    };
    if image.width() == 0 || image.height() == 0 {
        return reply(StatusCode::BAD_REQUEST, "the image is empty".into());
    }
    let input = Tensor::from_f32(
        "x",
        vec![1, 3, HEIGHT as i64, WIDTH as i64],
        &preprocess(&image),
    );
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

/// PP-OCR's classifier input: height 48, width in proportion (at most 192), padded with zeros on
/// the right, `(pixel / 255 - 0.5) / 0.5`, channels first.
fn preprocess(image: &image::RgbImage) -> Vec<f32> {
    let ratio = image.width() as f32 / image.height() as f32;
    let width = ((HEIGHT as f32 * ratio).ceil() as u32).clamp(1, WIDTH);
    let resized = image::imageops::resize(image, width, HEIGHT, FilterType::Triangle);
    let (w, h) = (WIDTH as usize, HEIGHT as usize);
    let mut chw = vec![0.0f32; 3 * h * w];
    for (x, y, pixel) in resized.enumerate_pixels() {
        for c in 0..3 {
            chw[c * h * w + y as usize * w + x as usize] = (pixel[c] as f32 / 255.0 - 0.5) / 0.5;
        }
    }
    chw
}

fn reply(status: StatusCode, error: String) -> Result<Response<Body>, Error> {
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from_json(&serde_json::json!({ "error": error }))?)?)
}
