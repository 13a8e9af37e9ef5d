//! The gRPC services' codec: prost's, with the entries of an inference request counted on the
//! wire before any is decoded.
//!
//! A protobuf entry costs 2 bytes on the wire and a whole struct once decoded: a 16 MiB
//! `ModelInferRequest` of empty `inputs` entries decoded into 2.5 GB (about 155× its size), and
//! a 16 KiB gzip body decompresses into one. So the decoder first walks the message's fields
//! (no allocation) and refuses, with `INVALID_ARGUMENT`, a request with more entries than any
//! model could use. Other messages decode as prost decodes them.

use std::marker::PhantomData;

use bytes::Buf;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

use tessera_core::config::pb;

/// Inputs, requested outputs, raw input buffers or request parameters one request may carry.
pub const MAX_ENTRIES: usize = 4096;
/// Parameters one input or output may carry.
pub const MAX_TENSOR_PARAMETERS: usize = 256;
/// `bytes_contents` elements one request may carry in all (each decodes to a 32-byte handle;
/// large BYTES tensors go in `raw_input_contents`, as Triton's clients send them).
pub const MAX_TYPED_BYTES_ELEMENTS: usize = 1 << 20;

/// What a request message's fields may hold, checked on its wire bytes before it is decoded.
pub trait WireBounds {
    /// Why `wire` holds more than the server takes; `None` when it is within bounds (or is not
    /// this message at all: prost then says what is wrong with it).
    fn excess(_wire: &[u8]) -> Option<String> {
        None
    }
}

/// prost's codec, decoding through [`BoundedDecoder`].
#[derive(Debug, Clone)]
pub struct BoundedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for BoundedCodec<T, U> {
    fn default() -> Self {
        BoundedCodec(PhantomData)
    }
}

impl<T, U> Codec for BoundedCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + WireBounds + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = BoundedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder(PhantomData)
    }
}

/// Checks a message's [`WireBounds`], then decodes it with prost.
#[derive(Debug, Clone)]
pub struct BoundedDecoder<U>(PhantomData<U>);

impl<U: prost::Message + Default + WireBounds> Decoder for BoundedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // The whole message is one contiguous buffer here (tonic has read it to its end).
        let wire = buf.chunk();
        if wire.len() == buf.remaining()
            && let Some(excess) = U::excess(wire)
        {
            // Consumed, refused: tonic reads the stream's next message after these bytes.
            buf.advance(buf.remaining());
            return Err(Status::invalid_argument(excess));
        }
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// The fields of one message on the wire: (field number, the bytes of a length-delimited
/// field). Stops at the first malformed field (prost reports it when it decodes).
fn fields(mut wire: &[u8]) -> impl Iterator<Item = (u64, Option<&[u8]>)> {
    std::iter::from_fn(move || {
        let key = varint(&mut wire)?;
        let value = match key & 7 {
            0 => varint(&mut wire).map(|_| None),
            1 => skip(&mut wire, 8).map(|_| None),
            2 => {
                let len = usize::try_from(varint(&mut wire)?).ok()?;
                skip(&mut wire, len).map(Some)
            }
            5 => skip(&mut wire, 4).map(|_| None),
            _ => None,
        }?;
        Some((key >> 3, value))
    })
}

/// prost's varint reader, on a byte slice it advances.
fn varint(wire: &mut &[u8]) -> Option<u64> {
    prost::encoding::decode_varint(wire).ok()
}

fn skip<'a>(wire: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
    if wire.len() < len {
        return None;
    }
    let (taken, rest) = wire.split_at(len);
    *wire = rest;
    Some(taken)
}

