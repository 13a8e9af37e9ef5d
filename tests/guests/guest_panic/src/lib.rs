//! Test fixture `guest_panic`: panics in `execute` when any X < 0, which traps the instance and
//! fails its whole batch; otherwise `Y = X`. The host must replace the instance, so the model
//! answers again afterwards.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response};

/// The handler.
pub struct GuestPanic;

impl Model for GuestPanic {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(GuestPanic)
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let x = request.take_input("X")?;
        x.check(DataType::Fp32, &[-1, 1])?;
        if let Some(v) = x.as_f32()?.iter().find(|v| **v < 0.0) {
            panic!("guest_panic: X = {v} is negative, panicking on purpose");
        }
        Ok(Response::new().with_output(x.renamed("Y")))
    }
}

tessera_guest::export_model!(GuestPanic);
