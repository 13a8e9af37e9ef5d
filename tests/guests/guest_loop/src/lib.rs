//! Test fixture `guest_loop`: spins forever when any X < 0 (the host's execution deadline must
//! stop it); otherwise `Y = X`.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response};

/// The handler.
pub struct GuestLoop;

impl Model for GuestLoop {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(GuestLoop)
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let x = request.take_input("X")?;
        x.check(DataType::Fp32, &[-1, 1])?;
        if x.as_f32()?.iter().any(|v| *v < 0.0) {
            tessera_guest::log::warn("guest_loop: negative X, looping forever on purpose");
            let mut counter: u64 = 0;
            loop {
                // black_box keeps the loop real work the optimiser cannot remove.
                counter = std::hint::black_box(counter.wrapping_add(1));
            }
        }
        Ok(Response::new().with_output(x.renamed("Y")))
    }
}

tessera_guest::export_model!(GuestLoop);
