//! Test fixture `identity_echo`: `Y = X + offset` for X: FP32 `[batch, 1]`, always, where
//! `offset` is the config's `offset` parameter (0 when absent, so by default Y = X). The model
//! that keeps answering while its neighbours misbehave; deployment tests tell two deployed
//! revisions apart by their offset.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

/// The handler.
pub struct IdentityEcho {
    offset: f32,
}

impl Model for IdentityEcho {
    fn initialize(config: &ModelConfig) -> Result<Self, String> {
        let offset = match config.parameter("offset") {
            Some(text) => text
                .parse()
                .map_err(|e| format!("parameter 'offset' = '{text}' is not a number: {e}"))?,
            None => 0.0,
        };
        Ok(IdentityEcho { offset })
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let x = request.take_input("X")?;
        x.check(DataType::Fp32, &[-1, 1])?;
        if self.offset == 0.0 {
            return Ok(Response::new().with_output(x.renamed("Y")));
        }
        let y: Vec<f32> = x.as_f32()?.iter().map(|v| v + self.offset).collect();
        Ok(Response::new().with_output(Tensor::from_f32("Y", x.shape().to_vec(), &y)))
    }
}

tessera_guest::export_model!(IdentityEcho);
