//! Model configuration: Triton's `ModelConfig` protobuf, read from `config.pbtxt` (protobuf text
//! format) and written back as the JSON Triton returns from `GET /v2/models/{m}/config`.
//!
//! The schema lives once, in `crates/core/proto/model_config.proto`, with Triton's message and field names
//! and numbers. prost generates the typed structs ([`pb`]); prost-reflect parses the text format
//! against the same descriptor, so unknown fields are rejected with their line and column.

use std::path::Path;
use std::sync::LazyLock;

use miette::Diagnostic;
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};

use crate::tensor::DataType;

mod autocomplete;
mod validate;

pub use autocomplete::{ModelSignature, TensorSignature, autocomplete, merge_completion};
pub use validate::{check_file_names, validate};

/// Types generated from `model_config.proto` (package `inference`, as in Triton).
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

pub use pb::ModelConfig;

static DESCRIPTORS: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/model_config.bin")).as_ref())
        .expect("the embedded descriptor set was produced by build.rs from a valid schema")
});

fn model_config_descriptor() -> prost_reflect::MessageDescriptor {
    DESCRIPTORS
        .get_message_by_name("inference.ModelConfig")
        .expect("the schema defines inference.ModelConfig")
}

/// The same schema with every map field read as what it is on the wire, a list of key/value
/// entry messages. A map of a dynamic message is a `HashMap`, whose order differs from one
/// instance to the next; as a list its entries can be put in key order, so the same
/// configuration always has the same text (a redeploy of it must hash as unchanged).
static LISTED_MAPS: LazyLock<DescriptorPool> = LazyLock::new(|| {
    let mut set = DESCRIPTORS
        .file_descriptor_protos()
        .cloned()
        .collect::<Vec<_>>();
    fn unmark(message: &mut prost_reflect::prost_types::DescriptorProto) {
        if let Some(options) = message.options.as_mut() {
            options.map_entry = None;
        }
        message.nested_type.iter_mut().for_each(unmark);
    }
    for file in &mut set {
        file.message_type.iter_mut().for_each(unmark);
    }
    DescriptorPool::from_file_descriptor_set(prost_reflect::prost_types::FileDescriptorSet {
        file: set,
    })
    .expect("the same schema, with map entries as plain messages")
});

/// Puts the entries of every map field of `message`, at any depth, in key order.
fn sort_map_entries(message: &mut DynamicMessage, maps: &prost_reflect::MessageDescriptor) {
    use prost_reflect::{Kind, Value};
    for (field, value) in message.fields_mut() {
        // A field is a map in the real schema (`maps`): here it is a list of entries.
        let is_map = maps.get_field(field.number()).is_some_and(|f| f.is_map());
        let nested = match maps.get_field(field.number()).map(|f| f.kind()) {
            Some(Kind::Message(m)) => m,
            _ => continue,
        };
        match value {
            Value::List(items) if is_map => {
                let key = |v: &Value| match v {
                    Value::Message(entry) => entry
                        .get_field_by_name("key")
                        .map(|k| format!("{:?}", k.as_ref()))
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                items.sort_by_cached_key(key);
                let entry_value = nested.get_field_by_name("value").map(|f| f.kind());
                if let Some(Kind::Message(value_desc)) = entry_value {
                    for item in items.iter_mut() {
                        if let Value::Message(entry) = item
                            && let Some(Value::Message(inner)) =
                                entry.get_field_by_name_mut("value")
                        {
                            sort_map_entries(inner, &value_desc);
                        }
                    }
                }
            }
            Value::List(items) => {
                for item in items.iter_mut() {
                    if let Value::Message(inner) = item {
                        sort_map_entries(inner, &nested);
                    }
                }
            }
            Value::Message(inner) => sort_map_entries(inner, &nested),
            _ => {}
        }
    }
}

/// A configuration that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Syntax {
        path: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{0}")]
    Invalid(String),
}

