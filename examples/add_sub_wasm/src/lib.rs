// Triton's classic `add_sub` model as a Tessera handler.
//
// Inputs INPUT0, INPUT1: FP32 of the shape the config gives INPUT0 (the example repository's:
// [batch, 16]; Triton's python_backend example: [4]). Outputs OUTPUT0 = INPUT0 + INPUT1 and
// OUTPUT1 = INPUT0 - INPUT1, same shape. Each request of a batch is checked and answered on its
// own, and only the outputs the caller asked for are computed.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

/// The handler: the input shape it accepts, from its config.
pub struct AddSub {
    shape: Vec<i64>,
}

/// INPUT0's configured shape, with the batch dimension first when the model batches.
fn configured_shape(config: &ModelConfig) -> Option<Vec<i64>> {
    let input = config
        .json()
        .get("input")?
        .as_array()?
        .iter()
        .find(|i| i.get("name").and_then(|n| n.as_str()) == Some("INPUT0"))?;
    // Numbers, as Triton writes them; strings (protobuf's JSON mapping) are taken too.
    let dims: Option<Vec<i64>> = input
        .get("dims")?
        .as_array()?
        .iter()
        .map(|d| d.as_i64().or_else(|| d.as_str()?.parse().ok()))
        .collect();
    let mut shape = dims?;
    if config.max_batch_size() > 0 {
        shape.insert(0, -1);
    }
    Some(shape)
}

impl Model for AddSub {
    fn initialize(config: &ModelConfig) -> Result<Self, String> {
        let shape = configured_shape(config).unwrap_or_else(|| vec![-1, 16]);
        tessera_guest::log::info!("add_sub_wasm ready (inputs {shape:?})");
        Ok(AddSub { shape })
    }

    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let a = request
            .input("INPUT0")?
            .check(DataType::Fp32, &self.shape)?;
        let b = request
            .input("INPUT1")?
            .check(DataType::Fp32, &self.shape)?;
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
