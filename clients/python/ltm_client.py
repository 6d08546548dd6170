#!/usr/bin/python3
"""A small Python client of the ltm.v1.Generation API (proto/ltm/v1/ltm.proto).

As a library::

    from ltm_client import LtmClient
    with LtmClient("127.0.0.1:50051") as c:
        print(c.generate("Hello", max_new_tokens=8).text)
        for m in c.generate_stream("Hello", max_new_tokens=8):
            print(m.text, end="", flush=True)
        print(c.chat([("user", "Hello")], max_new_tokens=8).text)  # the model's chat template
        ids = c.tokenize("Hello")
        text = c.detokenize(ids)
        info = c.model_info()

Over TLS, with an API key (the server runs with --tls-cert/--tls-key and --api-key-file)::

    LtmClient("host:50051", tls=True, root_certificates=open("ca.pem", "rb").read(),
              api_key=open("key.txt").read().strip())

As a command (same flags as ltm-client)::

    /usr/bin/python3 clients/python/ltm_client.py --server ADDR --prompt TEXT --max-new-tokens N

Needs Debian's python3-grpcio and python3-protobuf and the stubs the build generates
(target ltm_proto_python): found via $LTM_PYTHON_STUBS, else ../../build/python relative to this
file. Errors of the server are raised as grpc.RpcError (the command prints them and exits 1).
"""

import argparse
import os
import sys


def _add_stub_path():
    path = os.environ.get("LTM_PYTHON_STUBS")
    if not path:
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.normpath(os.path.join(here, "..", "..", "build", "python"))
    if not os.path.isfile(os.path.join(path, "ltm", "v1", "ltm_pb2.py")):
        raise ImportError(
            f"ltm Python stubs not found in {path}: build the target ltm_proto_python and set "
            "LTM_PYTHON_STUBS to <build dir>/python")
    if path not in sys.path:
        sys.path.insert(0, path)


_add_stub_path()

import grpc  # noqa: E402
from ltm.v1 import ltm_pb2, ltm_pb2_grpc  # noqa: E402

FINISH_REASONS = {
    ltm_pb2.FINISH_REASON_UNSPECIFIED: "unspecified",
    ltm_pb2.FINISH_REASON_LENGTH: "length",
    ltm_pb2.FINISH_REASON_STOP: "stop",
    ltm_pb2.FINISH_REASON_EOS: "eos",
    ltm_pb2.FINISH_REASON_CANCELLED: "cancelled",
    ltm_pb2.FINISH_REASON_ERROR: "error",
}


def make_request(prompt=None, *, prompt_token_ids=None, max_new_tokens=None, temperature=None,
                 top_k=None, top_p=None, repetition_penalty=None, seed=None, stop=(),
                 return_logprobs=False, request_id="", ignore_eos=False, adapter=""):
    """A GenerateRequest; None leaves a field unset (the server's default applies). `adapter`
    names a loaded LoRA adapter ("" = the base model)."""
    req = ltm_pb2.GenerateRequest(stop=list(stop), return_logprobs=return_logprobs,
                                  request_id=request_id, ignore_eos=ignore_eos, adapter=adapter)
    if prompt is not None:
        req.prompt = prompt
    if prompt_token_ids is not None:
        req.prompt_token_ids.extend(prompt_token_ids)
    for name, value in (("max_new_tokens", max_new_tokens), ("temperature", temperature),
                        ("top_k", top_k), ("top_p", top_p),
                        ("repetition_penalty", repetition_penalty), ("seed", seed)):
        if value is not None:
            setattr(req, name, value)
    return req


def make_chat_request(messages, *, max_new_tokens=None, temperature=None, top_k=None, top_p=None,
                      repetition_penalty=None, seed=None, stop=(), return_logprobs=False,
                      request_id="", ignore_eos=False, adapter=""):
    """A ChatRequest: `messages` is a list of (role, content) pairs or {"role", "content"} dicts;
    the other fields as make_request's (max_new_tokens unset: what the context leaves)."""
    req = ltm_pb2.ChatRequest(stop=list(stop), return_logprobs=return_logprobs,
                              request_id=request_id, ignore_eos=ignore_eos, adapter=adapter)
    for m in messages:
        role, content = (m["role"], m["content"]) if isinstance(m, dict) else m
        req.messages.add(role=role, content=content)
    for name, value in (("max_new_tokens", max_new_tokens), ("temperature", temperature),
                        ("top_k", top_k), ("top_p", top_p),
                        ("repetition_penalty", repetition_penalty), ("seed", seed)):
        if value is not None:
            setattr(req, name, value)
    return req


