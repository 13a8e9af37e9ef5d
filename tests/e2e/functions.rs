//! HTTP functions: `wasi:http` components served at `/v1/functions/<name>/...`, built from
//! `examples/` (hello, classify_text) and `tests/guests/function_probe`, over real HTTP.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{
    Hammer, TestServer, examples_repo, fixtures_repo, largest_batch, repo_root,
    require_onnx_runtime, shared_cache, temp_dir, tessera_cli, wait_until,
};

fn example_functions() -> String {
    repo_root().join("functions").display().to_string()
}

fn fixture_functions() -> String {
    repo_root()
        .join("tests/fixtures/functions")
        .display()
        .to_string()
}

/// Sends `method path body` and returns (status, headers, body text).
async fn call(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: Vec<u8>,
) -> (u16, reqwest::header::HeaderMap, String) {
    let response = server
        .client
        .request(method, server.url(path))
        .body(body)
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap_or_default();
    (status, headers, text)
}

async fn get(server: &TestServer, path: &str) -> (u16, String) {
    let (status, _, text) = call(server, reqwest::Method::GET, path, Vec::new()).await;
    (status, text)
}

#[tokio::test]
async fn hello_streams_bodies_both_ways() {
    let repo = temp_dir("empty-repo");
    let functions = example_functions();
    let server = TestServer::start(&[repo], &["--functions", &functions], &shared_cache()).await;
    assert_eq!(
        get(&server, "/v1/functions/hello/").await,
        (200, "Hello from Tessera!\n".to_owned()),
        "the manifest's GREETING reaches the guest"
    );
    let (status, text) = get(&server, "/v1/functions/hello/nowhere?x=1").await;
    assert_eq!(
        (status, text.as_str()),
        (404, "not found\n"),
        "the guest's own 404"
    );
    // 8 MiB through the guest and back, in both directions as a stream.
    let body: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    let response = server
        .client
        .post(server.url("/v1/functions/hello/echo"))
        .body(body.clone())
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status(), 200);
    let echoed = response.bytes().await.expect("the whole body");
    assert!(
        echoed.as_ref() == body.as_slice(),
        "{} bytes came back",
        echoed.len()
    );
    let (status, list) = server.get("/v1/functions").await;
    assert_eq!(status, 200);
    assert!(
        list.as_array()
            .expect("list")
            .iter()
            .any(|f| f["name"] == "hello" && f["state"] == "READY"),
        "{list}"
    );
    server.stop();
}

