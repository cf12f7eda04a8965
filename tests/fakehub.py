"""A local stand-in for the Hugging Face Hub's file endpoint, for download tests without network.

Serves `HEAD|GET /{owner}/{name}/resolve/{revision}/{file}` with the headers huggingface_hub reads
(X-Repo-Commit, ETag, Content-Length) and the Hub's error codes (RepoNotFound, EntryNotFound,
GatedRepo), from an in-memory {repo: {file: bytes}} table.
"""
from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]], gated: set[str] = frozenset()):
        self.repos = repos
        self.gated = set(gated)
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):
                hub._serve(self, body=False)

            def do_GET(self):
                hub._serve(self, body=True)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, req: BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append((req.command, req.path))
        parts = unquote(req.path.split("?")[0]).strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._error(req, 404, "RepoNotFound")
        repo, file = "/".join(parts[:2]), "/".join(parts[4:])
        if repo in self.gated:
            return self._error(req, 403, "GatedRepo")
        if repo not in self.repos:
            return self._error(req, 404, "RepoNotFound")
        data = self.repos[repo].get(file)
        if data is None:
            return self._error(req, 404, "EntryNotFound")
        commit = hashlib.sha1(repo.encode()).hexdigest()
        req.send_response(200)
        req.send_header("X-Repo-Commit", commit)
        req.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        req.send_header("Content-Length", str(len(data)))
        req.send_header("Content-Type", "application/octet-stream")
        req.end_headers()
        if body:
            req.wfile.write(data)

    @staticmethod
    def _error(req: BaseHTTPRequestHandler, status: int, code: str) -> None:
        req.send_response(status)
        req.send_header("X-Error-Code", code)
        req.send_header("Content-Length", "0")
        req.end_headers()


def fill_cache(cache: Path, repos: dict[str, dict[str, bytes]]) -> None:
    """Lay files out in `cache` the way huggingface_hub does: snapshots/<commit>/<file> + refs/main."""
    for repo, files in repos.items():
        root = cache / ("models--" + repo.replace("/", "--"))
        commit = "c" * 40
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / "main").write_text(commit)
        for name, data in files.items():
            path = root / "snapshots" / commit / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