def read_api_key_file(path):
    """The key in `path` as the server reads it: without surrounding spaces and newline."""
    with open(path, "rb") as f:
        key = f.read(4097).decode("utf-8").strip(" \t\r\n")
    if not key:
        raise ValueError(f"{path}: is empty")
    return key


class LtmClient:
    """A connection to an ltm server. `timeout` (seconds) is the default deadline of each call.

    TLS: `tls=True`, or any of `root_certificates` (PEM bytes of the CA that signed the server's
    certificate; default: the system's roots), `client_cert` + `client_key` (PEM bytes, for mutual
    TLS), `server_name` (the name to verify instead of the address's host). `api_key` is sent as
    "authorization: Bearer <key>" on every call."""

    def __init__(self, address, timeout=None, *, tls=False, root_certificates=None,
                 client_cert=None, client_key=None, server_name=None, api_key=None):
        self.address = address
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
        if tls or root_certificates or client_cert or client_key or server_name:
            if (client_cert is None) != (client_key is None):
                raise ValueError("give client_cert and client_key together")
            creds = grpc.ssl_channel_credentials(root_certificates=root_certificates,
                                                 private_key=client_key,
                                                 certificate_chain=client_cert)
            options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address)
        self._stub = ltm_pb2_grpc.GenerationStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _timeout(self, timeout):
        return self.timeout if timeout is None else timeout

    def generate(self, prompt=None, *, timeout=None, **kwargs):
        """One unary call; returns the GenerateResponse (all tokens, text, usage, timings)."""
        return self._stub.Generate(make_request(prompt, **kwargs), timeout=self._timeout(timeout),
                                   metadata=self._metadata)

    def generate_stream(self, prompt=None, *, timeout=None, **kwargs):
        """Yields GenerateResponse messages as tokens arrive; the last one has finish_reason and
        usage. Breaking out of the loop cancels the call (the server frees the request)."""
        call = self._stub.GenerateStream(make_request(prompt, **kwargs),
                                         timeout=self._timeout(timeout), metadata=self._metadata)
        try:
            yield from call
        finally:
            call.cancel()  # no-op once the call has ended

    def chat(self, messages, *, timeout=None, **kwargs):
        """A chat reply in one call (the server renders `messages` with the model's chat
        template); returns the GenerateResponse."""
        return self._stub.Chat(make_chat_request(messages, **kwargs),
                               timeout=self._timeout(timeout), metadata=self._metadata)

    def chat_stream(self, messages, *, timeout=None, **kwargs):
        """Yields a chat reply's GenerateResponse messages as tokens arrive (as generate_stream)."""
        call = self._stub.ChatStream(make_chat_request(messages, **kwargs),
                                     timeout=self._timeout(timeout), metadata=self._metadata)
        try:
            yield from call
        finally:
            call.cancel()

    def tokenize(self, text, *, timeout=None):
        """Token ids of `text`."""
        resp = self._stub.Tokenize(ltm_pb2.TokenizeRequest(text=text),
                                   timeout=self._timeout(timeout), metadata=self._metadata)
        return list(resp.token_ids)

    def detokenize(self, token_ids, *, timeout=None):
        """Text of `token_ids` (a character split by the ids comes back as U+FFFD)."""
        resp = self._stub.Tokenize(ltm_pb2.TokenizeRequest(token_ids=list(token_ids)),
                                   timeout=self._timeout(timeout), metadata=self._metadata)
        return resp.text

    def load_adapter(self, name, *, timeout=None):
        """Loads the LoRA adapter folder `name` of the server's --lora-dir; its AdapterInfo."""
        return self._stub.LoadAdapter(ltm_pb2.LoadAdapterRequest(name=name),
                                      timeout=self._timeout(timeout), metadata=self._metadata)

    def unload_adapter(self, name, *, force=False, timeout=None):
        """Unloads an adapter once no request uses it (force: ends those requests, ABORTED)."""
        return self._stub.UnloadAdapter(ltm_pb2.UnloadAdapterRequest(name=name, force=force),
                                        timeout=self._timeout(timeout), metadata=self._metadata)

    def list_adapters(self, *, timeout=None):
        """AdapterInfo of the loaded adapters and of the --lora-dir folders not loaded."""
        return list(self._stub.ListAdapters(ltm_pb2.ListAdaptersRequest(),
                                            timeout=self._timeout(timeout),
                                            metadata=self._metadata).adapters)

    def model_info(self, *, timeout=None):
        """The ModelInfo message: model shape, deployment, live load."""
        return self._stub.GetModelInfo(ltm_pb2.GetModelInfoRequest(),
                                       timeout=self._timeout(timeout), metadata=self._metadata)


