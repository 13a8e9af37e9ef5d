//! The KServe v2 inference request/response bodies: JSON tensors (flat or nested `data`), and the
//! binary tensor data extension (`Inference-Header-Content-Length`, `binary_data_size`,
//! `binary_data`, `binary_data_output`), and the classification extension's `class_count`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::infer::{
    InferError, InferRequest, InferResponse, ParamValue, RequestedOutput, SharedMemoryRef,
};
use crate::tensor::{Bytes, DataType, Tensor, TensorData, element_count};

// Decoding never builds a generic `serde_json::Value` tree: each input's `data` is kept as the raw
// JSON text it occupies in the body (borrowed, not copied) until its datatype is known, then
// streamed straight into a typed little-endian buffer. Peak memory stays a small multiple of the
// body (at most 8 bytes per number, each at least 2 bytes of JSON; a 32-byte handle plus the text
// per BYTES element, each at least 3 bytes of JSON), and no
// allocation is ever sized from a declared shape.

#[derive(Deserialize)]
struct RequestJson<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Option<Parameters>,
    #[serde(borrow)]
    inputs: Vec<InputJson<'a>>,
    #[serde(default)]
    outputs: Option<Vec<OutputJson>>,
}

#[derive(Deserialize)]
struct InputJson<'a> {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Option<Parameters>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Option<Parameters>,
}

/// A `parameters` object: KServe v2 parameter values are booleans, numbers or strings.
#[derive(Default)]
struct Parameters(BTreeMap<String, ParamValue>);

impl Parameters {
    fn get(&self, key: &str) -> Option<&ParamValue> {
        self.0.get(key)
    }
}

impl<'de> Deserialize<'de> for Parameters {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ParametersVisitor;
        impl<'de> Visitor<'de> for ParametersVisitor {
            type Value = Parameters;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of parameters")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parameters, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value = map.next_value::<ParamJson>()?;
                    out.insert(key, value.0);
                }
                Ok(Parameters(out))
            }
        }
        d.deserialize_map(ParametersVisitor)
    }
}

struct ParamJson(ParamValue);

