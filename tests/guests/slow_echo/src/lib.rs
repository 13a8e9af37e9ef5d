//! Test fixture `slow_echo`: `Y = X` for X: FP32 `[batch, 1]`, after sleeping the request's
//! `delay_ms` parameter (an integer; anything else is invalid input). The scheduling tests use it
//! to keep an instance busy so that later requests queue, and then observe the order of answers.
//! `finalize` logs "slow_echo finalized", which the shutdown test looks for.

use std::time::Duration;

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response};

/// The handler.
pub struct SlowEcho;

impl Model for SlowEcho {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(SlowEcho)
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let delay = request.parameter_i64("delay_ms")?.unwrap_or(0);
        if delay > 0 {
            // A WASI clock wait: the host parks this guest without holding an OS thread.
            std::thread::sleep(Duration::from_millis(delay.unsigned_abs()));
        }
        let x = request.take_input("X")?;
        x.check(DataType::Fp32, &[-1, 1])?;
        Ok(Response::new().with_output(x.renamed("Y")))
    }

    fn finalize(&mut self) {
        tessera_guest::log::info("slow_echo finalized");
    }
}

tessera_guest::export_model!(SlowEcho);
