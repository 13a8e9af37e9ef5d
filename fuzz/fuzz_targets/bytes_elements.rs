//! The BYTES element codec of the binary extension (4-byte little-endian length, then the bytes):
//! decoding never panics, and what decodes encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_core::kserve::{decode_bytes_elements, encode_bytes_elements};
use tessera_core::tensor::Bytes;

fuzz_target!(|data: &[u8]| {
    if let Ok(items) = decode_bytes_elements(&Bytes::copy_from_slice(data)) {
        let encoded = Bytes::from(encode_bytes_elements(&items));
        assert_eq!(encoded, data);
        assert_eq!(decode_bytes_elements(&encoded), Ok(items));
    }
});
