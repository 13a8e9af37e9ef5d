//! The repository and the command line: `tessera check`, broken models beside good ones,
//! auto-complete, unsupported backends, a missing ONNX Runtime.

use std::path::Path;
use std::process::Command;

use crate::harness::{
    TestServer, examples_repo, fixtures_repo, require_onnx_runtime, shared_cache, temp_dir,
    with_ort,
};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir").flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

/// A repository with one good model and several broken ones.
fn mixed_repository() -> std::path::PathBuf {
    let repo = temp_dir("mixed-repo");
    let examples = examples_repo();
    copy_dir(&examples.join("add_sub"), &repo.join("add_sub"));
    // No config.pbtxt at all: derived from the ONNX file.
    std::fs::create_dir_all(repo.join("derived/1")).expect("mkdir");
    std::fs::copy(
        examples.join("add_sub/1/model.onnx"),
        repo.join("derived/1/model.onnx"),
    )
    .expect("copy");
    // A misspelled field.
    copy_dir(&examples.join("add_sub"), &repo.join("typo"));
    let text = std::fs::read_to_string(repo.join("typo/config.pbtxt")).expect("config");
    std::fs::write(
        repo.join("typo/config.pbtxt"),
        text.replace("name: \"add_sub\"", "name: \"typo\"\nmax_bach_size: 4"),
    )
    .expect("write");
    // A backend tessera does not run.
    std::fs::create_dir_all(repo.join("trt/1")).expect("mkdir");
    std::fs::write(
        repo.join("trt/config.pbtxt"),
        "name: \"trt\"\nplatform: \"tensorrt_plan\"\nmax_batch_size: 8\n",
    )
    .expect("write");
    // dynamic_batching without max_batch_size: Triton's ONNX Runtime backend fills in 4.
    copy_dir(&examples.join("add_sub"), &repo.join("batch_default"));
    let text = std::fs::read_to_string(repo.join("batch_default/config.pbtxt")).expect("config");
    std::fs::write(
        repo.join("batch_default/config.pbtxt"),
        text.replace("name: \"add_sub\"", "name: \"batch_default\"")
            .replace("max_batch_size: 8", "dynamic_batching { }"),
    )
    .expect("write");
    // No configuration, and a file Triton knows by name (DALI): refused as that backend.
    std::fs::create_dir_all(repo.join("dali/1")).expect("mkdir");
    std::fs::write(repo.join("dali/1/model.dali"), b"serialized pipeline").expect("write");
    // A configuration that ends in the middle of a message.
    std::fs::create_dir_all(repo.join("cut/1")).expect("mkdir");
    std::fs::write(
        repo.join("cut/config.pbtxt"),
        "name: \"cut\"\nbackend: \"wasm\"\ninput [\n  {\n",
    )
    .expect("write");
    // A GPU instance group on a CPU-only build.
    copy_dir(&examples.join("add_sub"), &repo.join("gpu"));
    let text = std::fs::read_to_string(repo.join("gpu/config.pbtxt")).expect("config");
    std::fs::write(
        repo.join("gpu/config.pbtxt"),
        text.replace("name: \"add_sub\"", "name: \"gpu\"")
            .replace("KIND_CPU", "KIND_GPU"),
    )
    .expect("write");
    repo
}

