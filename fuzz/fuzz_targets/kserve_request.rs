//! The KServe v2 request decoder: a JSON body, or a JSON header followed by binary tensor data.
//! The first byte picks the mode; with binary data, the next two give the header length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_core::kserve::decode_request;
use tessera_core::tensor::Bytes;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let result = if mode & 1 == 0 {
        decode_request(&Bytes::copy_from_slice(rest), None)
    } else if let Some((len, body)) = rest.split_first_chunk::<2>() {
        decode_request(
            &Bytes::copy_from_slice(body),
            Some(usize::from(u16::from_le_bytes(*len))),
        )
    } else {
        return;
    };
    // What the decoder accepts must be self-consistent: the invariant every later stage relies on.
    if let Ok(request) = result {
        for tensor in &request.inputs {
            assert!(tensor.check_consistent().is_ok(), "{tensor:?}");
        }
    }
});
