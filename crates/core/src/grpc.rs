//! The messages of Triton's gRPC service (`GRPCInferenceService`, `proto/grpc_service.proto`)
//! and the codec between them and the request path's vocabulary: a `ModelInferRequest` becomes
//! an [`InferRequest`], an [`InferResponse`] a `ModelInferResponse`. It lives here, below the
//! server, so the decoder of these untrusted messages is fuzzed (`fuzz/`) like the JSON one.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

use crate::infer::{InferError, InferRequest, InferResponse, ParamValue, RequestedOutput};
use crate::kserve::{
    RegionReader, class_count_parameter, decode_bytes_elements, encode_bytes_elements,
    read_shared_input, scheduling_parameters, shared_memory_parameters,
};
use crate::tensor::{DataType, Tensor, TensorData};

/// The generated messages (package `inference`, with the `ModelConfig` types).
pub use crate::config::pb;
use pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use pb::model_infer_response::InferOutputTensor;

fn parameter(name: &str, value: pb::InferParameter) -> Result<ParamValue, InferError> {
    use pb::infer_parameter::ParameterChoice;
    match value.parameter_choice {
        Some(ParameterChoice::BoolParam(b)) => Ok(ParamValue::Bool(b)),
        Some(ParameterChoice::Int64Param(n)) => Ok(ParamValue::Int(n)),
        // Kept bit for bit: a correlation id is a uint64 in Triton (one past 2^63 reads back as
        // itself); a count or a time past 2^63 reads as negative and is refused by its reader.
        Some(ParameterChoice::Uint64Param(n)) => {
            Ok(ParamValue::Int(i64::from_ne_bytes(n.to_ne_bytes())))
        }
        Some(ParameterChoice::DoubleParam(d)) => Ok(ParamValue::Double(d)),
        Some(ParameterChoice::StringParam(s)) => Ok(ParamValue::String(s)),
        None => Err(InferError::invalid(format!(
            "parameter '{name}' has no value"
        ))),
    }
}

pub fn parameters(
    map: HashMap<String, pb::InferParameter>,
) -> Result<BTreeMap<String, ParamValue>, InferError> {
    map.into_iter()
        .map(|(k, v)| parameter(&k, v).map(|v| (k, v)))
        .collect()
}

pub fn to_pb_parameter(value: &ParamValue) -> pb::InferParameter {
    use pb::infer_parameter::ParameterChoice;
    pb::InferParameter {
        parameter_choice: Some(match value {
            ParamValue::Bool(b) => ParameterChoice::BoolParam(*b),
            ParamValue::Int(n) => ParameterChoice::Int64Param(*n),
            ParamValue::Double(d) => ParameterChoice::DoubleParam(*d),
            ParamValue::String(s) => ParameterChoice::StringParam(s.clone()),
        }),
    }
}

/// A `ModelInferRequest` as the request path's [`InferRequest`]. Raw contents stay the slices
/// of the message tonic decoded; inputs in shared memory are read through `regions`.
///
/// `raw_input_contents` holds, in order, the data of the inputs that are neither in shared
/// memory nor typed (as tritonclient fills it): every such input takes the next entry, and no
/// entry may be left over.
pub fn decode_request(
    message: pb::ModelInferRequest,
    regions: &dyn RegionReader,
) -> Result<InferRequest, InferError> {
    let parameters = parameters(message.parameters)?;
    let (priority, timeout) = scheduling_parameters(&parameters)?;
    let raw_count = message.raw_input_contents.len();
    let mut raw = message.raw_input_contents.into_iter();
    let mut inputs = Vec::with_capacity(message.inputs.len());
    for input in message.inputs {
        inputs.push(decode_input(input, &mut raw, regions)?);
    }
    if raw.next().is_some() {
        return Err(InferError::invalid(format!(
            "raw_input_contents has {raw_count} entries, more than the inputs that take raw data"
        )));
    }
    let outputs = message
        .outputs
        .into_iter()
        .map(decode_output)
        .collect::<Result<_, _>>()?;
    Ok(InferRequest {
        id: message.id,
        inputs,
        outputs,
        parameters,
        priority,
        timeout,
    })
}

fn decode_output(output: InferRequestedOutputTensor) -> Result<RequestedOutput, InferError> {
    let params = parameters(output.parameters)?;
    Ok(RequestedOutput {
        class_count: class_count_parameter(&params)?,
        shared_memory: shared_memory_parameters(&params)?,
        name: output.name,
        binary: false,
    })
}

