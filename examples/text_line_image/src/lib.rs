//! PP-OCR's text-orientation classifier reads a text line as RGB, height 48, width kept in
//! proportion up to 192 and right-padded with zeros, scaled to [-1, 1]
//! (`(pixel / 255 - 0.5) / 0.5`, Triton's "INCEPTION" scaling), channels first. Decoding and
//! resizing run in the sandbox, in the guest that calls this.

use image::imageops::FilterType;

pub const HEIGHT: u32 = 48;
pub const WIDTH: u32 = 192;
/// Elements of one preprocessed image: `[3, HEIGHT, WIDTH]`.
pub const ELEMENTS: usize = 3 * HEIGHT as usize * WIDTH as usize;

/// The classifier's input (`[3, HEIGHT, WIDTH]`, CHW) of a PNG or JPEG file's bytes; the error
/// says why the bytes are no such image.
pub fn classifier_input(encoded: &[u8]) -> Result<Vec<f32>, String> {
    let mut reader = image::ImageReader::new(std::io::Cursor::new(encoded))
        .with_guessed_format()
        .map_err(|e| format!("not a PNG or JPEG image: {e}"))?;
    reader.limits(decode_limits());
    let image = reader
        .decode()
        .map_err(|e| format!("not a PNG or JPEG image the classifier takes: {e}"))?
        .to_rgb8();
    if image.width() == 0 || image.height() == 0 {
        return Err("the image is empty".into());
    }
    Ok(preprocess(&image))
}

/// A text line is at most this many pixels on a side: a small file may declare 50,000,000 × 1
/// pixels, whose resizing overflows a 32-bit address space.
pub const MAX_SIDE: u32 = 16_384;
/// What decoding may allocate: well under the sandbox's memory, so that a file that decodes
/// into hundreds of MiB is refused by name instead of stopping the instance.
pub const MAX_DECODE_BYTES: u64 = 64 << 20;

fn decode_limits() -> image::Limits {
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    limits
}

fn preprocess(image: &image::RgbImage) -> Vec<f32> {
    let ratio = image.width() as f32 / image.height() as f32;
    let width = ((HEIGHT as f32 * ratio).ceil() as u32).clamp(1, WIDTH);
    let resized = image::imageops::resize(image, width, HEIGHT, FilterType::Triangle);
    let (w, h) = (WIDTH as usize, HEIGHT as usize);
    let mut chw = vec![0.0f32; ELEMENTS];
    for (x, y, pixel) in resized.enumerate_pixels() {
        for c in 0..3 {
            chw[c * h * w + y as usize * w + x as usize] = (pixel[c] as f32 / 255.0 - 0.5) / 0.5;
        }
    }
    chw
}
