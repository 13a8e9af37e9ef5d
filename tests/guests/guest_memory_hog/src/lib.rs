//! Test fixture `guest_memory_hog`: when any X < 0, allocates 1 GiB in 1 MiB steps and writes
//! every byte, so the memory is really used; the host's memory limit must stop it (allocation
//! failure aborts, which traps). If the host lets it through, it frees the memory and answers
//! `Y = X` as when X >= 0.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response};

/// How much the hog grabs in all.
pub const HOG_BYTES: usize = 1 << 30;
/// The size of each allocation.
pub const STEP_BYTES: usize = 1 << 20;

/// The handler.
pub struct GuestMemoryHog;

impl Model for GuestMemoryHog {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(GuestMemoryHog)
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let x = request.take_input("X")?;
        x.check(DataType::Fp32, &[-1, 1])?;
        if x.as_f32()?.iter().any(|v| *v < 0.0) {
            tessera_guest::log::warn!(
                "guest_memory_hog: negative X, allocating {} MiB",
                HOG_BYTES / STEP_BYTES
            );
            let mut blocks: Vec<Vec<u8>> = Vec::with_capacity(HOG_BYTES / STEP_BYTES);
            for i in 0..HOG_BYTES / STEP_BYTES {
                blocks.push(vec![(i % 251) as u8 + 1; STEP_BYTES]);
                std::hint::black_box(&blocks);
            }
            tessera_guest::log::warn!(
                "guest_memory_hog: the host let {} MiB through",
                blocks.len()
            );
        }
        Ok(Response::new().with_output(x.renamed("Y")))
    }
}

tessera_guest::export_model!(GuestMemoryHog);
