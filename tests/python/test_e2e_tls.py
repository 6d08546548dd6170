"""Transport security and access (issue 12), with certificates this test makes with openssl:

- a TLS server (--tls-cert/--tls-key) with an API key (--api-key-file): plaintext is refused, a
  call without the key or with a wrong one gets UNAUTHENTICATED (health answers without one),
  the right key is served, by the Python client, ltm-client and ltm-loadgen;
- mutual TLS (--tls-client-ca): a client without a certificate, or with one the CA did not sign,
  cannot connect; one with a signed certificate is served;
- a representative part of the e2e suite (test_e2e_server.py: 32 concurrent requests equal the
  sequential ones, ltm-client and the one-shot command; stream equals unary; every bad request
  names its field) passes over TLS with the key.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import grpc
import pytest

from ltm_testing.e2e import *  # noqa: F401,F403  (fixtures: small_model; helpers)
from ltm_testing.e2e import CLIENT, LOADGEN, TRANSPORTS, health_status, raw_channel
from ltm_testing.server import Server
from ltm_client import LtmClient

# Run over TLS: the same test functions, collected here with this module's `server` fixture.
from test_e2e_server import (  # noqa: F401
    test_bad_requests_get_invalid_argument_naming_the_field,
    test_concurrent_greedy_equals_sequential_and_one_shot,
    test_stream_equals_unary_and_is_whole_utf8)

OPENSSL = shutil.which("openssl")
# openssl is a declared dependency (scripts/setup): missing, the test fails rather than skips.
assert OPENSSL, "openssl not found (scripts/setup installs it)"
KEY = "e2e-tls-secret-0123456789"


def openssl(*args: str, cwd: str) -> None:
    p = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"openssl {' '.join(args)}: {p.stderr}"


def make_ca(d: str, name: str) -> None:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)


def make_cert(d: str, name: str, ca: str, san: str) -> None:
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout",
            f"{name}.key", "-out", f"{name}.csr", cwd=d)
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(f"subjectAltName={san}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
            cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> str:
    d = str(tmp_path_factory.mktemp("pki"))
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_cert(d, "server", "ca", "IP:127.0.0.1,DNS:localhost")
    make_cert(d, "client", "ca", "DNS:client")
    make_cert(d, "rogue", "other-ca", "DNS:rogue")
    with open(os.path.join(d, "api.key"), "w") as f:
        f.write(KEY + "\n")
    return d


def p(d: str, name: str) -> str:
    return os.path.join(d, name)


@pytest.fixture(scope="module")
def server(small_model, pki, tmp_path_factory):
    """The e2e suite's server, over TLS with an API key."""
    srv = Server(small_model, extra=["--kv-memory-mb", 16, "--max-message-bytes", 64 * 1024,
                                     "--tls-cert", p(pki, "server.pem"),
                                     "--tls-key", p(pki, "server.key"),
                                     "--api-key-file", p(pki, "api.key")],
                 log_dir=str(tmp_path_factory.mktemp("logs")), name="tls",
                 client_options=dict(root_certificates=open(p(pki, "ca.pem"), "rb").read(),
                                     api_key=KEY))
    with srv:
        TRANSPORTS[srv.address] = {"ca": p(pki, "ca.pem"), "api_key_file": p(pki, "api.key")}
        yield srv
        TRANSPORTS.pop(srv.address, None)
        print(f"--- tls server log (tail) ---\n{srv.log_tail(3000)}")


