//! Test fixture `guest_recursive`: when X < 0, calls `infer("guest_recursive", ...)` — itself — with the same
//! input. The host must refuse the cycle (`quota-exceeded`) instead of deadlocking; the error is
//! returned as this request's error, kind kept. Were a call ever answered, its `Y` would be
//! passed back.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, ResultExt, infer};

/// This model's own name.
pub const SELF_MODEL: &str = "guest_recursive";

/// The handler.
pub struct GuestRecursive;

impl Model for GuestRecursive {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(GuestRecursive)
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
        let mut answer =
            infer(SELF_MODEL, None, forwarded).context(format!("infer('{SELF_MODEL}')"))?;
        Ok(Response::new().with_output(answer.take_output("Y")?))
    }
}

tessera_guest::export_model!(GuestRecursive);
