"""Replicas on one shared deployment store: a real S3-compatible server (moto's server mode, on
loopback), Azure Blob Storage's emulator (Azurite) and a shared directory (file://), each with
three tessera replicas.

A deploy, a rollback, an unload and a load made on one replica serve on all; a replica started
later serves everything before it is ready; two replicas deploying one model at once: one wins,
the other answers 409 and the manifest stays whole; with the store unreachable, replicas keep
serving their cache, refuse deploys with 503, and converge once it is back.
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import MODEL_REPOSITORY, binary, launch, stop, wait_for

BUCKET = "tessera-replicas"
POLL_MS = "200"
ONNX = (MODEL_REPOSITORY / "add_sub" / "1" / "model.onnx").read_bytes()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Outage:
    """A TCP relay in front of the object store that the test can cut and restore: the replicas
    reach the store through it only, so cutting it is the store going away for them."""

    def __init__(self, upstream: int):
        self.upstream = upstream
        # Set where the store server itself can be stopped and started again.
        self.stopped = self.started = None
        self.server = None
        self.port = free_port()
        self.up = threading.Event()
        self.up.set()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                client.close()
                continue
            self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop_store(self):
        """The store goes away: its server stops where it can, else the relay is cut."""
        if self.stopped:
            self.stopped()
        else:
            self.cut()

    def start_store(self):
        if self.started:
            self.server = self.started()
        else:
            self.restore()

    def cut(self):
        self.up.clear()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns.clear()

    def restore(self):
        self.up.set()

    def close(self):
        self.cut()
        self.listener.close()


AZURITE = Path(__file__).resolve().parents[1] / "tools/node_modules/.bin/azurite-blob"
# Azurite's well-known development account (public, in Azure's documentation).
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")


def start_listening(cmd: list[str], port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"{cmd[0]} did not start: " + log.read_text())
            time.sleep(0.1)


@pytest.fixture(scope="module", params=["s3", "azure", "file"])
def shared(request):
    """(store URL, extra environment, Outage or None, scratch dir)."""
    scratch = Path(tempfile.mkdtemp(prefix="tessera-replicas-"))
    if request.param == "file":
        yield (scratch / "shared").as_uri(), {}, None, scratch
        shutil.rmtree(scratch, ignore_errors=True)
        return
    port = free_port()
    if request.param == "s3":
        server = start_listening(
            [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            port, scratch / "moto.log")
        import boto3
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
        s3.create_bucket(Bucket=BUCKET)
        relay = Outage(port)
        url = f"s3://{BUCKET}/replicas"
        env = {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT": f"http://127.0.0.1:{relay.port}",
            "AWS_ALLOW_HTTP": "true",
        }
    else:
        if not AZURITE.exists():
            pytest.fail(f"{AZURITE} is missing: run scripts/prepare.sh (npm ci in tests/tools)")
        azurite = [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                   "--location", str(scratch / "azurite"), "--silent", "--skipApiVersionCheck"]
        server = start_listening(azurite, port, scratch / "azurite.log")
        from azure.storage.blob import BlobServiceClient
        BlobServiceClient.from_connection_string(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
        ).create_container(BUCKET)
        relay = Outage(port)
        # Azurite keeps its data on disk (--location): here the outage is the real thing, the
        # server stopped and started again; moto keeps its data in memory, so S3's outage is
        # the relay cut.
        relay.server = server
        # Stopped as a service is (SIGTERM): Azurite writes its metadata out on the way down.
        relay.stopped = lambda: relay.server.terminate() or relay.server.wait()
        relay.started = lambda: start_listening(azurite, port, scratch / "azurite.log")
        url = f"az://{BUCKET}/replicas"
        env = {
            "AZURE_STORAGE_USE_EMULATOR": "true",
            "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{relay.port}",
        }
    try:
        yield url, env, relay, scratch
    finally:
        relay.close()
        server = relay.server or server
        server.kill()
        server.wait()
        shutil.rmtree(scratch, ignore_errors=True)


class Replicas:
    def __init__(self, url: str, env: dict, scratch: Path):
        self.url, self.env, self.scratch = url, env, scratch
        self.repo = scratch / "repository"
        self.repo.mkdir(exist_ok=True)
        self.running: list[tuple] = []

    def start(self, index: int | None = None, extra: list[str] | None = None):
        """Starts a replica; with `index`, again on that replica's cache (a restart)."""
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            cache = self.scratch / f"cache-{len(self.running) if index is None else index}"
            srv, proc, log = launch(binary(), [
                "--model-repository", str(self.repo), "--model-control-mode", "explicit",
                "--store", self.url, "--store-cache", str(cache), "--store-poll-ms", POLL_MS,
                *(extra or [])])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if index is None:
            self.running.append((srv, proc, log))
        else:
            # The replica it replaces was killed or stopped by the test: its log goes too.
            _, old_proc, old_log = self.running[index]
            stop(old_proc, old_log)
            self.running[index] = (srv, proc, log)
        return srv

    def stop_all(self, keep: bool):
        for _, proc, log in self.running:
            stop(proc, log, keep)
        self.running.clear()


