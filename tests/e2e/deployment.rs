//! Deploying without a restart: Triton's `load` with files into the deployment store, hot swap
//! under load, crash safety under SIGKILL, bad deployments, rollback and unload across restarts,
//! and the `tessera deploy / models / rollback / unload` commands.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{
    Hammer, TestServer, echo_component, echo_config, output_f32, repo_root, shared_cache, temp_dir,
    tessera_cli,
};

/// What the model answers for X = 0: its offset, or the error.
async fn answer(server: &TestServer, name: &str) -> Result<f32, String> {
    let (status, body) = server
        .infer(
            name,
            json!([{ "name": "X", "shape": [1, 1], "datatype": "FP32", "data": [0.0] }]),
        )
        .await;
    if status != 200 {
        return Err(format!("{status} {body}"));
    }
    Ok(output_f32(&body, "Y")[0])
}

/// Every path under `dir` with its size, to show that a refused deployment changed nothing.
fn listing(dir: &Path) -> Vec<(PathBuf, u64)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let len = entry.metadata().map_or(0, |m| m.len());
            if path.is_dir() {
                walk(&path, out);
            }
            out.push((path, len));
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

#[tokio::test]
async fn hot_swap_under_load_switches_once_without_errors() {
    let repo = temp_dir("empty-repo");
    let server = TestServer::start(&[repo], &[], &shared_cache()).await;
    let wasm = echo_component();
    let (status, body) = server
        .deploy("swap", &echo_config("swap", 1), &[("1/model.wasm", &wasm)])
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["revision"], 1, "{body}");
    assert_eq!(answer(&server, "swap").await, Ok(1.0));

    let server = Arc::new(server);
    let hammer = Hammer::start(8, {
        let server = server.clone();
        move || {
            let server = server.clone();
            async move { answer(&server, "swap").await }
        }
    });
    hammer.wait_calls(50).await;
    let (status, body) = server
        .deploy("swap", &echo_config("swap", 2), &[("1/model.wasm", &wasm)])
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["revision"], 2, "{body}");
    // Acknowledged means serving: the next request sees the new revision.
    assert_eq!(answer(&server, "swap").await, Ok(2.0));
    hammer.wait_calls(50).await;

    let (mut old, mut new) = (0, 0);
    for seen in hammer.stop().await {
        let errors: Vec<_> = seen.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(
            errors.is_empty(),
            "requests failed across the swap: {errors:?}"
        );
        let values: Vec<f32> = seen.into_iter().map(Result::unwrap_or_default).collect();
        let switch = values
            .iter()
            .position(|&v| v == 2.0)
            .unwrap_or(values.len());
        assert!(
            values[..switch].iter().all(|&v| v == 1.0)
                && values[switch..].iter().all(|&v| v == 2.0),
            "answers must switch from old to new once and never back: {values:?}"
        );
        old += switch;
        new += values.len() - switch;
    }
    assert!(
        old > 0 && new > 0,
        "both revisions answered ({old} old, {new} new)"
    );
    let server = Arc::into_inner(server).expect("clients are done");
    let log = server.stop();
    assert!(log.contains("deployed"), "{log}");
}