fn decode_input(
    input: InferInputTensor,
    raw: &mut impl Iterator<Item = Bytes>,
    regions: &dyn RegionReader,
) -> Result<Tensor, InferError> {
    let InferInputTensor {
        name,
        datatype,
        shape,
        contents,
        parameters: params,
    } = input;
    let datatype = DataType::from_name(&datatype).ok_or_else(|| {
        InferError::invalid(format!("input '{name}' has unknown datatype '{datatype}'"))
    })?;
    let in_shared_memory = shared_memory_parameters(&parameters(params)?)?;
    let typed = contents.filter(|c| *c != pb::InferTensorContents::default());
    let raw_bytes = |bytes: Bytes| {
        if datatype == DataType::Bytes {
            decode_bytes_elements(&bytes)
                .map(TensorData::Elements)
                .map_err(|e| InferError::invalid(format!("input '{name}': {e}")))
        } else {
            Ok(TensorData::Raw(bytes))
        }
    };
    let data = match (in_shared_memory, typed) {
        (Some(_), Some(_)) => {
            return Err(InferError::invalid(format!(
                "input '{name}' has both shared memory and typed contents"
            )));
        }
        (Some(place), None) => {
            raw_bytes(read_shared_input(regions, &name, datatype, &shape, &place)?)?
        }
        (None, Some(contents)) => typed_contents(&name, datatype, contents)?,
        (None, None) => match raw.next() {
            Some(bytes) => raw_bytes(bytes)?,
            None => {
                return Err(InferError::invalid(format!(
                    "input '{name}' has no data (contents, raw_input_contents or shared memory)"
                )));
            }
        },
    };
    let tensor = Tensor::new(name, datatype, shape, data);
    tensor.check_consistent().map_err(InferError::invalid)?;
    Ok(tensor)
}

/// Typed contents as little-endian elements; a narrower datatype's values must fit it.
fn typed_contents(
    name: &str,
    datatype: DataType,
    c: pb::InferTensorContents,
) -> Result<TensorData, InferError> {
    fn narrow<T, U: TryFrom<T>, const N: usize>(
        name: &str,
        values: Vec<T>,
        le: impl Fn(U) -> [u8; N],
    ) -> Result<TensorData, InferError> {
        let mut out = Vec::with_capacity(values.len() * N);
        for v in values {
            let v = U::try_from(v).map_err(|_| {
                InferError::invalid(format!(
                    "input '{name}' has a value out of range for its datatype"
                ))
            })?;
            out.extend_from_slice(&le(v));
        }
        Ok(TensorData::Raw(Bytes::from(out)))
    }
    match datatype {
        DataType::Bool => Ok(TensorData::Raw(
            c.bool_contents.iter().map(|&b| u8::from(b)).collect(),
        )),
        DataType::Int8 => narrow(name, c.int_contents, i8::to_le_bytes),
        DataType::Int16 => narrow(name, c.int_contents, i16::to_le_bytes),
        DataType::Int32 => narrow(name, c.int_contents, i32::to_le_bytes),
        DataType::Int64 => narrow(name, c.int64_contents, i64::to_le_bytes),
        DataType::Uint8 => narrow(name, c.uint_contents, u8::to_le_bytes),
        DataType::Uint16 => narrow(name, c.uint_contents, u16::to_le_bytes),
        DataType::Uint32 => narrow(name, c.uint_contents, u32::to_le_bytes),
        DataType::Uint64 => narrow(name, c.uint64_contents, u64::to_le_bytes),
        DataType::Fp32 => narrow(name, c.fp32_contents, f32::to_le_bytes),
        DataType::Fp64 => narrow(name, c.fp64_contents, f64::to_le_bytes),
        DataType::Bytes => Ok(TensorData::Elements(c.bytes_contents)),
        // As in Triton: FP16 has no typed field.
        DataType::Fp16 => Err(InferError::invalid(format!(
            "input '{name}' is FP16: send its data in raw_input_contents"
        ))),
    }
}

