"""A local HTTP stand-in for the Hub endpoints ``huggingface_hub`` calls when committing a dataset.

Implements repo creation, the recursive tree listing, ``preupload`` (every file answered as a
regular git blob, so the client sends contents inline in the commit) and ``commit`` (NDJSON:
header, files, deletions). It keeps every repo's files in memory, counts how often each path was
committed, and can be told to fail commits with a status code, to test retries and resumption.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml


@dataclass
class CommitFailure:
    """Fail the next ``times`` commits whose summary contains ``match`` with HTTP ``status``."""

    match: str
    times: int
    status: int = 500


@dataclass
class HubState:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    commits: list[dict] = field(default_factory=list)
    commit_count_by_path: dict[str, int] = field(default_factory=dict)
    failures: list[CommitFailure] = field(default_factory=list)
    failed_commits: int = 0
    authorizations: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


_TREE = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/?]+)")
_PREUPLOAD = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/?]+)")
_COMMIT = re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/?]+)")


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _HubHandler(BaseHTTPRequestHandler):
    """The routes; ``state`` is bound per server by :func:`make_handler`."""

    state: HubState

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def do_GET(self):
        self.state.authorizations.add(self.headers.get("Authorization", ""))
        match = _TREE.match(self.path)
        if not match:
            return self._send(404, {"error": f"no route {self.path}"})
        files = self.state.repos.get(match["repo"])
        if files is None:
            return self._send(404, {"error": "Repository not found"})
        return self._send(
            200,
            [
                {"type": "file", "path": path, "size": len(data), "oid": _blob_id(data)}
                for path, data in sorted(files.items())
            ],
        )

    def do_POST(self):
        self.state.authorizations.add(self.headers.get("Authorization", ""))
        body = self._body()
        if self.path.startswith("/api/repos/create"):
            payload = json.loads(body)
            repo = f"{payload.get('organization') or 'user'}/{payload['name']}"
            with self.state.lock:
                self.state.repos.setdefault(repo, {})
            host = f"http://{self.headers['Host']}"
            return self._send(200, {"url": f"{host}/datasets/{repo}", "name": repo})
        if self.path.startswith("/api/validate-yaml"):
            return self._validate_card(json.loads(body)["content"])
        if match := _PREUPLOAD.match(self.path):
            files = json.loads(body)["files"]
            return self._send(
                200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
            )
        if match := _COMMIT.match(self.path):
            return self._commit(match["repo"], body)
        return self._send(404, {"error": f"no route {self.path}"})

    def _validate_card(self, content: str) -> None:
        """The checks the Hub makes that matter here: YAML front matter whose configs name splits and files."""
        errors = []
        try:
            front = yaml.safe_load(content.split("---", 2)[1]) if content.startswith("---") else {}
            for config in front.get("configs", []):
                if not config.get("config_name") or not all(
                    re.match(r"^\w+(\.\w+)*$", f["split"]) and f["path"] for f in config["data_files"]
                ):
                    errors.append({"message": f"bad config {config!r}"})
        except (yaml.YAMLError, IndexError, KeyError, TypeError) as exc:
            errors.append({"message": f"invalid YAML metadata: {exc}"})
        return self._send(400 if errors else 200, {"errors": errors, "warnings": []})

    def _commit(self, repo: str, body: bytes) -> None:
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        with self.state.lock:
            for failure in self.state.failures:
                if failure.times > 0 and failure.match in header["summary"]:
                    failure.times -= 1
                    self.state.failed_commits += 1
                    return self._send(failure.status, {"error": "injected failure"})
            files = self.state.repos.setdefault(repo, {})
            changed = []
            for line in lines:
                if line["key"] == "file":
                    value = line["value"]
                    files[value["path"]] = base64.b64decode(value["content"])
                    changed.append(value["path"])
                elif line["key"] == "deletedFile":
                    files.pop(line["value"]["path"], None)
                    changed.append(line["value"]["path"])
                elif line["key"] != "header":
                    return self._send(400, {"error": f"unsupported operation {line['key']}"})
            for path in changed:
                self.state.commit_count_by_path[path] = self.state.commit_count_by_path.get(path, 0) + 1
            oid = hashlib.sha1(f"{len(self.state.commits)}:{header['summary']}".encode()).hexdigest()
            self.state.commits.append({"summary": header["summary"], "paths": changed, "oid": oid})
        host = f"http://{self.headers['Host']}"
        return self._send(200, {"commitUrl": f"{host}/datasets/{repo}/commit/{oid}", "commitOid": oid})


def make_handler(state: HubState) -> type[_HubHandler]:
    return type("Handler", (_HubHandler,), {"state": state})


class HubStandIn:
    """``with HubStandIn() as hub: HfApi(endpoint=hub.url, token=...)``."""

    def __init__(self):
        self.state = HubState()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.state))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