#[tokio::test]
async fn acknowledged_deployments_survive_sigkill_at_any_moment() {
    let repo = temp_dir("empty-repo");
    let store = temp_dir("crash-store");
    let store_arg = store.to_str().expect("utf-8 path").to_owned();
    let args = ["--store", store_arg.as_str()];
    let wasm = echo_component();
    let mut server = TestServer::start(std::slice::from_ref(&repo), &args, &shared_cache()).await;

    // How long a deployment takes here (the component compiled already), to spread the kills
    // over it. Each round deploys to a freshly started server, which may take longer or
    // shorter than this warm one: the window then follows what the rounds see (wider after a
    // kill that came too early, narrower after one that came too late), so both outcomes keep
    // coming however the machine's speed differs from the calibration.
    let (status, body) = server
        .deploy(
            "crash",
            &echo_config("crash", 100),
            &[("1/model.wasm", &wasm)],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let started = Instant::now();
    let (status, body) = server
        .deploy(
            "crash",
            &echo_config("crash", 0),
            &[("1/model.wasm", &wasm)],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let mut span_ms = (started.elapsed().as_millis() as u64 * 2).max(20);
    let mut acknowledged = 0u32;

    // A fixed seed: a failure replays the same kill times.
    let mut seed: u64 = 0x7e55_e7a5_eed5_0001;
    let mut random = move |below: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % below
    };
    let (mut killed_before_ack, mut acked) = (0, 0);
    let mut round = 0u32;
    while round < 20 || (round < 40 && (acked == 0 || killed_before_ack == 0)) {
        round += 1;
        let server_ref = Arc::new(server);
        let url = server_ref.url("/v2/repository/models/crash/load");
        let body = {
            use base64::Engine as _;
            json!({ "parameters": {
                "config": echo_config("crash", round).to_string(),
                "file:1/model.wasm": base64::engine::general_purpose::STANDARD.encode(&wasm),
            }})
        };
        let client = server_ref.client.clone();
        let deploy = tokio::spawn(async move {
            match client.post(url).json(&body).send().await {
                Ok(r) => r.status().as_u16(),
                Err(_) => 0,
            }
        });
        tokio::time::sleep(Duration::from_millis(random(span_ms))).await;
        let pid = server_ref.pid().to_string();
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
        let status = deploy.await.expect("deploy task");
        if status == 200 {
            acknowledged = round;
            acked += 1;
            span_ms = (span_ms * 2 / 3).max(5);
        } else {
            killed_before_ack += 1;
            span_ms = span_ms * 3 / 2 + 1;
        }
        drop(Arc::into_inner(server_ref).expect("one owner").stop());

        server = TestServer::start(std::slice::from_ref(&repo), &args, &shared_cache()).await;
        let serving = answer(&server, "crash").await;
        if acknowledged == round {
            assert_eq!(
                serving,
                Ok(round as f32),
                "round {round}: acknowledged, must serve"
            );
        } else {
            // Not acknowledged: the previous deployment, or the new one if it completed.
            let serving = serving.unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert!(
                serving == acknowledged as f32 || serving == round as f32,
                "round {round}: serves {serving}, expected {acknowledged} or {round}"
            );
            acknowledged = serving as u32;
        }
        // Nothing half-written is visible: staging is empty, every revision is in the manifest.
        assert_eq!(
            std::fs::read_dir(store.join("tmp")).expect("tmp").count(),
            0
        );
        let manifest: Value = serde_json::from_slice(
            &std::fs::read(store.join("models/crash/manifest.json")).expect("manifest"),
        )
        .expect("manifest is whole JSON");
        let named: Vec<String> = manifest["revisions"]
            .as_array()
            .expect("revisions")
            .iter()
            .map(|r| r["revision"].to_string())
            .collect();
        for entry in std::fs::read_dir(store.join("models/crash")).expect("model dir") {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            assert!(
                name == "manifest.json" || named.contains(&name),
                "round {round}: {name} is not a published revision ({named:?})"
            );
        }
    }
    eprintln!("{acked} deployments acknowledged, {killed_before_ack} killed before the answer");
    assert!(
        acked > 0 && killed_before_ack > 0,
        "the kills hit both before and after the answer"
    );
    server.stop();
}

#[tokio::test]
async fn bad_deployments_are_refused_and_change_nothing() {
    let repo = temp_dir("empty-repo");
    let store = temp_dir("bad-store");
    let args = [
        "--store",
        store.to_str().expect("utf-8"),
        "--max-deployment-bytes",
        "400000",
    ];
    let server = TestServer::start(&[repo], &args, &shared_cache()).await;
    let wasm = echo_component();
    let (status, body) = server
        .deploy("good", &echo_config("good", 1), &[("1/model.wasm", &wasm)])
        .await;
    assert_eq!(status, 200, "{body}");
    let before = (listing(&store), server.states().await);

    let other_world =
        std::fs::read(repo_root().join("target/guests/wasm32-wasip2/release/cli_hello.wasm"))
            .expect("the build compiles the cli_hello fixture");
    let imports_http = std::fs::read(
        repo_root().join("target/guests/wasm32-wasip2/release/guest_http_import.wasm"),
    )
    .expect("the build compiles the guest_http_import fixture");
    let core_module = b"\0asm\x01\0\0\0".to_vec();
    let oversized = vec![0u8; 500_000];
    let config = echo_config("bad", 1);
    // (what, model name, config, files, status, text the error contains)
    type Case<'a> = (
        &'a str,
        &'a str,
        Value,
        Vec<(&'a str, &'a [u8])>,
        u16,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "core module",
            "bad",
            config.clone(),
            vec![("1/model.wasm", &core_module)],
            400,
            "core Wasm module",
        ),
        (
            "another world",
            "bad",
            config.clone(),
            vec![("1/model.wasm", &other_world)],
            400,
            "tessera:inference/model",
        ),
        (
            "a handler that imports wasi:http (as a JS build with fetch does)",
            "bad",
            config.clone(),
            vec![("1/model.wasm", &imports_http)],
            400,
            // The import is named (wasmtime's words), then the fix (which follows from it).
            "model handlers cannot make HTTP requests",
        ),
        (
            "not JSON",
            "bad",
            Value::String("{nope".into()),
            vec![("1/model.wasm", &wasm)],
            400,
            "config",
        ),
        (
            "unknown field",
            "bad",
            json!({ "nmae": "bad" }),
            vec![("1/model.wasm", &wasm)],
            400,
            "nmae",
        ),
        (
            "too large",
            "bad",
            config.clone(),
            vec![("1/model.wasm", &oversized)],
            413,
            "max-deployment-bytes",
        ),
        (
            "path escapes",
            "bad",
            config.clone(),
            vec![("../../evil", &wasm)],
            400,
            "invalid file path",
        ),
        (
            "one file named twice",
            "bad",
            config.clone(),
            vec![("1/model.wasm", &wasm), ("1//model.wasm", &wasm)],
            400,
            "is given twice",
        ),
        (
            "slash in name",
            "a%2Fb",
            config.clone(),
            vec![("1/model.wasm", &wasm)],
            400,
            "invalid model name",
        ),
        (
            "dot-dot name",
            "..evil",
            config.clone(),
            vec![("1/model.wasm", &wasm)],
            400,
            "invalid model name",
        ),
        (
            "name mismatch",
            "other",
            config.clone(),
            vec![("1/model.wasm", &wasm)],
            400,
            "names the model",
        ),
        (
            "a good name over a good model, broken",
            "good",
            echo_config("good", 1)
                .as_object()
                .map(|o| {
                    let mut o = o.clone();
                    o.insert("max_batch_size".into(), json!(-1));
                    Value::Object(o)
                })
                .expect("object"),
            vec![("1/model.wasm", &wasm)],
            400,
            "failed to load 'good'",
        ),
    ];
    for (what, name, config, files, want_status, want_text) in cases {
        // A config that is not JSON goes as the raw string.
        let (status, body) = match &config {
            Value::String(raw) => {
                use base64::Engine as _;
                let mut parameters = serde_json::Map::new();
                parameters.insert("config".into(), Value::String(raw.clone()));
                for (path, bytes) in &files {
                    parameters.insert(
                        format!("file:{path}"),
                        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
                    );
                }
                server
                    .post_json(
                        &format!("/v2/repository/models/{name}/load"),
                        &json!({ "parameters": parameters }),
                    )
                    .await
            }
            _ => server.deploy(name, &config, &files).await,
        };
        assert_eq!(status, want_status, "{what}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(want_text), "{what}: {error}");
        assert_eq!(
            (listing(&store), server.states().await),
            before,
            "{what}: a refused deployment changed something"
        );
        assert_eq!(answer(&server, "good").await, Ok(1.0), "{what}");
    }
    server.stop();
}