def test_plaintext_is_refused_and_keys_are_checked(server, pki):
    assert "TLS" in server.log()
    # Plaintext to a TLS port: no connection.
    with LtmClient(server.address) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.model_info(timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    ca = open(p(pki, "ca.pem"), "rb").read()
    # TLS without a key, with a wrong one: UNAUTHENTICATED on every method.
    for key in (None, "wrong", KEY + "x"):
        with LtmClient(server.address, root_certificates=ca, api_key=key) as c:
            for call in (lambda: c.model_info(timeout=10), lambda: c.tokenize("hi", timeout=10),
                         lambda: c.generate("Hi", max_new_tokens=1, timeout=10),
                         lambda: list(c.generate_stream("Hi", max_new_tokens=1, timeout=10))):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (key, e.value.details())
                assert KEY not in e.value.details()
    # Health needs no key.
    creds = grpc.ssl_channel_credentials(root_certificates=ca)
    channel = grpc.secure_channel(server.address, creds)
    try:
        assert health_status(channel) == 1
    finally:
        channel.close()
    # The right key: served. A server certificate the client does not trust: refused.
    with LtmClient(server.address, root_certificates=ca, api_key=KEY) as c:
        assert c.generate("Hi", max_new_tokens=2, temperature=0, ignore_eos=True,
                          timeout=60).usage.completion_tokens == 2
    other = open(p(pki, "other-ca.pem"), "rb").read()
    with LtmClient(server.address, root_certificates=other, api_key=KEY) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.model_info(timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_command_line_clients_over_tls(server, pki):
    base = ["--server", server.address, "--tls-ca", p(pki, "ca.pem")]
    ok = subprocess.run([CLIENT, *base, "--api-key-file", p(pki, "api.key"), "--prompt", "Hello",
                         "--max-new-tokens", "3", "--temperature", "0", "--ignore-eos"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "completion_tokens=3" in ok.stderr
    bad = subprocess.run([CLIENT, *base, "--info"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "UNAUTHENTICATED" in bad.stderr, bad.stderr
    py = subprocess.run(["/usr/bin/python3", os.path.join(os.environ["LTM_SOURCE_DIR"], "clients",
                                                          "python", "ltm_client.py"),
                         *base, "--api-key-file", p(pki, "api.key"), "--tokenize", "Hello"],
                        capture_output=True, text=True, timeout=60)
    assert py.returncode == 0 and py.stdout.strip() == "15496", py.stderr
    lg = subprocess.run([LOADGEN, *base, "--api-key-file", p(pki, "api.key"), "--concurrency", "4",
                         "--requests", "8", "--duration-s", "30", "--max-new-tokens", "4",
                         "--prompt-tokens", "8", "--json"],
                        capture_output=True, text=True, timeout=120)
    assert lg.returncode == 0, lg.stderr
    report = json.loads(lg.stdout)
    assert report["requests"] == 8 and report["requests_ok"] == 8, report


def test_mutual_tls_needs_a_signed_client_certificate(small_model, pki, tmp_path):
    ca = open(p(pki, "ca.pem"), "rb").read()
    cert = open(p(pki, "client.pem"), "rb").read()
    key = open(p(pki, "client.key"), "rb").read()
    with Server(small_model, ranks=1, tp=1, pp=1,
                extra=["--kv-memory-mb", 16, "--tls-cert", p(pki, "server.pem"),
                       "--tls-key", p(pki, "server.key"), "--tls-client-ca", p(pki, "ca.pem")],
                log_dir=str(tmp_path), name="mtls",
                client_options=dict(root_certificates=ca, client_cert=cert, client_key=key)) as srv:
        assert "client certificates required" in srv.log()
        with LtmClient(srv.address, root_certificates=ca) as c:  # no client certificate
            with pytest.raises(grpc.RpcError) as e:
                c.model_info(timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        rogue = dict(client_cert=open(p(pki, "rogue.pem"), "rb").read(),
                     client_key=open(p(pki, "rogue.key"), "rb").read())
        with LtmClient(srv.address, root_certificates=ca, **rogue) as c:  # signed by another CA
            with pytest.raises(grpc.RpcError) as e:
                c.model_info(timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        with LtmClient(srv.address, root_certificates=ca, client_cert=cert, client_key=key) as c:
            r = c.generate("Hello", max_new_tokens=2, temperature=0, ignore_eos=True, timeout=60)
            assert len(r.token_ids) == 2
