//! The KServe v2 inference request/response bodies: JSON tensors (flat or nested `data`), and the
//! binary tensor data extension (`Inference-Header-Content-Length`, `binary_data_size`,
//! `binary_data`, `binary_data_output`), and the classification extension's `class_count`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value};

use crate::infer::{InferError, InferRequest, InferResponse, ParamValue, RequestedOutput};
use crate::tensor::{DataType, Tensor, TensorData, element_count};

#[derive(Deserialize)]
struct RequestJson {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Option<Vec<OutputJson>>,
}

#[derive(Deserialize)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
}

fn param_value(v: &Value) -> Option<ParamValue> {
    Some(match v {
        Value::Bool(b) => ParamValue::Bool(*b),
        Value::Number(n) if n.is_i64() => ParamValue::Int(n.as_i64()?),
        Value::Number(n) if n.is_u64() => ParamValue::Int(i64::try_from(n.as_u64()?).ok()?),
        Value::Number(n) => ParamValue::Double(n.as_f64()?),
        Value::String(s) => ParamValue::String(s.clone()),
        _ => return None,
    })
}

fn param_u64(params: Option<&Map<String, Value>>, key: &str) -> Result<Option<u64>, InferError> {
    match params.and_then(|p| p.get(key)) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            InferError::invalid(format!("parameter '{key}' must be a non-negative integer"))
        }),
    }
}

fn param_bool(params: Option<&Map<String, Value>>, key: &str) -> Result<bool, InferError> {
    match params.and_then(|p| p.get(key)) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(InferError::invalid(format!(
            "parameter '{key}' must be a boolean"
        ))),
    }
}

/// Decodes a request body. `header_length` is the `Inference-Header-Content-Length` header.
pub fn decode_request(
    body: &[u8],
    header_length: Option<usize>,
) -> Result<InferRequest, InferError> {
    let (json, mut binary) = match header_length {
        Some(n) if n > body.len() => {
            return Err(InferError::invalid(format!(
                "Inference-Header-Content-Length is {n} but the body has only {} bytes",
                body.len()
            )));
        }
        Some(n) => body.split_at(n),
        None => (body, &[][..]),
    };
    let parsed: RequestJson = serde_json::from_slice(json)
        .map_err(|e| InferError::invalid(format!("failed to parse the request JSON: {e}")))?;
    let params = parsed.parameters.as_ref();
    let all_binary = param_bool(params, "binary_data_output")?;
    let mut request = InferRequest {
        id: parsed.id.unwrap_or_default(),
        priority: u32::try_from(param_u64(params, "priority")?.unwrap_or(0))
            .map_err(|_| InferError::invalid("parameter 'priority' is too large"))?,
        timeout: param_u64(params, "timeout")?
            .filter(|&t| t > 0)
            .map(Duration::from_micros),
        ..Default::default()
    };
    if let Some(p) = params {
        for (k, v) in p {
            if let Some(value) = param_value(v) {
                request.parameters.insert(k.clone(), value);
            }
        }
    }
    for input in parsed.inputs {
        let datatype = DataType::from_name(&input.datatype).ok_or_else(|| {
            InferError::invalid(format!(
                "input '{}' has unknown datatype '{}'",
                input.name, input.datatype
            ))
        })?;
        let count = element_count(&input.shape).ok_or_else(|| {
            InferError::invalid(format!(
                "input '{}' has an invalid shape {:?}",
                input.name, input.shape
            ))
        })?;
        let data = match param_u64(input.parameters.as_ref(), "binary_data_size")? {
            Some(size) => {
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                if size > binary.len() {
                    return Err(InferError::invalid(format!(
                        "input '{}' declares binary_data_size {size} but only {} bytes of binary data remain",
                        input.name,
                        binary.len()
                    )));
                }
                let (mine, rest) = binary.split_at(size);
                binary = rest;
                decode_binary(&input.name, datatype, mine)?
            }
            None => {
                let data = input.data.ok_or_else(|| {
                    InferError::invalid(format!(
                        "input '{}' has neither 'data' nor 'binary_data_size'",
                        input.name
                    ))
                })?;
                decode_json_data(&input.name, datatype, &data, count)?
            }
        };
        let tensor = Tensor::new(input.name, datatype, input.shape, data);
        tensor.check_consistent().map_err(InferError::invalid)?;
        request.inputs.push(tensor);
    }
    if !binary.is_empty() {
        return Err(InferError::invalid(format!(
            "{} bytes of binary data follow the JSON header but no input claims them",
            binary.len()
        )));
    }
    for output in parsed.outputs.unwrap_or_default() {
        let p = output.parameters.as_ref();
        request.outputs.push(RequestedOutput {
            binary: param_bool(p, "binary_data")?
                || all_binary && p.and_then(|p| p.get("binary_data")).is_none(),
            // The wire name is "classification" (tritonclient's `class_count` argument).
            class_count: u32::try_from(
                param_u64(p, "classification")?
                    .or(param_u64(p, "class_count")?)
                    .unwrap_or(0),
            )
            .map_err(|_| InferError::invalid("class_count is too large"))?,
            name: output.name,
        });
    }
    if all_binary && request.outputs.is_empty() {
        // "all outputs, binary": resolved against the model's outputs by the caller.
        request
            .parameters
            .insert("binary_data_output".into(), ParamValue::Bool(true));
    }
    Ok(request)
}

