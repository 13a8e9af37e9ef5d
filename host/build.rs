//! The Wasm guests in `examples/` and `tests/guests/` are built for `wasm32-wasip2` and installed
//! as `model.wasm` next to their `config.pbtxt`, so `cargo run`/`cargo test` serve fresh handlers.
//! Triton's gRPC service (`crates/core/proto/grpc_service.proto`, `proto/health.proto`, vendored
//! from triton-inference-server/common) becomes tonic server code; its messages are the ones
//! `crates/core/build.rs` compiles, shared rather than generated twice.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    compile_grpc();
    embed_python_build_files();
    build_guests();
}

/// `tessera build` carries what it hands componentize-py and componentize-qjs: the WIT and the
/// Python and JavaScript guest SDKs, so the binary builds a model.py or model.js wherever it runs.
fn embed_python_build_files() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir.parent().expect("host/ has a parent");
    let mut out = String::new();
    for (constant, dir, sub, exts) in [
        ("WIT_FILES", root.join("wit"), "", &["wit"][..]),
        (
            "PYTHON_SDK_FILES",
            root.join("guest-sdk-python/src"),
            "",
            &["py"][..],
        ),
        (
            "JS_SDK_FILES",
            root.join("guest-sdk-js"),
            "src",
            &["js", "ts", "cjs"][..],
        ),
    ] {
        println!("cargo:rerun-if-changed={}", dir.join(sub).display());
        let mut files = Vec::new();
        collect_files(&dir, &dir.join(sub), exts, &mut files);
        if constant == "JS_SDK_FILES" {
            // The package's manifest, for `import ... from "@tessera/guest"`; not node_modules.
            let manifest = dir.join("package.json");
            println!("cargo:rerun-if-changed={}", manifest.display());
            files.push((
                "package.json".into(),
                manifest.to_string_lossy().into_owned(),
            ));
        }
        files.sort();
        out.push_str(&format!("pub const {constant}: &[(&str, &str)] = &[\n"));
        for (relative, path) in files {
            out.push_str(&format!("    ({relative:?}, include_str!({path:?})),\n"));
        }
        out.push_str("];\n");
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("set by cargo"));
    std::fs::write(out_dir.join("python_build_files.rs"), out).expect("OUT_DIR is writable");
}

fn collect_files(root: &Path, dir: &Path, exts: &[&str], out: &mut Vec<(String, String)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a readable directory entry").path();
        if path.is_dir() {
            collect_files(root, &path, exts, out);
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| exts.contains(&e))
        {
            let relative = path.strip_prefix(root).expect("under root");
            out.push((
                relative.to_string_lossy().into_owned(),
                path.to_string_lossy().into_owned(),
            ));
        }
    }
}

fn compile_grpc() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let core_proto = manifest_dir.join("../crates/core/proto");
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed={}", core_proto.display());
    let fds = protox::compile(
        ["grpc_service.proto", "health.proto"],
        [manifest_dir.join("proto"), core_proto],
    )
    .expect("the gRPC protos compile");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        // Every message of the `inference` package is tessera-core's (its codec is fuzzed there):
        // only the service is generated here.
        .extern_path(".inference", "::tessera_core::config::pb")
        // prost's codec, with an inference request's entries counted before it is decoded.
        .codec_path("crate::protocol::grpc_codec::BoundedCodec")
        .compile_fds(fds)
        .expect("tonic generates the gRPC service");
}

/// Builds each guest workspace and copies its components into the matching model repository.
fn build_guests() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("host/ has a parent")
        .to_path_buf();
    for dir in [
        "wit",
        "guest-sdk",
        "examples",
        "tests/guests",
        "functions",
        "tests/fixtures/functions",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed=TESSERA_SKIP_GUESTS");
    if env::var_os("TESSERA_SKIP_GUESTS").is_some() {
        return;
    }
    let target_dir = root.join("target").join("guests");
    let guests = [
        (
            root.join("examples/Cargo.toml"),
            root.join("model_repository"),
            root.join("functions"),
        ),
        (
            root.join("tests/guests/Cargo.toml"),
            root.join("tests/fixtures/model_repository"),
            root.join("tests/fixtures/functions"),
        ),
    ];
    for (manifest, repository, functions) in guests {
        if !manifest.exists() {
            continue;
        }
        let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.arg("build")
            .arg("--release")
            .arg("--target=wasm32-wasip2")
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target_dir);
        // The outer build's flags and target belong to the host, not to the guests.
        for var in [
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTFLAGS",
            "CARGO_BUILD_TARGET",
            "CARGO_TARGET_DIR",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO_MAKEFLAGS",
            "MAKEFLAGS",
            "MFLAGS",
        ] {
            cmd.env_remove(var);
        }
        let status = cmd.status().expect("cargo can be spawned");
        if !status.success() {
            panic!(
                "building the Wasm guests in {} failed (is the target installed? `rustup target add wasm32-wasip2`)",
                manifest.display()
            );
        }
        install_components(&target_dir.join("wasm32-wasip2/release"), &repository);
        install_functions(&target_dir.join("wasm32-wasip2/release"), &functions);
    }
}

/// Copies `<name>.wasm` to `<functions>/<name>/function.wasm` for each function folder there (or
/// the component its `function.toml` names with a `# component: <crate>` line).
fn install_functions(built: &Path, functions: &Path) {
    let Ok(entries) = std::fs::read_dir(functions) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let Some(name) = dir.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        let manifest = std::fs::read_to_string(dir.join("function.toml")).unwrap_or_default();
        let crate_name = manifest
            .lines()
            .find_map(|l| l.trim().strip_prefix("# component:"))
            .map_or(name.as_str(), str::trim);
        copy_if_changed(
            &built.join(format!("{crate_name}.wasm")),
            &dir.join("function.wasm"),
            &name,
        );
    }
}

fn copy_if_changed(component: &Path, dest: &Path, name: &str) {
    if !component.exists() {
        println!("cargo:warning=no component built for '{name}'");
        return;
    }
    let fresh = std::fs::read(component).expect("read component");
    if std::fs::read(dest).ok().as_deref() != Some(fresh.as_slice()) {
        std::fs::write(dest, fresh).expect("install component");
    }
}

/// Copies `<name>.wasm` to `<repository>/<name>/1/model.wasm` for each Wasm model there (or the
/// component its config names with a `# component: <crate>` line).
fn install_components(built: &Path, repository: &Path) {
    let Ok(entries) = std::fs::read_dir(repository) else {
        return;
    };
    for entry in entries.flatten() {
        let model_dir = entry.path();
        let Some(name) = model_dir
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
        else {
            continue;
        };
        let config = std::fs::read_to_string(model_dir.join("config.pbtxt")).unwrap_or_default();
        if !config.contains("\"wasm\"") {
            continue;
        }
        // A fixture may serve another crate's component: `# component: <crate>` in its config.
        let crate_name = config
            .lines()
            .find_map(|l| l.trim().strip_prefix("# component:"))
            .map_or(name.as_str(), str::trim);
        let dest_dir = model_dir.join("1");
        std::fs::create_dir_all(&dest_dir).expect("create version folder");
        copy_if_changed(
            &built.join(format!("{crate_name}.wasm")),
            &dest_dir.join("model.wasm"),
            &name,
        );
    }
}