impl WireBounds for pb::ModelInferRequest {
    fn excess(wire: &[u8]) -> Option<String> {
        // ModelInferRequest: parameters = 4, inputs = 5, outputs = 6, raw_input_contents = 7;
        // an input's parameters = 4 and contents = 5 (whose bytes_contents = 8); an output's
        // parameters = 2.
        let mut counts = [0usize; 8];
        let mut typed_bytes = 0usize;
        for (field, value) in fields(wire) {
            let Ok(index) = usize::try_from(field) else {
                continue;
            };
            if let Some(count) = counts.get_mut(index) {
                *count += 1;
            }
            let tensor_parameters = match (field, value) {
                (5, Some(input)) => {
                    let mut parameters = 0;
                    for (field, value) in fields(input) {
                        match (field, value) {
                            (4, _) => parameters += 1,
                            (5, Some(contents)) => {
                                typed_bytes += fields(contents).filter(|(f, _)| *f == 8).count();
                            }
                            _ => {}
                        }
                    }
                    parameters
                }
                (6, Some(output)) => fields(output).filter(|(f, _)| *f == 2).count(),
                _ => 0,
            };
            if tensor_parameters > MAX_TENSOR_PARAMETERS {
                return Some(format!(
                    "a tensor of the request has {tensor_parameters} parameters; at most {MAX_TENSOR_PARAMETERS} are accepted"
                ));
            }
        }
        let named = [
            (4, "parameters"),
            (5, "inputs"),
            (6, "outputs"),
            (7, "raw_input_contents"),
        ];
        for (field, what) in named {
            if counts[field] > MAX_ENTRIES {
                return Some(format!(
                    "the request has {} {what}; at most {MAX_ENTRIES} are accepted",
                    counts[field]
                ));
            }
        }
        (typed_bytes > MAX_TYPED_BYTES_ELEMENTS).then(|| {
            format!(
                "the request has {typed_bytes} bytes_contents elements; at most {MAX_TYPED_BYTES_ELEMENTS} are accepted (send large BYTES tensors in raw_input_contents)"
            )
        })
    }
}

/// The other requests: decoded as they are (small, or refused by their handlers' own checks).
macro_rules! unbounded {
    ($($message:ty),* $(,)?) => {
        $(impl WireBounds for $message {})*
    };
}

unbounded!(
    pb::ServerLiveRequest,
    pb::ServerReadyRequest,
    pb::ModelReadyRequest,
    pb::ServerMetadataRequest,
    pb::ModelMetadataRequest,
    pb::ModelConfigRequest,
    pb::ModelStatisticsRequest,
    pb::RepositoryIndexRequest,
    pb::RepositoryModelLoadRequest,
    pb::RepositoryModelUnloadRequest,
    pb::SystemSharedMemoryStatusRequest,
    pb::SystemSharedMemoryRegisterRequest,
    pb::SystemSharedMemoryUnregisterRequest,
    pb::CudaSharedMemoryStatusRequest,
    pb::CudaSharedMemoryRegisterRequest,
    pb::CudaSharedMemoryUnregisterRequest,
    pb::TraceSettingRequest,
    pb::LogSettingsRequest,
    crate::protocol::grpc::health_pb::HealthCheckRequest,
);

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn excess(request: &pb::ModelInferRequest) -> Option<String> {
        pb::ModelInferRequest::excess(&request.encode_to_vec())
    }

    #[test]
    fn requests_within_bounds_pass_and_floods_of_entries_are_refused() {
        let input = pb::model_infer_request::InferInputTensor {
            name: "x".into(),
            datatype: "BYTES".into(),
            shape: vec![2],
            contents: Some(pb::InferTensorContents {
                bytes_contents: vec![
                    bytes::Bytes::from_static(b"a"),
                    bytes::Bytes::from_static(b"b"),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut request = pb::ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input.clone(); 3],
            raw_input_contents: vec![bytes::Bytes::from(vec![0u8; 16]); 3],
            ..Default::default()
        };
        assert_eq!(excess(&request), None);
        request.inputs = vec![Default::default(); MAX_ENTRIES + 1];
        let refused = excess(&request).unwrap_or_default();
        assert!(refused.contains("4097 inputs"), "{refused}");
        request.inputs = vec![];
        request.outputs = vec![Default::default(); MAX_ENTRIES + 1];
        assert!(excess(&request).is_some_and(|e| e.contains("outputs")));
        request.outputs = vec![];
        let mut flood = input;
        if let Some(contents) = flood.contents.as_mut() {
            contents.bytes_contents = vec![bytes::Bytes::new(); MAX_TYPED_BYTES_ELEMENTS + 1];
        }
        request.inputs = vec![flood];
        assert!(excess(&request).is_some_and(|e| e.contains("bytes_contents")));
        // Bytes that are no message are left to prost to refuse.
        assert_eq!(pb::ModelInferRequest::excess(&[0xff, 0xff]), None);
    }
}
