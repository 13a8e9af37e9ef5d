//! GPU placement on machines without a GPU: the real server, its real CUDA driver loading
//! (cudarc), pointed at a fake `libcuda.so` built from `tests/gpu/fake_libcuda.c` that reports
//! devices but creates no contexts. What a real GPU does (ONNX Runtime's CUDA provider, NVML) is
//! checked by `scripts/gpu/e2e.sh` on a GPU machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::harness::{TestServer, examples_repo, require_onnx_runtime, shared_cache, temp_dir};

/// A directory holding the fake driver as `libcuda.so`, for `LD_LIBRARY_PATH`.
fn fake_driver() -> PathBuf {
    let dir = temp_dir("fake-cuda");
    let source = crate::harness::repo_root().join("tests/gpu/fake_libcuda.c");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(&source)
        .status()
        .expect("a C compiler (cc) builds the fake CUDA driver");
    assert!(status.success(), "cc failed on {}", source.display());
    dir
}

/// Copies example model `from` to `repo/name` with its instance groups replaced by `groups`
/// (pbtxt; empty: none) and any extra configuration appended.
fn model(repo: &Path, from: &str, name: &str, groups: &str, extra: &str) {
    let source = examples_repo().join(from);
    let target = repo.join(name);
    std::fs::create_dir_all(target.join("1")).expect("mkdir");
    for entry in std::fs::read_dir(source.join("1"))
        .expect("version dir")
        .flatten()
    {
        std::fs::copy(entry.path(), target.join("1").join(entry.file_name())).expect("copy");
    }
    let config = std::fs::read_to_string(source.join("config.pbtxt")).expect("config");
    let cut = config.find("instance_group").unwrap_or(config.len());
    let config = config[..cut].replace(&format!("name: \"{from}\""), &format!("name: \"{name}\""));
    std::fs::write(
        target.join("config.pbtxt"),
        format!("{config}\n{groups}\n{extra}\n"),
    )
    .expect("write config");
}

async fn start(repo: PathBuf, flags: &[&str], driver: &Path, devices: &str) -> TestServer {
    let path = driver.display().to_string();
    TestServer::start_with_env(
        &[repo],
        flags,
        &shared_cache(),
        &[
            ("LD_LIBRARY_PATH", path.as_str()),
            ("FAKE_CUDA_DEVICES", devices),
        ],
    )
    .await
}

fn groups(config: &Value) -> Vec<(String, Value)> {
    config["instance_group"]
        .as_array()
        .unwrap_or_else(|| panic!("instance groups in {config}"))
        .iter()
        .map(|g| {
            (
                g["kind"].as_str().unwrap_or("").to_owned(),
                g["gpus"].clone(),
            )
        })
        .collect()
}

