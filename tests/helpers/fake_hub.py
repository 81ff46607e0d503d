"""A fake Hugging Face Hub: just the endpoints huggingface_hub calls for create_repo, upload_folder
and hf_hub_download, answered by tests/helpers/http_server.py on 127.0.0.1 (tests point HF_ENDPOINT at it).

Endpoints (model repos; every file is a "regular" git file, so no LFS or Xet upload):
    POST /api/repos/create                               -> {"url": ...}
    POST /api/validate-yaml                              -> no errors
    POST /api/models/OWNER/REPO/preupload/REV            -> uploadMode "regular" for every file
    POST /api/models/OWNER/REPO/commit/REV               -> stores the ndjson commit, new commit sha
    HEAD|GET /OWNER/REPO/resolve/REV/PATH                -> the file, with X-Repo-Commit and ETag
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field

from helpers.http_server import Reply, Request

_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<op>preupload|commit)/(?P<rev>[^/]+)$")


def _json(data, status: int = 200, headers: dict | None = None) -> Reply:
    return Reply(json.dumps(data).encode(), status, {"Content-Type": "application/json", **(headers or {})})


@dataclass
class FakeHub:
    base_url: str = ""
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit sha -> files
    branches: dict[str, str] = field(default_factory=dict)  # "owner/repo" -> head commit sha
    created: list[dict] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)

    def files(self, repo: str) -> dict[str, bytes]:
        return self.commits[self.branches[repo]]

    def add_commit(self, repo: str, files: dict[str, bytes]) -> str:
        parent = self.branches.get(repo)
        merged = {**(self.commits[parent] if parent else {}), **files}
        sha = hashlib.sha1(
            json.dumps(sorted((k, hashlib.sha1(v).hexdigest()) for k, v in merged.items())).encode()
        ).hexdigest()
        self.commits[sha], self.branches[repo] = merged, sha
        return sha

    def __call__(self, request: Request) -> Reply | None:
        self.auth.append(request.headers.get("Authorization") or request.headers.get("authorization"))
        if request.method == "POST" and request.path == "/api/repos/create":
            body = json.loads(request.body)
            self.created.append(body)
            repo = f"{body['organization']}/{body['name']}"
            if repo not in self.branches:
                self.add_commit(repo, {".gitattributes": b""})
            return _json({"url": f"{self.base_url}/{repo}", "name": repo, "id": repo})
        if request.method == "POST" and request.path == "/api/validate-yaml":
            return _json({"errors": [], "warnings": []})
        if match := _API.match(request.path):
            return self._api(match["repo"], match["op"], request.body)
        if match := _RESOLVE.match(request.path):
            return self._resolve(match["repo"], match["rev"], match["path"])
        return None

    def _api(self, repo: str, op: str, body: bytes) -> Reply:
        if repo not in self.branches:
            return _json({"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"})
        if op == "preupload":
            files = json.loads(body)["files"]
            return _json(
                {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
            )
        added = {}
        for line in body.splitlines():
            item = json.loads(line)
            if item["key"] == "file":
                added[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
        sha = self.add_commit(repo, added)
        return _json({"commitUrl": f"{self.base_url}/{repo}/commit/{sha}", "commitOid": sha, "pullRequestUrl": None})

    def _resolve(self, repo: str, rev: str, path: str) -> Reply:
        if repo not in self.branches:
            return _json({"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"})
        sha = self.branches[repo] if rev == "main" else rev
        if sha not in self.commits:
            return _json({"error": "Revision not found"}, 404, {"X-Error-Code": "RevisionNotFound"})
        data = self.commits[sha].get(path)
        if data is None:
            return _json({"error": "Entry not found"}, 404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha})
        etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return Reply(data, 200, {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream"})
