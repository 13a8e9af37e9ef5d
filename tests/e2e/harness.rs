//! Starts the real `tessera` binary on free loopback ports and talks HTTP to it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

pub fn examples_repo() -> PathBuf {
    repo_root().join("model_repository")
}

pub fn fixtures_repo() -> PathBuf {
    repo_root().join("tests/fixtures/model_repository")
}

/// The ONNX Runtime library (scripts/setup-python.sh installs it). Without it, tests that need
/// ONNX models skip themselves locally ([`require_onnx_runtime!`]); in CI (`CI` set) its absence
/// is a failure, so a broken set-up cannot pass as skipped tests.
pub fn ort_library() -> Option<String> {
    match std::env::var("ORT_DYLIB_PATH") {
        Ok(path) if !path.is_empty() => Some(path),
        _ if std::env::var_os("CI").is_some() => panic!(
            "ORT_DYLIB_PATH is not set in CI: run scripts/setup-python.sh and export ORT_DYLIB_PATH=$(scripts/ort-dylib-path.sh)"
        ),
        _ => None,
    }
}

/// Returns from the test (saying so) when ONNX Runtime is not installed, outside CI.
macro_rules! require_onnx_runtime {
    () => {
        if $crate::harness::ort_library().is_none() {
            eprintln!(
                "skipped: needs ONNX Runtime (run scripts/setup-python.sh and export ORT_DYLIB_PATH=$(scripts/ort-dylib-path.sh))"
            );
            return;
        }
    };
}
pub(crate) use require_onnx_runtime;

/// Points a command at ONNX Runtime when it is installed (and leaves it unset otherwise: an
/// empty `ORT_DYLIB_PATH` is an error for the server's flag).
pub fn with_ort(cmd: &mut Command) -> &mut Command {
    match ort_library() {
        Some(path) => cmd.env("ORT_DYLIB_PATH", path),
        None => cmd.env_remove("ORT_DYLIB_PATH"),
    }
}

pub struct TestServer {
    child: Child,
    pub base: String,
    pub metrics_port: u16,
    /// None with `--allow-grpc false`.
    pub grpc_port: Option<u16>,
    pub log: PathBuf,
    pub client: reqwest::Client,
}

impl TestServer {
    /// Starts tessera on `repos` with extra flags, and waits until it answers.
    pub async fn start(repos: &[PathBuf], extra: &[&str], cache: &Path) -> TestServer {
        Self::start_with_env(repos, extra, cache, &[]).await
    }

