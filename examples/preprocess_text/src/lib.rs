//! `preprocess_text`: BERT's uncased WordPiece tokenizer as a Tessera handler.
//!
//! Input `TEXT`: BYTES `[batch, 1]`, UTF-8. Outputs `INPUT_IDS`, `ATTENTION_MASK` and
//! `TOKEN_TYPE_IDS`: INT64 `[batch, seq]`, where `seq` is the longest encoding in the request
//! (`[CLS]` and `[SEP]` included), shorter rows padded with 0. Encodings longer than
//! `max_sequence_length` ids (a `config.pbtxt` parameter, default 128) are truncated, keeping
//! `[SEP]`. A text that is not UTF-8 fails its own request with an `invalid-input` error.
//!
//! The vocabulary is BERT's uncased `vocab.txt` (30,522 entries), compiled into the component.

pub mod wordpiece;

use tessera_guest::{DataType, Error, Model, ModelConfig, Request, Response, Tensor};

use wordpiece::Tokenizer;

/// The sequence length limit when the configuration sets none (BERT-style models usually
/// serve 128).
pub const DEFAULT_MAX_SEQUENCE_LENGTH: usize = 128;

/// The handler: the parsed vocabulary and the length limit.
pub struct PreprocessText {
    tokenizer: Tokenizer,
    max_len: usize,
}

impl Model for PreprocessText {
    fn initialize(config: &ModelConfig) -> Result<Self, String> {
        let max_len = match config.parameter("max_sequence_length") {
            None => DEFAULT_MAX_SEQUENCE_LENGTH,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n >= 2 => n,
                _ => {
                    return Err(format!(
                        "parameter max_sequence_length must be an integer >= 2, got '{v}'"
                    ));
                }
            },
        };
        let tokenizer = Tokenizer::from_vocab(include_str!("../vocab.txt"))?;
        tessera_guest::log::info!(
            "preprocess_text ready: WordPiece vocabulary loaded, max_sequence_length {max_len}"
        );
        Ok(PreprocessText { tokenizer, max_len })
    }

    fn execute_request(&mut self, request: Request) -> Result<Response, Error> {
        let text = request.input("TEXT")?.check(DataType::Bytes, &[-1, 1])?;
        let texts = text.as_strings()?;
        let encoded: Vec<Vec<i64>> = texts
            .iter()
            .map(|t| self.tokenizer.encode(t, self.max_len))
            .collect();
        let (ids, mask, types, shape) = pad(&encoded);

        let mut response = Response::new();
        if request.wants_output("INPUT_IDS") {
            response.push_output(Tensor::from_i64("INPUT_IDS", shape, &ids));
        }
        if request.wants_output("ATTENTION_MASK") {
            response.push_output(Tensor::from_i64("ATTENTION_MASK", shape, &mask));
        }
        if request.wants_output("TOKEN_TYPE_IDS") {
            response.push_output(Tensor::from_i64("TOKEN_TYPE_IDS", shape, &types));
        }
        Ok(response)
    }
}

/// Pads the encodings to the longest: ids, attention mask, token type ids (all 0 for a single
/// segment) and their shape `[batch, seq]`.
pub fn pad(encoded: &[Vec<i64>]) -> (Vec<i64>, Vec<i64>, Vec<i64>, [i64; 2]) {
    let seq = encoded.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = vec![Tokenizer::PAD; encoded.len() * seq];
    let mut mask = vec![0; encoded.len() * seq];
    for (row, e) in encoded.iter().enumerate() {
        ids[row * seq..row * seq + e.len()].copy_from_slice(e);
        mask[row * seq..row * seq + e.len()].fill(1);
    }
    let types = vec![0; encoded.len() * seq];
    (ids, mask, types, [encoded.len() as i64, seq as i64])
}

tessera_guest::export_model!(PreprocessText);

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> PreprocessText {
        let config =
            ModelConfig::from_json(r#"{"name":"preprocess_text","max_batch_size":8}"#).unwrap();
        PreprocessText::initialize(&config).unwrap()
    }

    #[test]
    fn pads_to_the_longest_text_of_the_request() {
        let mut m = model();
        let request = Request::new(vec![Tensor::from_strings(
            "TEXT",
            [2, 1],
            &["A man is eating food.", "Hi"],
        )]);
        let response = m.execute_request(request).unwrap();
        let ids = response.output("INPUT_IDS").unwrap();
        assert_eq!(ids.shape(), [2, 8]);
        assert_eq!(
            *ids.as_i64().unwrap(),
            [
                101, 1037, 2158, 2003, 5983, 2833, 1012, 102, 101, 7632, 102, 0, 0, 0, 0, 0
            ]
        );
        let mask = response
            .output("ATTENTION_MASK")
            .unwrap()
            .as_i64()
            .unwrap()
            .into_owned();
        assert_eq!(mask, [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]);
        assert!(
            response
                .output("TOKEN_TYPE_IDS")
                .unwrap()
                .as_i64()
                .unwrap()
                .iter()
                .all(|&t| t == 0)
        );
    }

    #[test]
    fn bad_utf8_fails_only_its_request() {
        let mut m = model();
        let bad = Request::new(vec![Tensor::from_bytes_elements(
            "TEXT",
            [1, 1],
            vec![vec![0xc3, 0x28]],
        )]);
        let good = Request::new(vec![Tensor::from_strings("TEXT", [1, 1], &["ok"])]);
        let results = m.execute(vec![bad, good]);
        assert!(results[0].as_ref().unwrap_err().is_invalid_input());
        assert!(results[1].is_ok());
    }

    #[test]
    fn rejects_wrong_datatype_and_shape() {
        let mut m = model();
        let r = Request::new(vec![Tensor::from_f32("TEXT", [1, 1], &[1.0])]);
        assert!(m.execute_request(r).unwrap_err().is_invalid_input());
        let r = Request::new(vec![Tensor::from_strings("TEXT", [1, 2], &["a", "b"])]);
        assert!(m.execute_request(r).unwrap_err().is_invalid_input());
    }

    #[test]
    fn truncates_to_the_configured_length() {
        let config = ModelConfig::from_json(
            r#"{"parameters":{"max_sequence_length":{"string_value":"5"}}}"#,
        )
        .unwrap();
        let mut m = PreprocessText::initialize(&config).unwrap();
        let r = Request::new(vec![Tensor::from_strings(
            "TEXT",
            [1, 1],
            &["A man is eating food."],
        )]);
        let response = m.execute_request(r).unwrap();
        assert_eq!(
            *response.output("INPUT_IDS").unwrap().as_i64().unwrap(),
            [101, 1037, 2158, 2003, 102]
        );
    }
}
