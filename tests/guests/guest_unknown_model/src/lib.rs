//! Test fixture `guest_unknown_model`: when X < 0, calls `infer("no_such_model", ...)` with its input and
//! returns the host's error as this request's error: same kind (`model-not-found`), the host's
//! message after `infer('no_such_model'): `. Should the call succeed, it answers with an
//! `internal` error saying so.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, ResultExt, infer};

/// The model it asks for, which must not exist.
pub const MISSING_MODEL: &str = "no_such_model";

/// The handler.
pub struct GuestUnknownModel;

impl Model for GuestUnknownModel {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(GuestUnknownModel)
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let x = request.input("X")?;
        x.check(DataType::Fp32, &[-1, 1])?;
        if x.as_f32()?.iter().all(|&v| v >= 0.0) {
            // Well-behaved input: Y = X, like every fixture.
            let y = request.take_input("X")?.renamed("Y");
            return Ok(Response::new().with_output(y));
        }
        let forwarded = Request::new(request.into_inputs());
        infer(MISSING_MODEL, None, forwarded).context(format!("infer('{MISSING_MODEL}')"))?;
        Err(Error::internal(format!(
            "infer('{MISSING_MODEL}') unexpectedly succeeded"
        )))
    }
}

tessera_guest::export_model!(GuestUnknownModel);
