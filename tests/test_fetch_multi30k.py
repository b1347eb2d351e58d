"""Multi30k downloaded when no local copy is found: from a small HTTP server on the loopback address that serves
copies of the real files, never the network. The checksum table, a fetch then a prepare from the cache, a corrupt
and an interrupted download (nothing kept), offline (one line, exit status 2), and a local copy used first."""
import gzip
import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nat_kd import corpus, multi30k
from nat_kd.corpus import LANGUAGES, data_dir, read_lines
from nat_kd.multi30k import SHA256, FetchError, needed_files
from nat_kd.prepare import PrepareConfig, main, prepare

EN_DE = needed_files(("en", "de"))


@pytest.fixture(scope="module")
def published():
    """The real raw files' bytes, read through the lookup every test uses (the local copy of Multi30k)."""
    return {name: (data_dir() / name).read_bytes() for name in SHA256}


class Site:
    """What the server serves (``files``), which of them it spoils (``corrupt``: one byte changed; ``cut``: the
    connection closed halfway through the body), and the file names asked for, in order (``requests``)."""

    def __init__(self, files):
        self.files, self.corrupt, self.cut, self.requests = files, set(), set(), []


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        site = self.server.site
        name = self.path.rsplit("/", 1)[-1]
        site.requests.append(name)
        body = site.files.get(name)
        if body is None:
            self.send_error(404)
            return
        if name in site.corrupt:
            middle = len(body) // 2
            body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1:]
        self.send_response(200)
        self.send_header("Content-Type", "application/gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # HTTP/1.0: the connection closes when the handler returns, here after half of the announced body
        self.wfile.write(body[:len(body) // 2] if name in site.cut else body)

    def log_message(self, *args):
        pass


@pytest.fixture
def site(published):
    """The server on 127.0.0.1 (a free port) in a thread, shut down after the test, or after 120 s whatever
    happens."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.site = Site(published)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    watchdog = threading.Timer(120, server.shutdown)
    watchdog.daemon = True
    watchdog.start()
    server.site.url = f"http://127.0.0.1:{server.server_address[1]}/multi30k/dataset/data/task1/raw/"
    yield server.site
    watchdog.cancel()
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def no_local(tmp_path, monkeypatch, site):
    """No local Multi30k (no --data-dir, no NAT_KD_DATA, no shared copy), an empty cache, the test server as the
    download's base URL; returns the cache folder."""
    monkeypatch.delenv("NAT_KD_DATA", raising=False)
    monkeypatch.setattr(corpus, "DEFAULT_DATA_DIR", tmp_path / "no-shared-copy")
    monkeypatch.setattr(corpus, "DOWNLOAD_DIR", tmp_path / "data" / "multi30k")
    monkeypatch.setenv(multi30k.URL_ENV, site.url)
    for proxy in ("no_proxy", "NO_PROXY"):  # the loopback server, never a proxy
        monkeypatch.setenv(proxy, "*")
    return corpus.DOWNLOAD_DIR


def cached(cache):
    """Every name in the cache folder, hidden (temporary) ones included."""
    return sorted(path.name for path in cache.iterdir()) if cache.is_dir() else []


def test_checksum_table_is_the_local_copy(published):
    assert sorted(SHA256) == sorted(needed_files(LANGUAGES))
    for name, data in published.items():
        assert hashlib.sha256(data).hexdigest() == SHA256[name], name
    assert multi30k.MULTI30K_URL.startswith("https://raw.githubusercontent.com/multi30k/dataset/")
    assert multi30k.MULTI30K_URL.endswith("/data/task1/raw/")


@pytest.mark.slow
def test_fetch_into_an_empty_cache_then_prepare(no_local, site, published, tmp_path, caplog):
    caplog.set_level("INFO")
    out = prepare(PrepareConfig("en", "de", vocab_size=200, train_limit=30), out_dir=tmp_path / "out")
    assert site.requests == EN_DE  # only the pair's files, each once
    assert cached(no_local) == sorted(EN_DE)
    for name in EN_DE:
        assert (no_local / name).read_bytes() == published[name]
    assert site.url + "train.en.gz" in caplog.text  # where each file came from
    manifest = json.loads((out / "manifest.json").read_text())
    assert json.loads((out / "source.json").read_text()) == {"raw_dir": str(no_local)}
    assert manifest["inputs_sha256"] == {name: SHA256[name] for name in EN_DE}
    assert manifest["sentences"] == {"train": 30, "valid": 1014, "test": 1000}
    assert read_lines(out / "raw" / "valid.de") == read_lines(data_dir() / "val.de.gz")

    # the next run reads the cache: no request; other readers find it too
    assert multi30k.raw_dir(None, ("en", "de")) == no_local
    assert corpus.data_dir() == no_local
    assert site.requests == EN_DE
    # another pair downloads only what it lacks
    multi30k.raw_dir(None, ("en", "fr"))
    assert site.requests == EN_DE + needed_files(("fr",))


def test_corrupt_download_is_refused_and_nothing_cached(no_local, site):
    site.corrupt.add("val.de.gz")
    with pytest.raises(FetchError) as caught:
        multi30k.raw_dir(None, ("en", "de"))
    message = str(caught.value)
    assert "val.de.gz" in message and "sha256" in message and "\n" not in message
    assert "NAT_KD_DATA" in message and "--data-dir" in message
    assert "val.de.gz" in site.requests
    # the files before it were checked and kept; the corrupt one, and no temporary file, is not
    assert cached(no_local) == sorted(["train.en.gz", "train.de.gz", "val.en.gz"])


def test_interrupted_download_leaves_nothing_and_the_next_run_fetches_again(no_local, site, published):
    site.cut.add("train.de.gz")
    with pytest.raises(FetchError, match=r"train\.de\.gz.*connection closed after \d+ of \d+ bytes.*NAT_KD_DATA"):
        multi30k.fetch(EN_DE)
    assert cached(no_local) == ["train.en.gz"]
    site.cut.clear()
    assert multi30k.fetch(EN_DE) == no_local
    assert site.requests == ["train.en.gz", "train.de.gz", *EN_DE[1:]]
    assert (no_local / "train.de.gz").read_bytes() == published["train.de.gz"]


def test_a_damaged_cached_file_is_downloaded_again(no_local, site, published):
    no_local.mkdir(parents=True)
    for name in EN_DE:
        (no_local / name).write_bytes(published[name])
    (no_local / "test_2016_flickr.en.gz").write_bytes(b"not the file")
    multi30k.fetch(EN_DE)
    assert site.requests == ["test_2016_flickr.en.gz"]
    assert (no_local / "test_2016_flickr.en.gz").read_bytes() == published["test_2016_flickr.en.gz"]


def test_offline_stops_with_one_line_and_status_2(no_local, monkeypatch, tmp_path, capsys):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(multi30k.URL_ENV, f"http://127.0.0.1:{port}/raw/")
    assert main(["--src", "en", "--tgt", "de", "--out-dir", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: no local Multi30k") and err.count("\n") == 1
    assert "NAT_KD_DATA" in err and "--data-dir" in err and f"127.0.0.1:{port}" in err
    assert not no_local.exists() and not (tmp_path / "out").exists()


@pytest.fixture
def local_copy(tmp_path, published):
    """A local Multi30k en-de folder: the first 40 lines of each file, gzipped as shipped."""
    local = tmp_path / "local"
    local.mkdir()
    for name in EN_DE:
        lines = gzip.decompress(published[name]).decode("utf-8").splitlines()[:40]
        with gzip.open(local / name, "wt", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))
    return local


@pytest.mark.parametrize("how", ["--data-dir", "NAT_KD_DATA", "shared"])
def test_a_local_copy_comes_first(how, no_local, site, local_copy, monkeypatch, published):
    no_local.mkdir(parents=True)  # even a complete cache is not read
    for name in EN_DE:
        (no_local / name).write_bytes(published[name])
    override = None
    if how == "--data-dir":
        override = local_copy
    elif how == "NAT_KD_DATA":
        monkeypatch.setenv("NAT_KD_DATA", str(local_copy))
    else:
        monkeypatch.setattr(corpus, "DEFAULT_DATA_DIR", local_copy)
    assert multi30k.raw_dir(override, ("en", "de")) == local_copy
    assert site.requests == []


def test_prepare_reads_the_local_copy_without_a_request(no_local, site, local_copy, monkeypatch, tmp_path):
    monkeypatch.setenv("NAT_KD_DATA", str(local_copy))
    out = prepare(PrepareConfig("en", "de", vocab_size=120), out_dir=tmp_path / "out")
    assert json.loads((out / "source.json").read_text())["raw_dir"] == str(local_copy)
    assert site.requests == [] and cached(no_local) == []


def test_a_missing_local_folder_given_is_an_error_not_a_download(no_local, site, tmp_path, monkeypatch):
    monkeypatch.setenv("NAT_KD_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(corpus.CorpusError, match="nowhere.*does not exist"):
        multi30k.raw_dir(None, ("en", "de"))
    assert site.requests == []