/// Binary tensor data: raw little-endian elements, or for BYTES 4-byte little-endian lengths
/// each followed by that many bytes.
fn decode_binary(name: &str, datatype: DataType, bytes: &[u8]) -> Result<TensorData, InferError> {
    if datatype != DataType::Bytes {
        return Ok(TensorData::Raw(bytes.to_vec()));
    }
    let mut items = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err(InferError::invalid(format!(
                "input '{name}': truncated BYTES element length"
            )));
        }
        let (len, tail) = rest.split_at(4);
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len > tail.len() {
            return Err(InferError::invalid(format!(
                "input '{name}': BYTES element of {len} bytes exceeds the {} bytes left",
                tail.len()
            )));
        }
        let (item, tail) = tail.split_at(len);
        items.push(item.to_vec());
        rest = tail;
    }
    Ok(TensorData::Elements(items))
}

/// Flattens nested JSON arrays in row-major order.
fn flatten<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| flatten(v, out)),
        other => out.push(other),
    }
}

fn decode_json_data(
    name: &str,
    datatype: DataType,
    data: &Value,
    count: usize,
) -> Result<TensorData, InferError> {
    let mut flat = Vec::with_capacity(count);
    flatten(data, &mut flat);
    if flat.len() != count {
        return Err(InferError::invalid(format!(
            "input '{name}': shape holds {count} elements but 'data' has {}",
            flat.len()
        )));
    }
    let bad = |v: &Value| {
        InferError::invalid(format!(
            "input '{name}': {v} is not a valid {datatype} value"
        ))
    };
    macro_rules! ints {
        ($t:ty) => {{
            let mut bytes = Vec::with_capacity(count * std::mem::size_of::<$t>());
            for v in &flat {
                let n: $t = v
                    .as_i64()
                    .and_then(|n| <$t>::try_from(n).ok())
                    .or_else(|| v.as_u64().and_then(|n| <$t>::try_from(n).ok()))
                    .ok_or_else(|| bad(v))?;
                bytes.extend_from_slice(&n.to_le_bytes());
            }
            TensorData::Raw(bytes)
        }};
    }
    Ok(match datatype {
        DataType::Bool => TensorData::Raw(
            flat.iter()
                .map(|v| v.as_bool().map(u8::from).ok_or_else(|| bad(v)))
                .collect::<Result<_, _>>()?,
        ),
        DataType::Uint8 => ints!(u8),
        DataType::Uint16 => ints!(u16),
        DataType::Uint32 => ints!(u32),
        DataType::Uint64 => ints!(u64),
        DataType::Int8 => ints!(i8),
        DataType::Int16 => ints!(i16),
        DataType::Int32 => ints!(i32),
        DataType::Int64 => ints!(i64),
        DataType::Fp16 => TensorData::Raw(
            flat.iter()
                .map(|v| {
                    v.as_f64()
                        .map(|f| half::f16::from_f64(f).to_le_bytes())
                        .ok_or_else(|| bad(v))
                })
                .collect::<Result<Vec<_>, _>>()?
                .concat(),
        ),
        DataType::Fp32 => TensorData::Raw(
            flat.iter()
                .map(|v| {
                    v.as_f64()
                        .map(|f| (f as f32).to_le_bytes())
                        .ok_or_else(|| bad(v))
                })
                .collect::<Result<Vec<_>, _>>()?
                .concat(),
        ),
        DataType::Fp64 => TensorData::Raw(
            flat.iter()
                .map(|v| v.as_f64().map(f64::to_le_bytes).ok_or_else(|| bad(v)))
                .collect::<Result<Vec<_>, _>>()?
                .concat(),
        ),
        DataType::Bytes => TensorData::Elements(
            flat.iter()
                .map(|v| {
                    v.as_str()
                        .map(|s| s.as_bytes().to_vec())
                        .ok_or_else(|| bad(v))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// Serializes a tensor's elements as a flat JSON array without going through `serde_json::Value`
/// (f32 keeps its shortest representation).
struct JsonData<'a>(&'a Tensor);

impl serde::Serialize for JsonData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let tensor = self.0;
        let raw = match &tensor.data {
            TensorData::Raw(b) => b.as_slice(),
            TensorData::Elements(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    let text = std::str::from_utf8(item).map_err(|_| {
                        serde::ser::Error::custom(format!(
                            "output '{}' holds non-UTF-8 BYTES; request it with binary_data",
                            tensor.name
                        ))
                    })?;
                    seq.serialize_element(text)?;
                }
                return seq.end();
            }
        };
        macro_rules! each {
            ($t:ty, $n:expr) => {{
                let mut seq = s.serialize_seq(Some(raw.len() / $n))?;
                for c in raw.chunks_exact($n) {
                    seq.serialize_element(&<$t>::from_le_bytes(c.try_into().unwrap_or([0; $n])))?;
                }
                seq.end()
            }};
        }
        match tensor.datatype {
            DataType::Bool => {
                let mut seq = s.serialize_seq(Some(raw.len()))?;
                for &b in raw {
                    seq.serialize_element(&(b != 0))?;
                }
                seq.end()
            }
            DataType::Uint8 => each!(u8, 1),
            DataType::Int8 => each!(i8, 1),
            DataType::Uint16 => each!(u16, 2),
            DataType::Int16 => each!(i16, 2),
            DataType::Uint32 => each!(u32, 4),
            DataType::Int32 => each!(i32, 4),
            DataType::Uint64 => each!(u64, 8),
            DataType::Int64 => each!(i64, 8),
            DataType::Fp16 => {
                let mut seq = s.serialize_seq(Some(raw.len() / 2))?;
                for c in raw.chunks_exact(2) {
                    seq.serialize_element(&half::f16::from_le_bytes([c[0], c[1]]).to_f32())?;
                }
                seq.end()
            }
            DataType::Fp32 => each!(f32, 4),
            DataType::Fp64 => each!(f64, 8),
            DataType::Bytes => s.serialize_seq(Some(0))?.end(),
        }
    }
}

/// Bytes of a tensor in the binary extension's layout.
fn binary_payload(tensor: &Tensor) -> Vec<u8> {
    match &tensor.data {
        TensorData::Raw(b) => b.clone(),
        TensorData::Elements(items) => {
            let mut out = Vec::with_capacity(items.iter().map(|i| i.len() + 4).sum());
            for item in items {
                out.extend_from_slice(&(item.len() as u32).to_le_bytes());
                out.extend_from_slice(item);
            }
            out
        }
    }
}

struct OutputEntry<'a> {
    tensor: &'a Tensor,
    binary_size: Option<usize>,
}

impl serde::Serialize for OutputEntry<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("name", &self.tensor.name)?;
        map.serialize_entry("datatype", self.tensor.datatype.name())?;
        map.serialize_entry("shape", &self.tensor.shape)?;
        match self.binary_size {
            Some(size) => map.serialize_entry(
                "parameters",
                &serde_json::json!({ "binary_data_size": size }),
            )?,
            None => map.serialize_entry("data", &JsonData(self.tensor))?,
        }
        map.end()
    }
}

