"""Fixtures for the tritonclient compatibility tests.

A session-scoped fixture starts the real `tessera` binary on free loopback
ports with `--model-repository model_repository`, waits for
`/v2/health/ready` (60 s at most) and stops it at the end of the session.

Environment:
  TESSERA_BIN     server binary (default: target/debug/tessera, relative to the repo root)
  ORT_DYLIB_PATH  ONNX Runtime shared library; required (scripts/ort-dylib-path.sh prints it)
  TESSERA_URL     optional HOST:PORT of an already running KServe v2 server; when set,
                  no binary is started and the tests run against that server instead
                  (useful to check the tests themselves against another server)

Prerequisites: scripts/setup-python.sh (the .venv), scripts/gen_models.py
(add_sub, mlp_classifier*). If tests fail, the tail of the server's stderr is
printed in the terminal summary.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
READY_TIMEOUT_S = 60.0
STDERR_TAIL_LINES = 60

# Set by the server fixture; read by pytest_terminal_summary.
_SERVER_LOG: Path | None = None


@dataclass
class Server:
    host: str
    http_port: int
    grpc_port: int | None
    metrics_port: int | None
    process: subprocess.Popen | None

    @property
    def url(self) -> str:
        """HOST:PORT, as tritonclient wants it."""
        return f"{self.host}:{self.http_port}"

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 30.0):
        """One raw HTTP request; returns (status, headers dict (lower-case keys), body bytes)."""
        conn = http.client.HTTPConnection(self.host, self.http_port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def post_json(self, path: str, obj) -> tuple[int, dict, bytes]:
        body = obj if isinstance(obj, (bytes, bytearray)) else json.dumps(obj).encode()
        return self.request("POST", path, body, {"Content-Type": "application/json"})


_LISTENING = {
    "http": re.compile(r"KServe v2 HTTP on [^\s]*:(\d+)"),
    "grpc": re.compile(r"KServe v2 gRPC on [^\s]*:(\d+)"),
    "metrics": re.compile(r"Prometheus metrics on [^\s]*:(\d+)/metrics"),
}


def _listening_ports(log: Path) -> dict[str, int]:
    """The ports the server logged it listens on (it binds port 0: nothing is picked here and
    released for another process to take first). Whole lines only."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    text = text[: text.rfind("\n") + 1]
    found = {}
    for name, pattern in _LISTENING.items():
        match = pattern.search(text)
        if match:
            found[name] = int(match.group(1))
    return found


def _tail(path: Path | None, lines: int = STDERR_TAIL_LINES) -> str:
    if path is None or not path.exists():
        return "(no server log)"
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:]) if text else "(server stderr is empty)"


def _ready(host: str, port: int) -> bool:
    try:
        conn = http.client.HTTPConnection(host, port, timeout=2)
        conn.request("GET", "/v2/health/ready")
        status = conn.getresponse().status
        conn.close()
        return status == 200
    except OSError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def server():
    global _SERVER_LOG

    external = os.environ.get("TESSERA_URL")
    if external:
        host, _, port = external.rpartition(":")
        srv = Server(host or "127.0.0.1", int(port), None, None, None)
        if not _ready(srv.host, srv.http_port):
            pytest.fail(f"TESSERA_URL={external}: /v2/health/ready is not 200", pytrace=False)
        yield srv
        return

    bin_path = binary()
    if not (bin_path.is_file() and os.access(bin_path, os.X_OK)):
        pytest.fail(f"tessera binary not found or not executable: {bin_path} "
                    "(build it with `cargo build`, or set TESSERA_BIN)", pytrace=False)
    ort = os.environ.get("ORT_DYLIB_PATH")
    if not ort:
        pytest.fail("ORT_DYLIB_PATH is not set; run: "
                    "export ORT_DYLIB_PATH=\"$(scripts/ort-dylib-path.sh)\"", pytrace=False)
    if not Path(ort).is_file():
        pytest.fail(f"ORT_DYLIB_PATH={ort} does not exist", pytrace=False)
    for needed in ("add_sub", "mlp_classifier"):
        if not (MODEL_REPOSITORY / needed / "1" / "model.onnx").is_file():
            pytest.fail(f"{MODEL_REPOSITORY / needed}/1/model.onnx missing; "
                        "run: .venv/bin/python scripts/gen_models.py", pytrace=False)

    srv, proc, log = launch(bin_path, ["--model-repository", "model_repository"])
    _SERVER_LOG = log
    try:
        yield srv
    finally:
        _stop(proc)


def binary() -> Path:
    """The tessera binary the tests run (TESSERA_BIN)."""
    bin_path = Path(os.environ.get("TESSERA_BIN", "target/debug/tessera"))
    return bin_path if bin_path.is_absolute() else REPO_ROOT / bin_path