#[tokio::test]
async fn classify_text_calls_the_embedding_ensemble() {
    require_onnx_runtime!();
    let functions = example_functions();
    let server = TestServer::start(
        &[examples_repo()],
        &["--functions", &functions],
        &shared_cache(),
    )
    .await;
    for (text, want) in [
        (
            "The striker scored twice and the team won the league",
            "sports",
        ),
        (
            "Add the garlic and simmer the tomato sauce for pasta",
            "food",
        ),
    ] {
        let (status, _, body) = call(
            &server,
            reqwest::Method::POST,
            "/v1/functions/classify_text/",
            json!({ "text": text }).to_string().into_bytes(),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(answer["label"], want, "{answer}");
        assert_eq!(answer["scores"].as_object().expect("scores").len(), 5);
    }
    let (status, _, body) = call(
        &server,
        reqwest::Method::POST,
        "/v1/functions/classify_text/",
        b"not json".to_vec(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // Its calls went through embed_text's queue like any request.
    let (_, stats) = server.get("/v2/models/embed_text/stats").await;
    assert!(
        stats["model_stats"][0]["inference_count"].as_u64() >= Some(2),
        "{stats}"
    );
    server.stop();
}

#[tokio::test]
async fn a_function_is_isolated() {
    let repo = temp_dir("empty-repo");
    let functions = fixture_functions();
    let server = TestServer::start(&[repo], &["--functions", &functions], &shared_cache()).await;
    let probe = |p: &str| format!("/v1/functions/function_probe/{p}");
    // A static does not survive: every invocation has a fresh instance.
    for _ in 0..3 {
        assert_eq!(get(&server, &probe("count")).await, (200, "1".to_owned()));
    }
    assert_eq!(
        get(&server, &probe("env")).await,
        (200, "VISIBLE=yes\n".to_owned()),
        "only the manifest's environment, none of the server's"
    );
    let (_, file) = get(&server, &probe("file")).await;
    assert!(file.starts_with("denied:"), "{file}");
    // Outgoing HTTP: the manifest allows 127.0.0.1 only.
    let port = server.base.rsplit(':').next().expect("port").to_owned();
    let (_, allowed) = get(
        &server,
        &probe(&format!("fetch?http://127.0.0.1:{port}/v2/health/live")),
    )
    .await;
    assert_eq!(allowed, "status 200");
    let (_, denied) = get(
        &server,
        &probe(&format!("fetch?http://localhost:{port}/v2/health/live")),
    )
    .await;
    assert!(denied.contains("HttpRequestDenied"), "{denied}");
    // The path reaches the guest as the client wrote it, still encoded (as `wasmtime serve`
    // passes it): a decoded `%3F` would start a query, a `%2F` or `..` would pass its routing.
    for (sent, seen) in [
        ("status%3F418", "unknown probe /status%3F418"),
        ("a%2Fb", "unknown probe /a%2Fb"),
        ("..%2F..%2Fetc", "unknown probe /..%2F..%2Fetc"),
        ("a%20b", "unknown probe /a%20b"),
    ] {
        assert_eq!(get(&server, &probe(sent)).await, (200, seen.to_owned()));
    }
    // An answer the server gives for the function, its body unread, says the connection ends.
    let (status, headers, _) = call(
        &server,
        reqwest::Method::POST,
        "/v1/functions/no_such_function/",
        vec![0; 4096],
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    let log = server.stop();
    assert!(log.contains("denied: not in allowed_hosts"), "{log}");
}

#[tokio::test]
async fn each_limit_gives_its_status_and_others_keep_serving() {
    let repo = temp_dir("empty-repo");
    let functions = fixture_functions();
    let server = TestServer::start(&[repo], &["--functions", &functions], &shared_cache()).await;
    let tight = |p: &str| format!("/v1/functions/function_tight/{p}");

    let started = Instant::now();
    let (status, text) = get(&server, &tight("spin")).await;
    assert_eq!(status, 504, "{text}");
    assert!(text.contains("time limit of 1500 ms"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let (status, text) = get(&server, &tight("alloc?64")).await;
    assert_eq!(status, 500, "{text}");
    assert!(text.contains("memory limit"), "{text}");

    let (status, _, text) = call(
        &server,
        reqwest::Method::POST,
        &tight("echo"),
        vec![0; 4096],
    )
    .await;
    assert_eq!(status, 413, "{text}");

    let (status, text) = get(&server, &tight("panic")).await;
    assert_eq!(status, 500, "{text}");
    assert!(
        text.contains("details in the server log") && !text.contains("panicked"),
        "a guest's panic stays in the log: {text}"
    );

    // One invocation at a time: a second one meanwhile is refused at once. The instances of the
    // calls above are gone first, so the one live instance counted next is the slow call's. It
    // sleeps 1 s of its 1.5 s limit: room for a slow instantiation, and for the second call to
    // arrive while it runs.
    wait_until("no instance of function_tight is live", || {
        server.has_metric("tessera_function_instances_live{function=\"function_tight\"} 0")
    })
    .await;
    let slow = {
        let (client, url) = (server.client.clone(), server.url(&tight("sleep?1000")));
        tokio::spawn(async move { client.get(url).send().await.map(|r| r.status().as_u16()) })
    };
    wait_until("the slow invocation runs", || {
        server.has_metric("tessera_function_instances_live{function=\"function_tight\"} 1")
    })
    .await;
    let (status, headers, text) =
        call(&server, reqwest::Method::GET, &tight("count"), Vec::new()).await;
    assert_eq!(status, 429, "{text}");
    assert_eq!(
        headers.get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    assert_eq!(slow.await.expect("task").expect("answered"), 200);

    // Nobody else was harmed, and the limited function serves again.
    assert_eq!(
        get(&server, "/v1/functions/function_probe/count").await.0,
        200
    );
    assert_eq!(get(&server, &tight("count")).await, (200, "1".to_owned()));
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(
            "tessera_function_invocations_total{function=\"function_tight\",status=\"5xx\"} 3"
        ),
        "{metrics}"
    );
    let log = server.stop();
    assert!(log.contains("the probe panics on request"), "{log}");
}

/// The lines of a streamed body up to its end, and whether it ended in an error (cut).
async fn read_streamed(server: &TestServer, path: &str) -> (u16, String, bool) {
    let mut response = server
        .client
        .get(server.url(path))
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    let mut text = String::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(None) => return (status, text, false),
            Err(_) => return (status, text, true),
        }
    }
}

#[tokio::test]
async fn a_body_cut_by_a_trap_or_the_time_limit_does_not_read_as_complete() {
    let repo = temp_dir("empty-repo");
    let functions = fixture_functions();
    let server = TestServer::start(&[repo], &["--functions", &functions], &shared_cache()).await;
    // Three lines, then a panic: the head and the lines went out, the end must not.
    let (status, text, cut) =
        read_streamed(&server, "/v1/functions/function_probe/trickle?3").await;
    assert_eq!((status, text.as_str(), cut), (200, "0\n1\n2\n", true));
    // The time limit (1.5 s) falls while the body trickles (a line each 100 ms, 100 lines).
    let (status, text, cut) =
        read_streamed(&server, "/v1/functions/function_tight/trickle?100").await;
    assert!(status == 200 && cut, "{status} {text:?} cut={cut}");
    assert!(text.lines().count() < 50, "{text:?}");
    // A body that completes still reads as complete.
    let (status, text, cut) = read_streamed(&server, "/v1/functions/function_probe/big?1").await;
    assert_eq!((status, text.len(), cut), (200, 1024, false));
    // An informational status is no answer (hyper would switch protocols on a 101), nor is a
    // number past 599.
    for code in [100, 101, 103, 600, 999] {
        let (status, text) = get(
            &server,
            &format!("/v1/functions/function_probe/status?{code}"),
        )
        .await;
        assert_eq!(status, 500, "{code}: {text}");
    }
    assert_eq!(
        get(&server, "/v1/functions/function_probe/status?418")
            .await
            .0,
        418
    );
    let log = server.stop();
    assert!(log.contains("the response is cut"), "{log}");
    assert!(log.contains("status 101, an informational status"), "{log}");
}

#[tokio::test]
async fn concurrent_invocations_are_batched_with_everyone_else() {
    let repo = temp_dir("empty-repo");
    let functions = fixture_functions();
    let server = TestServer::start(&[repo], &["--functions", &functions], &shared_cache()).await;
    let wasm = std::fs::read(fixtures_repo().join("identity_echo/1/model.wasm"))
        .expect("the build installs identity_echo");
    let config = json!({
        "name": "batched_echo", "backend": "wasm", "max_batch_size": 8,
        "input": [{ "name": "X", "data_type": "TYPE_FP32", "dims": [1] }],
        "output": [{ "name": "Y", "data_type": "TYPE_FP32", "dims": [1] }],
        "dynamic_batching": { "max_queue_delay_microseconds": 100000 }
    });
    let (status, body) = server
        .deploy("batched_echo", &config, &[("1/model.wasm", &wasm)])
        .await;
    assert_eq!(status, 200, "{body}");
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let (client, url) = (
                server.client.clone(),
                server.url("/v1/functions/function_probe/infer?batched_echo"),
            );
            tokio::spawn(async move {
                let r = client.get(url).send().await.expect("answers");
                (r.status().as_u16(), r.text().await.unwrap_or_default())
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.expect("task"), (200, "[1.0]".to_owned()));
    }
    let (_, stats) = server.get("/v2/models/batched_echo/stats").await;
    let m = &stats["model_stats"][0];
    assert_eq!(m["inference_count"], 16, "{m}");
    let largest = largest_batch(m);
    assert!(largest > 1, "function calls were batched together: {m}");
    server.stop();
}

#[tokio::test]
async fn a_component_of_another_kind_is_refused_with_the_reason() {
    let repo = temp_dir("empty-repo");
    let folder = temp_dir("bad-functions");
    for (name, bytes) in [
        (
            "a_model",
            std::fs::read(fixtures_repo().join("identity_echo/1/model.wasm")).expect("component"),
        ),
        ("a_core_module", b"\0asm\x01\0\0\0".to_vec()),
    ] {
        std::fs::create_dir_all(folder.join(name)).expect("folder");
        std::fs::write(folder.join(name).join("function.wasm"), bytes).expect("component");
    }
    std::fs::create_dir_all(folder.join("bad_manifest")).expect("folder");
    std::fs::write(
        folder.join("bad_manifest/function.wasm"),
        std::fs::read(repo_root().join("functions/hello/function.wasm")).expect("hello"),
    )
    .expect("component");
    std::fs::write(
        folder.join("bad_manifest/function.toml"),
        "[limits]\ntimeout = 1\n",
    )
    .expect("manifest");
    let dir = folder.display().to_string();
    let server = TestServer::start(&[repo], &["--functions", &dir], &shared_cache()).await;
    let (_, list) = server.get("/v1/functions").await;
    let reason = |name: &str| -> String {
        list.as_array()
            .expect("list")
            .iter()
            .find(|f| f["name"] == name)
            .map(|f| {
                assert_eq!(f["state"], "UNAVAILABLE", "{f}");
                f["reason"].as_str().unwrap_or_default().to_owned()
            })
            .unwrap_or_else(|| panic!("{name} is not listed: {list}"))
    };
    assert!(reason("a_model").contains("does not export wasi:http/incoming-handler"));
    assert!(reason("a_core_module").contains("core Wasm module"));
    assert!(reason("bad_manifest").contains("timeout"));
    let (status, text) = get(&server, "/v1/functions/a_model/").await;
    assert_eq!(status, 503, "{text}");
    let (status, _) = get(&server, "/v1/functions/nothing/").await;
    assert_eq!(status, 404);
    server.stop();
}

#[tokio::test]
async fn functions_deploy_roll_back_and_survive_restarts() {
    let repo = temp_dir("empty-repo");
    let store = temp_dir("function-store");
    let args = ["--store", store.to_str().expect("utf-8")];
    let server = TestServer::start(std::slice::from_ref(&repo), &args, &shared_cache()).await;
    let base = server.base.clone();
    let folder = temp_dir("greeter");
    std::fs::copy(
        repo_root().join("functions/hello/function.wasm"),
        folder.join("function.wasm"),
    )
    .expect("hello is built");
    let greet = |text: &str| {
        std::fs::write(
            folder.join("function.toml"),
            format!("[env]\nGREETING = \"{text}\"\n"),
        )
        .expect("manifest");
    };
    let dir = folder.to_str().expect("utf-8");

    greet("One");
    let (ok, out) = tessera_cli(&["deploy", dir, "--name", "greeter", "--server", &base]);
    assert!(
        ok && out.contains("revision 1") && out.contains("/v1/functions/greeter/"),
        "{out}"
    );
    assert_eq!(
        get(&server, "/v1/functions/greeter/").await,
        (200, "One!\n".to_owned())
    );
    greet("Two");
    let (ok, out) = tessera_cli(&["deploy", dir, "--name", "greeter", "--server", &base]);
    assert!(ok && out.contains("revision 2"), "{out}");
    assert_eq!(
        get(&server, "/v1/functions/greeter/").await,
        (200, "Two!\n".to_owned())
    );
    // The function's counters span its revisions: two calls, not one since the deploy.
    let metrics = server.metrics().await;
    assert!(
        metrics
            .contains("tessera_function_invocations_total{function=\"greeter\",status=\"2xx\"} 2"),
        "{metrics}"
    );
    let (ok, out) = tessera_cli(&["deploy", dir, "--name", "greeter", "--server", &base]);
    assert!(ok && out.contains("unchanged"), "{out}");

    // A bad deployment is refused and changes nothing.
    let model = std::fs::read(fixtures_repo().join("identity_echo/1/model.wasm")).expect("model");
    let before = std::fs::read_dir(store.join("functions/greeter"))
        .expect("store")
        .count();
    let (status, body) = {
        use base64::Engine as _;
        server
            .post_json(
                "/v2/repository/functions/greeter/load",
                &json!({ "parameters": {
                    "file:function.wasm": base64::engine::general_purpose::STANDARD.encode(&model)
                }}),
            )
            .await
    };
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("wasi:http"),
        "{body}"
    );
    // A memory limit below what the component starts with: no call could ever run.
    let (status, body) = {
        use base64::Engine as _;
        let hello = std::fs::read(folder.join("function.wasm")).expect("hello");
        server
            .post_json(
                "/v2/repository/functions/greeter/load",
                &json!({ "parameters": {
                    "file:function.wasm": base64::engine::general_purpose::STANDARD.encode(&hello),
                    "manifest": "[limits]\nmax_memory_bytes = 65536\n",
                }}),
            )
            .await
    };
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("bytes of memory, more than its max_memory_bytes")),
        "{body}"
    );
    assert_eq!(
        std::fs::read_dir(store.join("functions/greeter"))
            .expect("store")
            .count(),
        before
    );
    assert_eq!(
        get(&server, "/v1/functions/greeter/").await,
        (200, "Two!\n".to_owned())
    );

    let (ok, out) = tessera_cli(&["rollback", "greeter", "--function", "--server", &base]);
    assert!(ok && out.contains("revision 1"), "{out}");
    let (ok, out) = tessera_cli(&["rollback", "nothere", "--function", "--server", &base]);
    assert!(
        !ok && out.contains("function 'nothere' has no deployed revision"),
        "{out}"
    );
    assert_eq!(
        get(&server, "/v1/functions/greeter/").await,
        (200, "One!\n".to_owned())
    );

    // Durable: a SIGKILL and a restart serve the same revision.
    server.stop();
    let server = TestServer::start(std::slice::from_ref(&repo), &args, &shared_cache()).await;
    assert_eq!(
        get(&server, "/v1/functions/greeter/").await,
        (200, "One!\n".to_owned())
    );
    let (ok, out) = tessera_cli(&["unload", "greeter", "--function", "--server", &server.base]);
    assert!(ok, "{out}");
    assert_eq!(get(&server, "/v1/functions/greeter/").await.0, 404);
    server.stop();
    let server = TestServer::start(std::slice::from_ref(&repo), &args, &shared_cache()).await;
    assert_eq!(
        get(&server, "/v1/functions/greeter/").await.0,
        404,
        "stays unloaded"
    );
    // Listed as unloaded, as the repository index lists an unloaded model, not gone.
    let (status, listing) = server.get("/v1/functions").await;
    assert_eq!(status, 200, "{listing}");
    let row = listing
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == "greeter"))
        .unwrap_or_else(|| panic!("greeter is listed: {listing}"));
    assert_eq!(row["state"], "UNAVAILABLE", "{row}");
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("unloaded")),
        "{row}"
    );
    let (status, body) = server
        .post_json("/v2/repository/functions/greeter/load", &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        get(&server, "/v1/functions/greeter/").await,
        (200, "One!\n".to_owned())
    );
    server.stop();
}