/// Parses `config.pbtxt` text. `path` only labels errors.
pub fn parse(text: &str, path: &str) -> Result<ModelConfig, ConfigError> {
    let text = &colon_before_message_lists(text);
    let message =
        DynamicMessage::parse_text_format(model_config_descriptor(), text).map_err(|e| {
            // An error at the end of the text carries no label: report where the text ends,
            // not 1:1.
            let offset = e
                .labels()
                .and_then(|mut labels| labels.next())
                .map(|label| label.offset())
                .unwrap_or_else(|| {
                    if e.to_string().contains("end of input") {
                        text.len()
                    } else {
                        0
                    }
                });
            let (line, column) = line_and_column(text, offset);
            ConfigError::Syntax {
                path: path.to_owned(),
                line,
                column,
                message: e.to_string(),
            }
        })?;
    message
        .transcode_to::<ModelConfig>()
        .map_err(|e| ConfigError::Invalid(format!("{path}: {e}")))
}

/// Reads and parses a `config.pbtxt` file.
pub fn read(path: &Path) -> Result<ModelConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Writes `field [ {...} ]` as `field: [ {...} ]`.
///
/// The text-format spec makes the colon optional before a list of messages, and nearly every
/// Triton config omits it (`input [ { ... } ]`), but prost-reflect 0.16 only accepts the list
/// after a colon. An identifier directly followed by `[` can only be such a field name, so
/// adding the colon changes nothing else. The colon replaces a blank where there is one, keeping
/// line and column numbers of later errors exact. Strings and `#` comments are left alone.
fn colon_before_message_lists(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 8);
    let mut i = 0;
    let mut last = 0; // start of the text not yet copied
    while i < bytes.len() {
        match bytes[i] {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            quote @ (b'"' | b'\'') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote && bytes[i] != b'\n' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let mut j = i;
                while j < bytes.len() && (bytes[j] == b' ' || bytes[j] == b'\t') {
                    j += 1;
                }
                if j < bytes.len() && bytes[j] == b'[' {
                    out.push_str(&text[last..i]);
                    if j > i {
                        out.push(':');
                        out.push_str(&text[i + 1..j]);
                    } else {
                        out.push(':');
                    }
                    last = j;
                }
                i = j.max(i);
            }
            _ => i += 1,
        }
    }
    out.push_str(&text[last.min(text.len())..]);
    out
}

fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The configuration as Triton's JSON: proto field names, every field present, enums by name,
/// 64-bit integers as strings (protobuf's JSON mapping, which Triton's clients expect).
pub fn to_json(config: &ModelConfig) -> serde_json::Value {
    let mut message = DynamicMessage::new(model_config_descriptor());
    if message.transcode_from(config).is_err() {
        return serde_json::Value::Null;
    }
    // 64-bit integers (dims, reshape, timeouts...) as numbers, as Triton writes them
    // (ModelConfigToJson fixes protobuf's strings): a model.py compares `dims[0] != 1`.
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(false)
        .stringify_64_bit_integers(false);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .unwrap_or(serde_json::Value::Null)
}

/// Parses the JSON form of a configuration, as Triton's model-control `load` takes it in its
/// `config` parameter: protobuf's JSON mapping, with proto field names or lowerCamelCase, enums by
/// name, 64-bit integers as numbers or strings. Unknown fields are refused.
pub fn from_json(text: &str) -> Result<ModelConfig, ConfigError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let message = DynamicMessage::deserialize(model_config_descriptor(), &mut deserializer)
        .map_err(|e| ConfigError::Invalid(format!("config: {e}")))?;
    deserializer
        .end()
        .map_err(|e| ConfigError::Invalid(format!("config: {e}")))?;
    message
        .transcode_to::<ModelConfig>()
        .map_err(|e| ConfigError::Invalid(format!("config: {e}")))
}

/// The configuration in protobuf text format, as `config.pbtxt` holds it: the same
/// configuration gives the same text, maps' entries in key order.
pub fn to_text(config: &ModelConfig) -> String {
    let descriptor = LISTED_MAPS
        .get_message_by_name("inference.ModelConfig")
        .expect("the schema defines inference.ModelConfig");
    let Ok(mut message) =
        DynamicMessage::decode(descriptor, prost::Message::encode_to_vec(config).as_slice())
    else {
        return String::new();
    };
    sort_map_entries(&mut message, &model_config_descriptor());
    message
        .to_text_format_with_options(&prost_reflect::text_format::FormatOptions::new().pretty(true))
}