    /// [`TestServer::start`] with extra environment variables for the server.
    pub async fn start_with_env(
        repos: &[PathBuf],
        extra: &[&str],
        cache: &Path,
        env: &[(&str, &str)],
    ) -> TestServer {
        // The server binds port 0 and says which ports it got: no port is picked here and
        // released for another process to take first.
        let log = temp_dir("server-log").join("server.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
        for r in repos {
            cmd.arg("--model-repository").arg(r);
        }
        cmd.args(["--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1"]);
        for flag in ["--http-port", "--grpc-port", "--metrics-port"] {
            // `PORT` in the environment stands for --http-port (Knative's convention).
            let from_env = flag == "--http-port" && env.iter().any(|(k, _)| *k == "PORT");
            if !extra.contains(&flag) && !from_env {
                cmd.args([flag, "0"]);
            }
        }
        // Deployments go to a store of this test's own, never to the user's.
        if !extra.contains(&"--store") {
            cmd.arg("--store").arg(temp_dir("store"));
        }
        with_ort(&mut cmd)
            .arg("--wasm-cache-dir")
            .arg(cache)
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log_file);
        let mut child = cmd.spawn().expect("tessera starts");
        let deadline = Instant::now() + Duration::from_secs(120);
        let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
        let fail = |why: &str, child: &mut Child| -> ! {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tessera {why}; log:\n{}", read_log())
        };
        // The listeners log their addresses once the models have loaded.
        let (port, metrics_port, grpc_port) = loop {
            let text = read_log();
            let http = listening_port(&text, "KServe v2 HTTP on ");
            let metrics = listening_port(&text, "Prometheus metrics on ");
            let grpc = listening_port(&text, "KServe v2 gRPC on ");
            let metrics_off = extra.windows(2).any(|w| w == ["--allow-metrics", "false"]);
            let grpc_off = extra.windows(2).any(|w| w == ["--allow-grpc", "false"]);
            if let Some(http) = http
                && (metrics.is_some() || metrics_off)
                && (grpc.is_some() || grpc_off)
            {
                break (http, metrics.unwrap_or(0), grpc);
            }
            if let Ok(Some(status)) = child.try_wait() {
                fail(
                    &format!("exited with {status} before listening"),
                    &mut child,
                );
            }
            if Instant::now() > deadline {
                fail("did not start listening", &mut child);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let server = TestServer {
            child,
            base: format!("http://127.0.0.1:{port}"),
            metrics_port,
            grpc_port,
            log,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
        };
        loop {
            if let Ok(r) = server
                .client
                .get(server.url("/v2/health/live"))
                .send()
                .await
                && r.status().is_success()
            {
                return server;
            }
            assert!(
                Instant::now() < deadline,
                "tessera did not answer; log:\n{}",
                server.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The Prometheus text from `/metrics`.
    pub async fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        self.client
            .get(url)
            .send()
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("metrics text")
    }

    /// The server's peak resident memory so far (`VmHWM`), in bytes.
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc status of the server");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmHWM")
            * 1024
    }

    /// Sends `method` to `path` and returns the status, the content type and the body.
    pub async fn request(&self, method: reqwest::Method, path: &str) -> (u16, String, String) {
        let r = self
            .client
            .request(method, self.url(path))
            .send()
            .await
            .expect("answers");
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        (status, content_type, r.text().await.unwrap_or_default())
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn log_text(&self) -> String {
        let mut s = String::new();
        let _ = std::fs::File::open(&self.log).and_then(|mut f| f.read_to_string(&mut s));
        s
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(self.url(path))
            .send()
            .await
            .expect("GET answers");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, serde_json::to_vec(body).expect("json"), None)
            .await
    }

    pub async fn post_raw(
        &self,
        path: &str,
        body: Vec<u8>,
        header_length: Option<usize>,
    ) -> (u16, Value) {
        let mut req = self.client.post(self.url(path)).body(body);
        if let Some(n) = header_length {
            req = req.header("Inference-Header-Content-Length", n.to_string());
        }
        let r = req.send().await.expect("POST answers");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Infers with JSON tensors; returns the status and the body.
    pub async fn infer(&self, model: &str, inputs: Value) -> (u16, Value) {
        self.post_json(
            &format!("/v2/models/{model}/infer"),
            &json!({ "inputs": inputs }),
        )
        .await
    }

    /// Deploys a model through Triton's `load` with `config` (JSON) and `file:<path>` contents.
    pub async fn deploy(
        &self,
        name: &str,
        config: &Value,
        files: &[(&str, &[u8])],
    ) -> (u16, Value) {
        use base64::Engine as _;
        let mut parameters = serde_json::Map::new();
        parameters.insert("config".into(), Value::String(config.to_string()));
        for (path, bytes) in files {
            parameters.insert(
                format!("file:{path}"),
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
            );
        }
        self.post_json(
            &format!("/v2/repository/models/{name}/load"),
            &json!({ "parameters": parameters }),
        )
        .await
    }

    /// The process id, to signal it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The state of each model version, from the repository index.
    pub async fn states(&self) -> Vec<(String, String, String)> {
        let r = self
            .client
            .post(self.url("/v2/repository/index"))
            .send()
            .await
            .expect("index");
        let rows: Vec<Value> = r.json().await.expect("index json");
        rows.iter()
            .map(|r| {
                let s = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
                (s("name"), s("state"), s("reason"))
            })
            .collect()
    }

    /// The repository index as a lookup: `state(name)` is (name, state, reason).
    pub async fn state_lookup(&self) -> impl Fn(&str) -> (String, String, String) + use<> {
        let states = self.states().await;
        move |name: &str| {
            states
                .iter()
                .find(|(n, _, _)| n == name)
                .cloned()
                .unwrap_or_else(|| panic!("{name} is not in the repository index {states:?}"))
        }
    }

    /// Stops the server the way an orchestrator does (SIGTERM), waits for it, returns its log.
    pub fn terminate(mut self) -> (bool, String) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let exited_cleanly = self.child.wait().map(|s| s.success()).unwrap_or(false);
        (exited_cleanly, self.log_text())
    }

    pub fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log_text()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the `tessera` command (a client command such as `deploy`); returns whether it succeeded
/// and what it printed, stdout then stderr.
pub fn tessera_cli(args: &[&str]) -> (bool, String) {
    tessera_cli_as(None, args)
}

/// [`tessera_cli`] with `TESSERA_API_KEY` set to `key`.
pub fn tessera_cli_as(key: Option<&str>, args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    match key {
        Some(key) => cmd.env("TESSERA_API_KEY", key),
        None => cmd.env_remove("TESSERA_API_KEY"),
    };
    let out = cmd
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("tessera runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// One compiled-code cache for every test run (under cargo's target directory, so it persists and
/// a second run does not recompile; tests of the cache itself use their own directory).
pub fn shared_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-wasm-cache")
}

/// Where this test process keeps its files (server logs, temporary repositories): a directory
/// under cargo's target directory, removed when the process exits, so a run leaves nothing in
/// the system's temporary directory.
fn scratch() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    extern "C" fn remove_scratch() {
        if let Some(dir) = DIR.get() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    DIR.get_or_init(|| {
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("e2e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        // SAFETY: registers a plain function without captures; it runs once, at exit.
        unsafe { libc::atexit(remove_scratch) };
        dir
    })
}

/// A fresh directory in this process's scratch space (names are unique per call).
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = scratch().join(format!("{tag}-{}", N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The port of the address logged after `marker` (`... on 127.0.0.1:PORT`).
fn listening_port(log: &str, marker: &str) -> Option<u16> {
    // Whole lines only: the server may be writing the last one.
    let complete = &log[..log.rfind('\n')?];
    let line = complete.lines().find(|l| l.contains(marker))?;
    let address = line.split(marker).nth(1)?.split_whitespace().next()?;
    address
        .trim_end_matches("/metrics")
        .rsplit(':')
        .next()?
        .parse()
        .ok()
}

/// The largest batch size in one model version's statistics (an entry of `model_stats`).
pub fn largest_batch(model_stats: &Value) -> u64 {
    model_stats["batch_stats"]
        .as_array()
        .expect("batch stats")
        .iter()
        .filter_map(|b| b["batch_size"].as_u64())
        .max()
        .unwrap_or(0)
}

/// FP32 values of an output in a JSON response.
pub fn output_f32(body: &Value, name: &str) -> Vec<f32> {
    body["outputs"]
        .as_array()
        .and_then(|o| o.iter().find(|t| t["name"] == name))
        .and_then(|t| t["data"].as_array())
        .unwrap_or_else(|| panic!("output {name} in {body}"))
        .iter()
        .map(|v| v.as_f64().expect("number") as f32)
        .collect()
}

pub fn output(body: &Value, name: &str) -> Value {
    body["outputs"]
        .as_array()
        .and_then(|o| o.iter().find(|t| t["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("output {name} in {body}"))
}

/// Waits until `holds` is true (polling every 10 ms, at most 30 s): tests wait on the server's
/// observable state (statistics, metrics), never on a fixed time standing in for it.
pub async fn wait_until<F, Fut>(what: &str, mut holds: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !holds().await {
        assert!(
            Instant::now() < deadline,
            "the server never reached the expected state: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl TestServer {
    /// Whether `/metrics` has the sample `line` (name, labels and value).
    pub async fn has_metric(&self, line: &str) -> bool {
        self.metrics().await.lines().any(|l| l == line)
    }
}

/// Clients calling a server in a loop (as during a hot swap), counting their calls, so a test
/// waits until traffic has flowed instead of sleeping.
pub struct Hammer<T> {
    calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<Vec<T>>>,
}

impl<T: Send + 'static> Hammer<T> {
    /// `clients` tasks each calling `call` until stopped, keeping every answer in order.
    pub fn start<F, Fut>(clients: usize, call: F) -> Hammer<T>
    where
        F: Fn() -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = T> + Send,
    {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let calls = std::sync::Arc::new(AtomicU64::new(0));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let clients = (0..clients)
            .map(|_| {
                let (call, calls, stop) = (call.clone(), calls.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        seen.push(call().await);
                        calls.fetch_add(1, Ordering::Relaxed);
                    }
                    seen
                })
            })
            .collect();
        Hammer {
            calls,
            stop,
            clients,
        }
    }

    /// Waits until `n` more calls have been answered.
    pub async fn wait_calls(&self, n: u64) {
        use std::sync::atomic::Ordering;
        let target = self.calls.load(Ordering::Relaxed) + n;
        wait_until(&format!("{n} more calls answered"), || async {
            self.calls.load(Ordering::Relaxed) >= target
        })
        .await;
    }

    /// Stops the clients; each one's answers, in order.
    pub async fn stop(self) -> Vec<Vec<T>> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut all = Vec::new();
        for client in self.clients {
            all.push(client.await.expect("a hammering client"));
        }
        all
    }
}

/// The `identity_echo` fixture: `Y = X + offset` (its config's `offset` parameter).
pub fn echo_component() -> Vec<u8> {
    std::fs::read(fixtures_repo().join("identity_echo/1/model.wasm"))
        .expect("the build installs identity_echo")
}

/// Triton's JSON form of a config for `identity_echo` that adds `offset`.
pub fn echo_config(name: &str, offset: u32) -> Value {
    json!({
        "name": name,
        "backend": "wasm",
        "max_batch_size": 8,
        "input": [{ "name": "X", "data_type": "TYPE_FP32", "dims": [1] }],
        "output": [{ "name": "Y", "data_type": "TYPE_FP32", "dims": [1] }],
        "instance_group": [{ "count": 2, "kind": "KIND_CPU" }],
        "parameters": { "offset": { "string_value": offset.to_string() } }
    })
}
