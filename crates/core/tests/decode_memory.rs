//! Peak memory of decoding a large JSON request, measured with a counting allocator.
//!
//! Decoding through a `serde_json::Value` tree took ~20× the body (a 60 MB body grew the server by
//! ~1.3 GB before it was refused). The typed decoder must stay within a small multiple.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator and only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Peak bytes allocated while decoding `body`, above what was live before.
fn peak_while_decoding(body: &[u8]) -> (usize, Result<(), String>) {
    let body = tessera_core::tensor::Bytes::copy_from_slice(body);
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let result = tessera_core::kserve::decode_request(&body, None)
        .map(drop)
        .map_err(|e| e.message);
    (PEAK.load(Ordering::Relaxed) - base, result)
}

fn body(datatype: &str, element: &str, count: usize, declared: usize) -> Vec<u8> {
    let mut body = format!(
        r#"{{"inputs":[{{"name":"x","shape":[{declared}],"datatype":"{datatype}","data":["#
    )
    .into_bytes();
    for i in 0..count {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(element.as_bytes());
    }
    body.extend_from_slice(b"]}]}");
    body
}

// One test, so no other test allocates concurrently in this binary.
#[test]
fn decoding_stays_within_a_small_multiple_of_the_body() {
    let n = 2_000_000;
    for (datatype, element, limit) in [
        // 2 bytes of JSON per element become 1..8 bytes of tensor.
        ("UINT8", "1", 2.0),
        ("FP32", "1", 3.0),
        ("INT64", "1", 5.0),
        // The worst case: 3 bytes of JSON (`"",`) per empty string become one 32-byte `Bytes`
        // handle (the price of elements that can be slices of a binary body).
        ("BYTES", "\"\"", 12.0),
        // A real string costs its bytes plus the handle.
        ("BYTES", "\"some text of forty bytes, say, in a row\"", 3.0),
    ] {
        let accepted = body(datatype, element, n, n);
        let (peak, result) = peak_while_decoding(&accepted);
        assert_eq!(result, Ok(()), "{datatype}");
        let ratio = peak as f64 / accepted.len() as f64;
        assert!(
            ratio <= limit,
            "{datatype}: peak {peak} for a {} byte body ({ratio:.1}x)",
            accepted.len()
        );

        // Refused bodies (declared shape too small, or far too large) cost no more.
        for declared in [n - 1, 1 << 40] {
            let refused = body(datatype, element, n, declared);
            let (peak, result) = peak_while_decoding(&refused);
            assert!(result.is_err(), "{datatype} declared {declared}");
            let ratio = peak as f64 / refused.len() as f64;
            assert!(
                ratio <= limit,
                "{datatype} declared {declared}: {ratio:.1}x"
            );
        }
    }
}
