"""Shared helpers for the llama.cpp reference scripts (stdlib + xllamacpp only).

- ``LlamaServer``: starts llama.cpp's HTTP server *in-process* through
  ``xllamacpp.Server(CommonParams)`` (pip ``xllamacpp==2026.10.11549``, a
  prebuilt llama.cpp with its native server). The server listens on
  127.0.0.1 on an OS-chosen free port (``params.port = 0``);
  ``server.listening_address`` gives ``http://127.0.0.1:PORT``. Requests go
  over HTTP with ``urllib`` (llama.cpp native endpoints ``/tokenize``,
  ``/detokenize``, ``/completion``, ``/props``). Dropping the last reference to
  the ``xllamacpp.Server`` object stops the server.
- ``read_gguf_metadata``: a tiny GGUF v2/v3 header reader returning the scalar
  key/value pairs (arrays are skipped and reported only by length).
- ``sha256_file``.
"""

import gc
import hashlib
import json
import struct
import urllib.request

EXPECTED_SHA256 = {
    "smollm2-135m-instruct": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "qwen2.5-coder-0.5b-instruct": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------
# GGUF metadata (header only)
# --------------------------------------------------------------------------
_SCALAR = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path):
    """Return {key: value} for scalar/string KVs; arrays become {"array_len": n}."""
    with open(path, "rb") as f:
        def rd(fmt):
            n = struct.calcsize(fmt)
            return struct.unpack(fmt, f.read(n))[0]

        def rstr():
            n = rd("<Q")
            return f.read(n).decode("utf-8", errors="replace")

        def rval(t):
            if t in _SCALAR:
                return rd(_SCALAR[t])
            if t == _STRING:
                return rstr()
            if t == _ARRAY:
                et = rd("<I")
                n = rd("<Q")
                if et in _SCALAR:
                    f.seek(struct.calcsize(_SCALAR[et]) * n, 1)
                elif et == _STRING:
                    for _ in range(n):
                        f.seek(rd("<Q"), 1)
                else:
                    for _ in range(n):
                        rval(et)
                return {"array_len": n}
            raise ValueError(f"unknown GGUF value type {t}")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = rd("<I")
        _n_tensors = rd("<Q")
        n_kv = rd("<Q")
        meta = {"gguf.version": version}
        for _ in range(n_kv):
            key = rstr()
            meta[key] = rval(rd("<I"))
        return meta


# --------------------------------------------------------------------------
# llama.cpp server (in-process, via xllamacpp)
# --------------------------------------------------------------------------
class LlamaServer:
    def __init__(self, gguf_path, threads=1, n_ctx=2048, verbosity=None):
        import xllamacpp as xlc

        self.xlc = xlc
        p = xlc.CommonParams()
        p.model.path = gguf_path
        p.n_ctx = n_ctx
        p.n_batch = 2048
        p.n_ubatch = 512
        p.n_parallel = 1             # one slot: requests are processed serially
        p.n_gpu_layers = 0           # CPU only (the PyPI wheel is a CPU build anyway)
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
        p.hostnames = ["127.0.0.1"]
        p.port = 0                   # OS picks a free loopback port
        if verbosity is not None:
            p.verbosity = verbosity
        self.params = p
        self.threads = threads
        self.n_ctx = n_ctx
        self.server = xlc.Server(p)
        self.base = self.server.listening_address.rstrip("/")

    def request(self, path, body=None, timeout=600):
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(
            self.base + path, data=data,
            headers={"Content-Type": "application/json"},
            method="GET" if body is None else "POST")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode("utf-8"))

    def tokenize(self, text, add_special=False, parse_special=True):
        r = self.request("/tokenize", {"content": text, "add_special": add_special,
                                       "parse_special": parse_special})
        return [int(t) for t in r["tokens"]]

    def detokenize(self, ids):
        return self.request("/detokenize", {"tokens": list(ids)})["content"]

    def props(self):
        return self.request("/props")

    def close(self):
        if getattr(self, "server", None) is not None:
            self.server = None
            gc.collect()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def xllamacpp_versions():
    import xllamacpp as xlc
    from xllamacpp import _version
    v = _version.get_versions()
    return {"xllamacpp": xlc.__version__, "xllamacpp_git_revision": v.get("full-revisionid")}
