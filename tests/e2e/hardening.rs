//! Hardening of the surfaces a client reaches besides inference: shared memory the client
//! truncates, a store whose manifests are damaged, shutdown with slow and idle clients, slowloris
//! headers and bodies, server paths in errors, models that ask for features not built yet, a
//! server with only a store, and the client commands' `host:port`.

use std::ffi::CString;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{
    TestServer, echo_component, echo_config, fixtures_repo, output_f32, shared_cache, temp_dir,
    tessera_cli, wait_until,
};

/// A repository with the `identity_echo` (Y = X) and `slow_echo` fixtures.
fn echo_repo() -> PathBuf {
    let repo = temp_dir("echo-repo");
    for model in ["identity_echo", "slow_echo"] {
        let from = fixtures_repo().join(model);
        std::fs::create_dir_all(repo.join(model).join("1")).expect("model folder");
        std::fs::copy(
            from.join("config.pbtxt"),
            repo.join(model).join("config.pbtxt"),
        )
        .expect("config");
        std::fs::copy(
            from.join("1/model.wasm"),
            repo.join(model).join("1/model.wasm"),
        )
        .expect("the build installs the fixtures");
    }
    repo
}

async fn echo(server: &TestServer, model: &str, x: f32) -> Result<f32, String> {
    let (status, body) = server
        .infer(
            model,
            json!([{ "name": "X", "shape": [1, 1], "datatype": "FP32", "data": [x] }]),
        )
        .await;
    if status != 200 {
        return Err(format!("{status} {body}"));
    }
    Ok(output_f32(&body, "Y")[0])
}

/// A POSIX shared-memory object of the test's own, unlinked when dropped.
struct ShmObject {
    name: CString,
    fd: i32,
}

impl ShmObject {
    fn new(tag: &str, size: usize) -> ShmObject {
        let name =
            CString::new(format!("/tessera-e2e-{tag}-{}", std::process::id())).expect("no NUL");
        // SAFETY: creates and sizes an object of this test's own; the descriptor is kept to
        // resize it and closed in Drop.
        let fd = unsafe {
            let fd = libc::shm_open(name.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600);
            assert!(fd >= 0, "shm_open");
            fd
        };
        let object = ShmObject { name, fd };
        object.resize(size);
        object
    }

    fn key(&self) -> &str {
        self.name.to_str().expect("utf-8")
    }

    fn resize(&self, size: usize) {
        // SAFETY: resizes the object this test owns.
        assert_eq!(unsafe { libc::ftruncate(self.fd, size as libc::off_t) }, 0);
    }

    fn write(&self, offset: usize, bytes: &[u8]) {
        // SAFETY: writes this test's bytes into its own object.
        let n = unsafe {
            libc::pwrite(
                self.fd,
                bytes.as_ptr().cast(),
                bytes.len(),
                offset as libc::off_t,
            )
        };
        assert_eq!(n, bytes.len() as isize);
    }
}

impl Drop for ShmObject {
    fn drop(&mut self) {
        // SAFETY: the descriptor and the object this test created.
        unsafe {
            libc::close(self.fd);
            libc::shm_unlink(self.name.as_ptr());
        }
    }
}

#[tokio::test]
async fn a_shared_memory_object_truncated_by_its_client_cannot_fault_the_server() {
    let server = TestServer::start(&[echo_repo()], &[], &shared_cache()).await;
    let object = ShmObject::new("truncate", 8);
    object.write(0, &2.5f32.to_le_bytes());
    let (status, body) = server
        .post_json(
            "/v2/systemsharedmemory/region/r/register",
            &json!({ "key": object.key(), "offset": 0, "byte_size": 8 }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let request = json!({
        "inputs": [{ "name": "X", "shape": [1, 1], "datatype": "FP32", "parameters": {
            "shared_memory_region": "r", "shared_memory_byte_size": 4 } }],
        "outputs": [{ "name": "Y", "parameters": {
            "shared_memory_region": "r", "shared_memory_byte_size": 4,
            "shared_memory_offset": 4 } }]
    });
    let (status, body) = server
        .post_json("/v2/models/identity_echo/infer", &request)
        .await;
    assert_eq!(status, 200, "{body}");

    // The client shrinks its object under the registered region: reading the input, or
    // writing the output, through a mapping would raise SIGBUS and kill the server.
    object.resize(0);
    let (status, body) = server
        .post_json("/v2/models/identity_echo/infer", &request)
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("truncated")),
        "{body}"
    );
    object.resize(6);
    object.write(0, &2.5f32.to_le_bytes());
    let (status, body) = server
        .post_json("/v2/models/identity_echo/infer", &request)
        .await;
    assert_eq!(status, 400, "the output no longer fits: {body}");
    assert_eq!(
        echo(&server, "identity_echo", 1.0).await,
        Ok(1.0),
        "still serving"
    );

    // Grown back, the region works again.
    object.resize(8);
    let (status, body) = server
        .post_json("/v2/models/identity_echo/infer", &request)
        .await;
    assert_eq!(status, 200, "{body}");
}