def _parse_ids(text):
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated integers") from None


def _summary(last, ids, logprobs, show_logprobs):
    if show_logprobs:
        for i, lp in zip(ids, logprobs):
            print(f"token {i} logprob {lp:.4f}", file=sys.stderr)
    print(f"[{last.request_id}] finish_reason={FINISH_REASONS.get(last.finish_reason, '?')} "
          f"prompt_tokens={last.usage.prompt_tokens} "
          f"completion_tokens={last.usage.completion_tokens} "
          f"time_to_first_token_ms={last.timings.time_to_first_token_ms:.1f} "
          f"total_ms={last.timings.total_ms:.1f}", file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(description="Client of an ltm server (ltm.v1.Generation).")
    p.add_argument("--server", required=True, help="server address, HOST:PORT")
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--tls-ca", help="PEM CA certificate(s) to verify the server (implies --tls)")
    p.add_argument("--tls-cert", help="PEM client certificate for mutual TLS (implies --tls)")
    p.add_argument("--tls-key", help="PEM key of --tls-cert")
    p.add_argument("--tls-server-name", help="name the server's certificate must carry")
    p.add_argument("--api-key-file", help="send this file's key as 'authorization: Bearer <key>'")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="prompt text")
    prompt.add_argument("--prompt-ids", type=_parse_ids, help="prompt token ids, comma-separated")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--request-id", default="")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="stream tokens as they come (default) or make one unary call")
    p.add_argument("--logprobs", action="store_true", help="print token ids and logprobs")
    p.add_argument("--adapter", default="", help="generate with this loaded LoRA adapter")
    p.add_argument("--timeout-s", type=float, help="deadline of each call in seconds")
    p.add_argument("--info", action="store_true", help="print the model and server information")
    p.add_argument("--tokenize", metavar="TEXT", help="print the token ids of TEXT")
    p.add_argument("--detokenize", metavar="IDS", type=_parse_ids, help="print the text of ids")
    args = p.parse_args(argv)
    if (args.prompt is None and args.prompt_ids is None and not args.info
            and args.tokenize is None and args.detokenize is None):
        p.error("nothing to do: give --prompt, --prompt-ids, --info, --tokenize or --detokenize")

    if (args.tls_cert is None) != (args.tls_key is None):
        p.error("give --tls-cert and --tls-key together")

    def _read(path):
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    try:
        api_key = read_api_key_file(args.api_key_file) if args.api_key_file else None
        conn = dict(tls=args.tls, root_certificates=_read(args.tls_ca),
                    client_cert=_read(args.tls_cert), client_key=_read(args.tls_key),
                    server_name=args.tls_server_name, api_key=api_key)
    except (OSError, ValueError) as e:
        print(f"ltm_client: {e}", file=sys.stderr)
        return 2
    try:
        with LtmClient(args.server, timeout=args.timeout_s, **conn) as client:
            if args.info:
                print(client.model_info(), end="", flush=True)
            if args.tokenize is not None:
                print(",".join(str(i) for i in client.tokenize(args.tokenize)), flush=True)
            if args.detokenize is not None:
                print(client.detokenize(args.detokenize), flush=True)
            if args.prompt is None and args.prompt_ids is None:
                return 0
            kwargs = dict(prompt_token_ids=args.prompt_ids, max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed,
                          stop=args.stop, return_logprobs=args.logprobs,
                          request_id=args.request_id, ignore_eos=args.ignore_eos,
                          adapter=args.adapter)
            if not args.stream:
                resp = client.generate(args.prompt, **kwargs)
                print(resp.text, flush=True)
                _summary(resp, resp.token_ids, resp.logprobs, args.logprobs)
                return 0
            ids, logprobs, last = [], [], None
            for msg in client.generate_stream(args.prompt, **kwargs):
                sys.stdout.write(msg.text)
                sys.stdout.flush()
                ids.extend(msg.token_ids)
                logprobs.extend(msg.logprobs)
                last = msg
            print(flush=True)
            if last is not None:
                _summary(last, ids, logprobs, args.logprobs)
            return 0
    except grpc.RpcError as e:
        sys.stdout.flush()
        print(f"ltm_client: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