fn add_sub_inputs() -> Value {
    let row: Vec<f32> = (0..16).map(|i| i as f32).collect();
    json!([
        { "name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": row },
        { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": row },
    ])
}

#[tokio::test]
async fn instances_are_placed_on_the_gpus_the_driver_reports() {
    require_onnx_runtime!();
    let driver = fake_driver();
    let repo = temp_dir("gpu-repo");
    // A handler on every GPU, twice: it runs on the CPU, its instances count on their GPU.
    model(
        &repo,
        "add_sub_wasm",
        "handler_gpu",
        "instance_group [{ kind: KIND_GPU count: 2 }]",
        "",
    );
    model(
        &repo,
        "add_sub_wasm",
        "handler_gpu3",
        "instance_group [{ kind: KIND_GPU gpus: [3] }]",
        "",
    );
    // ONNX on the GPU needs a GPU build of ONNX Runtime; the test's is the CPU wheel.
    model(
        &repo,
        "add_sub",
        "onnx_gpu",
        "instance_group [{ kind: KIND_GPU }]",
        "",
    );
    // KIND_AUTO (no instance group) falls back to the CPU with that ONNX Runtime.
    model(&repo, "add_sub", "onnx_auto", "", "");
    model(
        &repo,
        "add_sub",
        "onnx_fp8",
        "instance_group [{ kind: KIND_CPU }]",
        r#"optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" parameters { key: "precision_mode" value: "FP8" } } ] } }"#,
    );
    model(
        &repo,
        "add_sub",
        "onnx_trt_on_cpu",
        "instance_group [{ kind: KIND_CPU }]",
        r#"optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ] } }"#,
    );
    let s = start(
        repo.clone(),
        &["--strict-readiness=false"],
        &driver,
        "9.0,8.6",
    )
    .await;
    let log = s.log_text();
    assert!(
        log.contains(
            "GPU 0: Fake GPU 0 (GPU-face0000-0000-0000-0000-000000000000), compute capability 9.0"
        ),
        "{log}"
    );
    assert!(log.contains("GPU 1: Fake GPU 1"), "{log}");
    let state = s.state_lookup().await;

    assert_eq!(
        state("handler_gpu").1,
        "READY",
        "{:?}",
        state("handler_gpu")
    );
    let (_, config) = s.get("/v2/models/handler_gpu/config").await;
    assert_eq!(
        groups(&config),
        vec![("KIND_GPU".into(), json!([0, 1]))],
        "{config}"
    );
    let (status, body) = s.infer("handler_gpu", add_sub_inputs()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(crate::harness::output_f32(&body, "OUTPUT0")[3], 6.0);

    let (_, _, reason) = state("handler_gpu3");
    assert!(
        reason.contains("invalid or unsupported gpu id 3. GPUs usable by this server are: 0, 1"),
        "{reason}"
    );

    let (_, state_gpu, reason) = state("onnx_gpu");
    assert_eq!(state_gpu, "UNAVAILABLE");
    assert!(
        reason.contains("CPU-only build") && reason.contains("onnxruntime-gpu"),
        "{reason}"
    );
    let (status, err) = s.infer("onnx_gpu", add_sub_inputs()).await;
    assert_eq!(status, 503, "{err}");

    assert_eq!(state("onnx_auto").1, "READY", "{:?}", state("onnx_auto"));
    let (_, config) = s.get("/v2/models/onnx_auto/config").await;
    assert_eq!(
        groups(&config),
        vec![("KIND_CPU".into(), json!([]))],
        "{config}"
    );
    let (status, body) = s.infer("onnx_auto", add_sub_inputs()).await;
    assert_eq!(status, 200, "{body}");

    assert!(
        state("onnx_fp8").1 == "UNAVAILABLE"
            && state("onnx_fp8")
                .2
                .contains("unsupported precision mode 'FP8'"),
        "{:?}",
        state("onnx_fp8")
    );
    // A GPU accelerator on a CPU instance is checked, then not used (as in Triton).
    assert_eq!(
        state("onnx_trt_on_cpu").1,
        "READY",
        "{:?}",
        state("onnx_trt_on_cpu")
    );

    // No NVML beside the fake driver: no GPU metrics, and the log says why.
    assert!(!s.metrics().await.contains("nv_gpu_utilization{"));
    assert!(s.log_text().contains("no GPU metrics"), "{}", s.log_text());
    s.stop();
}

#[tokio::test]
async fn gpus_flag_compute_capability_and_a_driver_without_devices() {
    let driver = fake_driver();
    let repo = temp_dir("gpu-repo");
    model(
        &repo,
        "add_sub_wasm",
        "handler_gpu",
        "instance_group [{ kind: KIND_GPU }]",
        "",
    );

    // --gpus 1: only the second device.
    let s = start(repo.clone(), &["--gpus", "1"], &driver, "9.0,9.0").await;
    let (_, config) = s.get("/v2/models/handler_gpu/config").await;
    assert_eq!(
        groups(&config),
        vec![("KIND_GPU".into(), json!([1]))],
        "{config}"
    );
    s.stop();

    // A device under --min-supported-compute-capability is not used.
    let s = start(repo.clone(), &[], &driver, "6.1,8.0").await;
    let (_, config) = s.get("/v2/models/handler_gpu/config").await;
    assert_eq!(
        groups(&config),
        vec![("KIND_GPU".into(), json!([1]))],
        "{config}"
    );
    assert!(
        s.log_text()
            .contains("compute capability 6.1, below --min-supported-compute-capability 7.5"),
        "{}",
        s.log_text()
    );
    s.stop();

    // The driver loads but has no device; and GPUs turned off.
    for (devices, flags, why) in [
        ("", &[][..], "CUDA_ERROR_NO_DEVICE"),
        ("9.0", &["--gpus", "none"][..], "--gpus none"),
    ] {
        let mut all = vec!["--strict-readiness=false"];
        all.extend_from_slice(flags);
        let s = start(repo.clone(), &all, &driver, devices).await;
        let (state, reason) = {
            let lookup = s.state_lookup().await;
            let (_, state, reason) = lookup("handler_gpu");
            (state, reason)
        };
        assert_eq!(state, "UNAVAILABLE");
        assert!(
            reason.contains("has kind KIND_GPU but no GPUs are available") && reason.contains(why),
            "{reason}"
        );
        s.stop();
    }
}
