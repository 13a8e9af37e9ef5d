// Triton's classic `add_sub` model as a Tessera handler.
//
// Inputs INPUT0, INPUT1: FP32 [batch, 16]. Outputs OUTPUT0 = INPUT0 + INPUT1 and
// OUTPUT1 = INPUT0 - INPUT1, same shape. Each request of a batch is checked and answered on its
// own, and only the outputs the caller asked for are computed.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

/// The handler. It keeps no state.
pub struct AddSub;

impl Model for AddSub {
    fn initialize(config: &ModelConfig) -> Result<Self, String> {
        tessera_guest::log::info!(
            "add_sub_wasm ready (max_batch_size {})",
            config.max_batch_size()
        );
        Ok(AddSub)
    }

    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let a = request.input("INPUT0")?.check(DataType::Fp32, &[-1, 16])?;
        let b = request.input("INPUT1")?.check(DataType::Fp32, &[-1, 16])?;
        if a.shape() != b.shape() {
            return Err(Error::invalid_input(format!(
                "INPUT0 has shape {:?} but INPUT1 has shape {:?}",
                a.shape(),
                b.shape()
            )));
        }
        // Borrowed views of the request's bytes: no copy when they are aligned.
        let (x, y) = (a.as_f32()?, b.as_f32()?);
        let shape = a.shape();

        let mut response = Response::new();
        if request.wants_output("OUTPUT0") {
            let sum: Vec<f32> = x.iter().zip(y.iter()).map(|(p, q)| p + q).collect();
            response.push_output(Tensor::from_f32("OUTPUT0", shape, &sum));
        }
        if request.wants_output("OUTPUT1") {
            let difference: Vec<f32> = x.iter().zip(y.iter()).map(|(p, q)| p - q).collect();
            response.push_output(Tensor::from_f32("OUTPUT1", shape, &difference));
        }
        Ok(response)
    }
}

tessera_guest::export_model!(AddSub);

#[cfg(test)]
mod tests;
