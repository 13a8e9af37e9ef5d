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

criterion_group!(benches, request_path);
criterion_main!(benches);
