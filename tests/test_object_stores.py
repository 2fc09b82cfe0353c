"""The object-store namespace of tests/object_stores.py, tried by the clients the pipeline uses:
each client runs as its own process inside the namespace, against gs:// and s3:// under the
stores' real names, logged in the way a Vertex AI job is (the GCE metadata server)."""
from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from object_stores import start_object_stores, unavailable_reason

pytestmark = pytest.mark.object_store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    stores = start_object_stores(str(tmp_path_factory.mktemp("object-stores")))
    try:
        yield stores
    finally:
        stores.close()


def run_python(stores, code: str, *, cwd, env=None, timeout=180) -> dict:
    """Runs `code` in a Python process inside the namespace; returns the JSON object its last
    line of output prints."""
    result = stores.run([sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)],
                        cwd=cwd, env={"TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
                        timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_starts_with_the_names_mapped(stores, tmp_path):
    seen = run_python(stores, """
        import json, socket
        names = ["www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com",
                 "metadata.google.internal", socket.gethostname()]
        print(json.dumps({name: socket.gethostbyname(name) for name in names}))
    """, cwd=tmp_path)
    assert set(seen.values()) == {"127.0.0.1"}, seen


def test_tensorflow_gfile_and_tfrecords_on_gcs(stores, tmp_path):
    bucket = stores.make_bucket("gs", "tf-bucket")
    stores.reset_counts()
    seen = run_python(stores, f"""
        import json
        import tensorflow as tf
        gfile, root = tf.io.gfile, "{bucket}/run"
        gfile.makedirs(root + "/shards")
        with gfile.GFile(root + "/shards/notes.txt", "w") as out:
            out.write("hello from tensorflow")
        seen = {{"exists": gfile.exists(root + "/shards/notes.txt"),
                "listdir": sorted(gfile.listdir(root + "/shards")),
                "glob": sorted(gfile.glob(root + "/shards/*.txt")),
                "length": gfile.stat(root + "/shards/notes.txt").length}}
        gfile.rename(root + "/shards/notes.txt", root + "/shards/renamed.txt")
        seen["after_rename"] = sorted(gfile.listdir(root + "/shards"))
        with gfile.GFile(root + "/shards/renamed.txt") as source:
            seen["read"] = source.read()
        with tf.io.TFRecordWriter(root + "/shards/data.tfrecord.gz", options="GZIP") as out:
            for i in range(500):
                out.write(b"record-%d" % i)
        records = list(tf.data.TFRecordDataset(root + "/shards/data.tfrecord.gz",
                                               compression_type="GZIP").as_numpy_iterator())
        seen["records"] = [len(records), records[0].decode(), records[-1].decode()]
        gfile.rmtree(root)
        seen["after_rmtree"] = gfile.exists(root + "/shards/renamed.txt")
        seen["bucket_after_rmtree"] = gfile.listdir("{bucket}")
        print(json.dumps(seen))
    """, cwd=tmp_path)
    assert seen == {
        "exists": True, "listdir": ["notes.txt"],
        "glob": [f"{bucket}/run/shards/notes.txt"], "length": 21,
        "after_rename": ["renamed.txt"], "read": "hello from tensorflow",
        "records": [500, "record-0", "record-499"],
        "after_rmtree": False, "bucket_after_rmtree": [],
    }
    counts = stores.gcs_requests()
    # Every request carried the token TensorFlow got from the metadata server.
    assert counts["total"] > 10 and counts["bearer"] == counts["total"], counts
    assert counts.get("GET-range", 0) >= 1, counts
    assert stores.metadata_requests().get("instance/service-accounts/default/token", 0) >= 1


def test_the_same_objects_from_every_gcs_client(stores, tmp_path):
    bucket = stores.make_bucket("gs", "shared-bucket")
    # TensorFlow writes...
    run_python(stores, f"""
        import json
        import tensorflow as tf
        with tf.io.TFRecordWriter("{bucket}/tf/part-0.tfrecord") as out:
            for i in range(3):
                out.write(b"row-%d" % i)
        print(json.dumps({{}}))
    """, cwd=tmp_path)
    # ...google-cloud-storage, logged in (and given its project) by the metadata server,
    # sees it and adds an object...
    seen = run_python(stores, """
        import json
        import google.auth
        import google.auth.transport.requests
        from google.cloud import storage
        credentials, project = google.auth.default()
        client = storage.Client()
        blobs = {blob.name: blob.size for blob in client.list_blobs("shared-bucket")}
        client.bucket("shared-bucket").blob("gcs/written.txt").upload_from_string(b"by gcs")
        credentials.refresh(google.auth.transport.requests.Request())
        print(json.dumps({"kind": type(credentials).__module__, "project": project,
                          "client_project": client.project, "blobs": blobs,
                          "account": credentials.service_account_email}))
    """, cwd=tmp_path)
    assert seen["kind"] == "google.auth.compute_engine.credentials", seen
    assert seen["project"] == seen["client_project"] == stores.project, seen
    assert seen["account"] == stores.service_account, seen
    assert list(seen["blobs"]) == ["tf/part-0.tfrecord"], seen
    assert seen["blobs"]["tf/part-0.tfrecord"] > 0, seen
    # ...pyarrow, once at the plain endpoint and once (default options) at the real names...
    seen = run_python(stores, f"""
        import json
        import pyarrow.fs as pafs
        host = "{stores.gcs_endpoint}".split("://")[1]
        plain = pafs.GcsFileSystem(endpoint_override=host, scheme="http", anonymous=True)
        default = pafs.GcsFileSystem()
        listing = sorted(info.path for info in
                         plain.get_file_info(pafs.FileSelector("shared-bucket", recursive=True))
                         if info.type == pafs.FileType.File)
        with plain.open_input_file("shared-bucket/gcs/written.txt") as source:
            plain_read = source.read().decode()
        with default.open_output_stream("shared-bucket/arrow/written.txt") as out:
            out.write(b"by pyarrow")
        with default.open_input_file("shared-bucket/gcs/written.txt") as source:
            default_read = source.read().decode()
        print(json.dumps({{"listing": listing, "plain": plain_read, "default": default_read}}))
    """, cwd=tmp_path)
    assert seen == {"listing": ["shared-bucket/gcs/written.txt",
                                "shared-bucket/tf/part-0.tfrecord"],
                    "plain": "by gcs", "default": "by gcs"}, seen
    # ...and Beam's FileSystems matches, creates, opens, copies, renames and deletes.
    seen = run_python(stores, f"""
        import json
        from apache_beam.io.filesystems import FileSystems
        root = "{bucket}"
        def names(pattern):
            return sorted(m.path[len(root) + 1:] for m in
                          FileSystems.match([pattern])[0].metadata_list)
        seen = {{"before": names(root + "/**")}}
        with FileSystems.open(root + "/arrow/written.txt") as source:
            seen["read"] = source.read().decode()
        with FileSystems.create(root + "/beam/a.txt") as out:
            out.write(b"by beam")
        FileSystems.copy([root + "/beam/a.txt"], [root + "/beam/copy.txt"])
        FileSystems.rename([root + "/beam/a.txt", root + "/gcs/written.txt"],
                           [root + "/beam/renamed.txt", root + "/beam/moved.txt"])
        seen["after"] = names(root + "/beam/*")
        with FileSystems.open(root + "/beam/moved.txt") as source:
            seen["moved"] = source.read().decode()
        FileSystems.delete([root + "/beam/copy.txt"])
        seen["end"] = names(root + "/**")
        print(json.dumps(seen))
    """, cwd=tmp_path)
    assert seen == {
        "before": ["arrow/written.txt", "gcs/written.txt", "tf/part-0.tfrecord"],
        "read": "by pyarrow",
        "after": ["beam/copy.txt", "beam/moved.txt", "beam/renamed.txt"],
        "moved": "by gcs",
        "end": ["arrow/written.txt", "beam/moved.txt", "beam/renamed.txt",
                "tf/part-0.tfrecord"],
    }, seen


def test_gz_named_objects_keep_their_bytes(stores, tmp_path):
    """A name ending in .gz says nothing to GCS: the object holds the bytes written, whoever
    writes and reads it. (pyarrow's open_output_stream gzips a .gz name itself unless told
    compression=None, and open_input_file does not undo it: a writer that forgets stores
    other bytes on real GCS too.) Only an object whose metadata says contentEncoding: gzip is
    transcoded on download, and only for a client that does not accept gzip."""
    bucket = stores.make_bucket("gs", "gz-bucket")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    seen = run_python(stores, f"""
        import gzip, json, os
        import pyarrow.fs as pafs
        import tensorflow as tf
        from google.cloud import storage
        from tfrecord_shards import fileio
        bucket = "{bucket}"
        payloads = {{"random": os.urandom(600_000),
                     "gzip": gzip.compress(os.urandom(2_000) + b"tfrecord " * 60_000)}}
        store = pafs.GcsFileSystem()
        seen = {{}}
        for kind, data in payloads.items():
            for writer in ("pyarrow", "fileio"):
                uri = f"{{bucket}}/{{writer}}/{{kind}}.gz"
                if writer == "pyarrow":
                    with store.open_output_stream(uri[5:], compression=None) as out:
                        out.write(data)
                else:
                    with fileio.open_file(uri, "wb") as out:
                        out.write(data)
                third = len(data) // 3
                with store.open_input_file(uri[5:]) as source:
                    arrow_read, arrow_range = source.read(), source.read_at(1000, third)
                with tf.io.gfile.GFile(uri, "rb") as source:
                    tf_read = source.read()
                    source.seek(2 * third)
                    tf_range = source.read(777)
                seen[f"{{writer}}/{{kind}}"] = {{
                    "size": store.get_file_info(uri[5:]).size == len(data),
                    "pyarrow": arrow_read == data,
                    "pyarrow_range": arrow_range == data[third:third + 1000],
                    "fileio": fileio.read_bytes(uri) == data,
                    "fileio_range": fileio.read_range(uri, 9, 100) == data[9:109],
                    "tensorflow": tf_read == data,
                    "tensorflow_range": tf_range == data[2 * third:2 * third + 777],
                }}
        # Metadata that really says gzip: stored as sent, served as stored to a client that
        # accepts gzip, decompressed (as GCS does) for one that does not ask for it raw.
        blob = storage.Client().bucket("gz-bucket").blob("encoded/data.gz")
        blob.content_encoding = "gzip"
        blob.upload_from_string(payloads["gzip"], content_type="application/octet-stream")
        blob.reload()
        seen["encoded"] = {{
            "size": blob.size == len(payloads["gzip"]),
            "raw": blob.download_as_bytes(raw_download=True) == payloads["gzip"],
            "decoded": blob.download_as_bytes() == gzip.decompress(payloads["gzip"]),
        }}
        print(json.dumps(seen))
    """, cwd=tmp_path, env={"PYTHONPATH": repo}, timeout=300)
    expected = {"size": True, "pyarrow": True, "pyarrow_range": True, "fileio": True,
                "fileio_range": True, "tensorflow": True, "tensorflow_range": True}
    for name in ("pyarrow/random", "pyarrow/gzip", "fileio/random", "fileio/gzip"):
        assert seen.pop(name) == expected, (name, seen)
    assert seen == {"encoded": {"size": True, "raw": True, "decoded": True}}, seen


def test_s3_through_pyarrow_and_boto3(stores, tmp_path):
    bucket = stores.make_bucket("s3", "s3-bucket")
    assert bucket == "s3://s3-bucket"
    seen = run_python(stores, f"""
        import json, os
        import boto3
        import pyarrow.fs as pafs
        fs = pafs.S3FileSystem(endpoint_override="{stores.s3_endpoint}", scheme="http",
                               access_key=os.environ["AWS_ACCESS_KEY_ID"],
                               secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                               region=os.environ["AWS_REGION"])
        with fs.open_output_stream("s3-bucket/shards/part-0.bin") as out:
            out.write(b"0123456789" * 100)
        listing = [(i.path, i.size) for i in
                   fs.get_file_info(pafs.FileSelector("s3-bucket/shards"))]
        with fs.open_input_file("s3-bucket/shards/part-0.bin") as source:
            source.seek(995)
            tail = source.read().decode()
        s3 = boto3.client("s3")  # AWS_ENDPOINT_URL and the keys from the environment
        s3.put_object(Bucket="s3-bucket", Key="shards/boto.txt", Body=b"by boto3")
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="s3-bucket")["Contents"])
        body = s3.get_object(Bucket="s3-bucket", Key="shards/part-0.bin")["Body"].read()
        print(json.dumps({{"listing": listing, "tail": tail, "keys": keys,
                          "size": len(body)}}))
    """, cwd=tmp_path)
    assert seen == {"listing": [["s3-bucket/shards/part-0.bin", 1000]], "tail": "56789",
                    "keys": ["shards/boto.txt", "shards/part-0.bin"], "size": 1000}, seen


def test_requests_are_counted(stores, tmp_path):
    stores.make_bucket("gs", "count-bucket")
    stores.make_bucket("s3", "count-bucket")
    stores.reset_counts()
    assert stores.gcs_requests() == {} and stores.s3_requests() == {}
    run_python(stores, f"""
        import json, urllib.request
        gcs = "{stores.gcs_endpoint}"
        def call(method, url, body=None, headers={{}}):
            request = urllib.request.Request(url, data=body, method=method, headers=headers)
            with urllib.request.urlopen(request) as response:
                return response.read()
        call("POST", gcs + "/upload/storage/v1/b/count-bucket/o?uploadType=media&name=x.bin",
             b"0123456789", {{"Content-Type": "application/octet-stream"}})
        call("GET", gcs + "/storage/v1/b/count-bucket/o/x.bin")
        part = call("GET", gcs + "/download/storage/v1/b/count-bucket/o/x.bin?alt=media",
                    headers={{"Range": "bytes=2-4"}})
        assert part == b"234", part
        import boto3
        s3 = boto3.client("s3")
        s3.put_object(Bucket="count-bucket", Key="y.bin", Body=b"abcdef")
        ranged = s3.get_object(Bucket="count-bucket", Key="y.bin", Range="bytes=1-2")
        assert ranged["Body"].read() == b"bc"
        assert s3.get_object(Bucket="count-bucket", Key="y.bin")["Body"].read() == b"abcdef"
        s3.head_object(Bucket="count-bucket", Key="y.bin")
        print(json.dumps({{}}))
    """, cwd=tmp_path)
    gcs = stores.gcs_requests()
    assert {key: gcs.get(key) for key in ("POST", "GET", "GET-range", "total", "bytes-in")} \
        == {"POST": 1, "GET": 1, "GET-range": 1, "total": 3, "bytes-in": 10}, gcs
    s3 = stores.s3_requests()
    assert {key: s3.get(key) for key in ("PUT", "GET", "GET-range", "HEAD", "total")} \
        == {"PUT": 1, "GET": 1, "GET-range": 1, "HEAD": 1, "total": 4}, s3
    stores.reset_counts()
    assert stores.gcs_requests() == {} and stores.s3_requests() == {}


def test_no_route_out_of_the_namespace(stores, tmp_path):
    seen = run_python(stores, """
        import errno, json, socket
        seen = {}
        for family, address in ((socket.AF_INET, ("10.255.255.1", 80)),
                                (socket.AF_INET6, ("2001:db8::1", 80, 0, 0))):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.settimeout(1)
            code = sock.connect_ex(address)
            seen[address[0]] = errno.errorcode.get(code, code)
            sock.close()
        try:
            socket.getaddrinfo("example.com", 443)
            seen["dns"] = "resolved"
        except socket.gaierror as error:
            seen["dns"] = "failed"
        print(json.dumps(seen))
    """, cwd=tmp_path)
    # Refused at once for want of a route, not timed out (which would be EAGAIN).
    for address in ("10.255.255.1", "2001:db8::1"):
        assert seen[address] == "ENETUNREACH", seen
    assert seen["dns"] == "failed", seen


def test_close_leaves_no_process(tmp_path):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    stores = start_object_stores(str(tmp_path / "stores"))
    try:
        sleeper = stores.popen(["sleep", "300"])
        # A process the client starts and leaves behind, outside any process group of ours.
        orphan_maker = stores.run(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"],
                                  check=True)
        orphan = int(orphan_maker.stdout.strip())
        pids = stores.namespace_pids()
        assert sleeper.pid in pids and orphan in pids and len(pids) >= 5, pids
    finally:
        stores.close()
    assert stores.namespace_pids() == []
    assert sleeper.poll() is not None
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie_of_someone_else(pid), pid
    with pytest.raises(RuntimeError):
        stores.run(["true"])


def _is_zombie_of_someone_else(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_on_loopback_the_file_layer_reaches_both_stores_and_close_leaves_no_process(tmp_path):
    """The emulators without a namespace (no root): on free loopback ports, reached through
    the endpoint variables our file layer reads; closing stops every server they started."""
    reason = unavailable_reason(loopback=True)
    if reason:
        pytest.skip(reason)
    stores = start_object_stores(str(tmp_path / "stores"), loopback=True)
    try:
        seen = {scheme: run_python(stores, f"""
            import json
            from tfrecord_shards import fileio
            root = "{stores.make_bucket(scheme, "loopback")}/run"
            fileio.makedirs(root + "/a")
            fileio.write_text(root + "/a/notes.txt", "hello")
            fileio.rename(root + "/a/notes.txt", root + "/a/moved.txt")
            print(json.dumps({{"listed": fileio.listdir(root + "/a"),
                              "read": fileio.read_text(root + "/a/moved.txt")}}))
        """, cwd=tmp_path, env={"PYTHONPATH": ROOT}) for scheme in ("gs", "s3")}
        counts = {"gs": stores.gcs_requests(), "s3": stores.s3_requests()}
        pids = stores.namespace_pids()
        assert len(pids) >= 3, pids  # the server side, fake-gcs-server and moto
    finally:
        stores.close()
    assert seen == {scheme: {"listed": ["moved.txt"], "read": "hello"}
                    for scheme in ("gs", "s3")}, seen
    assert all(count["total"] > 0 for count in counts.values()), counts
    assert stores.namespace_pids() == []
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie_of_someone_else(pid), pid
