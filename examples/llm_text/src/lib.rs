//! Text for the LLM pipeline's handlers, the parts Triton users write in Python around
//! TensorRT-LLM (`preprocessing/model.py`, `postprocessing/model.py`, `tensorrt_llm_bls`):
//!
//! - [`Text::load`] reads the model's `tokenizer.json` and `tokenizer_config.json` from the
//!   handler's own folder (`/model`, read-only), as a model.py reads files beside itself;
//! - [`Text::chat_prompt`] renders the model's chat template (Jinja, by `minijinja`) over
//!   OpenAI-style messages;
//! - [`Text::encode`] tokenizes (Hugging Face's `tokenizers`, the same library as
//!   `transformers`' fast tokenizers);
//! - [`Detokenizer`] turns a stream of token ids into text deltas that never split a UTF-8
//!   character (decoding each token alone garbles CJK and emoji: one character can span tokens);
//! - [`StopStrings`] ends generation at a stop string without ever streaming part of one.

use std::path::Path;

use serde::Deserialize;
use tokenizers::Tokenizer;

/// Where a handler finds its folder.
pub const MODEL_FILES: &str = "/model";

/// One chat message, as the OpenAI API sends it.
#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// The model's tokenizer and chat template.
pub struct Text {
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    bos_token: String,
    eos_token: String,
    /// The id that ends generation (`eos_token`).
    pub end_id: u32,
    pub pad_id: u32,
}

#[derive(Deserialize)]
struct TokenizerConfig {
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
}

impl Text {
    /// Reads `tokenizer.json` and `tokenizer_config.json` from `dir`.
    pub fn load(dir: &Path) -> Result<Text, String> {
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| format!("cannot read {}: {e}", tokenizer_path.display()))?;
        let config_path = dir.join("tokenizer_config.json");
        let config: TokenizerConfig = std::fs::read(&config_path)
            .map_err(|e| format!("cannot read {}: {e}", config_path.display()))
            .and_then(|bytes| {
                serde_json::from_slice(&bytes)
                    .map_err(|e| format!("{} is not valid: {e}", config_path.display()))
            })?;
        let id = |token: &Option<String>, what: &str| -> Result<u32, String> {
            let token = token
                .as_deref()
                .ok_or_else(|| format!("tokenizer_config.json names no {what}"))?;
            tokenizer
                .token_to_id(token)
                .ok_or_else(|| format!("{what} '{token}' is not in the vocabulary"))
        };
        let end_id = id(&config.eos_token, "eos_token")?;
        let pad_id = id(&config.pad_token, "pad_token").unwrap_or(end_id);
        Ok(Text {
            chat_template: config.chat_template,
            bos_token: config.bos_token.unwrap_or_default(),
            eos_token: config.eos_token.unwrap_or_default(),
            tokenizer,
            end_id,
            pad_id,
        })
    }

    /// Token ids of `text`. Special tokens written in it (`<|im_start|>`) become their ids, as
    /// `transformers` does: the chat template writes them.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("cannot tokenize: {e}"))
    }

    /// Text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| format!("cannot decode: {e}"))
    }

    /// The bytes one token stands for, as OpenAI's log-probabilities give them: a token may hold
    /// part of a character, which no text of it alone can show.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(token) = self.tokenizer.id_to_token(id) else {
            return Vec::new();
        };
        if matches!(
            self.tokenizer.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        ) && let Some(bytes) = byte_level_bytes(&token)
        {
            return bytes;
        }
        // A SentencePiece byte-fallback token, `<0xE4>`.
        if let Some(byte) = token
            .strip_prefix("<0x")
            .and_then(|t| t.strip_suffix('>'))
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            return vec![byte];
        }
        // A SentencePiece piece writes its leading space as U+2581, which decoding one token
        // alone would strip.
        if token.contains('\u{2581}') {
            return token.replace('\u{2581}', " ").into_bytes();
        }
        self.decode(&[id])
            .map(String::into_bytes)
            .unwrap_or_default()
    }

    /// The prompt the model's chat template makes of `messages`, ending where the assistant's
    /// answer begins.
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<String, String> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or("the model has no chat template (tokenizer_config.json): send text instead")?;
        let mut env = minijinja::Environment::new();
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    message,
                ))
            },
        );
        env.add_template("chat", template)
            .map_err(|e| format!("the chat template does not parse: {e}"))?;
        let template = env
            .get_template("chat")
            .map_err(|e| format!("the chat template: {e}"))?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| format!("cannot render the chat template: {e}"))
    }
}

