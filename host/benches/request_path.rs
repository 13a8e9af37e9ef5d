//! The request path without HTTP, in one process: decode a KServe JSON body → `Server::infer`
//! (admission, model table, validation, queue, batcher) → the `add_sub_wasm` handler → check and
//! shape outputs → encode the response. Guards the path's own cost from regressing; the
//! end-to-end numbers with a real client are in docs/benchmarks.md.
//!
//! `cargo bench --bench request_path` (after a build installed model_repository/add_sub_wasm).

use std::path::Path;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use tessera::infer::CallContext;
use tessera::protocol::kserve::{decode_request, encode_response};
use tessera::server::{Server, ServerOptions};
use tessera::tensor::Bytes;

/// A repository with only `add_sub_wasm`, so no ONNX Runtime is needed.
fn repository() -> std::path::PathBuf {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model_repository/add_sub_wasm");
    let repo = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-request-path");
    let model = repo.join("add_sub_wasm");
    std::fs::create_dir_all(model.join("1")).expect("bench repository");
    std::fs::copy(examples.join("config.pbtxt"), model.join("config.pbtxt")).expect("config");
    std::fs::copy(examples.join("1/model.wasm"), model.join("1/model.wasm"))
        .expect("model.wasm (build the workspace first)");
    repo
}

fn request_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server: Arc<Server> = runtime
        .block_on(Server::start(ServerOptions {
            model_repositories: vec![repository()],
            ..Default::default()
        }))
        .expect("server");
    let values: Vec<String> = (0..16).map(|i| format!("{i}.5")).collect();
    let body = Bytes::from(format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":[{0}]}},{{"name":"INPUT1","shape":[1,16],"datatype":"FP32","data":[{0}]}}]}}"#,
        values.join(",")
    ));
    c.bench_function("decode -> Server::infer (add_sub_wasm) -> encode", |b| {
        b.to_async(&runtime).iter(|| async {
            let request = decode_request(&body, None).expect("decodes");
            let response = server
                .infer(CallContext::root(), "add_sub_wasm", None, request)
                .await
                .expect("infers");
            encode_response(&response, |_| false).expect("encodes")
        })
    });
    c.bench_function("decode + encode only", |b| {
        let response = runtime
            .block_on(server.infer(
                CallContext::root(),
                "add_sub_wasm",
                None,
                decode_request(&body, None).expect("decodes"),
            ))
            .expect("infers");
        b.iter(|| {
            let request = decode_request(&body, None).expect("decodes");
            std::hint::black_box(request);
            encode_response(&response, |_| false).expect("encodes")
        })
    });
    runtime.block_on(server.shutdown());
}

/// A 1 MiB input read from a system shared-memory region: through the object's descriptor, as
/// the server does (a truncated object is an error, not SIGBUS), beside the copy out of a
/// mapping that it replaced.
fn shared_memory_input(c: &mut Criterion) {
    use tessera::infer::SharedMemoryRef;
    use tessera_core::kserve::RegionReader;
    const SIZE: usize = 1 << 20;
    let key = format!("/tessera-bench-{}", std::process::id());
    let c_key = std::ffi::CString::new(key.clone()).expect("no NUL");
    // SAFETY: creates, sizes and maps an object of this benchmark's own; unmapped and unlinked
    // at the end.
    let mapping = unsafe {
        let fd = libc::shm_open(c_key.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600);
        assert!(fd >= 0, "shm_open");
        assert_eq!(libc::ftruncate(fd, SIZE as libc::off_t), 0);
        let base = libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(base, libc::MAP_FAILED);
        libc::close(fd);
        std::ptr::write_bytes(base.cast::<u8>(), 7, SIZE);
        base
    };
    let shm = tessera::shm::SharedMemory::default();
    shm.register("bench", &key, 0, SIZE).expect("registers");
    let place = SharedMemoryRef {
        region: "bench".into(),
        offset: 0,
        byte_size: SIZE,
    };
    c.bench_function("shm input 1 MiB: pread (served)", |b| {
        b.iter(|| shm.read(&place).expect("reads"))
    });
    c.bench_function("shm input 1 MiB: copy from a mapping (replaced)", |b| {
        b.iter(|| {
            let mut out = vec![0u8; SIZE];
            // SAFETY: the mapping holds SIZE bytes and nothing truncates it here.
            unsafe { std::ptr::copy_nonoverlapping(mapping.cast::<u8>(), out.as_mut_ptr(), SIZE) };
            Bytes::from(out)
        })
    });
    // SAFETY: the mapping and the object made above.
    unsafe {
        libc::munmap(mapping, SIZE);
        libc::shm_unlink(c_key.as_ptr());
    }
}

criterion_group!(benches, request_path, shared_memory_input);
criterion_main!(benches);
