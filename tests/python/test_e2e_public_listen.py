"""Nobody gets in by default (issue 19, item 7): a --listen or --http that other hosts can reach,
with neither TLS nor an API key, is refused at start-up (exit 2, the message names the flag)
unless --insecure-public is given, which then serves and logs a warning; with an API key it
serves without one.

The refused commands stop while parsing flags, before anything binds. The ones that serve run
inside a network namespace of their own (ltm_testing.netns), so their 0.0.0.0 is that
namespace's only: nothing here listens on this machine's interfaces. Needs root.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ltm_testing import netns
from ltm_testing.checkpoint import make_checkpoint
from ltm_testing.e2e import CLIENT, GPT2_DIR, SMALL

WORKER = os.environ.get("LTM_WORKER", "")
KEY = "public-listen-secret-0123456789"
WARNING = "--insecure-public: the gRPC API on"
HTTP_WARNING = "--insecure-public: the HTTP API on"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("public") / "small")
    make_checkpoint(path, copy_vocab_from=GPT2_DIR, std=0.2, seed=21, **SMALL)
    return path


def refused(model, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([WORKER, "--model", model, "--threads", "1", *flags],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flags, named", [
    (["--listen", "0.0.0.0:50051"], "--listen 0.0.0.0:50051"),
    (["--listen", "[::]:50051"], "--listen [::]:50051"),
    (["--listen", "10.1.2.3:50051"], "--listen 10.1.2.3:50051"),
    (["--listen", "myhost:50051"], "--listen myhost:50051"),
    # TLS protects gRPC but not the plaintext HTTP door (which TLS already keeps on loopback).
    (["--listen", "127.0.0.1:50051", "--http", "0.0.0.0:8000"], "--http 0.0.0.0:8000"),
])
def test_a_public_listener_without_tls_or_a_key_is_refused(model, flags, named):
    p = refused(model, *flags)
    assert p.returncode == 2, p.stderr
    first = p.stderr.splitlines()[0]
    assert named in first and "--insecure-public" in first and "--api-key-file" in first, first


@pytest.mark.parametrize("flags", [
    ["--listen", "127.0.0.1:0"], ["--listen", "localhost:0"], ["--listen", "[::1]:0"],
    ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"],
])
def test_loopback_needs_nothing(model, flags):
    # Parsing accepts these (a bad model path then ends the run with 6, before any bind).
    p = subprocess.run([WORKER, "--model", model + "-missing", *flags], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 6, p.stderr


def _serve(host, model, tmp_path, *flags):
    log = open(tmp_path / "worker.log", "wb")
    proc = host.popen([WORKER, "--model", model, "--threads", "1", "--kv-memory-mb", "8",
                       "--listen", "0.0.0.0:50051", "--http", "0.0.0.0:8000", *flags],
                      stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    return proc, log


def _wait_info(host, args, proc, log_path) -> subprocess.CompletedProcess:
    last = None
    for _ in range(300):
        assert proc.poll() is None, f"exited {proc.returncode}: {log_path.read_text()}"
        last = host.run([CLIENT, "--server", f"{host.addr}:50051", "--info", *args], check=False,
                        timeout=30)
        if last.returncode == 0:
            return last
        time.sleep(0.3)
    raise AssertionError(f"no answer: {last.stderr if last else ''}\n{log_path.read_text()}")


def _http_status(host, path, key=None) -> int:
    code = ("import sys, urllib.request, urllib.error\n"
            f"r = urllib.request.Request('http://{host.addr}:8000{path}')\n"
            + (f"r.add_header('Authorization', 'Bearer {key}')\n" if key else "")
            + "try:\n  print(urllib.request.urlopen(r, timeout=10).status)\n"
              "except urllib.error.HTTPError as e:\n  print(e.code)\n")
    return int(host.run([sys.executable, "-c", code], timeout=30).stdout.strip())


@pytest.mark.skipif(netns.skip_reason() is not None, reason=str(netns.skip_reason()))
def test_insecure_public_serves_and_warns(model, tmp_path):
    with netns.Hosts(1) as hosts:
        h0 = hosts[0]
        proc, log = _serve(h0, model, tmp_path, "--insecure-public")
        try:
            _wait_info(h0, [], proc, tmp_path / "worker.log")
            assert _http_status(h0, "/v1/models") == 200
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
    text = (tmp_path / "worker.log").read_text()
    assert WARNING in text and HTTP_WARNING in text, text
    assert "open to anyone who can reach it" in text, text


@pytest.mark.skipif(netns.skip_reason() is not None, reason=str(netns.skip_reason()))
def test_an_api_key_serves_without_a_warning(model, tmp_path):
    key_file = tmp_path / "api.key"
    key_file.write_text(KEY + "\n")
    with netns.Hosts(1) as hosts:
        h0 = hosts[0]
        proc, log = _serve(h0, model, tmp_path, "--api-key-file", str(key_file))
        try:
            _wait_info(h0, ["--api-key-file", str(key_file)], proc, tmp_path / "worker.log")
            no_key = h0.run([CLIENT, "--server", f"{h0.addr}:50051", "--info"], check=False,
                            timeout=30)
            assert no_key.returncode != 0 and "UNAUTHENTICATED" in no_key.stderr, no_key.stderr
            assert _http_status(h0, "/v1/models") == 401
            assert _http_status(h0, "/v1/models", KEY) == 200
            assert _http_status(h0, "/health") in (200, 503)  # health needs no key
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
    text = (tmp_path / "worker.log").read_text()
    assert "--insecure-public" not in text, text
