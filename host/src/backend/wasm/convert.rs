//! Conversions between the server's request path types and the WIT types of `wit/tessera.wit`.

use std::collections::BTreeMap;

use super::tessera::inference::types as wit;
use crate::infer::{
    ErrorKind, InferError, InferRequest, InferResponse, InferResult, ParamValue, RequestedOutput,
};
use crate::signature::{ModelMetadata, TensorSpec};
use crate::tensor::{Bytes, DataType, Tensor, TensorData};

fn datatype_to_wit(d: DataType) -> wit::Datatype {
    match d {
        DataType::Bool => wit::Datatype::Bool,
        DataType::Uint8 => wit::Datatype::Uint8,
        DataType::Uint16 => wit::Datatype::Uint16,
        DataType::Uint32 => wit::Datatype::Uint32,
        DataType::Uint64 => wit::Datatype::Uint64,
        DataType::Int8 => wit::Datatype::Int8,
        DataType::Int16 => wit::Datatype::Int16,
        DataType::Int32 => wit::Datatype::Int32,
        DataType::Int64 => wit::Datatype::Int64,
        DataType::Fp16 => wit::Datatype::Fp16,
        DataType::Fp32 => wit::Datatype::Fp32,
        DataType::Fp64 => wit::Datatype::Fp64,
        DataType::Bytes => wit::Datatype::Bytes,
    }
}

fn datatype_from_wit(d: wit::Datatype) -> DataType {
    match d {
        wit::Datatype::Bool => DataType::Bool,
        wit::Datatype::Uint8 => DataType::Uint8,
        wit::Datatype::Uint16 => DataType::Uint16,
        wit::Datatype::Uint32 => DataType::Uint32,
        wit::Datatype::Uint64 => DataType::Uint64,
        wit::Datatype::Int8 => DataType::Int8,
        wit::Datatype::Int16 => DataType::Int16,
        wit::Datatype::Int32 => DataType::Int32,
        wit::Datatype::Int64 => DataType::Int64,
        wit::Datatype::Fp16 => DataType::Fp16,
        wit::Datatype::Fp32 => DataType::Fp32,
        wit::Datatype::Fp64 => DataType::Fp64,
        wit::Datatype::Bytes => DataType::Bytes,
    }
}

/// A tensor for a guest. Owned, so a payload nobody else holds moves into the WIT value without
/// a copy (`Vec::from(Bytes)` reuses a uniquely owned buffer).
fn tensor_to_wit(t: Tensor) -> wit::Tensor {
    wit::Tensor {
        name: t.name,
        datatype: datatype_to_wit(t.datatype),
        shape: t.shape,
        data: match t.data {
            TensorData::Raw(b) => wit::TensorData::Raw(b.into()),
            TensorData::Elements(e) => {
                wit::TensorData::Elements(e.into_iter().map(Vec::from).collect())
            }
        },
    }
}

/// A tensor from a guest, checked: the guest is not trusted to be consistent.
fn tensor_from_wit(t: wit::Tensor) -> Result<Tensor, String> {
    let tensor = Tensor::new(
        t.name,
        datatype_from_wit(t.datatype),
        t.shape,
        match t.data {
            wit::TensorData::Raw(b) => TensorData::Raw(b.into()),
            wit::TensorData::Elements(e) => {
                TensorData::Elements(e.into_iter().map(Bytes::from).collect())
            }
        },
    );
    tensor.check_consistent()?;
    Ok(tensor)
}

fn params_to_wit(params: &BTreeMap<String, ParamValue>) -> Vec<wit::Parameter> {
    params
        .iter()
        .map(|(k, v)| wit::Parameter {
            key: k.clone(),
            value: match v {
                ParamValue::Bool(b) => wit::ParameterValue::Bool(*b),
                ParamValue::Int(i) => wit::ParameterValue::Int(*i),
                ParamValue::Double(d) => wit::ParameterValue::Double(*d),
                ParamValue::String(s) => wit::ParameterValue::String(s.clone()),
            },
        })
        .collect()
}

fn params_from_wit(params: Vec<wit::Parameter>) -> BTreeMap<String, ParamValue> {
    params
        .into_iter()
        .map(|p| {
            let v = match p.value {
                wit::ParameterValue::Bool(b) => ParamValue::Bool(b),
                wit::ParameterValue::Int(i) => ParamValue::Int(i),
                wit::ParameterValue::Double(d) => ParamValue::Double(d),
                wit::ParameterValue::String(s) => ParamValue::String(s),
            };
            (p.key, v)
        })
        .collect()
}

/// A request as the handler's `execute` receives it; the batch is the instance's to consume.
pub fn request_to_wit(r: InferRequest) -> wit::Request {
    wit::Request {
        parameters: params_to_wit(&r.parameters),
        id: r.id,
        inputs: r.inputs.into_iter().map(tensor_to_wit).collect(),
        requested_outputs: r.outputs.into_iter().map(|o| o.name).collect(),
    }
}

/// A request a handler sends through `infer`.
pub fn request_from_wit(r: wit::Request) -> Result<InferRequest, InferError> {
    let inputs = r
        .inputs
        .into_iter()
        .map(tensor_from_wit)
        .collect::<Result<Vec<_>, _>>()
        .map_err(InferError::invalid)?;
    let parameters = params_from_wit(r.parameters);
    let priority = match parameters.get("priority") {
        Some(ParamValue::Int(p)) => u32::try_from(*p).unwrap_or(0),
        _ => 0,
    };
    Ok(InferRequest {
        id: r.id,
        inputs,
        outputs: r
            .requested_outputs
            .into_iter()
            .map(|name| RequestedOutput {
                name,
                ..Default::default()
            })
            .collect(),
        parameters,
        priority,
        ..Default::default()
    })
}