fn params_json(params: &BTreeMap<String, ParamValue>) -> Map<String, Value> {
    params
        .iter()
        .map(|(k, v)| {
            let v = match v {
                ParamValue::Bool(b) => Value::from(*b),
                ParamValue::Int(i) => Value::from(*i),
                ParamValue::Double(d) => Value::from(*d),
                ParamValue::String(s) => Value::from(s.clone()),
            };
            (k.clone(), v)
        })
        .collect()
}

/// An encoded response body and, when binary outputs follow the JSON, the JSON's length.
pub struct EncodedResponse {
    pub body: Vec<u8>,
    pub header_length: Option<usize>,
}

/// Encodes a response. `binary` says, per output name, whether it goes as binary data.
pub fn encode_response(
    response: &InferResponse,
    binary: impl Fn(&str) -> bool,
) -> Result<EncodedResponse, InferError> {
    let mut payloads = Vec::new();
    let entries: Vec<OutputEntry> = response
        .outputs
        .iter()
        .map(|t| {
            if binary(&t.name) {
                let payload = binary_payload(t);
                let entry = OutputEntry {
                    tensor: t,
                    binary_size: Some(payload.len()),
                };
                payloads.push(payload);
                entry
            } else {
                OutputEntry {
                    tensor: t,
                    binary_size: None,
                }
            }
        })
        .collect();
    let mut map = Map::new();
    map.insert(
        "model_name".into(),
        Value::from(response.model_name.clone()),
    );
    map.insert(
        "model_version".into(),
        Value::from(response.model_version.clone()),
    );
    if !response.id.is_empty() {
        map.insert("id".into(), Value::from(response.id.clone()));
    }
    if !response.parameters.is_empty() {
        map.insert(
            "parameters".into(),
            Value::Object(params_json(&response.parameters)),
        );
    }
    // Header fields first, then the outputs streamed without an intermediate Value.
    let mut body = serde_json::to_vec(&map).map_err(|e| InferError::internal(e.to_string()))?;
    body.pop(); // the closing brace
    if !map.is_empty() {
        body.push(b',');
    }
    body.extend_from_slice(b"\"outputs\":");
    serde_json::to_writer(&mut body, &entries).map_err(|e| InferError::invalid(e.to_string()))?;
    body.push(b'}');
    if payloads.is_empty() {
        return Ok(EncodedResponse {
            body,
            header_length: None,
        });
    }
    let header_length = body.len();
    for p in payloads {
        body.extend_from_slice(&p);
    }
    Ok(EncodedResponse {
        body,
        header_length: Some(header_length),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_json_data_is_flattened() {
        let body =
            br#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"INT32","data":[[1,2],[3,4]]}]}"#;
        let r = decode_request(body, None).expect("decodes");
        assert_eq!(r.inputs[0].to_f64_vec(), Some(vec![1.0, 2.0, 3.0, 4.0]));
    }

    #[test]
    fn binary_inputs_and_bytes_lengths() {
        let header = br#"{"inputs":[{"name":"s","shape":[2],"datatype":"BYTES","parameters":{"binary_data_size":11}}]}"#;
        let mut body = header.to_vec();
        body.extend_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(b"abc");
        body.extend_from_slice(&0u32.to_le_bytes());
        let r = decode_request(&body, Some(header.len())).expect("decodes");
        assert_eq!(
            r.inputs[0].data,
            TensorData::Elements(vec![b"abc".to_vec(), Vec::new()])
        );
    }

    #[test]
    fn truncated_and_mismatched_bodies_are_rejected() {
        assert!(decode_request(b"{}", Some(10)).is_err());
        let e = decode_request(
            br#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]}"#,
            None,
        )
        .expect_err("count mismatch");
        assert!(e.message.contains("3 elements"));
        assert!(
            decode_request(
                br#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[300]}]}"#,
                None
            )
            .is_err()
        );
    }

    #[test]
    fn response_mixes_json_and_binary() {
        let response = InferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            id: "7".into(),
            outputs: vec![
                Tensor::from_f32("a", vec![2], &[0.5, 1.0]),
                Tensor::from_f32("b", vec![1], &[2.0]),
            ],
            ..Default::default()
        };
        let encoded = encode_response(&response, |n| n == "b").expect("encodes");
        let n = encoded.header_length.expect("binary present");
        let json: Value = serde_json::from_slice(&encoded.body[..n]).expect("json");
        assert_eq!(json["id"], "7");
        assert_eq!(json["outputs"][0]["data"], serde_json::json!([0.5, 1.0]));
        assert_eq!(json["outputs"][1]["parameters"]["binary_data_size"], 4);
        assert_eq!(&encoded.body[n..], &2.0f32.to_le_bytes());
    }
}
