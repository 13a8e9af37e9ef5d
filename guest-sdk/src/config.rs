//! The model configuration a handler receives at initialisation.

use serde_json::Value;

/// A model's configuration, as the JSON that `GET /v2/models/{name}/config` returns: Triton's
/// `ModelConfig` message with proto field names (`max_batch_size`, `string_value`) and 64-bit
/// integers as strings.
///
/// ```
/// use tessera_guest::ModelConfig;
///
/// let config = ModelConfig::from_json(r#"{
///     "name": "postprocess_topk",
///     "max_batch_size": 8,
///     "parameters": { "labels": { "string_value": "cat,dog" } }
/// }"#)?;
/// assert_eq!(config.name(), "postprocess_topk");
/// assert_eq!(config.max_batch_size(), 8);
/// assert_eq!(config.parameter("labels"), Some("cat,dog"));
/// assert_eq!(config.json()["parameters"]["labels"]["string_value"], "cat,dog");
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    raw: String,
    json: Value,
}

impl ModelConfig {
    /// Parses the configuration JSON; the error is a message fit for `initialize`'s result.
    pub fn from_json(raw: &str) -> Result<Self, String> {
        let json = serde_json::from_str(raw)
            .map_err(|e| format!("the model configuration is not valid JSON: {e}"))?;
        Ok(ModelConfig {
            raw: raw.to_owned(),
            json,
        })
    }

    /// The JSON as the host sent it.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The parsed JSON, for fields without an accessor here.
    pub fn json(&self) -> &Value {
        &self.json
    }

    /// The model's name (`""` if absent).
    pub fn name(&self) -> &str {
        self.json.get("name").and_then(Value::as_str).unwrap_or("")
    }

    /// `max_batch_size` (0 when absent: the model does not batch).
    pub fn max_batch_size(&self) -> i64 {
        self.json
            .get("max_batch_size")
            .and_then(as_i64)
            .unwrap_or(0)
    }

    /// The `string_value` of a `parameters { key: ... value { string_value: ... } }` entry of
    /// `config.pbtxt`.
    pub fn parameter(&self, key: &str) -> Option<&str> {
        let entry = self.json.get("parameters")?.get(key)?;
        entry
            .get("string_value")
            .or_else(|| entry.get("stringValue"))
            .and_then(Value::as_str)
            .or_else(|| entry.as_str())
    }
}

/// A JSON number, or a string holding one (protobuf's JSON mapping writes 64-bit integers as
/// strings).
fn as_i64(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_stringified_integers_and_camel_case() {
        let c = ModelConfig::from_json(
            r#"{"max_batch_size":"4","parameters":{"k":{"stringValue":"v"}}}"#,
        )
        .unwrap();
        assert_eq!(c.max_batch_size(), 4);
        assert_eq!(c.parameter("k"), Some("v"));
        assert_eq!(c.parameter("missing"), None);
        assert_eq!(c.name(), "");
    }

    #[test]
    fn rejects_bad_json() {
        assert!(
            ModelConfig::from_json("{")
                .unwrap_err()
                .contains("not valid JSON")
        );
    }
}