/// What a guest's response costs against `max_output_bytes`: tensor payloads with 4 bytes per
/// BYTES element, names and shapes, and every parameter. Saturates instead of wrapping.
fn response_wire_size(r: &wit::Response) -> usize {
    let tensors = r.outputs.iter().fold(0usize, |acc, t| {
        let payload = match &t.data {
            wit::TensorData::Raw(b) => b.len(),
            wit::TensorData::Elements(items) => items.iter().fold(0usize, |n, item| {
                n.saturating_add(item.len())
                    .saturating_add(crate::tensor::BYTES_ELEMENT_OVERHEAD)
            }),
        };
        acc.saturating_add(payload)
            .saturating_add(t.name.len())
            .saturating_add(t.shape.len().saturating_mul(8))
    });
    let parameters = r.parameters.iter().fold(0usize, |acc, p| {
        let value = match &p.value {
            wit::ParameterValue::String(s) => s.len(),
            _ => 8,
        };
        acc.saturating_add(p.key.len()).saturating_add(value)
    });
    tensors.saturating_add(parameters)
}

/// A deterministic failure (the same response would fail again), so 500 rather than a 429 that
/// invites retries.
fn over_output_limit(what: &str, size: usize, max_output_bytes: usize) -> InferError {
    InferError::new(
        ErrorKind::Internal,
        format!(
            "the handler's {what} holds {size} bytes, over the max_output_bytes limit of {max_output_bytes}"
        ),
    )
}

/// A response a handler returned from `execute`, checked against the output size cap before
/// anything else, then for consistency.
pub fn response_from_wit(r: wit::Response, max_output_bytes: usize) -> InferResult {
    let size = response_wire_size(&r);
    if size > max_output_bytes {
        return Err(over_output_limit("response", size, max_output_bytes));
    }
    let outputs = r
        .outputs
        .into_iter()
        .map(tensor_from_wit)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            InferError::internal(format!("the handler returned an inconsistent tensor: {e}"))
        })?;
    let mut names = std::collections::HashSet::new();
    if let Some(twice) = outputs.iter().find(|t| !names.insert(t.name.as_str())) {
        return Err(InferError::internal(format!(
            "the handler returned output '{}' twice",
            tessera_core::infer::bounded(&twice.name, 256)
        )));
    }
    Ok(InferResponse {
        outputs,
        parameters: params_from_wit(r.parameters),
        ..Default::default()
    })
}

/// A response handed back to a handler's `infer` call.
pub fn response_to_wit(r: InferResponse) -> wit::Response {
    wit::Response {
        parameters: params_to_wit(&r.parameters),
        outputs: r.outputs.into_iter().map(tensor_to_wit).collect(),
    }
}

/// An error a handler returned; its message counts against `max_output_bytes` like a response.
pub fn error_from_wit(e: wit::Error, max_output_bytes: usize) -> InferError {
    if e.message.len() > max_output_bytes {
        return over_output_limit("error message", e.message.len(), max_output_bytes);
    }
    let kind = match e.kind {
        wit::ErrorKind::ModelNotFound => ErrorKind::NotFound,
        wit::ErrorKind::ModelNotReady => ErrorKind::Unavailable,
        wit::ErrorKind::InvalidInput => ErrorKind::InvalidArgument,
        wit::ErrorKind::QuotaExceeded => ErrorKind::ResourceExhausted,
        wit::ErrorKind::Timeout => ErrorKind::Timeout,
        wit::ErrorKind::Internal => ErrorKind::Internal,
    };
    InferError::new(kind, e.message)
}

pub fn error_to_wit(e: InferError) -> wit::Error {
    let kind = match e.kind {
        ErrorKind::NotFound => wit::ErrorKind::ModelNotFound,
        ErrorKind::Unavailable => wit::ErrorKind::ModelNotReady,
        // A unary call on a decoupled model: the call, not the data, is wrong.
        ErrorKind::InvalidArgument | ErrorKind::Unsupported => wit::ErrorKind::InvalidInput,
        ErrorKind::ResourceExhausted => wit::ErrorKind::QuotaExceeded,
        ErrorKind::Timeout => wit::ErrorKind::Timeout,
        ErrorKind::Internal => wit::ErrorKind::Internal,
    };
    wit::Error {
        kind,
        message: e.message,
    }
}

/// Model metadata for a handler's `model-metadata` call.
pub fn metadata_to_wit(m: &ModelMetadata) -> wit::ModelMetadata {
    let spec = |s: &TensorSpec| wit::TensorMetadata {
        name: s.name.clone(),
        datatype: datatype_to_wit(s.datatype),
        shape: s.client_shape(m.batched),
    };
    wit::ModelMetadata {
        name: m.name.clone(),
        versions: m.versions.iter().map(i64::to_string).collect(),
        platform: m.platform.clone(),
        inputs: m.inputs.iter().map(spec).collect(),
        outputs: m.outputs.iter().map(spec).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(name: &str) -> wit::Tensor {
        wit::Tensor {
            name: name.into(),
            datatype: wit::Datatype::Fp32,
            shape: vec![1],
            data: wit::TensorData::Raw(vec![0; 4]),
        }
    }

    #[test]
    fn a_response_naming_an_output_twice_is_an_error() {
        let twice = wit::Response {
            outputs: vec![output("F"), output("F")],
            parameters: Vec::new(),
        };
        let e = response_from_wit(twice, 1 << 20).expect_err("refused");
        assert!(e.message.contains("output 'F' twice"), "{}", e.message);
        let once = wit::Response {
            outputs: vec![output("F"), output("G")],
            parameters: Vec::new(),
        };
        assert_eq!(
            response_from_wit(once, 1 << 20)
                .expect("fine")
                .outputs
                .len(),
            2
        );
    }
}