def launch(bin_path: Path, args: list[str], ready_path: str = "/v2/health/ready",
           ready_timeout: float = READY_TIMEOUT_S):
    """Starts tessera with `args` on free loopback ports and a store of its own (in its log
    directory) and waits until `ready_path` answers 200. Returns (Server, process, stderr log);
    the caller stops it with `stop`."""
    log_dir = Path(tempfile.mkdtemp(prefix="tessera-pytest-"))
    log = log_dir / "server.stderr"
    cmd = [
        str(bin_path),
        *args,
        "--http-port", "0",
        "--grpc-port", "0",
        "--metrics-port", "0",
        "--http-address", "127.0.0.1",
        "--grpc-address", "127.0.0.1",
    ]
    if "--store" not in args:
        cmd += ["--store", str(log_dir / "store")]
    with open(log_dir / "server.stdout", "wb") as out, open(log, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err)
    srv = None
    deadline = time.monotonic() + ready_timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"tessera exited with status {proc.returncode} before becoming ready\n"
                        f"command: {' '.join(cmd)}\n--- stderr tail ---\n{_tail(log)}",
                        pytrace=False)
        if srv is None:
            ports = _listening_ports(log)
            if len(ports) == len(_LISTENING):
                srv = Server("127.0.0.1", ports["http"], ports["grpc"], ports["metrics"], proc)
        status = 0
        if srv is not None:
            try:
                status = srv.request("GET", ready_path, timeout=2)[0]
            except OSError:
                status = 0
        if status == 200:
            return srv, proc, log
        if time.monotonic() > deadline:
            _stop(proc)
            missing = [m for m in ("text_orientation", "minilm")
                       if (MODEL_REPOSITORY / m / "config.pbtxt").is_file()
                       and not (MODEL_REPOSITORY / m / "1" / "model.onnx").is_file()]
            hint = (f"\nnote: {', '.join(missing)} ha{'s' if len(missing) == 1 else 've'} a config "
                    "but no model.onnx (run scripts/fetch_models.sh)" if missing else "")
            pytest.fail(f"tessera not ready after {ready_timeout:.0f} s{hint}\n"
                        f"command: {' '.join(cmd)}\n--- stderr tail ---\n{_tail(log)}",
                        pytrace=False)
        time.sleep(0.1)


def stop(proc: subprocess.Popen, log: Path, keep: bool = False) -> None:
    """Stops a server from `launch` and removes its directory unless `keep` (a failed test)."""
    _stop(proc)
    if not keep:
        shutil.rmtree(log.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def client(server):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(url=server.url, connection_timeout=30, network_timeout=30)
    yield c
    c.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _SERVER_LOG is None:
        return
    failed = terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", [])
    if failed or exitstatus not in (0, 5):
        terminalreporter.write_sep("=", f"tessera stderr (last {STDERR_TAIL_LINES} lines, {_SERVER_LOG})")
        terminalreporter.write_line(_tail(_SERVER_LOG))
    else:
        # Nothing to look at: leave nothing behind. A failed run keeps its log for inspection.
        shutil.rmtree(_SERVER_LOG.parent, ignore_errors=True)


def metric(srv: Server, name: str, model: str | None = None, **labels: str) -> float:
    """A sample of the server's /metrics: the first line of `name` (a family, or a histogram's
    `_bucket`, `_count`, ...) with `model` and every label in `labels`."""
    conn = http.client.HTTPConnection(srv.host, srv.metrics_port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    if model is not None:
        wanted.append(f'model="{model}"')
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and all(
                w in line for w in wanted):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {wanted} in /metrics")


def wait_for(condition, timeout: float = 10.0) -> None:
    """Waits until `condition()` holds: tests wait on observable state, not on time."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def in_threads(run, count: int) -> None:
    """Runs `run(k)` for k in 0..count on threads at once and waits for all of them."""
    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# --- shared by the Python and JavaScript handler tests ----------------------------------------

# Triton's add_sub contract (FP32 [4]) served by the Rust example handler.
_ADD_SUB_RUST_CONFIG = """
name: "add_sub_rust"
backend: "wasm"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def add_rust_add_sub(repo: Path) -> None:
    """Puts `add_sub_rust` (the Rust example handler at the FP32 [4] contract) into `repo`."""
    (repo / "add_sub_rust" / "1").mkdir(parents=True)
    (repo / "add_sub_rust" / "config.pbtxt").write_text(_ADD_SUB_RUST_CONFIG)
    shutil.copy(MODEL_REPOSITORY / "add_sub_wasm" / "1" / "model.wasm",
                repo / "add_sub_rust" / "1" / "model.wasm")


def add_sub_inputs(module, a, b, model_name: str | None = None):
    """INPUT0, INPUT1 (FP32 [4], or [n, 4]) and, for the BLS models, MODEL_NAME, for tritonclient's
    `module` (http or grpc)."""
    import numpy as np

    shape = list(a.shape)  # [4], or [batch, 4] for a batching model
    inputs = [module.InferInput("INPUT0", shape, "FP32"),
              module.InferInput("INPUT1", shape, "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    if model_name is not None:
        name = module.InferInput("MODEL_NAME", [1], "BYTES")
        name.set_data_from_numpy(np.array([model_name.encode()], dtype=np.object_))
        inputs.append(name)
    return inputs


def probe(srv: "Server", model: str, mode: str) -> bytes:
    """Sends MODE to a sandbox probe model; returns its OUT."""
    import numpy as np
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(srv.url, network_timeout=60)
    inp = httpclient.InferInput("MODE", [1], "BYTES")
    inp.set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    return client.infer(model, [inp]).as_numpy("OUT")[0]


# The guest build tools scripts/prepare.sh installs (pinned in host/src/guest_build.rs).
COMPONENTIZE_PY = REPO_ROOT / ".venv" / "bin" / "componentize-py"
COMPONENTIZE_QJS = REPO_ROOT / "guest-sdk-js" / "node_modules" / ".bin" / "componentize-qjs"


def tessera_build(model_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """`tessera build` of a Python or JavaScript model folder with the pinned tools."""
    return subprocess.run([str(binary()), "build", str(model_dir),
                           "--componentize-py", str(COMPONENTIZE_PY),
                           "--componentize-qjs", str(COMPONENTIZE_QJS), *extra],
                          capture_output=True, text=True, timeout=300)


def sse_events(srv: "Server", model: str, body: dict) -> list[dict]:
    """The `data:` events of one `/generate_stream` call, parsed."""
    status, _, raw = srv.request("POST", f"/v2/models/{model}/generate_stream",
                                 json.dumps(body).encode())
    assert status == 200, raw
    return [json.loads(line[len("data: "):]) for line in raw.decode().splitlines()
            if line.startswith("data: ")]
