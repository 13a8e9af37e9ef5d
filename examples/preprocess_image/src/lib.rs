//! `preprocess_image`: the image-decoding step of `text_orientation_ensemble`, where Triton's
//! image ensembles (`preprocess_inception_ensemble`) run DALI. Each element of `IMAGE` (BYTES
//! `[batch, 1]`) is a PNG or JPEG file of a text line; `x` (FP32 `[batch, 3, 48, 192]`) is the
//! `text_orientation` classifier's input for each. A file that is no image fails its request,
//! naming the element.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};
use text_line_image::{ELEMENTS, HEIGHT, WIDTH, classifier_input};

pub struct PreprocessImage;

impl Model for PreprocessImage {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(PreprocessImage)
    }

    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let images = request.input("IMAGE")?.check(DataType::Bytes, &[-1, 1])?;
        let files = images.as_bytes_elements()?;
        let mut pixels = Vec::with_capacity(files.len() * ELEMENTS);
        for (index, file) in files.iter().enumerate() {
            let one = classifier_input(file)
                .map_err(|e| Error::invalid_input(format!("IMAGE[{index}]: {e}")))?;
            pixels.extend_from_slice(&one);
        }
        let batch = images.shape().first().copied().unwrap_or(0);
        let mut response = Response::new();
        response.push_output(Tensor::from_f32(
            "x",
            vec![batch, 3, i64::from(HEIGHT), i64::from(WIDTH)],
            &pixels,
        ));
        Ok(response)
    }
}

tessera_guest::export_model!(PreprocessImage);