/// The bytes of a byte-level BPE token (GPT-2's vocabulary, SmolLM2's): each byte is written as
/// one character, printable bytes as themselves and the others (controls, space, 127-160, 173)
/// as U+0100 onwards, in byte order. None for a token outside that alphabet.
fn byte_level_bytes(token: &str) -> Option<Vec<u8>> {
    token
        .chars()
        .map(|c| match u32::from(c) {
            c @ (33..=126 | 161..=172 | 174..=255) => Some(c as u8),
            c @ 256..=288 => Some((c - 256) as u8),
            c @ 289..=322 => Some((c - 289 + 127) as u8),
            323 => Some(173),
            _ => None,
        })
        .collect()
}

/// Turns the token ids of one sequence, as they come, into text deltas.
///
/// TGI's prefix/read offsets: each push decodes two short windows, the tokens since the
/// last emitted text with one token before them for context (a SentencePiece tokenizer's
/// leading space depends on it), and the same window without the new tokens; the difference
/// is the delta. Text that ends in U+FFFD (a character split across tokens) waits for the next
/// token. So a token costs the decoding of a few tokens, not of the sequence so far.
#[derive(Debug, Default)]
pub struct Detokenizer {
    /// The tokens from the context token on; older ones are dropped.
    ids: Vec<u32>,
    /// Where the new (not yet emitted) tokens begin in `ids`.
    read: usize,
}

impl Detokenizer {
    /// Adds tokens; returns the text they complete (maybe empty).
    pub fn push(&mut self, text: &Text, ids: &[u32]) -> Result<String, String> {
        self.ids.extend_from_slice(ids);
        let (seen, all) = self.decode_windows(text)?;
        if all.len() <= seen.len() || all.ends_with('\u{fffd}') {
            return Ok(String::new());
        }
        let delta = Self::delta(&seen, &all).to_owned();
        // The last emitted token is the next window's context.
        let context = self.ids.len() - 1;
        self.ids.drain(..context);
        self.read = self.ids.len();
        Ok(delta)
    }

    /// What is left when the sequence ends. A character the last tokens only began (the
    /// token limit cut it) is dropped rather than shown as U+FFFD.
    pub fn finish(&mut self, text: &Text) -> Result<String, String> {
        let (seen, all) = self.decode_windows(text)?;
        let delta = Self::delta(&seen, &all)
            .trim_end_matches('\u{fffd}')
            .to_owned();
        self.ids.clear();
        self.read = 0;
        Ok(delta)
    }

    /// The text of the emitted window and of the whole window.
    fn decode_windows(&self, text: &Text) -> Result<(String, String), String> {
        let seen = match self.read {
            0 => String::new(),
            read => text.decode(&self.ids[..read])?,
        };
        Ok((seen, text.decode(&self.ids)?))
    }

    fn delta<'a>(seen: &str, all: &'a str) -> &'a str {
        // The whole window's text begins with the emitted window's; should a normaliser ever
        // rewrite the boundary, emit from the same byte offset if it is a character boundary.
        all.strip_prefix(seen)
            .or_else(|| all.get(seen.len()..))
            .unwrap_or_default()
    }
}