@pytest.fixture(scope="module")
def replicas(shared, request):
    url, env, relay, scratch = shared
    group = Replicas(url, env, scratch)
    for _ in range(3):
        group.start()
    failed_before = request.session.testsfailed
    yield group, relay
    group.stop_all(keep=request.session.testsfailed > failed_before)


def config(name: str, max_batch_size: int) -> str:
    return json.dumps({
        "name": name, "platform": "onnxruntime_onnx", "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                  {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                   {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
    })


def deploy(srv, name: str, max_batch_size: int):
    return srv.post_json(f"/v2/repository/models/{name}/load", {"parameters": {
        "config": config(name, max_batch_size),
        "file:1/model.onnx": base64.b64encode(ONNX).decode()}})


def batch_size(srv, name: str):
    """The max_batch_size `name` serves with on `srv`, or None when it is not ready."""
    if srv.request("GET", f"/v2/models/{name}/ready")[0] != 200:
        return None
    status, _, body = srv.request("GET", f"/v2/models/{name}/config")
    return json.loads(body)["max_batch_size"] if status == 200 else None


def infer_ok(srv, name: str) -> bool:
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
                       for n in ("INPUT0", "INPUT1")]}
    status, _, data = srv.post_json(f"/v2/models/{name}/infer", body)
    return status == 200 and json.loads(data)["outputs"][0]["data"] == [2.0] * 16


def everywhere(servers, name: str, expected, timeout: float = 15.0):
    wait_for(lambda: all(batch_size(s, name) == expected for s in servers), timeout)


def test_a_deploy_rollback_unload_and_load_reach_every_replica(replicas):
    group, _ = replicas
    servers = [s for s, _, _ in group.running]
    status, _, body = deploy(servers[0], "m", 4)
    assert status == 200, body
    everywhere(servers, "m", 4)
    assert all(infer_ok(s, "m") for s in servers)
    status, _, body = deploy(servers[1], "m", 8)
    assert status == 200, body
    everywhere(servers, "m", 8)
    status, _, body = servers[2].request("POST", "/v2/repository/models/m/rollback")
    assert status == 200, body
    everywhere(servers, "m", 4)
    status, _, body = servers[0].post_json("/v2/repository/models/m/unload", {})
    assert status == 200, body
    everywhere(servers, "m", None)
    status, _, body = servers[1].post_json("/v2/repository/models/m/load", {})
    assert status == 200, body
    everywhere(servers, "m", 4)
    assert all(infer_ok(s, "m") for s in servers)


def test_a_function_deployed_to_one_replica_is_called_on_all(replicas):
    group, _ = replicas
    servers = [s for s, _, _ in group.running]
    component = (Path(__file__).resolve().parents[2] / "functions/hello/function.wasm").read_bytes()
    status, _, body = servers[0].post_json("/v2/repository/functions/greet/load", {"parameters": {
        "file:function.wasm": base64.b64encode(component).decode(),
        "manifest": '[env]\nGREETING = "Hello from every replica"\n'}})
    assert status == 200, body
    wait_for(lambda: all(s.request("GET", "/v1/functions/greet/")[2]
                         == b"Hello from every replica!\n" for s in servers), 15)
    status, _, body = servers[1].post_json("/v2/repository/functions/greet/unload", {})
    assert status == 200, body
    wait_for(lambda: all(s.request("GET", "/v1/functions/greet/")[0] == 404 for s in servers), 15)


def test_a_replica_started_later_serves_everything_when_ready(replicas):
    group, _ = replicas
    status, _, body = deploy(group.running[0][0], "late", 2)
    assert status == 200, body
    late = group.start()
    # Ready means it has applied the store: no waiting here.
    assert batch_size(late, "late") == 2
    assert infer_ok(late, "late")


