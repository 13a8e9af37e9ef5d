// Triton's `simple_string` example model (the one its string client examples call,
// simple_http_string_infer_client.py and the shared-memory ones) as a Tessera handler.
//
// INPUT0, INPUT1: BYTES [batch, 16], each element the decimal text of an INT32. OUTPUT0 and
// OUTPUT1: the text of their sum and difference, with INT32's wrap-around (Triton's model is a
// TensorFlow graph that parses the strings, adds and subtracts INT32s and prints them back).
// An element that is not an INT32 fails its request with the element's index.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

pub struct SimpleString;

fn integers(tensor: &Tensor) -> Result<Vec<i32>, Error> {
    tensor
        .as_bytes_elements()?
        .iter()
        .enumerate()
        .map(|(index, element)| {
            std::str::from_utf8(element)
                .ok()
                .and_then(|text| text.trim().parse::<i32>().ok())
                .ok_or_else(|| {
                    Error::invalid_input(format!(
                        "{}[{index}] is {:?}, not the decimal text of an INT32",
                        tensor.name(),
                        String::from_utf8_lossy(element)
                    ))
                })
        })
        .collect()
}

impl Model for SimpleString {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(SimpleString)
    }

    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let a = request.input("INPUT0")?.check(DataType::Bytes, &[-1, 16])?;
        let b = request.input("INPUT1")?.check(DataType::Bytes, &[-1, 16])?;
        if a.shape() != b.shape() {
            return Err(Error::invalid_input(format!(
                "INPUT0 has shape {:?} but INPUT1 has shape {:?}",
                a.shape(),
                b.shape()
            )));
        }
        let (x, y) = (integers(a)?, integers(b)?);
        let text = |op: fn(i32, i32) -> i32| -> Vec<String> {
            x.iter()
                .zip(&y)
                .map(|(p, q)| op(*p, *q).to_string())
                .collect()
        };
        let mut response = Response::new();
        if request.wants_output("OUTPUT0") {
            response.push_output(Tensor::from_strings(
                "OUTPUT0",
                a.shape(),
                &text(i32::wrapping_add),
            ));
        }
        if request.wants_output("OUTPUT1") {
            response.push_output(Tensor::from_strings(
                "OUTPUT1",
                a.shape(),
                &text(i32::wrapping_sub),
            ));
        }
        Ok(response)
    }
}

tessera_guest::export_model!(SimpleString);