#[tokio::test]
async fn rollback_unload_and_restart_with_the_command_line() {
    let repo = temp_dir("cli-repo");
    // A repository model (one that fails to load: no component) that a deployment replaces.
    std::fs::create_dir_all(repo.join("cli_stream/1")).expect("repository model folder");
    std::fs::write(
        repo.join("cli_stream/config.pbtxt"),
        "name: \"cli_stream\"\nbackend: \"wasm\"\n",
    )
    .expect("repository model config");
    let store = temp_dir("cli-store");
    let cache = temp_dir("cli-cache");
    let args = ["--store", store.to_str().expect("utf-8")];
    let server = TestServer::start(std::slice::from_ref(&repo), &args, &cache).await;
    let base = server.base.clone();

    // `tessera deploy DIR`, twice with different configs.
    let model_dir = temp_dir("cli-model");
    std::fs::create_dir_all(model_dir.join("1")).expect("version folder");
    std::fs::write(model_dir.join("1/model.wasm"), echo_component()).expect("component");
    // Parameters of its own beside the handler's: a map, whose order must not make the same
    // configuration look changed.
    let labels: String = (0..8)
        .map(|i| format!("parameters {{ key: \"label_{i}\" value {{ string_value: \"{i}\" }} }}\n"))
        .collect();
    let write_config = |offset: u32| {
        let text = format!(
            "name: \"cli\"\nbackend: \"wasm\"\nmax_batch_size: 8\n\
             input [ {{ name: \"X\" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n\
             output [ {{ name: \"Y\" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n\
             parameters {{ key: \"offset\" value {{ string_value: \"{offset}\" }} }}\n{labels}"
        );
        std::fs::write(model_dir.join("config.pbtxt"), text).expect("config");
    };
    let dir = model_dir.to_str().expect("utf-8");
    write_config(1);
    let (ok, out) = tessera_cli(&["deploy", dir, "--server", &base]);
    assert!(ok, "{out}");
    assert!(
        out.contains("revision 1") && out.contains("/v2/models/cli/infer"),
        "{out}"
    );
    assert!(!out.contains("serves instead"), "{out}");
    write_config(2);
    let (ok, out) = tessera_cli(&["deploy", dir, "--server", &base]);
    assert!(ok && out.contains("revision 2"), "{out}");
    assert_eq!(answer(&server, "cli").await, Ok(2.0));
    for _ in 0..3 {
        let (ok, out) = tessera_cli(&["deploy", dir, "--server", &base]);
        assert!(
            ok && out.contains("unchanged"),
            "a re-deploy of the same files: {out}"
        );
    }
    // A decoupled model's URL is the streaming one (`/infer` refuses it).
    let decoupled = crate::harness::examples_repo().join("repeat_int32");
    let (ok, out) = tessera_cli(&[
        "deploy",
        decoupled.to_str().expect("utf-8"),
        "--name",
        "cli_stream",
        "--server",
        &base,
    ]);
    assert!(
        ok && out.contains("/v2/models/cli_stream/generate_stream"),
        "{out}"
    );
    // It has the name of a repository model: said, not silent.
    let folder = repo.join("cli_stream");
    assert!(
        out.contains(&format!(
            "serves instead of the repository's model in {}",
            folder.display()
        )),
        "{out}"
    );
    let (status, body) = server.get("/v2/models/cli_stream/config").await;
    assert_eq!(status, 200, "the deployment serves: {body}");

    let (ok, out) = tessera_cli(&["rollback", "cli", "--server", &base]);
    assert!(ok && out.contains("revision 1"), "{out}");
    assert_eq!(answer(&server, "cli").await, Ok(1.0));
    let (ok, out) = tessera_cli(&["models", "--server", &base]);
    assert!(ok && out.contains("cli") && out.contains("READY"), "{out}");
    let (ok, out) = tessera_cli(&["rollback", "nothing", "--server", &base]);
    assert!(!ok && out.contains("no deployed revision"), "{out}");
    assert!(
        !out.contains("backtrace"),
        "errors are one clear message: {out}"
    );

    // The rollback is durable, and a restart compiles nothing.
    let log = server.stop();
    assert!(log.contains("deployed"), "{log}");
    let server = TestServer::start(std::slice::from_ref(&repo), &args, &cache).await;
    assert_eq!(answer(&server, "cli").await, Ok(1.0), "after a restart");
    let metrics = server.metrics().await;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("tessera_wasm_compile_cache_misses_total") && !l.ends_with(" 0")),
        "a restart takes compiled code from the cache:\n{metrics}"
    );

    // An unload is durable too; loading it again serves the same revision.
    let (ok, out) = tessera_cli(&["unload", "cli", "--server", &server.base]);
    assert!(ok && out.contains("cli"), "{out}");
    assert!(answer(&server, "cli").await.is_err());
    server.stop();
    let server = TestServer::start(std::slice::from_ref(&repo), &args, &cache).await;
    assert!(
        answer(&server, "cli").await.is_err(),
        "stays unloaded after a restart"
    );
    let (status, body) = server
        .post_json("/v2/repository/models/cli/load", &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(answer(&server, "cli").await, Ok(1.0));
    server.stop();

    // A revision whose config.pbtxt was lost on disk is not served with an empty one.
    std::fs::remove_file(store.join("models/cli/1/config.pbtxt")).expect("the revision's config");
    let server = TestServer::start(std::slice::from_ref(&repo), &args, &cache).await;
    let (status, body) = server.post_json("/v2/repository/index", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let index = body.to_string();
    assert!(
        index.contains("UNAVAILABLE") && index.contains("has no config.pbtxt"),
        "{index}"
    );
    assert!(answer(&server, "cli").await.is_err());
    server.stop();
}

#[test]
fn a_store_url_of_an_unsupported_scheme_is_refused_not_made_a_folder() {
    let dir = temp_dir("store-url");
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .current_dir(&dir)
        .args(["--store", "gs://bucket/prefix", "--http-port", "0"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("gs://bucket/prefix") && stderr.contains("not supported"),
        "{stderr}"
    );
    assert!(
        !dir.join("gs:").exists(),
        "a local folder was made for the URL"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_http_port_comes_from_port_as_knative_sets_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let port_text = port.to_string();
    let server =
        TestServer::start_with_env(&[], &[], &shared_cache(), &[("PORT", port_text.as_str())])
            .await;
    assert!(
        server.base.ends_with(&format!(":{port}")),
        "{} is not on PORT {port}",
        server.base
    );
    let ready = server
        .client
        .get(server.url("/v2/health/ready"))
        .send()
        .await
        .expect("answers");
    assert_eq!(ready.status(), 200);
    server.stop();
}
