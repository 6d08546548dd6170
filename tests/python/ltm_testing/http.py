"""The HTTP front door in end-to-end tests: a server started with `--http`, and small clients
built on Python's standard library (http.client, urllib) and curl.

    from ltm_testing.http import HttpServer
    with HttpServer(model_dir) as srv:
        srv.http_address                       # "127.0.0.1:PORT"
        status, headers, body = srv.request("GET", "/v1/models")
        out = srv.complete(prompt="Hi", max_tokens=4)         # the JSON response (200 expected)
        chunks = srv.stream(prompt="Hi", max_tokens=4)        # the SSE data: JSON chunks
        fams = srv.metrics()                   # {name: Family} parsed by prometheus_client
        srv.sample("ltm_requests_total", front_door="http", outcome="ok")

Every wait is bounded; only loopback addresses are used.
"""
from __future__ import annotations

import http.client
import json
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from prometheus_client.parser import text_string_to_metric_families

from .server import Server, ServerError, free_port


class HttpServer(Server):
    """Server (ltm_testing.server) with `--http 127.0.0.1:HTTP_PORT`; ready once /health is 200."""

    def __init__(self, model: str, *, api_key: Optional[str] = None, **kw):
        super().__init__(model, **kw)
        self.http_port = 0
        self.http_address = ""
        self.api_key = api_key

    def command(self, port: int) -> List[str]:
        self.http_port = free_port()
        self.http_address = f"127.0.0.1:{self.http_port}"
        return super().command(port) + ["--http", self.http_address]

    def start(self) -> "HttpServer":
        super().start()
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline:
            try:
                status, _, _ = self.request("GET", "/health", timeout=5)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise ServerError(f"{self.name}: /health is {status}, not 200, 60 s after start\n"
                          f"{self.log_tail()}")

    # ---- clients ------------------------------------------------------------------------------

    def connection(self, timeout: float = 60) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)

    def headers(self, auth: bool = True) -> Dict[str, str]:
        h = {"Content-Type": "application/json"}
        if auth and self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def request(self, method: str, path: str, body=None, *, headers: Optional[dict] = None,
                timeout: float = 60) -> Tuple[int, Dict[str, str], bytes]:
        """One request on a fresh connection: (status, headers with lower-case names, body)."""
        conn = self.connection(timeout)
        try:
            if body is not None and not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            conn.request(method, path, body=body,
                         headers=self.headers() if headers is None else headers)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def complete(self, **body) -> dict:
        status, _, data = self.request("POST", "/v1/completions", body)
        assert status == 200, f"HTTP {status}: {data[:2000]!r}\n{self.log_tail()}"
        return json.loads(data)

    def stream(self, conn: Optional[http.client.HTTPConnection] = None, **body) -> List[dict]:
        """A streamed completion: the JSON of every `data:` event, checked to end in [DONE]."""
        own = conn is None
        conn = conn or self.connection()
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
                         headers=self.headers())
            resp = conn.getresponse()
            assert resp.status == 200, f"HTTP {resp.status}: {resp.read()[:2000]!r}"
            assert resp.getheader("Content-Type") == "text/event-stream"
            return parse_sse(resp)
        finally:
            if own:
                conn.close()

    def metrics_text(self) -> str:
        status, headers, data = self.request("GET", "/metrics")
        assert status == 200, data
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        return data.decode("utf-8")

    def metrics(self) -> Dict[str, object]:
        """/metrics parsed by prometheus_client's text parser (which raises on a bad line)."""
        return {f.name: f for f in text_string_to_metric_families(self.metrics_text())}

    def sample(self, name: str, families: Optional[Dict[str, object]] = None, **labels) -> float:
        """The value of the sample `name` with exactly these labels (from `families` or a fresh
        scrape). Counter families are named without _total by prometheus_client."""
        families = families if families is not None else self.metrics()
        for fam in families.values():
            for s in fam.samples:
                if s.name == name and dict(s.labels) == labels:
                    return s.value
        raise KeyError(f"no sample {name}{labels}")

    def wait_http_idle(self, timeout: float = 20.0):
        """Until /metrics shows no KV block used, nothing running or queued."""
        deadline = time.monotonic() + timeout
        fams = None
        while time.monotonic() < deadline:
            fams = self.metrics()
            if (self.sample("ltm_kv_blocks_used", fams) == 0
                    and self.sample("ltm_running_sequences", fams) == 0
                    and self.sample("ltm_queue_depth", fams) == 0):
                return fams
            time.sleep(0.1)
        raise ServerError(f"not idle after {timeout} s: used "
                          f"{self.sample('ltm_kv_blocks_used', fams)}\n{self.log_tail()}")


def parse_sse(resp) -> List[dict]:
    """Reads server-sent events to the end: the JSON of every `data:` line until `data: [DONE]`
    (which must come, last)."""
    events: List[dict] = []
    done = False
    for raw in iter_lines(resp):
        line = raw.decode("utf-8")
        if not line:
            continue
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        assert not done, "data after [DONE]"
        payload = line[len("data: "):]
        if payload == "[DONE]":
            done = True
            continue
        events.append(json.loads(payload))
    assert done, f"the stream ended without data: [DONE] after {len(events)} events"
    return events


def iter_lines(resp) -> Iterator[bytes]:
    while True:
        line = resp.readline()
        if not line:
            return
        yield line.rstrip(b"\r\n")


def stream_text(events: Sequence[dict]) -> str:
    return "".join(c["text"] for e in events for c in e.get("choices", []))