/// A response as `ModelInferResponse`, every output in `raw_output_contents` (as Triton answers
/// and tritonclient's `as_numpy` reads), but those `placed` in shared memory (name, region,
/// bytes written): these are named with their region and keep an empty raw entry, so the
/// entries stay aligned with `outputs`.
pub fn encode_response(
    response: InferResponse,
    placed: &[(String, String, usize)],
) -> Result<pb::ModelInferResponse, InferError> {
    use pb::infer_parameter::ParameterChoice;
    let param = |choice| pb::InferParameter {
        parameter_choice: Some(choice),
    };
    let mut outputs = Vec::with_capacity(response.outputs.len());
    let mut raw = Vec::with_capacity(response.outputs.len());
    for t in response.outputs {
        let mut parameters = HashMap::new();
        match placed.iter().find(|(name, _, _)| *name == t.name) {
            Some((_, region, size)) => {
                parameters.insert(
                    "shared_memory_region".to_owned(),
                    param(ParameterChoice::StringParam(region.clone())),
                );
                parameters.insert(
                    "shared_memory_byte_size".to_owned(),
                    param(ParameterChoice::Int64Param(
                        i64::try_from(*size).unwrap_or(i64::MAX),
                    )),
                );
                raw.push(Bytes::new());
            }
            None => raw.push(match t.data {
                TensorData::Raw(bytes) => bytes,
                TensorData::Elements(items) => Bytes::from(encode_bytes_elements(&items)),
            }),
        }
        outputs.push(InferOutputTensor {
            name: t.name,
            datatype: t.datatype.name().into(),
            shape: t.shape,
            parameters,
            contents: None,
        });
    }
    Ok(pb::ModelInferResponse {
        model_name: response.model_name,
        model_version: response.model_version,
        id: response.id,
        parameters: response
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), to_pb_parameter(v)))
            .collect(),
        outputs,
        raw_output_contents: raw,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::ErrorKind;
    use crate::kserve::NoSharedMemory;

    fn input(name: &str, datatype: &str, shape: Vec<i64>) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape,
            parameters: HashMap::new(),
            contents: None,
        }
    }

    #[test]
    fn typed_and_raw_contents_become_the_same_tensor() -> Result<(), InferError> {
        let mut typed = input("X", "INT16", vec![1, 2]);
        typed.contents = Some(pb::InferTensorContents {
            int_contents: vec![-2, 300],
            ..Default::default()
        });
        let raw: Vec<u8> = [-2i16, 300].iter().flat_map(|v| v.to_le_bytes()).collect();
        let none = NoSharedMemory;
        let a = decode_input(typed, &mut std::iter::empty(), &none)?;
        let b = decode_input(
            input("X", "INT16", vec![1, 2]),
            &mut std::iter::once(Bytes::from(raw)),
            &none,
        )?;
        assert_eq!(a, b);
        Ok(())
    }

    #[test]
    fn bad_inputs_are_invalid_arguments() {
        let mut out_of_range = input("X", "INT8", vec![1]);
        out_of_range.contents = Some(pb::InferTensorContents {
            int_contents: vec![1000],
            ..Default::default()
        });
        let short = input("X", "FP32", vec![1, 4]);
        let raw = |b: &'static [u8]| std::iter::once(Bytes::from_static(b));
        let none = NoSharedMemory;
        let cases = [
            decode_input(out_of_range, &mut std::iter::empty(), &none),
            decode_input(short, &mut raw(&[0; 8]), &none),
            decode_input(input("X", "FP17", vec![1]), &mut raw(&[]), &none),
            decode_input(input("X", "FP32", vec![1]), &mut std::iter::empty(), &none),
        ];
        for case in cases {
            assert_eq!(case.err().map(|e| e.kind), Some(ErrorKind::InvalidArgument));
        }
        let request = |raw: usize| pb::ModelInferRequest {
            inputs: vec![input("A", "FP32", vec![1]), input("B", "FP32", vec![1])],
            raw_input_contents: vec![Bytes::from_static(&[0; 4]); raw],
            ..Default::default()
        };
        assert!(decode_request(request(2), &none).is_ok());
        assert!(
            decode_request(request(1), &none).is_err(),
            "an input without data"
        );
        assert!(
            decode_request(request(3), &none).is_err(),
            "an entry left over"
        );
    }

    #[test]
    fn outputs_go_back_raw_with_bytes_length_prefixed() -> Result<(), InferError> {
        let response = InferResponse {
            outputs: vec![Tensor::new(
                "S",
                DataType::Bytes,
                vec![2],
                TensorData::Elements(vec![Bytes::from_static(b"ab"), Bytes::new()]),
            )],
            ..Default::default()
        };
        let encoded = encode_response(response, &[])?;
        assert_eq!(
            encoded.raw_output_contents[0].as_ref(),
            &[2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]
        );
        assert_eq!(encoded.outputs[0].datatype, "BYTES");
        Ok(())
    }
}