/// The KServe datatype of a config `DataType` (`TYPE_STRING` is `BYTES`).
pub fn datatype_from_config(data_type: i32) -> Option<DataType> {
    use pb::DataType as C;
    Some(match C::try_from(data_type).ok()? {
        C::TypeBool => DataType::Bool,
        C::TypeUint8 => DataType::Uint8,
        C::TypeUint16 => DataType::Uint16,
        C::TypeUint32 => DataType::Uint32,
        C::TypeUint64 => DataType::Uint64,
        C::TypeInt8 => DataType::Int8,
        C::TypeInt16 => DataType::Int16,
        C::TypeInt32 => DataType::Int32,
        C::TypeInt64 => DataType::Int64,
        C::TypeFp16 => DataType::Fp16,
        C::TypeFp32 => DataType::Fp32,
        C::TypeFp64 => DataType::Fp64,
        C::TypeString => DataType::Bytes,
        C::TypeInvalid | C::TypeBf16 => return None,
    })
}

/// The config `DataType` of a KServe datatype.
pub fn datatype_to_config(datatype: DataType) -> pb::DataType {
    use pb::DataType as C;
    match datatype {
        DataType::Bool => C::TypeBool,
        DataType::Uint8 => C::TypeUint8,
        DataType::Uint16 => C::TypeUint16,
        DataType::Uint32 => C::TypeUint32,
        DataType::Uint64 => C::TypeUint64,
        DataType::Int8 => C::TypeInt8,
        DataType::Int16 => C::TypeInt16,
        DataType::Int32 => C::TypeInt32,
        DataType::Int64 => C::TypeInt64,
        DataType::Fp16 => C::TypeFp16,
        DataType::Fp32 => C::TypeFp32,
        DataType::Fp64 => C::TypeFp64,
        DataType::Bytes => C::TypeString,
    }
}

/// What runs a model, from `platform` / `backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Onnx,
    Wasm,
    Ensemble,
    /// A generative model run by the LLM engine (llama.cpp on a GGUF file), with TensorRT-LLM's
    /// tensors.
    Llm,
}

impl BackendKind {
    /// Resolves the backend, or says why this server cannot run the model.
    pub fn of(config: &ModelConfig) -> Result<BackendKind, String> {
        match (config.platform.as_str(), config.backend.as_str()) {
            ("onnxruntime_onnx", "" | "onnxruntime") | ("", "onnxruntime") => Ok(BackendKind::Onnx),
            // A Triton Python model (model.py) runs as the Wasm component `tessera build` makes
            // of it, beside the model.py, in the same version folder.
            ("", "wasm" | "python") => Ok(BackendKind::Wasm),
            ("", "llamacpp") => Ok(BackendKind::Llm),
            ("", "tensorrtllm") => Err(
                "backend 'tensorrtllm' runs TensorRT-LLM engines, which tessera does not; serve the model as a GGUF file with backend: \"llamacpp\" (the same input_ids/output_ids tensors, see docs/serving-llms.md)".into(),
            ),
            ("tensorrt_plan", "") | ("", "tensorrt") => Err(
                "TensorRT plans (platform 'tensorrt_plan', backend 'tensorrt') are not served by tessera: serve the ONNX model with the \"tensorrt\" GPU execution accelerator instead, which builds and runs the TensorRT engine through ONNX Runtime (docs/gpu.md)".into(),
            ),
            ("ensemble", "") => Ok(BackendKind::Ensemble),
            ("", "") => Err("the configuration names neither a platform nor a backend".into()),
            (platform, "") => Err(format!(
                "platform '{platform}' is not supported by tessera (supported: onnxruntime_onnx, ensemble; backends onnxruntime, wasm, llamacpp)"
            )),
            (_, backend) => Err(format!(
                "backend '{backend}' is not supported by tessera (supported: onnxruntime, wasm, python (built by `tessera build`), llamacpp)"
            )),
        }
    }
}