/// Stop strings over streamed text: text is released only once no stop string can begin in
/// it, and generation ends at the first one found (which is not part of the output).
#[derive(Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text not released yet: it may be the start of a stop string.
    held: String,
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> StopStrings {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds generated text. Returns the text that may be released, and whether a stop string
    /// was found (then the released text ends just before it, and nothing more follows).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            let out = self.held[..at].to_owned();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest tail that is a prefix of some stop string.
        let mut keep = 0;
        for stop in &self.stops {
            for (i, _) in self.held.char_indices() {
                let tail = &self.held[i..];
                if stop.starts_with(tail) {
                    keep = keep.max(tail.len());
                    break;
                }
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        (out, false)
    }

    /// The text still held when generation ends without a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_tokens_give_back_every_byte() {
        // GPT-2's bytes_to_unicode, the forward mapping: printable bytes as themselves, the
        // rest as U+0100 onwards in byte order.
        let printable = |b: u8| matches!(b, 33..=126 | 161..=172 | 174..=255);
        let mut shifted = 0u32;
        for b in 0..=255u8 {
            let c = if printable(b) {
                char::from(b)
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).expect("a character")
            };
            assert_eq!(byte_level_bytes(&c.to_string()), Some(vec![b]), "byte {b}");
        }
        assert_eq!(byte_level_bytes("\u{120}hello"), Some(b" hello".to_vec()));
        assert_eq!(byte_level_bytes("\u{4e2d}"), None);
    }

    #[test]
    fn detokenizer_streams_the_text_decoding_gives() {
        // The example repository's tokenizer (scripts/fetch_models.sh derives it from the GGUF).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../model_repository/tensorrt_llm/1");
        if !dir.join("tokenizer.json").exists() {
            eprintln!(
                "skipped: {} has no tokenizer.json (scripts/fetch_models.sh)",
                dir.display()
            );
            return;
        }
        let text = Text::load(&dir).expect("tokenizer loads");
        let samples = [
            "Hello, world! Streaming text token by token.",
            "  leading spaces, trailing spaces  ",
            "你好，世界。流式输出不应出现乱码。",
            "emoji: 👩‍👩‍👧‍👦 🚀🎉 and combining e\u{301}",
            "mixed 中文 and English, numbers 12345.",
        ];
        for sample in samples {
            let ids = text.encode(sample).expect("encodes");
            let whole = text.decode(&ids).expect("decodes");
            // Each token's own bytes, even those holding part of a character, add up to the text.
            let bytes: Vec<u8> = ids.iter().flat_map(|&id| text.token_bytes(id)).collect();
            assert_eq!(
                String::from_utf8_lossy(&bytes),
                whole,
                "{sample:?} token by token"
            );
            for step in [1, 2, 3] {
                let mut detokenizer = Detokenizer::default();
                let mut streamed = String::new();
                for chunk in ids.chunks(step) {
                    let delta = detokenizer.push(&text, chunk).expect("pushes");
                    assert!(
                        !delta.contains('\u{fffd}'),
                        "{sample:?}: half a character in {delta:?}"
                    );
                    streamed.push_str(&delta);
                }
                streamed.push_str(&detokenizer.finish(&text).expect("finishes"));
                assert_eq!(streamed, whole, "{sample:?} in chunks of {step}");
            }
        }
    }

    #[test]
    fn detokenizer_drops_a_character_cut_off_at_the_end() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../model_repository/tensorrt_llm/1");
        if !dir.join("tokenizer.json").exists() {
            return;
        }
        let text = Text::load(&dir).expect("tokenizer loads");
        let ids = text.encode("ok 🚀").expect("encodes");
        let mut detokenizer = Detokenizer::default();
        let mut streamed = String::new();
        // All but the last token: the rocket's bytes are split over several byte tokens.
        for id in &ids[..ids.len() - 1] {
            streamed.push_str(&detokenizer.push(&text, &[*id]).expect("pushes"));
        }
        streamed.push_str(&detokenizer.finish(&text).expect("finishes"));
        assert!(
            streamed.starts_with("ok") && !streamed.contains('\u{fffd}'),
            "{streamed:?}"
        );
    }

    #[test]
    fn stop_strings_never_release_part_of_one() {
        let mut stops = StopStrings::new(vec!["\n\nUser:".into(), "END".into()]);
        assert_eq!(stops.push("Hello"), ("Hello".into(), false));
        assert_eq!(stops.push(" wor"), (" wor".into(), false));
        assert_eq!(stops.push("ld\n"), ("ld".into(), false));
        assert_eq!(stops.push("\nUs"), ("".into(), false));
        assert_eq!(stops.push("er: hi"), ("".into(), true));
        let mut stops = StopStrings::new(vec!["END".into()]);
        assert_eq!(stops.push("the E"), ("the ".into(), false));
        assert_eq!(stops.push("x"), ("Ex".into(), false));
        assert_eq!(stops.push("EN"), ("".into(), false));
        assert_eq!(stops.finish(), "EN");
    }

    #[test]
    fn without_stop_strings_everything_is_released() {
        let mut stops = StopStrings::new(vec![String::new()]);
        assert_eq!(stops.push("a"), ("a".into(), false));
    }
}