impl<'de> Deserialize<'de> for ParamJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ParamVisitor;
        impl Visitor<'_> for ParamVisitor {
            type Value = ParamJson;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a parameter value (boolean, number or string)")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<ParamJson, E> {
                Ok(ParamJson(ParamValue::Bool(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ParamJson, E> {
                Ok(ParamJson(ParamValue::Int(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ParamJson, E> {
                // Bit for bit, as over gRPC: a uint64 correlation id past 2^63 reads back as
                // itself; a count or a time that large reads as negative and is refused.
                Ok(ParamJson(ParamValue::Int(i64::from_ne_bytes(
                    v.to_ne_bytes(),
                ))))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ParamJson, E> {
                Ok(ParamJson(ParamValue::Double(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ParamJson, E> {
                Ok(ParamJson(ParamValue::String(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<ParamJson, E> {
                Ok(ParamJson(ParamValue::String(v)))
            }
        }
        d.deserialize_any(ParamVisitor)
    }
}

/// A request's scheduling parameters, as every KServe v2 front-end carries them: `priority` (1
/// is highest, 0 the model's default) and `timeout` (queue timeout in µs; 0: none).
pub fn scheduling_parameters(
    params: &BTreeMap<String, ParamValue>,
) -> Result<(u32, Option<Duration>), InferError> {
    let get = |key: &str| param_u64_in(params.get(key), key);
    // Triton's priority is a uint64 (read bit for bit: past 2^63 it arrives as a negative
    // int64); one past the model's levels is its lowest level anyway.
    let priority = match params.get("priority") {
        Some(ParamValue::Int(n)) => u64::from_ne_bytes(n.to_ne_bytes()),
        None => 0,
        Some(_) => {
            return Err(InferError::invalid(
                "parameter 'priority' must be an unsigned integer",
            ));
        }
    };
    let priority = u32::try_from(priority).unwrap_or(u32::MAX);
    let timeout = get("timeout")?
        .filter(|&t| t > 0)
        .map(Duration::from_micros);
    Ok((priority, timeout))
}

/// Where a tensor lives in shared memory, from its `shared_memory_region`,
/// `shared_memory_byte_size` and `shared_memory_offset` parameters; None without a region.
pub fn shared_memory_parameters(
    params: &BTreeMap<String, ParamValue>,
) -> Result<Option<SharedMemoryRef>, InferError> {
    let region = match params.get("shared_memory_region") {
        None => return Ok(None),
        Some(ParamValue::String(name)) => name.clone(),
        Some(_) => {
            return Err(InferError::invalid(
                "parameter 'shared_memory_region' must be a string",
            ));
        }
    };
    let size = |key: &str| -> Result<Option<usize>, InferError> {
        param_u64_in(params.get(key), key)?
            .map(|n| {
                usize::try_from(n).map_err(|_| InferError::invalid(format!("'{key}' is too large")))
            })
            .transpose()
    };
    let byte_size = size("shared_memory_byte_size")?.ok_or_else(|| {
        InferError::invalid(format!(
            "shared memory region '{region}' is named without 'shared_memory_byte_size'"
        ))
    })?;
    Ok(Some(SharedMemoryRef {
        region,
        offset: size("shared_memory_offset")?.unwrap_or(0),
        byte_size,
    }))
}

/// Reads inputs that live in shared memory; the server's registry of regions implements it.
pub trait RegionReader {
    /// The bytes at `place`, checked against the registered region.
    fn read(&self, place: &SharedMemoryRef) -> Result<Bytes, InferError>;
}

/// An input's bytes from shared memory, read only once the size the request gives matches what
/// the input's shape and datatype take (any size for BYTES): a client could otherwise have the
/// server read gigabytes for a tensor of four floats.
pub fn read_shared_input(
    regions: &dyn RegionReader,
    name: &str,
    datatype: DataType,
    shape: &[i64],
    place: &SharedMemoryRef,
) -> Result<Bytes, InferError> {
    match tessera_abi::shape_byte_size(datatype, shape) {
        Ok(Some(needed)) if needed != place.byte_size => Err(InferError::invalid(format!(
            "input '{name}': its shared memory size ({} bytes) is not the {needed} bytes its shape {shape:?} of {} takes",
            place.byte_size,
            datatype.name()
        ))),
        Err(e) => Err(InferError::invalid(format!(
            "input '{name}' has an invalid shape {shape:?}: {e}"
        ))),
        _ => regions.read(place),
    }
}

/// A front-end without shared memory: every region is unknown.
pub struct NoSharedMemory;

impl RegionReader for NoSharedMemory {
    fn read(&self, place: &SharedMemoryRef) -> Result<Bytes, InferError> {
        Err(InferError::invalid(format!(
            "Unable to find system shared memory region: '{}'",
            place.region
        )))
    }
}

/// The number of classes an output asks for (its `classification` parameter, as tritonclient
/// sends `class_count`; 0: the tensor itself).
/// A model version named in a URL or a gRPC field: `""` is the newest (None); anything else must
/// be a positive integer, refused in Triton's words (clients match on them).
pub fn parse_model_version(version: &str) -> Result<Option<i64>, InferError> {
    if version.is_empty() {
        return Ok(None);
    }
    match version.parse::<i64>() {
        Ok(v) if v > 0 => Ok(Some(v)),
        Ok(_) => Err(InferError::invalid(format!(
            "invalid model version specified '{version}' , version should be an integral value > 0"
        ))),
        Err(_) => Err(InferError::invalid(format!(
            "failed to get model version from specified version string '{version}' (details: stol), version should be an integral value > 0"
        ))),
    }
}

pub fn class_count_parameter(params: &BTreeMap<String, ParamValue>) -> Result<u32, InferError> {
    let count = param_u64_in(params.get("classification"), "classification")?
        .or(param_u64_in(params.get("class_count"), "class_count")?)
        .unwrap_or(0);
    u32::try_from(count).map_err(|_| InferError::invalid("class_count is too large"))
}

fn param_u64(params: Option<&Parameters>, key: &str) -> Result<Option<u64>, InferError> {
    param_u64_in(params.and_then(|p| p.get(key)), key)
}

fn param_u64_in(value: Option<&ParamValue>, key: &str) -> Result<Option<u64>, InferError> {
    match value {
        None => Ok(None),
        Some(ParamValue::Int(n)) if *n >= 0 => Ok(Some(n.unsigned_abs())),
        Some(_) => Err(InferError::invalid(format!(
            "parameter '{key}' must be an integer from 0 to 2^63-1"
        ))),
    }
}

fn param_bool(params: Option<&Parameters>, key: &str) -> Result<bool, InferError> {
    match params.and_then(|p| p.get(key)) {
        None => Ok(false),
        Some(ParamValue::Bool(b)) => Ok(*b),
        Some(_) => Err(InferError::invalid(format!(
            "parameter '{key}' must be a boolean"
        ))),
    }
}

/// Marks the strings [`quote_non_finite`] makes: U+FFFF, a noncharacter no client text holds.
const NON_FINITE_MARK: char = '\u{FFFF}';

/// The JSON with Triton's non-standard numbers (`NaN`, `-NaN`, `Infinity`, `-Infinity`, `Inf`,
/// `-Inf`, which rapidjson reads with kParseNanAndInfFlag and Python's `json` writes) turned
/// into marked strings that only float data takes (a client's own string "NaN" stays a string,
/// refused in float data as before); None when it has none (the common case costs one scan, no
/// copy).
fn quote_non_finite(json: &[u8]) -> Option<Vec<u8>> {
    // Each a string of U+FFFF (in UTF-8) and the word.
    const TOKENS: [(&[u8], &[u8]); 6] = [
        (b"NaN", b"\"\xEF\xBF\xBFNaN\""),
        (b"-NaN", b"\"\xEF\xBF\xBFNaN\""),
        (b"Infinity", b"\"\xEF\xBF\xBFInfinity\""),
        (b"-Infinity", b"\"\xEF\xBF\xBF-Infinity\""),
        (b"Inf", b"\"\xEF\xBF\xBFInfinity\""),
        (b"-Inf", b"\"\xEF\xBF\xBF-Infinity\""),
    ];
    let mut out: Option<Vec<u8>> = None;
    let (mut i, mut copied) = (0, 0);
    let mut in_string = false;
    while i < json.len() {
        let b = json[i];
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if b == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        if matches!(b, b'N' | b'I' | b'-') {
            let rest = &json[i..];
            let found = TOKENS.iter().find(|(token, _)| {
                rest.starts_with(token)
                    && !rest
                        .get(token.len())
                        .is_some_and(|next| next.is_ascii_alphanumeric())
            });
            if let Some((token, quoted)) = found {
                let out = out.get_or_insert_with(|| Vec::with_capacity(json.len() + 16));
                out.extend_from_slice(&json[copied..i]);
                out.extend_from_slice(quoted);
                i += token.len();
                copied = i;
                continue;
            }
        }
        i += 1;
    }
    let mut out = out?;
    out.extend_from_slice(&json[copied..]);
    Some(out)
}

/// Decodes a request body. `header_length` is the `Inference-Header-Content-Length` header.
/// Binary tensor data stays in `body`: each binary input is a slice of it, not a copy.
pub fn decode_request(
    body: &Bytes,
    header_length: Option<usize>,
) -> Result<InferRequest, InferError> {
    decode_request_with(body, header_length, &NoSharedMemory)
}

/// [`decode_request`], with inputs in shared memory read through `regions`.
pub fn decode_request_with(
    body: &Bytes,
    header_length: Option<usize>,
    regions: &dyn RegionReader,
) -> Result<InferRequest, InferError> {
    let (json, mut binary) = match header_length {
        Some(n) if n > body.len() => {
            return Err(InferError::invalid(format!(
                "Inference-Header-Content-Length is {n} but the body has only {} bytes",
                body.len()
            )));
        }
        Some(n) => (&body[..n], body.slice(n..)),
        None => (&body[..], Bytes::new()),
    };
    let quoted = quote_non_finite(json);
    let json = quoted.as_deref().unwrap_or(json);
    let parsed: RequestJson = serde_json::from_slice(json)
        .map_err(|e| InferError::invalid(format!("failed to parse the request JSON: {e}")))?;
    let all_binary = param_bool(parsed.parameters.as_ref(), "binary_data_output")?;
    let parameters = parsed.parameters.map(|p| p.0).unwrap_or_default();
    let (priority, timeout) = scheduling_parameters(&parameters)?;
    let mut request = InferRequest {
        id: parsed.id.unwrap_or_default(),
        priority,
        timeout,
        parameters,
        ..Default::default()
    };
    for input in parsed.inputs {
        let datatype = DataType::from_name(&input.datatype).ok_or_else(|| {
            InferError::invalid(format!(
                "input '{}' has unknown datatype '{}'",
                input.name, input.datatype
            ))
        })?;
        // The declared size is checked before any data is looked at, and never allocated from.
        let count = element_count(&input.shape).map_err(|e| {
            InferError::invalid(format!(
                "input '{}' has an invalid shape {:?}: {e}",
                input.name, input.shape
            ))
        })?;
        let in_shared_memory = match &input.parameters {
            Some(p) => shared_memory_parameters(&p.0)?,
            None => None,
        };
        let binary_size = param_u64(input.parameters.as_ref(), "binary_data_size")?;
        let data = match (in_shared_memory, binary_size) {
            (Some(_), Some(_)) => {
                return Err(InferError::invalid(format!(
                    "input '{}' has both shared memory and binary data",
                    input.name
                )));
            }
            (Some(_), None) if input.data.is_some() => {
                return Err(InferError::invalid(format!(
                    "input '{}' has both shared memory and data",
                    input.name
                )));
            }
            (Some(place), None) => {
                let bytes =
                    read_shared_input(regions, &input.name, datatype, &input.shape, &place)?;
                decode_binary(&input.name, datatype, bytes)?
            }
            (None, Some(_)) if input.data.is_some() => {
                return Err(InferError::invalid(format!(
                    "input '{}' has both binary data and data",
                    input.name
                )));
            }
            (None, Some(size)) => {
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                if size > binary.len() {
                    return Err(InferError::invalid(format!(
                        "input '{}' declares binary_data_size {size} but only {} bytes of binary data remain",
                        input.name,
                        binary.len()
                    )));
                }
                let mine = binary.split_to(size);
                decode_binary(&input.name, datatype, mine)?
            }
            (None, None) => {
                let data = input.data.ok_or_else(|| {
                    InferError::invalid(format!(
                        "input '{}' has neither 'data' nor 'binary_data_size'",
                        input.name
                    ))
                })?;
                decode_json_data(&input.name, datatype, data, count)?
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
            class_count: match p {
                Some(p) => class_count_parameter(&p.0)?,
                None => 0,
            },
            shared_memory: match p {
                Some(p) => shared_memory_parameters(&p.0)?,
                None => None,
            },
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
fn decode_binary(name: &str, datatype: DataType, bytes: Bytes) -> Result<TensorData, InferError> {
    if datatype != DataType::Bytes {
        return Ok(TensorData::Raw(bytes));
    }
    decode_bytes_elements(&bytes)
        .map(TensorData::Elements)
        .map_err(|e| InferError::invalid(format!("input '{name}': {e}")))
}

/// Splits the binary layout of a BYTES tensor (each element a 4-byte little-endian length, then
/// that many bytes) into its elements, each a slice of `bytes`.
pub fn decode_bytes_elements(bytes: &Bytes) -> Result<Vec<Bytes>, String> {
    let mut items = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let Some(len) = bytes.get(at..at + 4) else {
            return Err("truncated BYTES element length".into());
        };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let start = at + 4;
        let left = bytes.len() - start;
        if len > left {
            return Err(format!(
                "BYTES element of {len} bytes exceeds the {left} bytes left"
            ));
        }
        items.push(bytes.slice(start..start + len));
        at = start + len;
    }
    Ok(items)
}

/// Encodes BYTES elements in the binary layout that [`decode_bytes_elements`] reads.
pub fn encode_bytes_elements(items: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        items
            .iter()
            .fold(0usize, |n, i| n.saturating_add(i.len() + 4)),
    );
    for item in items {
        // An element over 4 GiB cannot be encoded; the server never builds one (body limits).
        let len = u32::try_from(item.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&item[..len as usize]);
    }
    out
}

/// Where a JSON input's elements go as they are parsed.
struct ElementSink<'n> {
    name: &'n str,
    datatype: DataType,
    /// Elements the shape declares; more than this stops the decoder at once.
    expected: usize,
    seen: usize,
    raw: Vec<u8>,
    elements: Vec<Bytes>,
}

impl ElementSink<'_> {
    fn admit<E: de::Error>(&mut self) -> Result<(), E> {
        self.seen += 1;
        if self.seen > self.expected {
            return Err(E::custom(format!(
                "input '{}': shape holds {} elements but 'data' has more",
                self.name, self.expected
            )));
        }
        Ok(())
    }

    fn bad<E: de::Error>(&self, value: impl fmt::Display) -> E {
        E::custom(format!(
            "input '{}': {value} is not a valid {} value",
            self.name, self.datatype
        ))
    }

    fn push_int<E: de::Error>(&mut self, v: i128) -> Result<(), E> {
        self.admit()?;
        macro_rules! int {
            ($t:ty) => {
                self.raw
                    .extend_from_slice(&<$t>::try_from(v).map_err(|_| self.bad(v))?.to_le_bytes())
            };
        }
        match self.datatype {
            DataType::Uint8 => int!(u8),
            DataType::Uint16 => int!(u16),
            DataType::Uint32 => int!(u32),
            DataType::Uint64 => int!(u64),
            DataType::Int8 => int!(i8),
            DataType::Int16 => int!(i16),
            DataType::Int32 => int!(i32),
            DataType::Int64 => int!(i64),
            // Integers are valid floating-point values (`[1, 2]` for FP32).
            DataType::Fp16 | DataType::Fp32 | DataType::Fp64 => {
                self.seen -= 1;
                return self.push_float(v as f64);
            }
            DataType::Bool | DataType::Bytes => return Err(self.bad(v)),
        }
        Ok(())
    }

    fn push_float<E: de::Error>(&mut self, v: f64) -> Result<(), E> {
        self.admit()?;
        match self.datatype {
            DataType::Fp16 => self
                .raw
                .extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            DataType::Fp32 => self.raw.extend_from_slice(&(v as f32).to_le_bytes()),
            DataType::Fp64 => self.raw.extend_from_slice(&v.to_le_bytes()),
            _ => return Err(self.bad(v)),
        }
        Ok(())
    }

    fn push_bool<E: de::Error>(&mut self, v: bool) -> Result<(), E> {
        self.admit()?;
        match self.datatype {
            DataType::Bool => self.raw.push(u8::from(v)),
            _ => return Err(self.bad(v)),
        }
        Ok(())
    }

    fn push_str<E: de::Error>(&mut self, v: &str) -> Result<(), E> {
        // Triton's NaN and infinities (see `quote_non_finite`), in float data only.
        if let Some(word) = v.strip_prefix(NON_FINITE_MARK) {
            let value = match word {
                "NaN" => f64::NAN,
                "Infinity" => f64::INFINITY,
                _ => f64::NEG_INFINITY,
            };
            return match self.datatype {
                DataType::Fp16 | DataType::Fp32 | DataType::Fp64 => self.push_float(value),
                _ => Err(self.bad(word)),
            };
        }
        self.admit()?;
        match self.datatype {
            DataType::Bytes => self.elements.push(Bytes::copy_from_slice(v.as_bytes())),
            _ => return Err(self.bad(format_args!("\"{}\"", v.escape_default()))),
        }
        Ok(())
    }
}

/// Walks `data` (nested arrays, row-major) and pushes each scalar into the sink. Nesting depth is
/// bounded by serde_json's recursion limit.
struct Elements<'s, 'n>(&'s mut ElementSink<'n>);

impl<'de> DeserializeSeed<'de> for Elements<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Elements<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("tensor data: an array (possibly nested) of scalars")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Elements(&mut *self.0))?.is_some() {}
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.0.push_bool(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.0.push_int(i128::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.0.push_int(i128::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.0.push_float(v)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.push_str(v)
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(self.0.bad("null"))
    }
    fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<(), A::Error> {
        Err(self.0.bad("an object"))
    }
}

fn decode_json_data(
    name: &str,
    datatype: DataType,
    data: &RawValue,
    count: usize,
) -> Result<TensorData, InferError> {
    // Every element takes a few bytes of JSON at least (`1,`, `"",`, `true,`): a declared count
    // the body cannot hold is refused at once, and the buffers are never larger than the body
    // could fill.
    let shortest_element = match datatype {
        DataType::Bool => 5,
        DataType::Bytes => 3,
        _ => 2,
    };
    let most = data.get().len() / shortest_element + 1;
    if count > most {
        // Refused before parsing: this much JSON cannot hold that many elements.
        return Err(InferError::invalid(format!(
            "input '{name}': shape holds {count} elements but 'data' ({} bytes of JSON) cannot hold more than {most}",
            data.get().len()
        )));
    }
    let room = count;
    let mut sink = ElementSink {
        name,
        datatype,
        expected: count,
        seen: 0,
        raw: Vec::with_capacity(room.saturating_mul(datatype.size().unwrap_or(0))),
        elements: Vec::with_capacity(if datatype == DataType::Bytes { room } else { 0 }),
    };
    let mut de = serde_json::Deserializer::from_str(data.get());
    Elements(&mut sink)
        .deserialize(&mut de)
        .map_err(|e| InferError::invalid(strip_position(e)))?;
    if sink.seen != count {
        return Err(InferError::invalid(format!(
            "input '{name}': shape holds {count} elements but 'data' has {}",
            sink.seen
        )));
    }
    Ok(match datatype {
        DataType::Bytes => TensorData::Elements(sink.elements),
        _ => TensorData::Raw(sink.raw.into()),
    })
}

/// A data error's message without serde_json's "at line 1 column N" (positions inside the raw
/// `data` slice, not the body, would mislead).
fn strip_position(e: serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) if e.line() > 0 => text[..i].to_owned(),
        _ => text,
    }
}

/// Serializes a tensor's elements as a flat JSON array without going through `serde_json::Value`
/// (f32 keeps its shortest representation).
struct JsonData<'a>(&'a Tensor);

impl serde::Serialize for JsonData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let tensor = self.0;
        let raw = match &tensor.data {
            TensorData::Raw(b) => &b[..],
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
        TensorData::Raw(b) => b.to_vec(),
        TensorData::Elements(items) => encode_bytes_elements(items),
    }
}

/// Where an output of a response goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// `data` in the JSON.
    Json,
    /// Binary data after the JSON.
    Binary,
    /// Already written to a shared-memory region by the front-end: neither data nor
    /// parameters in the JSON (Triton's C++ client reads any output `parameters` as binary
    /// data).
    SharedMemory,
}

/// A tensor's elements as a JSON value (a flat array), for answers built as `serde_json` values
/// (the generate extension): a NaN or an infinity is `null` there, as `serde_json` has no other
/// way to hold one.
pub fn output_data_value(tensor: &Tensor) -> Result<Value, InferError> {
    serde_json::to_value(JsonData(tensor)).map_err(|e| InferError::invalid(e.to_string()))
}

/// Whether a floating-point tensor holds a NaN or an infinity.
fn has_non_finite(tensor: &Tensor) -> bool {
    let TensorData::Raw(raw) = &tensor.data else {
        return false;
    };
    match tensor.datatype {
        DataType::Fp16 => raw
            .chunks_exact(2)
            .any(|c| !half::f16::from_le_bytes([c[0], c[1]]).is_finite()),
        DataType::Fp32 => raw
            .chunks_exact(4)
            .any(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
        DataType::Fp64 => raw
            .chunks_exact(8)
            .any(|c| !f64::from_le_bytes(c.try_into().unwrap_or([0; 8])).is_finite()),
        _ => false,
    }
}

/// A floating-point tensor's elements as a JSON array, non-finite ones as Triton writes them.
fn write_floats(out: &mut Vec<u8>, tensor: &Tensor) {
    fn one<T: serde::Serialize>(out: &mut Vec<u8>, value: T, as_f64: f64) {
        if as_f64.is_nan() {
            out.extend_from_slice(b"NaN");
        } else if as_f64.is_infinite() {
            out.extend_from_slice(if as_f64 > 0.0 {
                b"Infinity"
            } else {
                b"-Infinity"
            });
        } else {
            // A finite number: serde_json's shortest form, as every other response has it.
            let _ = serde_json::to_writer(&mut *out, &value);
        }
    }
    let TensorData::Raw(raw) = &tensor.data else {
        return;
    };
    out.push(b'[');
    let size = match tensor.datatype {
        DataType::Fp16 => 2,
        DataType::Fp32 => 4,
        _ => 8,
    };
    for (i, c) in raw.chunks_exact(size).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match tensor.datatype {
            DataType::Fp16 => {
                let v = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                one(out, v, f64::from(v));
            }
            DataType::Fp32 => {
                let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                one(out, v, f64::from(v));
            }
            _ => {
                let v = f64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                one(out, v, v);
            }
        }
    }
    out.push(b']');
}

struct OutputEntry<'a> {
    tensor: &'a Tensor,
    placement: Placement,
    binary_size: usize,
}

impl serde::Serialize for OutputEntry<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("name", &self.tensor.name)?;
        map.serialize_entry("datatype", self.tensor.datatype.name())?;
        map.serialize_entry("shape", &self.tensor.shape)?;
        match &self.placement {
            Placement::Binary => map.serialize_entry(
                "parameters",
                &serde_json::json!({ "binary_data_size": self.binary_size }),
            )?,
            Placement::SharedMemory => {}
            Placement::Json => map.serialize_entry("data", &JsonData(self.tensor))?,
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
    encode_response_placed(response, |name| {
        if binary(name) {
            Placement::Binary
        } else {
            Placement::Json
        }
    })
}

/// Encodes a response with each output where `placement` puts it.
pub fn encode_response_placed(
    response: &InferResponse,
    placement: impl Fn(&str) -> Placement,
) -> Result<EncodedResponse, InferError> {
    let mut payloads = Vec::new();
    let entries: Vec<OutputEntry> = response
        .outputs
        .iter()
        .map(|t| {
            let placement = placement(&t.name);
            let mut binary_size = 0;
            if placement == Placement::Binary {
                let payload = binary_payload(t);
                binary_size = payload.len();
                payloads.push(payload);
            }
            OutputEntry {
                tensor: t,
                placement,
                binary_size,
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
    body.extend_from_slice(b"\"outputs\":[");
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        if entry.placement == Placement::Json && has_non_finite(entry.tensor) {
            // serde_json writes NaN and infinities as `null`; Triton writes `NaN`, `Infinity`
            // and `-Infinity` (rapidjson's kWriteNanAndInfFlag), which its clients read back.
            let fields = OutputEntry {
                tensor: entry.tensor,
                placement: Placement::SharedMemory, // name, datatype and shape only
                binary_size: 0,
            };
            serde_json::to_writer(&mut body, &fields)
                .map_err(|e| InferError::invalid(e.to_string()))?;
            body.pop(); // the closing brace
            body.extend_from_slice(b",\"data\":");
            write_floats(&mut body, entry.tensor);
            body.push(b'}');
        } else {
            serde_json::to_writer(&mut body, entry)
                .map_err(|e| InferError::invalid(e.to_string()))?;
        }
    }
    body.extend_from_slice(b"]}");
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
    #[test]
    fn model_versions_are_refused_in_tritons_words() {
        assert_eq!(parse_model_version(""), Ok(None));
        assert_eq!(parse_model_version("3"), Ok(Some(3)));
        let message = |v: &str| parse_model_version(v).err().map(|e| e.message);
        assert_eq!(
            message("wrong_specification").as_deref(),
            Some(
                "failed to get model version from specified version string 'wrong_specification' (details: stol), version should be an integral value > 0"
            )
        );
        assert!(
            message("-1").is_some_and(|m| m.starts_with("invalid model version specified '-1'"))
        );
        assert!(message("0").is_some());
    }

    use super::*;

    fn decode(body: &[u8], header_length: Option<usize>) -> Result<InferRequest, InferError> {
        decode_request(&Bytes::copy_from_slice(body), header_length)
    }

    /// A registry that counts reads and hands back zeros of the size asked.
    struct CountingRegions(std::cell::Cell<usize>);

    impl RegionReader for CountingRegions {
        fn read(&self, place: &SharedMemoryRef) -> Result<Bytes, InferError> {
            self.0.set(self.0.get() + 1);
            Ok(Bytes::from(vec![0u8; place.byte_size]))
        }
    }

    #[test]
    fn a_shared_memory_input_is_read_only_at_the_size_its_shape_takes() {
        let regions = CountingRegions(std::cell::Cell::new(0));
        let body = |size: u64| {
            Bytes::from(format!(
                r#"{{"inputs":[{{"name":"x","shape":[1,4],"datatype":"FP32","parameters":{{"shared_memory_region":"r","shared_memory_byte_size":{size}}}}}]}}"#
            ))
        };
        let Err(refused) = decode_request_with(&body(4 << 30), None, &regions) else {
            panic!("a byte size the shape cannot take is refused");
        };
        assert!(
            refused.message.contains("not the 16 bytes"),
            "{}",
            refused.message
        );
        assert_eq!(
            regions.0.get(),
            0,
            "nothing read for a size the tensor cannot have"
        );
        let r = decode_request_with(&body(16), None, &regions).expect("decodes");
        assert_eq!(r.inputs[0].to_f64_vec(), Some(vec![0.0; 4]));
        assert_eq!(regions.0.get(), 1);
        // Data beside a region: which one is meant? Refused, as over gRPC.
        let both = Bytes::from_static(
            br#"{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[1],"parameters":{"shared_memory_region":"r","shared_memory_byte_size":4}}]}"#,
        );
        let Err(refused) = decode_request_with(&both, None, &regions) else {
            panic!("shared memory and data are refused together");
        };
        assert!(
            refused.message.contains("both shared memory and data"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn nested_json_data_is_flattened() {
        let body =
            br#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"INT32","data":[[1,2],[3,4]]}]}"#;
        let r = decode(body, None).expect("decodes");
        assert_eq!(r.inputs[0].to_f64_vec(), Some(vec![1.0, 2.0, 3.0, 4.0]));
    }

    #[test]
    fn binary_inputs_and_bytes_lengths() {
        let header = br#"{"inputs":[{"name":"s","shape":[2],"datatype":"BYTES","parameters":{"binary_data_size":11}}]}"#;
        let mut body = header.to_vec();
        body.extend_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(b"abc");
        body.extend_from_slice(&0u32.to_le_bytes());
        let r = decode(&body, Some(header.len())).expect("decodes");
        assert_eq!(
            r.inputs[0].data,
            TensorData::Elements(vec![Bytes::from_static(b"abc"), Bytes::new()])
        );
    }

    #[test]
    fn an_input_with_binary_data_and_data_is_refused() {
        let header = br#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1.0],"parameters":{"binary_data_size":4}}]}"#;
        let mut body = header.to_vec();
        body.extend_from_slice(&2.0f32.to_le_bytes());
        let e = decode(&body, Some(header.len())).expect_err("refused");
        assert!(
            e.message.contains("both binary data and data"),
            "{}",
            e.message
        );
    }

    #[test]
    fn truncated_and_mismatched_bodies_are_rejected() {
        assert!(decode(b"{}", Some(10)).is_err());
        let e = decode(
            br#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]}"#,
            None,
        )
        .expect_err("count mismatch");
        assert!(e.message.contains("3 elements"));
        assert!(
            decode(
                br#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[300]}]}"#,
                None
            )
            .is_err()
        );
    }

    #[test]
    fn a_huge_declared_shape_is_refused_without_allocating_from_it() {
        // ~10^12 elements with one element of data: the decoder used to reserve 8 TB for it and
        // abort the process.
        let e = decode(
            br#"{"inputs":[{"name":"x","shape":[1000000,1000000],"datatype":"FP64","data":[1]}]}"#,
            None,
        )
        .expect_err("refused");
        assert!(
            e.message.contains("1000000000000 elements"),
            "{}",
            e.message
        );
        // Near 2^62 and i64::MAX: this used to panic with "capacity overflow".
        for shape in [
            "[4611686018427387904]",
            "[9223372036854775807]",
            "[4294967296,4294967296]",
        ] {
            let body = format!(
                r#"{{"inputs":[{{"name":"x","shape":{shape},"datatype":"FP32","data":[1]}}]}}"#
            );
            let e = decode(body.as_bytes(), None).expect_err("refused");
            assert_eq!(
                e.kind,
                crate::infer::ErrorKind::InvalidArgument,
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn a_binary_shape_whose_byte_size_wraps_is_refused() {
        // [2^62] FP32 "needs" 2^64 = 0 bytes with wrapping arithmetic: an empty payload passed.
        let header = br#"{"inputs":[{"name":"x","shape":[4611686018427387904],"datatype":"FP32","parameters":{"binary_data_size":0}}]}"#;
        let e = decode(header, Some(header.len())).expect_err("refused");
        assert!(e.message.contains("overflows"), "{}", e.message);
    }

    #[test]
    fn binary_inputs_are_slices_of_the_body_not_copies() {
        let header = br#"{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}},{"name":"s","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":7}}]}"#;
        let mut body = header.to_vec();
        body.extend_from_slice(&1.5f32.to_le_bytes());
        body.extend_from_slice(&2.5f32.to_le_bytes());
        body.extend_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(b"abc");
        let body = Bytes::from(body);
        let r = decode_request(&body, Some(header.len())).expect("decodes");
        let inside = |b: &Bytes| body.as_ptr_range().contains(&b.as_ptr());
        let TensorData::Raw(x) = &r.inputs[0].data else {
            panic!("raw")
        };
        assert!(inside(x), "the FP32 payload points into the body");
        let TensorData::Elements(s) = &r.inputs[1].data else {
            panic!("elements")
        };
        assert_eq!(&s[0][..], b"abc");
        assert!(inside(&s[0]), "the BYTES element points into the body");
    }

    #[test]
    fn too_many_elements_stop_the_decoder() {
        let e = decode(
            br#"{"inputs":[{"name":"x","shape":[2],"datatype":"INT32","data":[1,2,3,4,5]}]}"#,
            None,
        )
        .expect_err("refused");
        assert!(e.message.contains("has more"), "{}", e.message);
        assert!(!e.message.contains("line 1"), "{}", e.message);
    }

    #[test]
    fn every_datatype_decodes_from_json() {
        let cases = [
            ("BOOL", "[true,false]", vec![1u8, 0]),
            ("UINT8", "[1,255]", vec![1, 255]),
            ("INT8", "[-1,2]", vec![255, 2]),
            ("UINT16", "[513,0]", vec![1, 2, 0, 0]),
            (
                "INT32",
                "[[-2],[3]]",
                [(-2i32).to_le_bytes(), 3i32.to_le_bytes()].concat(),
            ),
            (
                "FP32",
                "[1,2.5]",
                [1f32.to_le_bytes(), 2.5f32.to_le_bytes()].concat(),
            ),
            (
                "FP64",
                "[0.5,-1]",
                [0.5f64.to_le_bytes(), (-1f64).to_le_bytes()].concat(),
            ),
            (
                "FP16",
                "[1,0.5]",
                [
                    half::f16::from_f32(1.0).to_le_bytes(),
                    half::f16::from_f32(0.5).to_le_bytes(),
                ]
                .concat(),
            ),
            (
                "UINT64",
                "[18446744073709551615,0]",
                [u64::MAX.to_le_bytes(), [0; 8]].concat(),
            ),
        ];
        for (datatype, data, want) in cases {
            let body = format!(
                r#"{{"inputs":[{{"name":"x","shape":[2],"datatype":"{datatype}","data":{data}}}]}}"#
            );
            let r = decode(body.as_bytes(), None)
                .unwrap_or_else(|e| panic!("{datatype}: {}", e.message));
            assert_eq!(r.inputs[0].data, TensorData::Raw(want.into()), "{datatype}");
        }
        let r = decode(
            r#"{"inputs":[{"name":"s","shape":[2],"datatype":"BYTES","data":["a\u00e9","한"]}]}"#
                .as_bytes(),
            None,
        )
        .expect("decodes");
        assert_eq!(
            r.inputs[0].data,
            TensorData::Elements(vec![Bytes::from("aé"), Bytes::from("한")])
        );
        for (datatype, data) in [
            ("BOOL", "[1]"),
            ("INT32", "[1.5]"),
            ("FP32", "[\"1\"]"),
            ("BYTES", "[1]"),
            ("INT8", "[null]"),
            ("INT8", "[{}]"),
        ] {
            let body = format!(
                r#"{{"inputs":[{{"name":"x","shape":[1],"datatype":"{datatype}","data":{data}}}]}}"#
            );
            let e = decode(body.as_bytes(), None).expect_err(datatype);
            assert!(
                e.message.contains("not a valid"),
                "{datatype}: {}",
                e.message
            );
        }
    }

    #[test]
    fn parameters_must_be_scalars() {
        let r = decode(
            br#"{"parameters":{"a":true,"b":-3,"c":1.5,"d":"s","priority":2},"inputs":[]}"#,
            None,
        )
        .expect("decodes");
        assert_eq!(r.parameters["b"], ParamValue::Int(-3));
        assert_eq!(r.parameters["c"], ParamValue::Double(1.5));
        assert_eq!(r.priority, 2);
        for bad in [
            r#"{"parameters":{"a":[1]},"inputs":[]}"#,
            r#"{"parameters":{"a":{"b":1}},"inputs":[]}"#,
        ] {
            let e = decode(bad.as_bytes(), None).expect_err("refused");
            assert!(e.message.contains("parameter value"), "{}", e.message);
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let mut data = "[".repeat(100_000);
        data.push_str(&"]".repeat(100_000));
        let body =
            format!(r#"{{"inputs":[{{"name":"x","shape":[1],"datatype":"FP32","data":{data}}}]}}"#);
        assert!(decode(body.as_bytes(), None).is_err());
    }

    #[test]
    fn bytes_elements_round_trip() {
        let items = vec![
            Bytes::from_static(b"abc"),
            Bytes::new(),
            Bytes::from(vec![0xff; 300]),
        ];
        let encoded = Bytes::from(encode_bytes_elements(&items));
        assert_eq!(decode_bytes_elements(&encoded), Ok(items));
        assert!(decode_bytes_elements(&Bytes::from_static(&[1, 0, 0])).is_err());
        assert!(decode_bytes_elements(&Bytes::from_static(&[5, 0, 0, 0, b'a'])).is_err());
    }

    #[test]
    fn non_finite_inputs_are_read_as_triton_reads_them() {
        let body = br#"{"inputs":[{"name":"x","shape":[7],"datatype":"FP32","data":[NaN, Infinity,-Infinity,Inf,-Inf,1.5,-NaN]},
            {"name":"s","shape":[2],"datatype":"BYTES","data":["NaN Infinity \" NaN","Inf"]}]}"#;
        let request = decode(body, None).expect("decodes");
        let TensorData::Raw(raw) = &request.inputs[0].data else {
            panic!("raw")
        };
        let values: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert!(values[0].is_nan());
        assert_eq!(
            values[1..6],
            [
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::INFINITY,
                f32::NEG_INFINITY,
                1.5
            ]
        );
        assert!(values[6].is_nan());
        // Inside strings nothing changes.
        let TensorData::Elements(items) = &request.inputs[1].data else {
            panic!("elements")
        };
        assert_eq!(&items[0][..], b"NaN Infinity \" NaN");
        assert_eq!(&items[1][..], b"Inf");
        // In integer or BYTES data, as a client's string, and as a bare word elsewhere, it is
        // still an error.
        for refused in [
            &br#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT32","data":[NaN]}]}"#[..],
            br#"{"inputs":[{"name":"x","shape":[1],"datatype":"BYTES","data":[NaN]}]}"#,
            br#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":["NaN"]}]}"#,
        ] {
            assert!(decode(refused, None).is_err());
        }
        assert!(
            decode(
                br#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[Nope]}]}"#,
                None
            )
            .is_err()
        );
    }

    #[test]
    fn non_finite_outputs_are_written_as_triton_writes_them() {
        let values = [1.5f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        let response = InferResponse {
            outputs: vec![
                Tensor::from_f32("y", vec![4], &values),
                Tensor::from_f32("z", vec![1], &[0.25]),
            ],
            ..Default::default()
        };
        let encoded = encode_response(&response, |_| false).expect("encodes");
        let text = String::from_utf8(encoded.body).expect("utf-8");
        assert!(
            text.contains(r#""data":[1.5,NaN,Infinity,-Infinity]}"#),
            "{text}"
        );
        assert!(text.contains(r#""data":[0.25]}"#), "{text}");
        // Everything else is JSON as before.
        let standard = text
            .replace("-Infinity", "0")
            .replace("Infinity", "0")
            .replace("NaN", "0");
        let json: Value = serde_json::from_str(&standard).expect("JSON around the tokens");
        assert_eq!(json["outputs"][0]["shape"], serde_json::json!([4]));
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
