"""A loopback stand-in for the Hugging Face Hub HTTP API, in memory. For tests only.

It speaks the subset of the Hub API that `huggingface_hub` (1.x), `datasets`, `transformers` and TRL call to create
repos, upload (regular and git-LFS), list, download and validate cards, for model and dataset repos, on 127.0.0.1
and a free port:

* GET `/api/whoami-v2`; POST `/api/repos/create` (409 with the repo `url` when it exists); POST `/api/validate-yaml`
  (400 when the card's YAML does not parse or its `model-index` misses a required key);
* GET `/api/{models|datasets}/{id}[/revision/{rev}]` (repo info with `siblings`);
* POST `.../preupload/{rev}`: `lfs` for known binary extensions (safetensors, parquet, png, ...), samples with a NUL
  byte and files over 10 MB, `regular` otherwise; the `oid` of a file that is already there;
* POST `.../commit/{rev}` (NDJSON: `header`, `file` base64, `lfsFile` pointers to uploaded objects, `deletedFile`,
  `deletedFolder`);
* GET `.../tree/{rev}[/{path}]` (`recursive`, `expand`; 404 `EntryNotFound` for a missing folder, which
  `HfFileSystem.glob` relies on); POST `.../paths-info/{rev}`; GET `.../refs`; GET `.../commits/{rev}`;
* git-LFS basic transfer: POST `/[datasets/]{id}.git/info/lfs/objects/batch`, then PUT to the returned `href`
  (a "presigned" URL: no token needed, the body must hash to the announced sha256);
* HEAD/GET `/[datasets/]{id}/resolve/{rev}/{path}` with `X-Repo-Commit`, `ETag` and byte ranges.

Errors carry the Hub's `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`), so the client raises
its usual exceptions. Any other route answers 404 with the path in the JSON body and is recorded in
`unknown_requests`, so that a test fails loudly when a library starts calling something new. With `token` set,
every request except the presigned upload must carry `Authorization: Bearer <token>` (401 otherwise, as the Hub
answers a missing or wrong token).

How to point the libraries at it: `huggingface_hub`, `datasets` and `transformers` read `HF_ENDPOINT` (and
`HF_HUB_OFFLINE`) once, when they are imported, and copy it into many module constants, so patching them in a
process that has already imported them is fragile. The robust way, used by the tests, is to run the client code in
a subprocess whose environment is `server.client_env()`: `HF_ENDPOINT` = this server, `HF_HUB_OFFLINE=0`,
`HF_HUB_DISABLE_XET=1` (otherwise uploads go through Xet storage, which this server does not speak), telemetry off,
and `HF_TOKEN` = the server's token.

Not the Hub: no Xet, no pull requests or branches other than `main`, no gating, no rate limits, and the YAML check
covers only what is listed above.

Example:
    ```python
    import subprocess, sys
    from trl_agents.loopback import LoopbackHubServer

    script = "from huggingface_hub import HfApi; HfApi().create_repo('tester/demo'); print('ok')"
    with LoopbackHubServer(token="hf_test") as hub:
        subprocess.run([sys.executable, "-c", script], env=hub.client_env(home="/tmp/home"), check=True)
        assert hub.count("repos/create") == 1 and hub.files("tester/demo") == {}
    ```

    >>> import json, urllib.request
    >>> with LoopbackHubServer(user="tester") as hub:
    ...     request = urllib.request.Request(f"{hub.url}/api/repos/create", method="POST",
    ...                                      data=json.dumps({"name": "demo", "type": "model"}).encode())
    ...     print(json.load(urllib.request.urlopen(request))["url"].removeprefix(hub.url))
    ...     hub.count("repos/create"), hub.unknown_requests
    /tester/demo
    (1, [])
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from .base import Answer, LoopbackHTTPServer, RequestError

LFS_SIZE_THRESHOLD = 10 * 1024 * 1024  # the Hub stores larger files with LFS whatever their type
LFS_EXTENSIONS = (  # a subset of the Hub's default .gitattributes
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".npy", ".npz", ".pkl", ".pickle",
    ".parquet", ".arrow", ".png", ".jpg", ".jpeg", ".gif", ".zip", ".gz", ".tar", ".zst", ".model",
)
REPO_TYPES = {"models": "model", "datasets": "dataset"}
_REPO = r"(?P<repo_id>[\w.\-]+/[\w.\-]+)"
_API = rf"^/api/(?P<kind>models|datasets)/{_REPO}"
_ROUTES = [  # (method, route name used by count(), path pattern); path patterns match the raw (quoted) path
    ("GET", "whoami-v2", r"^/api/whoami-v2$"),
    ("POST", "repos/create", r"^/api/repos/create$"),
    ("POST", "validate-yaml", r"^/api/validate-yaml$"),
    ("POST", "preupload", _API + r"/preupload/(?P<revision>[^/]+)$"),
    ("POST", "commit", _API + r"/commit/(?P<revision>[^/]+)$"),
    ("GET", "tree", _API + r"/tree/(?P<revision>[^/]+)(?:/(?P<path>.+))?$"),
    ("POST", "paths-info", _API + r"/paths-info/(?P<revision>[^/]+)$"),
    ("GET", "refs", _API + r"/refs$"),
    ("GET", "commits", _API + r"/commits/(?P<revision>[^/]+)$"),
    ("GET", "repo-info", _API + r"(?:/revision/(?P<revision>[^/]+))?$"),
    ("POST", "lfs-batch", rf"^/(?P<prefix>datasets/)?{_REPO}\.git/info/lfs/objects/batch$"),
    ("PUT", "lfs-upload", r"^/lfs-upload/(?P<oid>[0-9a-f]{64})$"),
    ("HEAD", "resolve", rf"^/(?P<prefix>datasets/)?{_REPO}/resolve/(?P<revision>[^/]+)/(?P<path>.+)$"),
    ("GET", "resolve", rf"^/(?P<prefix>datasets/)?{_REPO}/resolve/(?P<revision>[^/]+)/(?P<path>.+)$"),
]
_ROUTES = [(method, name, re.compile(pattern)) for method, name, pattern in _ROUTES]
_REPO_NAME = re.compile(r"^[\w][\w.\-]{0,94}$")
_FRONT_MATTER = re.compile(r"^---\s*\n(.*?)\n---\s*(\n|$)", re.DOTALL)  # a card's YAML metadata block
# model-index keys the Hub's card validation requires (hub-docs modelcard.md spec).
_MODEL_INDEX_REQUIRED = {"task": ("type",), "dataset": ("type", "name"), "metric": ("type", "value")}


@dataclass
class StoredFile:
    """One file of a commit: its bytes, whether the repo stores it with LFS, and the commit that last wrote it."""

    content: bytes
    lfs: bool
    last_commit: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def git_oid(self) -> str:
        """Git blob id: of the content for a regular file, of the LFS pointer for an LFS file (as git stores it)."""
        blob = self.pointer if self.lfs else self.content
        return hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest()

    @property
    def pointer(self) -> bytes:
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.content)}\n"
        return pointer.encode()


@dataclass
class Commit:
    oid: str
    title: str
    message: str
    date: str
    files: dict[str, StoredFile]


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    created: str
    commits: list[Commit] = field(default_factory=list)  # oldest first; the last one is `main`

    def commit_at(self, revision: str) -> Commit:
        revision = unquote(revision)
        if revision in ("main", "refs/heads/main"):
            return self.commits[-1]
        for commit in self.commits:
            if commit.oid == revision:
                return commit
        raise RequestError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    @property
    def url_prefix(self) -> str:
        return "" if self.repo_type == "model" else f"{self.repo_type}s/"


class LoopbackHubServer(LoopbackHTTPServer):
    """A Hub-compatible HTTP server on 127.0.0.1 that keeps its repos in memory (tests only).

    Args:
        token: When set, requests must carry `Authorization: Bearer <token>` (401 otherwise), as on the Hub for
            writes and private repos; None accepts every request.
        user: The user name `whoami` reports, and the namespace of `create_repo("name")` without one.

    Use as a context manager (`with LoopbackHubServer() as hub: hub.url`). Every request is recorded:
    `count(route)` tells how often a route was called (route names as in the module docstring, e.g. "commit",
    "lfs-batch", "resolve"), `unknown_requests` lists those that matched no route, `files(repo_id)` returns a repo's
    content for assertions.
    """

    def __init__(self, token: str | None = None, user: str = "tester"):
        super().__init__()
        self.token = token
        self.user = user
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lfs_objects: dict[str, bytes] = {}  # sha256 -> bytes, uploaded but maybe not committed yet
        self.requests: list[tuple[str, str, str]] = []  # (method, route name or "unknown", path)
        self._lock = threading.RLock()

    def client_env(self, home: str | None = None, token: str | None | bool = True) -> dict[str, str]:
        """Environment for a subprocess whose huggingface_hub / datasets / transformers should talk to this server.

        Args:
            home: HOME and HF_HOME of the subprocess (caches, stored tokens); a new temporary folder when None.
            token: `True` passes the server's token as HF_TOKEN, a string passes that token, `None`/`False` none.
        """
        home = home or tempfile.mkdtemp(prefix="loopback-hub-home-")
        env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(
            HOME=home,
            HF_HOME=os.path.join(home, ".cache", "huggingface"),
            HF_ENDPOINT=self.url,
            HF_HUB_OFFLINE="0",
            HF_HUB_DISABLE_XET="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            HF_HUB_DISABLE_UPDATE_CHECK="1",
            TRANSFORMERS_OFFLINE="0",
        )
        token = self.token if token is True else token
        if token:
            env["HF_TOKEN"] = token
        return env

    # ---- what clients did ------------------------------------------------------------------------------------------

    def count(self, route: str) -> int:
        """Number of requests received on a route, by name (e.g. "commit", "lfs-upload", "resolve")."""
        with self._lock:
            return sum(name == route for _, name, _ in self.requests)

    @property
    def unknown_requests(self) -> list[str]:
        """`"METHOD /path"` of every request that matched no route."""
        with self._lock:
            return [f"{method} {path}" for method, name, path in self.requests if name == "unknown"]

    def files(self, repo_id: str, repo_type: str = "model", revision: str = "main") -> dict[str, bytes]:
        """The files of a repo at a revision: path -> content."""
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            return {path: stored.content for path, stored in repo.commit_at(revision).files.items()}

    # ---- dispatch --------------------------------------------------------------------------------------------------

    def handle(self, method: str, target: str, headers, body: bytes) -> Answer:
        """Answer one request: (status, extra headers, JSON-able answer, or bytes for a raw body)."""
        parts = urlsplit(target)
        for route_method, name, pattern in _ROUTES:
            match = pattern.match(parts.path)
            if match and route_method == method:
                break
        else:
            with self._lock:
                self.requests.append((method, "unknown", parts.path))
            raise RequestError(404, f"loopback Hub: no route for {method} {parts.path}")
        with self._lock:
            self.requests.append((method, name, parts.path))
        authorized = headers.get("Authorization") == f"Bearer {self.token}"
        if self.token is not None and name != "lfs-upload" and not authorized:  # (the upload URL is "presigned")
            raise RequestError(401, "Invalid credentials in Authorization header")
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        params = {key: value for key, value in match.groupdict().items() if value is not None}
        handler = getattr(self, "_" + name.replace("-", "_").replace("/", "_"))
        with self._lock:
            return handler(method=method, query=query, headers=headers, body=body, **params)

    def error_answer(self, error: RequestError) -> Answer:
        """The Hub's error answer: `{"error": message}` (plus body keys), `X-Error-Message` and `X-Error-Code`, which
        huggingface_hub turns into its exceptions."""
        headers = {**error.headers, "X-Error-Message": error.message}
        if error.code:
            headers["X-Error-Code"] = error.code
        return error.status, headers, {"error": error.message, **error.body}

    def _repo(self, repo_type: str, repo_id: str) -> Repo:
        try:
            return self.repos[(repo_type, repo_id)]
        except KeyError:
            raise RequestError(404, "Repository not found", "RepoNotFound") from None

    def _repo_from(self, kind: str | None = None, prefix: str | None = None, repo_id: str = "") -> Repo:
        repo_type = REPO_TYPES[kind] if kind else ("dataset" if prefix else "model")
        return self._repo(repo_type, repo_id)

    # ---- account and repos -----------------------------------------------------------------------------------------

    def _whoami_v2(self, headers, **_) -> tuple:
        if not headers.get("Authorization"):  # the Hub needs a token to tell who you are
            raise RequestError(401, "Invalid credentials in Authorization header")
        access = {"displayName": "loopback", "role": "write"}
        return 200, {}, {"type": "user", "id": "0", "name": self.user, "fullname": self.user, "orgs": [],
                         "auth": {"type": "access_token", "accessToken": access}}

    def _repos_create(self, body, **_) -> tuple:
        request = json.loads(body or b"{}")
        name, namespace = request.get("name", ""), request.get("organization") or self.user
        repo_type = request.get("type") or "model"
        if repo_type not in REPO_TYPES.values():
            raise RequestError(400, f"loopback Hub: repo type {repo_type!r} is not supported (model, dataset)")
        if not _REPO_NAME.match(name) or "--" in name or ".." in name or name.endswith((".git", ".")):
            raise RequestError(400, f"Invalid repo name: {name!r}")
        private = request.get("visibility", "private" if request.get("private") else "public") == "private"
        repo = Repo(repo_type, f"{namespace}/{name}", private, _now())
        repo_id, url = repo.repo_id, f"{self.url}/{repo.url_prefix}{repo.repo_id}"
        if (repo_type, repo_id) in self.repos:
            raise RequestError(409, "You already created this repo", body={"url": url})
        repo.commits.append(Commit(_new_oid(), "initial commit", "", repo.created, {}))
        self.repos[(repo_type, repo_id)] = repo
        return 200, {}, {"url": url, "name": repo_id, "id": repo_id}

    def _validate_yaml(self, body, **_) -> tuple:
        content = json.loads(body).get("content", "")
        errors = []
        match = _FRONT_MATTER.match(content)
        if match:
            try:
                metadata = yaml.safe_load(match.group(1)) or {}
            except yaml.YAMLError as err:
                metadata, errors = {}, [{"message": f"YAML does not parse: {err}"}]
            errors += [{"message": message} for message in _model_index_errors(metadata)]
        return (400 if errors else 200), {}, {"errors": errors, "warnings": []}

    def _repo_info(self, kind, repo_id, revision="main", **_) -> tuple:
        repo = self._repo_from(kind, repo_id=repo_id)
        commit = repo.commit_at(revision)
        info = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "author": repo_id.split("/")[0],
            "sha": commit.oid, "private": repo.private, "gated": False, "disabled": False, "lastModified": commit.date,
            "createdAt": repo.created, "downloads": 0, "likes": 0, "tags": [],
            "siblings": [{"rfilename": path, "size": len(stored.content), "blobId": stored.git_oid}
                         for path, stored in sorted(commit.files.items())],
        }
        card = commit.files.get("README.md")
        if card is not None:
            info["cardData"] = _front_matter(card.content.decode("utf-8", "replace"))
        if kind == "models":
            info["modelId"] = repo_id
        return 200, {}, info

    # ---- uploads ---------------------------------------------------------------------------------------------------

    def _preupload(self, kind, repo_id, revision, query, body, **_) -> tuple:
        repo = self._repo_from(kind, repo_id=repo_id)
        if query.get("create_pr"):
            raise RequestError(400, "loopback Hub: pull requests are not supported")
        commit = repo.commit_at(revision)
        answers = []
        for entry in json.loads(body)["files"]:
            sample = base64.b64decode(entry.get("sample", ""))
            binary = entry["path"].lower().endswith(LFS_EXTENSIONS) or b"\0" in sample
            lfs = binary or entry["size"] > LFS_SIZE_THRESHOLD
            existing = commit.files.get(entry["path"])
            oid = None if existing is None else (existing.sha256 if existing.lfs else existing.git_oid)
            answers.append({"path": entry["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                            "oid": oid})
        return 200, {}, {"files": answers, "commitOid": commit.oid}

    def _lfs_batch(self, repo_id, body, prefix=None, **_) -> tuple:
        self._repo_from(prefix=prefix, repo_id=repo_id)
        request = json.loads(body)
        if request.get("operation") != "upload":
            raise RequestError(400, "loopback Hub: only the LFS 'upload' operation is supported")
        objects = []
        for item in request.get("objects", []):
            answer = {"oid": item["oid"], "size": item["size"], "authenticated": True}
            if item["oid"] not in self.lfs_objects:  # already stored: no action, the client skips the upload
                href = f"{self.url}/lfs-upload/{item['oid']}?signature={secrets.token_hex(8)}"
                answer["actions"] = {"upload": {"href": href, "expires_in": 3600}}
            objects.append(answer)
        return 200, {"Content-Type": "application/vnd.git-lfs+json"}, {"transfer": "basic", "objects": objects}

    def _lfs_upload(self, oid, body, **_) -> tuple:
        if hashlib.sha256(body).hexdigest() != oid:
            raise RequestError(400, f"LFS upload: the body does not hash to {oid}")
        self.lfs_objects[oid] = body
        return 200, {}, b""

    def _commit(self, kind, repo_id, revision, query, body, **_) -> tuple:
        repo = self._repo_from(kind, repo_id=repo_id)
        if query.get("create_pr"):
            raise RequestError(400, "loopback Hub: pull requests are not supported")
        parent = repo.commit_at(revision)
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header = next((line["value"] for line in lines if line["key"] == "header"), {})
        if header.get("parentCommit") not in (None, parent.oid):
            raise RequestError(412, "A commit has happened since. Please refresh and try again.")
        oid = _new_oid()
        files = dict(parent.files)
        for line in lines:
            key, value = line["key"], line["value"]
            path = value.get("path", "")
            if key == "file":
                files[path] = StoredFile(base64.b64decode(value["content"]), False, oid)
            elif key == "lfsFile":
                if value["oid"] not in self.lfs_objects:
                    raise RequestError(400, f"LFS object {value['oid']} of {path} was never uploaded")
                files[path] = StoredFile(self.lfs_objects[value["oid"]], True, oid)
            elif key == "deletedFile":
                if files.pop(path, None) is None:
                    raise RequestError(404, f"cannot delete {path}: not in the repo", "EntryNotFound")
            elif key == "deletedFolder":
                files = {name: f for name, f in files.items() if not name.startswith(path.rstrip("/") + "/")}
            elif key != "header":
                raise RequestError(400, f"loopback Hub: commit operation {key!r} is not supported")
        repo.commits.append(Commit(oid, header.get("summary", ""), header.get("description", ""), _now(), files))
        commit_url = f"{self.url}/{repo.url_prefix}{repo_id}/commit/{oid}"
        return 200, {}, {"success": True, "commitOid": oid, "commitUrl": commit_url, "pullRequestUrl": None}

    # ---- listings --------------------------------------------------------------------------------------------------

    def _tree(self, kind, repo_id, revision, query, path="", **_) -> tuple:
        repo = self._repo_from(kind, repo_id=repo_id)
        commit = repo.commit_at(revision)
        folder = unquote(path).strip("/")
        recursive = query.get("recursive", "").lower() in ("1", "true")
        prefix = folder + "/" if folder else ""
        below = [name for name in commit.files if name.startswith(prefix)]
        if folder and not below:
            raise RequestError(404, f"{folder} does not exist on main", "EntryNotFound")
        entries = {}
        for name in below:
            parts = name[len(prefix):].split("/")
            depth = len(parts) if recursive else 1
            for level in range(1, min(depth, len(parts) - 1) + 1):  # the folders on the way
                sub = prefix + "/".join(parts[:level])
                entries.setdefault(sub, _entry(repo, commit, sub, query.get("expand")))
            if len(parts) == 1 or recursive:
                entries[name] = _entry(repo, commit, name, query.get("expand"))
        return 200, {}, [entries[name] for name in sorted(entries)]

    def _paths_info(self, kind, repo_id, revision, body, **_) -> tuple:
        repo = self._repo_from(kind, repo_id=repo_id)
        commit = repo.commit_at(revision)
        form = parse_qs(body.decode())
        expand = form.get("expand", ["false"])[-1].lower() in ("1", "true")
        paths = [p.strip("/") for p in form.get("paths", [])]
        exists = [p for p in paths if p in commit.files or any(n.startswith(p + "/") for n in commit.files)]
        return 200, {}, [_entry(repo, commit, path, expand) for path in exists]

    def _refs(self, kind, repo_id, **_) -> tuple:
        head = self._repo_from(kind, repo_id=repo_id).commits[-1]
        main = {"name": "main", "ref": "refs/heads/main", "targetCommit": head.oid}
        return 200, {}, {"branches": [main], "tags": [], "converts": [], "pullRequests": []}

    def _commits(self, kind, repo_id, revision, **_) -> tuple:
        repo = self._repo_from(kind, repo_id=repo_id)
        history = repo.commits[: repo.commits.index(repo.commit_at(revision)) + 1]
        return 200, {}, [{"id": c.oid, "title": c.title, "message": c.message, "date": c.date,
                          "authors": [{"user": self.user}]} for c in reversed(history)]

    # ---- downloads -------------------------------------------------------------------------------------------------

    def _resolve(self, method, repo_id, revision, path, headers, prefix=None, **_) -> tuple:
        commit = self._repo_from(prefix=prefix, repo_id=repo_id).commit_at(revision)
        stored = commit.files.get(unquote(path))
        if stored is None:
            raise RequestError(404, "Entry not found", "EntryNotFound", headers={"X-Repo-Commit": commit.oid})
        etag = f'"{stored.sha256 if stored.lfs else stored.git_oid}"'
        answer = {"X-Repo-Commit": commit.oid, "ETag": etag, "Accept-Ranges": "bytes"}
        if stored.lfs:
            answer.update({"X-Linked-Etag": etag, "X-Linked-Size": str(len(stored.content))})
        content, status = stored.content, 200
        ranged = re.match(r"bytes=(\d*)-(\d*)$", headers.get("Range", ""))
        if ranged and method == "GET":
            size = len(content)
            start, end = ranged.groups()
            first = int(start) if start else max(size - int(end), 0)
            last = min(int(end), size - 1) if start and end else size - 1
            if first >= size:
                unsatisfiable = {"Content-Range": f"bytes */{size}"}
                raise RequestError(416, "Requested range not satisfiable", headers=unsatisfiable)
            content, status = content[first : last + 1], 206
            answer["Content-Range"] = f"bytes {first}-{last}/{size}"
        return status, answer, content


def _entry(repo: Repo, commit: Commit, path: str, expand: Any = None) -> dict[str, Any]:
    """A tree / paths-info entry: a file (with its LFS pointer info) or a folder; `lastCommit` when expanded."""
    stored = commit.files.get(path)
    if stored is None:
        entry = {"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest()}
        last = commit
    else:
        entry = {"type": "file", "path": path, "size": len(stored.content), "oid": stored.git_oid}
        if stored.lfs:
            entry["lfs"] = {"oid": stored.sha256, "size": len(stored.content), "pointerSize": len(stored.pointer)}
        last = repo.commit_at(stored.last_commit)
    if expand and str(expand).lower() not in ("0", "false"):
        entry["lastCommit"] = {"id": last.oid, "title": last.title, "date": last.date}
    return entry


def _model_index_errors(metadata: dict[str, Any]) -> list[str]:
    """What the Hub would refuse in a card's `model-index` (missing required keys); [] when it is fine."""
    errors = []
    for model in metadata.get("model-index") or []:
        if not model.get("name"):
            errors.append('"model-index[0].name" is required')
        for result in model.get("results") or []:
            for part, keys in _MODEL_INDEX_REQUIRED.items():
                values = result.get("metrics", []) if part == "metric" else [result.get(part) or {}]
                for value in values:
                    errors += [f'"model-index.results.{part}.{key}" is required' for key in keys if key not in value]
    return errors


def _front_matter(card: str) -> dict[str, Any] | None:
    match = _FRONT_MATTER.match(card)
    try:
        return yaml.safe_load(match.group(1)) if match else None
    except yaml.YAMLError:
        return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _new_oid() -> str:
    return secrets.token_hex(20)