/// The `dynamic_batching` block, if the model has one.
pub fn dynamic_batching(config: &ModelConfig) -> Option<&pb::ModelDynamicBatching> {
    match &config.scheduling_choice {
        Some(pb::model_config::SchedulingChoice::DynamicBatching(d)) => Some(d),
        _ => None,
    }
}

/// The `ensemble_scheduling` block, if the model is an ensemble.
pub fn ensemble_scheduling(config: &ModelConfig) -> Option<&pb::ModelEnsembling> {
    match &config.scheduling_choice {
        Some(pb::model_config::SchedulingChoice::EnsembleScheduling(e)) => Some(e),
        _ => None,
    }
}

/// Settings that parse but that tessera does not act on, named for a warning at load time.
pub fn ignored_settings(config: &ModelConfig) -> Vec<&'static str> {
    let mut ignored = Vec::new();
    if config.optimization.is_some() {
        ignored.push("optimization");
    }
    if config.response_cache.as_ref().is_some_and(|c| c.enable) {
        ignored.push("response_cache");
    }
    ignored
}

/// Why the model cannot be served yet, if it asks for a feature tessera does not have: serving
/// it anyway would answer wrongly (no sequence state, one response where many are due, missing
/// batch inputs), so the model is refused at load with this reason instead. `streams` says
/// whether the model's backend can answer with a stream (Wasm handlers of the
/// `decoupled-model` world, the LLM engine and ensembles can; ONNX models cannot).
pub fn unsupported_settings(config: &ModelConfig, streams: bool) -> Option<String> {
    let mut unsupported = Vec::new();
    let decoupled = config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled);
    if let Some(pb::model_config::SchedulingChoice::SequenceBatching(sb)) =
        &config.scheduling_choice
    {
        if sb.iterative_sequence {
            unsupported.push(
                "sequence_batching { iterative_sequence: true } (requests a backend reschedules)",
            );
        }
        if decoupled {
            unsupported.push("sequence_batching on a decoupled model");
        }
    }
    if !streams && decoupled {
        unsupported.push(
            "model_transaction_policy { decoupled: true } for this backend (only Wasm handlers of the decoupled-model world, the llamacpp engine and ensembles answer with a stream of responses)",
        );
    }
    if !config.batch_input.is_empty() || !config.batch_output.is_empty() {
        unsupported.push(
            "batch_input / batch_output (ragged batching: tessera does not yet form these tensors)",
        );
    }
    (!unsupported.is_empty()).then(|| {
        format!(
            "not supported by tessera yet, so the model is not loaded: {}",
            unsupported.join("; ")
        )
    })
}

/// The model file of a version: `default_model_filename`, or the backend's `default` name.
pub fn model_file(config: &ModelConfig, version_dir: &Path, default: &str) -> std::path::PathBuf {
    let name = if config.default_model_filename.is_empty() {
        default
    } else {
        &config.default_model_filename
    };
    version_dir.join(name)
}