def test_two_replicas_deploying_at_once_one_wins_the_other_gets_409(replicas):
    group, _ = replicas
    a, b = group.running[0][0], group.running[1][0]
    servers = [s for s, _, _ in group.running]
    conflicts = 0
    for trial in range(6):
        name = f"raced{trial}"
        barrier = threading.Barrier(2)
        answers = {}

        def run(srv, size):
            barrier.wait()
            answers[size] = deploy(srv, name, size)

        threads = [threading.Thread(target=run, args=(a, 2)),
                   threading.Thread(target=run, args=(b, 4))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = sorted(answers[s][0] for s in (2, 4))
        assert statuses in ([200, 200], [200, 409]), answers
        if statuses == [200, 409]:
            conflicts += 1
            loser = next(s for s in (2, 4) if answers[s][0] == 409)
            error = json.loads(answers[loser][2])["error"]
            assert "another replica" in error, error
            winner = 4 if loser == 2 else 2
        else:
            # One after the other: the later one built on the first and serves.
            winner = None
        wait_for(lambda: len({batch_size(s, name) for s in servers}) == 1
                 and batch_size(servers[0], name) is not None, 15)
        if winner is not None:
            assert batch_size(servers[0], name) == winner
    assert conflicts >= 1, "no trial overlapped: the race was never exercised"


def test_replicas_serve_their_cache_while_the_store_is_away(replicas):
    """The object store goes away under load (Azurite stopped, S3 cut off) and comes back: no
    request fails, a deploy meanwhile is refused (503), a replica restarted meanwhile serves
    its cache and says so, and all converge afterwards."""
    group, relay = replicas
    if relay is None:
        pytest.skip("the outage is simulated for object stores (a relay in front of them)")
    servers = [s for s, _, _ in group.running]
    status, _, body = deploy(servers[0], "steady", 2)
    assert status == 200, body
    everywhere(servers, "steady", 2)
    failures, done = [], threading.Event()

    def load():  # on the two replicas that stay up throughout
        while not done.is_set():
            for srv in servers[:2]:
                if not infer_ok(srv, "steady"):
                    failures.append(srv.http_port)
    loader = threading.Thread(target=load)
    loader.start()
    try:
        relay.stop_store()
        try:
            wait_for(lambda: metric_value(servers[2], "tessera_shared_store_reachable") == 0, 15)
            status, _, body = deploy(servers[1], "steady", 8)
            assert status == 503, body
            assert "unreachable" in json.loads(body)["error"]
            group.running[2][1].terminate()
            group.running[2][1].wait()
            restarted = group.start(index=2)
            assert infer_ok(restarted, "steady")
            assert metric_value(restarted, "tessera_shared_store_reachable") == 0
            status, headers, _ = restarted.request("GET", "/v2/health/ready")
            assert status == 200 and "unreachable" in headers.get("tessera-store", "")
        finally:
            relay.start_store()
        servers = [s for s, _, _ in group.running]
        status, _, body = deploy(servers[1], "steady", 8)
        assert status == 200, body
        everywhere(servers, "steady", 8)
    finally:
        done.set()
        loader.join()
    assert failures == []
    assert metric_value(servers[2], "tessera_shared_store_reachable") == 1
    assert "tessera-store" not in servers[2].request("GET", "/v2/health/ready")[1]


def metric_value(srv, family: str) -> float:
    conn = http.client.HTTPConnection(srv.host, srv.metrics_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    for line in text.splitlines():
        if line.startswith(family + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{family} is not on /metrics")


def test_a_replica_killed_mid_deploy_loses_nothing_acknowledged(replicas):
    """SIGKILL at a random point of a deploy: after the restart, every replica serves the same
    revision, the acknowledged one or the one in flight (if it reached the store), never a mix;
    and the next deploy goes through."""
    group, _ = replicas
    acknowledged = 2
    for trial in range(4):
        servers = [s for s, _, _ in group.running]
        status, _, body = deploy(servers[0], "killed", acknowledged)
        assert status == 200, body
        everywhere(servers, "killed", acknowledged)
        in_flight = 16 + trial
        thread = threading.Thread(target=lambda: _quietly(deploy, servers[0], "killed", in_flight))
        thread.start()
        time.sleep(0.03 * trial)
        group.running[0][1].kill()
        group.running[0][1].wait()
        thread.join()
        restarted = group.start(index=0)
        servers = [s for s, _, _ in group.running]
        wait_for(lambda: len({batch_size(s, "killed") for s in servers}) == 1, 15)
        assert batch_size(restarted, "killed") in (acknowledged, in_flight)
        acknowledged = 4 + trial
    status, _, body = deploy(group.running[1][0], "killed", 32)
    assert status == 200, body
    everywhere([s for s, _, _ in group.running], "killed", 32)


def _quietly(call, *args):
    try:
        call(*args)
    except OSError:
        pass  # the server was killed under the request: that is the point


def test_a_second_server_on_one_store_directory_is_refused(tmp_path):
    store, repo = tmp_path / "store", tmp_path / "repository"
    repo.mkdir()
    srv, proc, log = launch(binary(), ["--model-repository", str(repo), "--store", str(store)])
    try:
        second = subprocess.run(
            [str(binary()), "--model-repository", str(repo), "--store", str(store),
             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
            capture_output=True, text=True, timeout=60)
        assert second.returncode != 0
        assert "in use by another server" in second.stderr, second.stderr[-2000:]
    finally:
        stop(proc, log)


ADMIN_KEY = "pytest-replicas-admin-key-0123"


@pytest.fixture(scope="module")
def tenant_replicas(shared, request):
    """Two replicas with tenancy on, on a store of their own beside the other tests'."""
    url, env, _, scratch = shared
    key_file = scratch / "admin.key"
    key_file.write_text(ADMIN_KEY)
    (scratch / "tenants").mkdir(exist_ok=True)
    group = Replicas(url + "-tenants", env, scratch / "tenants")
    servers = []
    for _ in range(2):
        servers.append(group.start(extra=["--admin-key-file", str(key_file)]))
    failed_before = request.session.testsfailed
    yield servers
    group.stop_all(keep=request.session.testsfailed > failed_before)


def admin(srv, method: str, path: str, body=None):
    data = json.dumps(body).encode() if body is not None else None
    return srv.request(method, path, data, {"Authorization": f"Bearer {ADMIN_KEY}",
                                           "Content-Type": "application/json"})


def as_tenant(srv, key: str, method: str, path: str, body=None):
    data = json.dumps(body).encode() if body is not None else None
    return srv.request(method, path, data, {"Authorization": f"Bearer {key}",
                                           "Content-Type": "application/json"})


def test_tenants_keys_and_deployments_reach_every_replica(tenant_replicas):
    a, b = tenant_replicas
    status, _, body = admin(a, "POST", "/v1/tenants", {"name": "acme"})
    assert status == 201, body
    status, _, body = admin(a, "POST", "/v1/tenants/acme/keys")
    assert status in (200, 201), body
    key = json.loads(body)["key"]
    # The key issued on one replica opens the other.
    wait_for(lambda: as_tenant(b, key, "POST", "/v2/repository/index", {})[0] == 200, 15)
    body = {"parameters": {"config": config("mine", 4),
                           "file:1/model.onnx": base64.b64encode(ONNX).decode()}}
    status, _, answer = as_tenant(b, key, "POST", "/v2/repository/models/mine/load", body)
    assert status == 200, answer
    infer = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
                        for n in ("INPUT0", "INPUT1")]}
    wait_for(lambda: as_tenant(a, key, "POST", "/v2/models/mine/infer", infer)[0] == 200, 15)
    # The operator does not see a tenant's model by its name.
    assert a.post_json("/v2/models/mine/infer", infer)[0] in (401, 404)
    # Deleted on one replica: its keys and its deployments end on all.
    status, _, answer = admin(b, "DELETE", "/v1/tenants/acme")
    assert status in (200, 204), answer
    wait_for(lambda: as_tenant(a, key, "POST", "/v2/repository/index", {})[0] == 401, 15)
    # A new tenant of the same name inherits nothing.
    status, _, body = admin(a, "POST", "/v1/tenants", {"name": "acme"})
    assert status == 201, body
    fresh = json.loads(admin(a, "POST", "/v1/tenants/acme/keys")[2])["key"]
    wait_for(lambda: as_tenant(b, fresh, "POST", "/v2/repository/index", {})[0] == 200, 15)
    for srv in (a, b):
        names = [row["name"] for row in
                 json.loads(as_tenant(srv, fresh, "POST", "/v2/repository/index", {})[2])]
        assert "mine" not in names
