//! `bls_branch`: business logic scripting — a handler that calls other models of the server and
//! picks a path from the data, as Triton's Python BLS examples do.
//!
//! Inputs `INPUT0`, `INPUT1`: FP32 `[1, 16]`. For each request:
//!
//! 1. **A**: `add_sub` (an ONNX model) on `{INPUT0, INPUT1}` gives `s = OUTPUT0` (the sum) and
//!    `d = OUTPUT1` (the difference).
//! 2. If the elements of `s` add up to 0 or more, **B**: `add_sub_wasm` on `{INPUT0: s,
//!    INPUT1: d}`; `OUTPUT` is its `OUTPUT0` (`s + d = 2 * INPUT0`) and `BRANCH` is
//!    `"add_sub_wasm"`.
//! 3. Otherwise **C**: `add_sub` on `{INPUT0: d, INPUT1: s}`; `OUTPUT` is its `OUTPUT1`
//!    (`d - s = -2 * INPUT1`) and `BRANCH` is `"add_sub"`.
//!
//! Outputs `OUTPUT`: FP32 `[1, 16]`, `BRANCH`: BYTES `[1, 1]`. An error from a called model
//! becomes this request's error, with its kind kept and the step named in the message.

use tessera_guest::{
    DataType, Error, Model, ModelConfig, Request, Response, ResultExt, Tensor, infer,
};

/// The ONNX model of steps A and C.
pub const ADD_SUB: &str = "add_sub";
/// The Wasm model of step B.
pub const ADD_SUB_WASM: &str = "add_sub_wasm";

/// The handler. It keeps no state.
pub struct BlsBranch;

impl Model for BlsBranch {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(BlsBranch)
    }

    fn execute_request(&mut self, mut request: Request) -> Result<Response, Error> {
        let a = request.take_input("INPUT0")?;
        let b = request.take_input("INPUT1")?;
        a.check(DataType::Fp32, &[1, 16])?;
        b.check(DataType::Fp32, &[1, 16])?;

        // Step A: sum and difference from the ONNX model. The tensors move into the request.
        let step_a = Request::builder()
            .input(a)
            .input(b)
            .requested_output("OUTPUT0")
            .requested_output("OUTPUT1")
            .build();
        let mut answer = infer(ADD_SUB, None, step_a).context("step A (add_sub)")?;
        let s = answer.take_output("OUTPUT0").context("step A (add_sub)")?;
        let d = answer.take_output("OUTPUT1").context("step A (add_sub)")?;
        let total: f32 = s.as_f32().context("step A (add_sub) OUTPUT0")?.iter().sum();

        let (output, branch) = if total >= 0.0 {
            // Step B: (s + d) = 2 * INPUT0, from the Wasm model.
            let step_b = Request::builder()
                .input(s.renamed("INPUT0"))
                .input(d.renamed("INPUT1"))
                .requested_output("OUTPUT0")
                .build();
            let mut answer = infer(ADD_SUB_WASM, None, step_b).context("step B (add_sub_wasm)")?;
            (
                answer
                    .take_output("OUTPUT0")
                    .context("step B (add_sub_wasm)")?,
                ADD_SUB_WASM,
            )
        } else {
            // Step C: (d - s) = -2 * INPUT1, from the ONNX model again.
            let step_c = Request::builder()
                .input(d.renamed("INPUT0"))
                .input(s.renamed("INPUT1"))
                .requested_output("OUTPUT1")
                .build();
            let mut answer = infer(ADD_SUB, None, step_c).context("step C (add_sub)")?;
            (
                answer.take_output("OUTPUT1").context("step C (add_sub)")?,
                ADD_SUB,
            )
        };
        output
            .check(DataType::Fp32, &[1, 16])
            .map_err(|e| e.with_kind(tessera_guest::ErrorKind::Internal))?;
        Ok(Response::new()
            .with_output(output.renamed("OUTPUT"))
            .with_output(Tensor::from_strings("BRANCH", [1, 1], &[branch])))
    }
}

tessera_guest::export_model!(BlsBranch);

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;
    use tessera_guest::testing;

    /// A stand-in for both add_sub models, recording the calls.
    fn fake_models(calls: Rc<RefCell<Vec<String>>>) {
        testing::set_infer(move |model, _version, request| {
            calls.borrow_mut().push(model.to_owned());
            let x = request.input("INPUT0")?.as_f32()?.into_owned();
            let y = request.input("INPUT1")?.as_f32()?.into_owned();
            let sum: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
            let diff: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p - q).collect();
            Ok(Response::new()
                .with_output(Tensor::from_f32("OUTPUT0", [1, 16], &sum))
                .with_output(Tensor::from_f32("OUTPUT1", [1, 16], &diff)))
        });
    }

    fn request(a: f32, b: f32) -> Request {
        Request::builder()
            .input(Tensor::from_f32("INPUT0", [1, 16], &[a; 16]))
            .input(Tensor::from_f32("INPUT1", [1, 16], &[b; 16]))
            .build()
    }

    #[test]
    fn non_negative_sum_goes_to_add_sub_wasm() {
        let calls = Rc::new(RefCell::new(Vec::new()));
        fake_models(calls.clone());
        let response = BlsBranch.execute_request(request(1.5, 0.25)).unwrap();
        assert_eq!(
            *response.output("OUTPUT").unwrap().as_f32().unwrap(),
            [3.0; 16]
        );
        assert_eq!(
            response.output("BRANCH").unwrap().as_strings().unwrap(),
            ["add_sub_wasm"]
        );
        assert_eq!(*calls.borrow(), ["add_sub", "add_sub_wasm"]);
        testing::clear_infer();
    }

    #[test]
    fn negative_sum_goes_back_to_add_sub() {
        let calls = Rc::new(RefCell::new(Vec::new()));
        fake_models(calls.clone());
        let response = BlsBranch.execute_request(request(-2.0, 0.5)).unwrap();
        assert_eq!(
            *response.output("OUTPUT").unwrap().as_f32().unwrap(),
            [-1.0; 16]
        );
        assert_eq!(
            response.output("BRANCH").unwrap().as_strings().unwrap(),
            ["add_sub"]
        );
        assert_eq!(*calls.borrow(), ["add_sub", "add_sub"]);
        testing::clear_infer();
    }

    #[test]
    fn downstream_errors_keep_their_kind_and_gain_context() {
        testing::set_infer(|model, _, _| {
            Err(Error::model_not_ready(format!(
                "model '{model}' is loading"
            )))
        });
        let err = BlsBranch.execute_request(request(1.0, 1.0)).unwrap_err();
        assert_eq!(err.kind(), tessera_guest::ErrorKind::ModelNotReady);
        assert_eq!(
            err.message(),
            "step A (add_sub): model 'add_sub' is loading"
        );
        testing::clear_infer();
    }

    #[test]
    fn rejects_wrong_shapes_before_calling_anything() {
        testing::clear_infer();
        let r = Request::builder()
            .input(Tensor::from_f32("INPUT0", [2, 16], &[0.0; 32]))
            .input(Tensor::from_f32("INPUT1", [2, 16], &[0.0; 32]))
            .build();
        assert!(BlsBranch.execute_request(r).unwrap_err().is_invalid_input());
    }
}
