//! Test fixture: a stateful handler over host-kept implicit state. Each request carries the
//! control inputs the host fills in (START bool, END fp32, CORRID string) and the state SUM_IN;
//! it answers SUM = (START ? 0 : SUM_IN) + INPUT, SUM_OUT = SUM (the next state), ID = CORRID
//! and ENDED = END. The handler keeps nothing between requests.

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

struct SequenceSum;

impl Model for SequenceSum {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        Ok(SequenceSum)
    }

    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let input = request.input("INPUT")?;
        input.check(DataType::Int64, &[1, 1])?;
        let start = request.input("START")?.as_bool()?;
        let end = request.input("END")?.as_f32()?.into_owned();
        let id = request.input("CORRID")?.as_strings()?.join("");
        let state = request.input("SUM_IN")?.as_i64()?.into_owned();
        let value = input.as_i64()?.first().copied().unwrap_or(0);
        let previous = if start.first().copied().unwrap_or(false) {
            0
        } else {
            state.first().copied().unwrap_or(0)
        };
        let sum = previous + value;
        Ok(Response::new()
            .with_output(Tensor::from_i64("SUM", [1, 1], &[sum]))
            .with_output(Tensor::from_i64("SUM_OUT", [1, 1], &[sum]))
            .with_output(Tensor::from_strings("ID", [1, 1], &[id]))
            .with_output(Tensor::from_f32("ENDED", [1, 1], &end)))
    }
}

tessera_guest::export_model!(SequenceSum);