#[tokio::test]
async fn broken_models_do_not_stop_the_others() {
    crate::harness::require_onnx_runtime!();
    let repo = mixed_repository();
    let s = TestServer::start(&[repo], &["--strict-readiness=false"], &shared_cache()).await;
    let state = s.state_lookup().await;
    assert_eq!(state("add_sub").1, "READY");
    assert_eq!(state("derived").1, "READY", "{:?}", state("derived"));
    let typo = state("typo");
    assert_eq!(typo.1, "UNAVAILABLE");
    assert!(
        typo.2.contains("max_bach_size") && typo.2.contains("config.pbtxt:2:"),
        "{typo:?}"
    );
    assert!(
        state("trt").2.contains("tensorrt_plan")
            && state("trt")
                .2
                .contains("\"tensorrt\" GPU execution accelerator"),
        "{:?}",
        state("trt")
    );
    assert!(state("gpu").2.contains("KIND_GPU"), "{:?}", state("gpu"));
    assert!(
        state("dali").2.contains("backend 'dali' is not supported"),
        "{:?}",
        state("dali")
    );
    assert!(
        state("cut").2.contains("config.pbtxt:5:1:"),
        "{:?}",
        state("cut")
    );
    assert_eq!(
        state("batch_default").1,
        "READY",
        "{:?}",
        state("batch_default")
    );
    let (_, config) = s.get("/v2/models/batch_default/config").await;
    assert_eq!(config["max_batch_size"], 4, "{config}");
    let row: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let (status, body) = s
        .infer(
            "batch_default",
            serde_json::json!([
                { "name": "INPUT0", "shape": [2, 16], "datatype": "FP32", "data": row },
                { "name": "INPUT1", "shape": [2, 16], "datatype": "FP32", "data": row },
            ]),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Auto-complete derived the configuration from the ONNX file.
    let (status, config) = s.get("/v2/models/derived/config").await;
    assert_eq!(status, 200);
    assert_eq!(config["max_batch_size"], 4);
    assert_eq!(config["input"][0]["dims"], serde_json::json!([16]));
    let (status, err) = s.infer("typo", serde_json::json!([])).await;
    assert_eq!(status, 503, "{err}");
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|e| e.contains("max_bach_size"))
    );
    // Strict readiness is off: the server is ready although some models are not.
    assert_eq!(s.get("/v2/health/ready").await.0, 200);
}

#[tokio::test]
async fn strict_readiness_reports_broken_models() {
    crate::harness::require_onnx_runtime!();
    let s = TestServer::start(&[mixed_repository()], &[], &shared_cache()).await;
    assert_eq!(s.get("/v2/health/ready").await.0, 503);
    assert_eq!(s.get("/v2/models/add_sub/ready").await.0, 200);
}

#[test]
fn check_command_reports_each_version() {
    require_onnx_runtime!();
    let ok = with_ort(&mut Command::new(env!("CARGO_BIN_EXE_tessera")))
        .args(["check", "--model-repository"])
        .arg(examples_repo())
        .arg("--wasm-cache-dir")
        .arg(shared_cache())
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(stdout.contains("add_sub\t1\tREADY-to-load"), "{stdout}");
    assert!(
        stdout.contains("preprocess_text\t1\tREADY-to-load"),
        "{stdout}"
    );
    // The server-wide limits are printed with their values.
    assert!(
        stdout.contains("limit\tmax_inflight_requests\t4096"),
        "{stdout}"
    );

    let bad = with_ort(&mut Command::new(env!("CARGO_BIN_EXE_tessera")))
        .args(["check", "--model-repository"])
        .arg(mixed_repository())
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&bad.stdout);
    assert!(!bad.status.success());
    assert!(stdout.contains("typo\t-\tUNAVAILABLE"), "{stdout}");
    assert!(stdout.contains("add_sub\t1\tREADY-to-load"), "{stdout}");
}

#[tokio::test]
async fn missing_onnx_runtime_is_reported_not_fatal() {
    let s = TestServer::start(
        &[examples_repo()],
        &[
            "--onnxruntime-library",
            "/nonexistent/libonnxruntime.so",
            "--strict-readiness=false",
        ],
        &shared_cache(),
    )
    .await;
    let state = s.state_lookup().await;
    let add_sub = state("add_sub");
    assert_eq!(add_sub.1, "UNAVAILABLE");
    assert!(add_sub.2.contains("pip install onnxruntime"), "{add_sub:?}");
    assert_eq!(
        state("add_sub_wasm").1,
        "READY",
        "Wasm handlers do not need ONNX Runtime"
    );
}