#[tokio::test]
async fn a_function_swaps_under_load_without_errors() {
    use std::sync::Arc;
    let repo = temp_dir("empty-repo");
    let server = Arc::new(TestServer::start(&[repo], &[], &shared_cache()).await);
    let component =
        std::fs::read(repo_root().join("functions/hello/function.wasm")).expect("hello");
    let deploy = |greeting: &str| {
        use base64::Engine as _;
        json!({ "parameters": {
            "file:function.wasm": base64::engine::general_purpose::STANDARD.encode(&component),
            "manifest": format!("[env]\nGREETING = \"{greeting}\"\n"),
        }})
    };
    let (status, body) = server
        .post_json("/v2/repository/functions/swap/load", &deploy("Old"))
        .await;
    assert_eq!(status, 200, "{body}");
    let hammer = Hammer::start(8, {
        let server = server.clone();
        move || {
            let server = server.clone();
            async move { get(&server, "/v1/functions/swap/").await }
        }
    });
    hammer.wait_calls(50).await;
    let (status, body) = server
        .post_json("/v2/repository/functions/swap/load", &deploy("New"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get(&server, "/v1/functions/swap/").await.1, "New!\n");
    hammer.wait_calls(50).await;
    let (mut old, mut new) = (0, 0);
    for seen in hammer.stop().await {
        assert!(
            seen.iter().all(|(s, _)| *s == 200),
            "no failed invocation: {seen:?}"
        );
        let switch = seen
            .iter()
            .position(|(_, t)| t == "New!\n")
            .unwrap_or(seen.len());
        assert!(
            seen[..switch].iter().all(|(_, t)| t == "Old!\n")
                && seen[switch..].iter().all(|(_, t)| t == "New!\n"),
            "old, then new, never back"
        );
        old += switch;
        new += seen.len() - switch;
    }
    assert!(old > 0 && new > 0, "{old} old, {new} new");
}

#[tokio::test]
async fn a_functions_custom_metrics_outlive_its_invocations() {
    let repo = temp_dir("empty-repo");
    let functions = fixture_functions();
    let server = TestServer::start(&[repo], &["--functions", &functions], &shared_cache()).await;
    // Each invocation is a fresh instance; the counter it adds to is held for the function.
    for expected in ["1", "2", "3"] {
        assert_eq!(
            get(&server, "/v1/functions/function_probe/metric").await,
            (200, expected.to_owned())
        );
    }
    let metrics = server.metrics().await;
    assert!(
        metrics.lines().any(|l| l == "probe_function_calls_total 3"),
        "{metrics}"
    );
}
