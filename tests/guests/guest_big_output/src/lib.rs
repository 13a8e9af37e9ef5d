//! Test fixture `guest_big_output`: besides `Y = X`, returns `BIG`: UINT8 `[batch, n]` where
//! `n = max(|x|) MiB` over the negative values of X (0 when none is negative): X = -64 asks for
//! a 64 MiB output per row, which the host's output size limit must refuse. The bytes are
//! allocated in the guest first, so pick |X| below the instance's memory limit (or the guest
//! traps on allocation instead) and above the output limit.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

/// One mebibyte.
pub const MIB: usize = 1 << 20;

/// The handler.
pub struct GuestBigOutput;

impl Model for GuestBigOutput {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(GuestBigOutput)
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let x = request.take_input("X")?;
        x.check(DataType::Fp32, &[-1, 1])?;
        let batch = x.dim(0)?;
        let mebibytes = x
            .as_f32()?
            .iter()
            .filter(|v| **v < 0.0)
            .map(|v| v.abs().ceil() as usize)
            .max()
            .unwrap_or(0);
        let row = mebibytes
            .checked_mul(MIB)
            .filter(|n| {
                n.checked_mul(batch)
                    .is_some_and(|total| total <= isize::MAX as usize)
            })
            .ok_or_else(|| {
                Error::invalid_input(format!("{mebibytes} MiB per row cannot be addressed"))
            })?;
        // Filled with a non-zero byte so the pages are really written.
        let big = Tensor::from_raw(
            "BIG",
            DataType::Uint8,
            [batch as i64, row as i64],
            vec![0xab; row * batch],
        );
        Ok(Response::new().with_output(x.renamed("Y")).with_output(big))
    }
}

tessera_guest::export_model!(GuestBigOutput);
