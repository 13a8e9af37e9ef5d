//! `preprocessing`: the first step of the LLM pipeline in TensorRT-LLM's layout, as a sandboxed
//! handler instead of Python. Per request row:
//!
//! - `QUERY` (BYTES `[1]`): the prompt text, tokenized as it is; or `MESSAGES` (BYTES `[1]`,
//!   Tessera's): OpenAI-style chat messages as JSON, rendered with the model's chat template;
//! - `REQUEST_OUTPUT_LEN` (INT32 `[1]`), passed on;
//! - `STOP_WORDS_DICT` (BYTES `[-1]`, optional): words that end generation, as token ids in
//!   TensorRT-LLM's `[2, n]` layout (tokens, then end offsets).
//!
//! Outputs: `INPUT_ID` (INT32 `[-1]`, rows padded with the pad token), `REQUEST_INPUT_LEN`,
//! `REQUEST_OUTPUT_LEN`, `STOP_WORDS_IDS`, `OUT_END_ID`, `OUT_PAD_ID` (INT32), and
//! `EXCLUDE_INPUT` (BOOL `[1]`, true: the pipeline wants only new tokens from the engine).
//!
//! The tokenizer and the template come from `tokenizer.json` and `tokenizer_config.json` in the
//! handler's own folder, which `scripts/fetch_models.sh` derives from the GGUF.

use std::path::Path;

use llm_text::{Message, Text};
use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

struct Preprocessing {
    text: Text,
}

/// The prompt of one row: its text, or its chat messages rendered.
fn prompt(text: &Text, request: &Request, row: usize) -> Result<String, Error> {
    let read = |name: &str| -> Result<Option<String>, Error> {
        let Some(tensor) = request.get_input(name) else {
            return Ok(None);
        };
        let values = tensor.as_bytes_elements()?;
        let value = values
            .get(row)
            .ok_or_else(|| Error::invalid_input(format!("{name} has no element for row {row}")))?;
        String::from_utf8(value.clone())
            .map(Some)
            .map_err(|_| Error::invalid_input(format!("{name} is not valid UTF-8")))
    };
    if let Some(messages) = read("MESSAGES")? {
        let messages: Vec<Message> = serde_json::from_str(&messages).map_err(|e| {
            Error::invalid_input(format!(
                "MESSAGES must be a JSON list of {{\"role\", \"content\"}} objects: {e}"
            ))
        })?;
        if messages.is_empty() {
            return Err(Error::invalid_input("MESSAGES is empty"));
        }
        return text.chat_prompt(&messages).map_err(Error::invalid_input);
    }
    read("QUERY")?.ok_or_else(|| Error::invalid_input("QUERY or MESSAGES is required"))
}

/// Stop words of one row in TensorRT-LLM's layout: `[2, n]`, the words' tokens back to back,
/// then where each ends (padded with -1).
fn stop_words(text: &Text, words: &[String]) -> Result<(Vec<i32>, Vec<i32>), Error> {
    let mut tokens = Vec::new();
    let mut ends = Vec::new();
    for word in words.iter().filter(|w| !w.is_empty()) {
        let ids = text.encode(word).map_err(Error::invalid_input)?;
        tokens.extend(ids.iter().map(|&t| t as i32));
        ends.push(tokens.len() as i32);
    }
    Ok((tokens, ends))
}

impl Model for Preprocessing {
    fn initialize(_config: &ModelConfig) -> Result<Self, String> {
        let text = Text::load(Path::new(llm_text::MODEL_FILES))?;
        tessera_guest::log::info("preprocessing ready: tokenizer and chat template loaded");
        Ok(Preprocessing { text })
    }

    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let lengths = request
            .input("REQUEST_OUTPUT_LEN")?
            .expect_datatype(DataType::Int32)?
            .as_i32()?
            .into_owned();
        let rows = lengths.len();
        if rows == 0 {
            return Err(Error::invalid_input("REQUEST_OUTPUT_LEN is empty"));
        }
        let mut prompts = Vec::with_capacity(rows);
        for row in 0..rows {
            let prompt = prompt(&self.text, &request, row)?;
            let ids = self.text.encode(&prompt).map_err(Error::invalid_input)?;
            if ids.is_empty() {
                return Err(Error::invalid_input("the prompt is empty"));
            }
            prompts.push(ids);
        }
        let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let pad = self.text.pad_id as i32;
        let mut padded = Vec::with_capacity(rows * width);
        for ids in &prompts {
            padded.extend(ids.iter().map(|&t| t as i32));
            padded.extend(std::iter::repeat_n(pad, width - ids.len()));
        }
        let words: Vec<String> = match request.get_input("STOP_WORDS_DICT") {
            Some(t) => t.as_strings()?.into_iter().map(str::to_owned).collect(),
            None => Vec::new(),
        };
        let (tokens, mut ends) = stop_words(&self.text, &words)?;
        // One row of tokens and one of ends, of the same width (at least 1).
        let n = tokens.len().max(1);
        let mut layout = tokens.clone();
        layout.resize(n, 0);
        ends.resize(n, -1);
        layout.extend(ends);
        let mut stop_ids = Vec::with_capacity(rows * 2 * n);
        for _ in 0..rows {
            stop_ids.extend_from_slice(&layout);
        }
        let rows_i = rows as i64;
        let input_lengths: Vec<i32> = prompts.iter().map(|p| p.len() as i32).collect();
        Ok(Response::new()
            .with_output(Tensor::from_i32(
                "INPUT_ID",
                [rows_i, width as i64],
                &padded,
            ))
            .with_output(Tensor::from_i32(
                "REQUEST_INPUT_LEN",
                [rows_i, 1],
                &input_lengths,
            ))
            .with_output(Tensor::from_i32(
                "REQUEST_OUTPUT_LEN",
                [rows_i, 1],
                &lengths,
            ))
            .with_output(Tensor::from_i32(
                "STOP_WORDS_IDS",
                [rows_i, 2, n as i64],
                &stop_ids,
            ))
            .with_output(Tensor::from_i32(
                "OUT_END_ID",
                [rows_i, 1],
                &vec![self.text.end_id as i32; rows],
            ))
            .with_output(Tensor::from_i32(
                "OUT_PAD_ID",
                [rows_i, 1],
                &vec![pad; rows],
            ))
            .with_output(Tensor::from_bool(
                "EXCLUDE_INPUT",
                [rows_i, 1],
                &vec![true; rows],
            )))
    }
}

tessera_guest::export_model!(Preprocessing);