/// The store's manifest of a deployment.
fn manifest(store: &Path, model: &str) -> PathBuf {
    store.join("models").join(model).join("manifest.json")
}

#[tokio::test]
async fn a_damaged_or_missing_manifest_is_reported_and_repairable_not_fatal() {
    let store = temp_dir("damaged-store");
    let store_flag = store.to_str().expect("utf-8").to_owned();
    let extra = ["--store", store_flag.as_str()];
    let server = TestServer::start(&[], &extra, &shared_cache()).await;
    let component = echo_component();
    for model in ["healthy", "emptied", "unmanifested"] {
        for count in 1..=2 {
            // Two revisions each, differing by their instance count.
            let mut config = echo_config(model, 0);
            config["instance_group"] = json!([{ "count": count, "kind": "KIND_CPU" }]);
            let (status, body) = server
                .deploy(model, &config, &[("1/model.wasm", &component)])
                .await;
            assert_eq!(status, 200, "{body}");
        }
    }
    drop(server.stop());
    std::fs::write(manifest(&store, "emptied"), b"").expect("empties");
    std::fs::remove_file(manifest(&store, "unmanifested")).expect("removes");

    // Start-up goes on, serves the rest, and says what is wrong where an operator looks.
    let server = TestServer::start(&[], &extra, &shared_cache()).await;
    assert_eq!(echo(&server, "healthy", 3.0).await, Ok(3.0));
    let state = server.state_lookup().await;
    for model in ["emptied", "unmanifested"] {
        let (_, status, reason) = state(model);
        assert_eq!(status, "UNAVAILABLE", "{model}");
        assert!(reason.contains("manifest"), "{model}: {reason}");
        assert!(!reason.contains(&store_flag), "no server path: {reason}");
        assert!(
            store.join("models").join(model).join("1").is_dir(),
            "{model}: acknowledged revisions are kept"
        );
    }
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("tessera_store_damaged_deployments{area=\"models\"} 2"),
        "{metrics}"
    );
    assert!(server.log_text().contains("ERROR"), "reported loudly");

    // An operator repairs them: a rollback serves the newest revision on disk, a new deploy
    // serves the new one; both rebuild the manifest.
    let (status, body) = server
        .post_json("/v2/repository/models/unmanifested/rollback", &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server
        .deploy(
            "emptied",
            &echo_config("emptied", 0),
            &[("1/model.wasm", &component)],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for model in ["emptied", "unmanifested"] {
        assert_eq!(echo(&server, model, 4.0).await, Ok(4.0), "{model}");
    }
    drop(server.stop());
    let server = TestServer::start(&[], &extra, &shared_cache()).await;
    for model in ["healthy", "emptied", "unmanifested"] {
        assert_eq!(
            echo(&server, model, 5.0).await,
            Ok(5.0),
            "{model} after a restart"
        );
    }
    assert!(
        server
            .metrics()
            .await
            .contains("tessera_store_damaged_deployments{area=\"models\"} 0")
    );
}

/// Opens a connection and sends `bytes`, leaving it open.
fn open_with(port: u16, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connects");
    stream.write_all(bytes).expect("sends");
    stream
}

fn port_of(base: &str) -> u16 {
    base.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port in the base URL")
}

/// Whether the server closed `stream` within `within` (a read returns end of file or an error).
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    }
}

