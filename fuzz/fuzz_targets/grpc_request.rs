//! The gRPC request decoder: arbitrary bytes as a `ModelInferRequest` message (protobuf, as tonic
//! hands it over), then into the request path's `InferRequest`, with inputs that name shared
//! memory read from a stand-in region of bounded size. What it accepts must be self-consistent,
//! and a response made of it must encode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tessera_core::grpc::{decode_request, encode_response, pb};
use tessera_core::infer::{InferError, InferResponse, SharedMemoryRef};
use tessera_core::kserve::RegionReader;
use tessera_core::tensor::Bytes;

/// A region of zeros of at most 64 KiB: larger windows are refused, as out of a region.
struct Zeros;

impl RegionReader for Zeros {
    fn read(&self, place: &SharedMemoryRef) -> Result<Bytes, InferError> {
        if place.byte_size > 1 << 16 {
            return Err(InferError::invalid("out of the region"));
        }
        Ok(Bytes::from(vec![0u8; place.byte_size]))
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(message) = pb::ModelInferRequest::decode(data) else {
        return;
    };
    let Ok(request) = decode_request(message, &Zeros) else {
        return;
    };
    for tensor in &request.inputs {
        assert!(tensor.check_consistent().is_ok(), "{tensor:?}");
    }
    let response = InferResponse {
        outputs: request.inputs,
        parameters: request.parameters,
        ..Default::default()
    };
    let encoded = encode_response(response, &[]).expect("a consistent response encodes");
    assert_eq!(encoded.outputs.len(), encoded.raw_output_contents.len());
});