/// A string parameter from the config's `parameters` map.
pub fn string_parameter<'a>(config: &'a ModelConfig, key: &str) -> Option<&'a str> {
    config.parameters.get(key).map(|p| p.string_value.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_triton_add_sub() {
        let text = r#"
            name: "add_sub"  # trailing comment
            backend: "python"
            max_batch_size: 8
            input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
            input { name: "INPUT1" data_type: TYPE_FP32 dims: 16 }
            dynamic_batching { }
        "#;
        let config = parse(text, "config.pbtxt").expect("parses");
        assert_eq!(config.max_batch_size, 8);
        assert_eq!(config.input.len(), 2);
        assert_eq!(config.input[1].dims, vec![16]);
        assert!(dynamic_batching(&config).is_some());
    }

    #[test]
    fn json_and_text_round_trip() {
        let json = r#"{"name": "m", "backend": "wasm", "max_batch_size": 8,
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": ["16"]}],
            "output": [{"name": "Y", "dataType": "TYPE_FP32", "dims": [16]}],
            "parameters": {"offset": {"string_value": "2"}}}"#;
        let config = from_json(json).expect("Triton's JSON form parses");
        assert_eq!(config.input[0].dims, vec![16]);
        assert_eq!(config.output[0].data_type, pb::DataType::TypeFp32 as i32);
        assert_eq!(string_parameter(&config, "offset"), Some("2"));
        let text = to_text(&config);
        assert_eq!(parse(&text, "round trip").expect("text parses"), config);
        assert!(text.contains("key: \"offset\""), "{text}");
        assert!(from_json(r#"{"nmae": "typo"}"#).is_err(), "unknown field");
        assert!(from_json(r#"{"name": "m"} trailing"#).is_err());
    }

    #[test]
    fn the_same_configuration_always_has_the_same_text() {
        // Maps at two depths: the model's parameters, and an ensemble step's input map.
        let params: Vec<String> = (0..12)
            .map(|i| format!(r#""p{i}": {{"string_value": "{i}"}}"#))
            .collect();
        let json = format!(
            r#"{{"name": "m", "platform": "ensemble", "parameters": {{{}}},
            "ensemble_scheduling": {{"step": [{{"model_name": "a", "model_version": -1,
              "input_map": {{"x": "X", "y": "Y", "z": "Z", "w": "W"}},
              "output_map": {{"o": "O"}}}}]}}}}"#,
            params.join(", ")
        );
        let first = to_text(&from_json(&json).expect("parses"));
        for _ in 0..20 {
            // Each parse makes new maps, each with its own iteration order.
            let config = from_json(&json).expect("parses");
            assert_eq!(to_text(&config), first);
            assert_eq!(parse(&first, "text").expect("parses"), config);
        }
        let p0 = first.find("\"p0\"").expect("p0");
        let p11 = first.find("\"p11\"").expect("p11");
        let p2 = first.find("\"p2\"").expect("p2");
        assert!(p0 < p11 && p11 < p2, "keys in order: {first}");
    }

    #[test]
    fn message_lists_without_colon() {
        assert_eq!(colon_before_message_lists("input [ { } ]"), "input:[ { } ]");
        assert_eq!(colon_before_message_lists("input[{}]"), "input:[{}]");
        assert_eq!(colon_before_message_lists("dims: [ 1 ]"), "dims: [ 1 ]");
        assert_eq!(
            colon_before_message_lists("name: \"a [\" # b [\n"),
            "name: \"a [\" # b [\n"
        );
    }

    #[test]
    fn unknown_field_names_field_and_line() {
        let text = "name: \"m\"\nmax_batch_size: 1\nmax_bach_size: 2\n";
        let err = parse(text, "m/config.pbtxt")
            .expect_err("must fail")
            .to_string();
        assert!(err.contains("m/config.pbtxt:3:"), "{err}");
        assert!(err.contains("max_bach_size"), "{err}");
    }

    #[test]
    fn json_uses_triton_shape() {
        let config = parse(
            "name: \"m\" max_batch_size: 4 input { name: \"x\" data_type: TYPE_FP32 dims: [ 3 ] }",
            "c",
        )
        .expect("parses");
        let json = to_json(&config);
        assert_eq!(json["name"], "m");
        assert_eq!(json["max_batch_size"], 4);
        assert_eq!(json["input"][0]["data_type"], "TYPE_FP32");
        assert_eq!(json["input"][0]["dims"][0], 3);
    }

    #[test]
    fn every_reference_config_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/triton-configs");
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).expect("test data present") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "pbtxt") {
                read(&path).unwrap_or_else(|e| panic!("{e}"));
                count += 1;
            }
        }
        assert!(count >= 9, "expected the reference configs, found {count}");
    }

    #[test]
    fn a_file_that_ends_early_is_reported_where_it_ends() {
        let text = "name: \"m\"\nmax_batch_size: 1\ninput [ {\n  name: \"x\"\n";
        let err = parse(text, "m/config.pbtxt")
            .expect_err("must fail")
            .to_string();
        assert!(err.starts_with("m/config.pbtxt:5:1:"), "{err}");
        let err = parse("name: ", "c").expect_err("must fail").to_string();
        assert!(err.starts_with("c:1:7:"), "{err}");
    }
}