#[tokio::test]
async fn shutdown_finishes_within_the_exit_timeout_whatever_clients_hold_open() {
    let server = TestServer::start(
        &[echo_repo()],
        &[
            "--exit-timeout-secs",
            "2",
            "--http-header-read-timeout-secs",
            "300",
        ],
        &shared_cache(),
    )
    .await;
    let port = port_of(&server.base);
    let grpc_port = server.grpc_port.expect("gRPC is on");
    // A request in flight (slow_echo waits 1 s), a half-sent header, a body that drips, an
    // idle HTTP/2 connection after its preface and settings.
    let in_flight = {
        let client = server.client.clone();
        let url = server.url("/v2/models/slow_echo/infer");
        tokio::spawn(async move {
            client
                .post(url)
                .json(
                    &json!({ "inputs": [{ "name": "X", "shape": [1, 1], "datatype": "FP32",
                    "data": [7.0] }], "parameters": { "delay_ms": 1000 } }),
                )
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    let _half_header = open_with(port, b"GET /v2 HTTP/1.1\r\nHost: x\r\n");
    let _dripping_body = open_with(
        port,
        b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
    );
    let _idle_h2 = open_with(
        grpc_port,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    );
    wait_until("slow_echo is executing", || async {
        let (_, stats) = server.get("/v2/models/slow_echo/stats").await;
        stats["model_stats"][0]["inference_stats"]["queue"]["count"].as_u64() >= Some(1)
    })
    .await;
    let started = Instant::now();
    let (exited_cleanly, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("joins");
    let took = started.elapsed();
    assert!(exited_cleanly, "exit status; log:\n{log}");
    assert!(
        took < Duration::from_secs(15),
        "shutdown took {took:?} with an exit timeout of 2 s; log:\n{log}"
    );
    assert_eq!(
        in_flight.await.expect("joins").ok(),
        Some(200),
        "the request in flight finished"
    );
    let dropped = log.find("readiness dropped").expect("readiness drops");
    let closed = log
        .find("still open after --exit-timeout-secs")
        .expect("the rest is closed");
    assert!(dropped < closed, "readiness drops first:\n{log}");
}

#[tokio::test]
async fn slow_headers_and_slow_bodies_cost_a_socket_for_seconds_not_forever() {
    let server = TestServer::start(
        &[echo_repo()],
        &[
            "--http-header-read-timeout-secs",
            "1",
            "--http-body-read-timeout-secs",
            "2",
            "--max-connections",
            "8",
        ],
        &shared_cache(),
    )
    .await;
    let port = port_of(&server.base);
    // Eight connections trickling headers hold every connection slot...
    let mut slow: Vec<TcpStream> = (0..8)
        .map(|_| open_with(port, b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Slow: a"))
        .collect();
    // ...until the header timeout closes them: a new client is served after seconds. (A new
    // connection: a pooled one idle past the header timeout is closed by the server too.)
    let started = Instant::now();
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let answer = fresh
        .post(server.url("/v2/models/identity_echo/infer"))
        .json(
            &json!({ "inputs": [{ "name": "X", "shape": [1, 1], "datatype": "FP32",
            "data": [2.0] }] }),
        )
        .send()
        .await
        .expect("answers");
    assert_eq!(answer.status().as_u16(), 200);
    assert!(started.elapsed() < Duration::from_secs(10));
    for stream in &mut slow {
        assert!(
            closed_within(stream, Duration::from_secs(5)),
            "a slow header is closed"
        );
    }
    // A body that drips is answered 408 with a KServe error body, then closed.
    let mut dripping = open_with(
        port,
        b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
    );
    dripping
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut answer: Vec<u8> = Vec::new();
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    while started.elapsed() < Duration::from_secs(10) {
        let _ = dripping.write_all(b" ");
        dripping
            .set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        match dripping.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        if answer.ends_with(b"}") {
            break;
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("--http-body-read-timeout-secs"), "{answer}");
    let again = fresh
        .get(server.url("/v2/health/live"))
        .send()
        .await
        .expect("answers");
    assert_eq!(again.status().as_u16(), 200);
    // gRPC: the HTTP/2 preface alone, or with half its SETTINGS frame, does not start a
    // connection (the preface alone held one for good); preface and SETTINGS whole do.
    let grpc_port = server.grpc_port.expect("gRPC is on");
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut preface_only = open_with(grpc_port, preface);
    let mut half_settings = open_with(grpc_port, &[&preface[..], b"\x00\x00\x06\x04\x00"].concat());
    let mut started = open_with(
        grpc_port,
        &[&preface[..], b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"].concat(),
    );
    assert!(closed_within(&mut preface_only, Duration::from_secs(5)));
    assert!(closed_within(&mut half_settings, Duration::from_secs(5)));
    assert!(
        !closed_within(&mut started, Duration::from_secs(2)),
        "a started HTTP/2 connection may idle"
    );
}

#[tokio::test]
async fn a_store_failure_does_not_show_the_store_path_to_clients() {
    let server = TestServer::start(&[], &[], &shared_cache()).await;
    let component = echo_component();
    let long = format!("1/{}", "A".repeat(256));
    let (status, body) = server
        .deploy(
            "long_name",
            &echo_config("long_name", 0),
            &[("1/model.wasm", &component), (&long, b"x")],
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let text = body.to_string();
    assert!(text.contains("at most 255"), "{text}");
    assert!(
        !text.contains("/e2e-") && !text.contains("too long"),
        "{text}"
    );
    // A deployment that fails to load names its files relative to itself.
    let mut config = echo_config("no_labels", 0);
    config["output"][0]["label_filename"] = json!("labels.txt");
    let (status, body) = server
        .deploy("no_labels", &config, &[("1/model.wasm", &component)])
        .await;
    assert_eq!(status, 400, "{body}");
    let text = body.to_string();
    assert!(
        text.contains("labels.txt") && !text.contains("/e2e-"),
        "{text}"
    );
}

#[tokio::test]
async fn models_needing_iterative_sequences_a_stream_world_or_ragged_batches_are_refused_at_load() {
    let repo = echo_repo();
    let config = repo.join("slow_echo/config.pbtxt");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        format!("{text}\nsequence_batching {{ iterative_sequence: true }}\n"),
    )
    .expect("writes");
    let server = TestServer::start(&[repo], &[], &shared_cache()).await;
    let (_, status, reason) = server.state_lookup().await("slow_echo");
    assert_eq!(status, "UNAVAILABLE");
    assert!(reason.contains("iterative_sequence"), "{reason}");
    let component = echo_component();
    let cases = [
        (
            "decoupled",
            json!({ "model_transaction_policy": { "decoupled": true } }),
        ),
        (
            "ragged",
            json!({ "batch_input": [{ "kind": "BATCH_ELEMENT_COUNT",
            "target_name": ["N"], "data_type": "TYPE_FP32", "source_input": ["X"] }] }),
        ),
    ];
    for (name, extra) in cases {
        let mut config = echo_config(name, 0);
        for (key, value) in extra.as_object().expect("object") {
            config[key] = value.clone();
        }
        let (status, body) = server
            .deploy(name, &config, &[("1/model.wasm", &component)])
            .await;
        assert_eq!(status, 400, "{name}: {body}");
        // A decoupled model needs a handler of the decoupled-model world.
        let expected = match name {
            "decoupled" => "not a component of the tessera:inference/decoupled-model world",
            _ => "not supported by tessera yet",
        };
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(expected)),
            "{name}: {body}"
        );
    }
    assert_eq!(echo(&server, "identity_echo", 1.0).await, Ok(1.0));
}

#[tokio::test]
async fn a_server_with_only_a_store_starts_empty_and_takes_deployments() {
    let server = TestServer::start(&[], &[], &shared_cache()).await;
    let (status, _) = server.get("/v2/health/ready").await;
    assert_eq!(status, 200);
    assert!(server.states().await.is_empty());
    let component = echo_component();
    let (status, body) = server
        .deploy(
            "first",
            &echo_config("first", 0),
            &[("1/model.wasm", &component)],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(echo(&server, "first", 6.0).await, Ok(6.0));
    // tritonclient's `host:port` works for the client commands too.
    let address = server.base.trim_start_matches("http://").to_owned();
    let (ok, out) =
        tokio::task::spawn_blocking(move || tessera_cli(&["models", "--server", &address]))
            .await
            .expect("joins");
    assert!(ok && out.contains("first"), "{out}");
}