#[tokio::test]
async fn strict_model_config_refuses_to_derive() {
    crate::harness::require_onnx_runtime!();
    let s = TestServer::start(
        &[mixed_repository()],
        &["--strict-model-config=true", "--strict-readiness=false"],
        &shared_cache(),
    )
    .await;
    let state = s.state_lookup().await;
    assert_eq!(state("add_sub").1, "READY");
    let derived = state("derived");
    assert_eq!(derived.1, "UNAVAILABLE");
    assert!(
        derived.2.contains("--strict-model-config=false"),
        "{derived:?}"
    );
}

#[tokio::test]
async fn reshape_maps_client_dims_to_model_dims() {
    crate::harness::require_onnx_runtime!();
    let repo = temp_dir("reshape");
    std::fs::create_dir_all(repo.join("grid/1")).expect("mkdir");
    std::fs::copy(
        examples_repo().join("add_sub/1/model.onnx"),
        repo.join("grid/1/model.onnx"),
    )
    .expect("copy");
    // Clients send 4x4 grids; the model takes 16-vectors; clients get 4x4 grids back.
    let io = |kind: &str, name: &str| {
        format!(
            "{kind} {{ name: \"{name}\" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape {{ shape: [ 16 ] }} }}\n"
        )
    };
    let config = format!(
        "name: \"grid\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n{}{}{}{}",
        io("input", "INPUT0"),
        io("input", "INPUT1"),
        io("output", "OUTPUT0"),
        io("output", "OUTPUT1")
    );
    std::fs::write(repo.join("grid/config.pbtxt"), config).expect("config");
    let s = TestServer::start(&[repo], &[], &shared_cache()).await;
    let a: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let inputs = serde_json::json!([
        { "name": "INPUT0", "shape": [2, 4, 4], "datatype": "FP32", "data": a },
        { "name": "INPUT1", "shape": [2, 4, 4], "datatype": "FP32", "data": vec![1.0; 32] },
    ]);
    let (status, body) = s.infer("grid", inputs).await;
    assert_eq!(status, 200, "{body}");
    let sum = crate::harness::output(&body, "OUTPUT0");
    assert_eq!(sum["shape"], serde_json::json!([2, 4, 4]));
    let got: Vec<f64> = sum["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|v| v.as_f64().expect("number"))
        .collect();
    assert_eq!(got, (0..32).map(|i| i as f64 + 1.0).collect::<Vec<_>>());
    let (_, meta) = s.get("/v2/models/grid").await;
    assert_eq!(meta["inputs"][0]["shape"], serde_json::json!([-1, 4, 4]));
}

/// `tessera check` on the fixtures under an address-space limit of about 12 GB.
fn check_under_ulimit(extra: &str) -> std::process::Output {
    let command = format!(
        "ulimit -v 12000000 && exec '{}' check --model-repository '{}' --wasm-cache-dir '{}' {extra}",
        env!("CARGO_BIN_EXE_tessera"),
        fixtures_repo().display(),
        shared_cache().display(),
    );
    with_ort(&mut Command::new("sh"))
        .args(["-c", &command])
        .output()
        .expect("runs")
}

#[test]
fn the_wasm_pool_is_sized_from_the_server_limits() {
    // The default pool reserves terabytes of address space: refused under `ulimit -v`, with a
    // message that says what to lower.
    let default = check_under_ulimit("");
    let stderr = String::from_utf8_lossy(&default.stderr);
    assert!(!default.status.success());
    assert!(stderr.contains("--wasm-pool-instances"), "{stderr}");
    // Sized for 20 instances of at most 192 MiB, the same repository loads.
    let sized = check_under_ulimit("--wasm-pool-instances 20 --wasm-max-memory-bytes 201326592");
    let stdout = String::from_utf8_lossy(&sized.stdout);
    assert!(
        sized.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&sized.stderr)
    );
    assert!(
        stdout.contains("identity_echo\t1\tREADY-to-load"),
        "{stdout}"
    );
    assert!(
        stdout.contains("limit\twasm_pool_instances\t20"),
        "{stdout}"
    );
}
