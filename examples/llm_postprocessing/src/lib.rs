//! `postprocessing`: the last step of the LLM pipeline in TensorRT-LLM's layout, as a sandboxed
//! handler instead of Python: `TOKENS_BATCH` (INT32 `[beams, tokens]`) and `SEQUENCE_LENGTH`
//! (INT32 `[beams]`) become `OUTPUT` (BYTES `[beams]`), the text of each beam's first
//! `SEQUENCE_LENGTH` tokens, special tokens left out.
//!
//! The engine cuts streamed responses at character boundaries, so a response decoded alone
//! never shows half a character; a stateful reader of a stream decodes incrementally instead
//! (see `tensorrt_llm_bls`).

use std::path::Path;

use llm_text::Text;
use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

struct Postprocessing {
    text: Text,
}

impl Model for Postprocessing {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        let text = Text::load(Path::new(llm_text::MODEL_FILES))?;
        tessera_guest::log::info("postprocessing ready: tokenizer loaded");
        Ok(Postprocessing { text })
    }

    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let tokens = request.input("TOKENS_BATCH")?;
        tokens.expect_datatype(DataType::Int32)?;
        let shape = tokens.shape().to_vec();
        // [batch, beams, tokens] with the batch dimension, [beams, tokens] without.
        let width = usize::try_from(*shape.last().unwrap_or(&0)).unwrap_or(0);
        let ids = tokens.as_i32()?;
        // From the shape, not the data: a stream's last response may hold no tokens.
        let rows = shape[..shape.len().saturating_sub(1)]
            .iter()
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .product::<usize>();
        let lengths = match request.get_input("SEQUENCE_LENGTH") {
            Some(t) => t.as_i32()?.into_owned(),
            None => vec![width as i32; rows],
        };
        if lengths.len() != rows {
            return Err(Error::invalid_input(format!(
                "SEQUENCE_LENGTH has {} values for {rows} sequences",
                lengths.len()
            )));
        }
        let mut texts = Vec::with_capacity(rows.max(1));
        for (row, &length) in lengths.iter().enumerate() {
            let length = usize::try_from(length).unwrap_or(0).min(width);
            let row_ids: Vec<u32> = ids[row * width..row * width + length]
                .iter()
                .map(|&t| u32::try_from(t).unwrap_or(0))
                .collect();
            texts.push(self.text.decode(&row_ids).map_err(Error::invalid_input)?);
        }
        let mut out_shape: Vec<i64> = shape[..shape.len().saturating_sub(1)].to_vec();
        if out_shape.is_empty() {
            out_shape.push(texts.len() as i64);
        }
        Ok(Response::new().with_output(Tensor::from_strings("OUTPUT", out_shape, &texts)))
    }
}

tessera_guest::export_model!(Postprocessing);
