//! Test fixture `identity_echo`: `Y = X` for X: FP32 `[batch, 1]`, always. The model that keeps
//! answering while its neighbours misbehave.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response};

/// The handler.
pub struct IdentityEcho;

impl Model for IdentityEcho {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(IdentityEcho)
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let x = request.take_input("X")?;
        x.check(DataType::Fp32, &[-1, 1])?;
        Ok(Response::new().with_output(x.renamed("Y")))
    }
}

tessera_guest::export_model!(IdentityEcho);
