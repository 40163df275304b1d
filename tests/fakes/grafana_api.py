"""A fake Grafana HTTP API on 127.0.0.1, faithful to what Grafana documents for the endpoints a dashboard push
uses (Grafana HTTP API reference: Health, Folder, Dashboard), so the real grafana-client code path runs against it.

- `GET /api/health` (no authentication): `{"commit", "database": "ok", "version"}`.
- Every other `/api/` path needs `Authorization: Bearer <token>`; otherwise 401 `{"message": "Unauthorized"}`.
- `GET /api/folders`: list of `{id, uid, title}`; `GET /api/folders/:uid`: the folder, or 404
  `{"message": "Folder not found", "status": "not-found"}`.
- `POST /api/folders` `{"uid"?, "title", "parentUid"?}`: 200 and the folder; 400 without a title or with a uid over
  40 characters; 409 when a folder with that uid, or that title, exists.
- `POST /api/dashboards/db` `{"dashboard": {...}, "folderUid"?, "overwrite"?, "message"?}`: 200 `{"id", "uid",
  "url", "status": "success", "version", "slug"}`, the version incremented per save; saved into `folderUid`, or into
  the General folder without one (a dashboard that exists is moved there). 400 for a body that is not a
  JSON object with a `dashboard` object, an empty title, a uid over 40 characters, or an unknown `folderUid`
  ("Folder not found"); 404 for a `dashboard.id` that does not exist. Without `overwrite: true`: 412
  `{"status": "version-mismatch"}` when the uid exists with another version, 412 `{"status": "name-exists"}` when
  another dashboard in the folder has the same title. With `overwrite: true` both are replaced, as Grafana's
  getExistingDashboardByTitleAndFolder does it: the saved dashboard takes the same-titled one's id and uid. 400
  `{"message": "Cannot save provisioned dashboard"}` for a dashboard in `provisioned` (from a file, without
  allowUiUpdates).
- `GET /api/dashboards/uid/:uid`: `{"dashboard", "meta": {"folderId", "folderUid", "folderTitle", "folderUrl",
  "version", "provisioned", ...}}` or 404; the folder fields as Grafana's GetDashboard fills them: the folder's id,
  uid, title and url, or 0, "", "General" and "" for a dashboard in the General folder.

`sub_path` (e.g. "/grafana") serves the API under it, as Grafana with `root_url` behind a reverse proxy; every other
path answers the proxy's HTML 404 page. Every request is recorded (method, path without the sub-path, headers,
parsed JSON body). `fail[(method, path_prefix)] = (status, body)` makes matching requests fail, e.g. a 403 or a 500;
a str body is an HTML page (a proxy's 502).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "11.6.0"
PROXY_404 = ("<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1>"
             "</center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")


def slugify(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def folder_url(uid: str, title: str) -> str:
    return f"/dashboards/f/{uid}/{slugify(title)}"


class FakeGrafana:
    def __init__(self, token: str = "glsa_test_token", version: str = VERSION, sub_path: str = ""):
        self.token = token
        self.version = version
        self.sub_path = sub_path.rstrip("/")
        self.provisioned: set[str] = set()  # uids of dashboards provisioned from files
        self.requests: list[dict] = []
        self.folders: dict[str, dict] = {}
        self.dashboards: dict[str, dict] = {}  # uid -> {"dashboard", "folderUid", "version", "id", "message"}
        self.fail: dict[tuple[str, str], tuple[int, dict]] = {}
        self.lock = threading.Lock()
        self._next_id = 1
        self._server: ThreadingHTTPServer | None = None

    # --- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> "FakeGrafana":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake._handle(self, "GET")

            def do_POST(self):
                fake._handle(self, "POST")

            def do_PUT(self):
                fake._handle(self, "PUT")

            def do_DELETE(self):
                fake._handle(self, "DELETE")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{self.sub_path}"

    def calls(self, method: str | None = None, path: str | None = None) -> list[dict]:
        return [r for r in self.requests if (method is None or r["method"] == method)
                and (path is None or r["path"] == path)]

    # --- dispatch -------------------------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = h.path.split("?", 1)[0]
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body, bad_json = None, False
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                bad_json = True
        if not path.startswith(self.sub_path + "/"):
            status, answer = 404, PROXY_404
        else:
            path = path[len(self.sub_path):]
            with self.lock:
                self.requests.append({"method": method, "path": path, "headers": dict(h.headers.items()),
                                      "body": body})
                status, answer = self._route(h, method, path, body, bad_json)
        html = isinstance(answer, str)
        data = answer.encode() if html else json.dumps(answer).encode()
        h.send_response(status)
        h.send_header("Content-Type", "text/html" if html else "application/json; charset=UTF-8")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _route(self, h, method: str, path: str, body, bad_json: bool) -> tuple[int, object]:
        if method == "GET" and path == "/api/health":
            return 200, {"commit": "fake", "database": "ok", "version": self.version}
        if not path.startswith("/api/"):
            return 404, {"message": "Not found"}
        if h.headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"message": "Unauthorized"}
        for (m, prefix), failure in self.fail.items():
            if m == method and path.startswith(prefix):
                return failure
        if method == "POST":
            if bad_json or not isinstance(body, dict):
                return 400, {"message": "bad request data"}
            if "json" not in (h.headers.get("Content-Type") or ""):
                return 400, {"message": "bad request data: expected Content-Type application/json"}
        if path == "/api/folders" and method == "GET":
            return 200, [{"id": f["id"], "uid": f["uid"], "title": f["title"]} for f in self.folders.values()]
        if path == "/api/folders" and method == "POST":
            return self._create_folder(body)
        if path.startswith("/api/folders/") and method == "GET":
            folder = self.folders.get(path.rsplit("/", 1)[1])
            return (200, folder) if folder else (404, {"message": "Folder not found", "status": "not-found"})
        if path == "/api/dashboards/db" and method == "POST":
            return self._save_dashboard(body)
        if path.startswith("/api/dashboards/uid/") and method == "GET":
            saved = self.dashboards.get(path.rsplit("/", 1)[1])
            if not saved:
                return 404, {"message": "Dashboard not found", "status": "not-found"}
            return 200, {"dashboard": saved["dashboard"],
                         "meta": {**self._folder_meta(saved["folderUid"]), "version": saved["version"],
                                  "slug": slugify(saved["dashboard"]["title"]), "url": saved["url"],
                                  "provisioned": saved["dashboard"]["uid"] in self.provisioned}}
        return 404, {"message": "Not found"}

    def _folder_meta(self, folder_uid: str) -> dict:
        folder = self.folders.get(folder_uid)
        if not folder:
            return {"folderId": 0, "folderUid": "", "folderTitle": "General", "folderUrl": ""}
        return {"folderId": folder["id"], "folderUid": folder["uid"], "folderTitle": folder["title"],
                "folderUrl": folder.get("url", folder_url(folder["uid"], folder["title"]))}

    def _create_folder(self, body: dict) -> tuple[int, object]:
        title = body.get("title")
        if not isinstance(title, str) or not title.strip():
            return 400, {"message": "folder title cannot be empty"}
        uid = body.get("uid") or f"f{self._next_id:08d}"
        if len(uid) > 40:
            return 400, {"message": "uid too long, max 40 characters"}
        if uid in self.folders:
            return 409, {"message": "a folder with the same uid already exists"}
        if any(f["title"] == title and f.get("parentUid") == body.get("parentUid") for f in self.folders.values()):
            return 409, {"message": "a folder or dashboard in the general folder with the same name already exists"}
        folder = {"id": self._next_id, "uid": uid, "title": title, "url": folder_url(uid, title),
                  "hasAcl": False, "canSave": True, "canEdit": True, "canAdmin": True, "version": 1}
        if body.get("parentUid"):
            folder["parentUid"] = body["parentUid"]
        self._next_id += 1
        self.folders[uid] = folder
        return 200, folder

    def _save_dashboard(self, body: dict) -> tuple[int, object]:
        board = body.get("dashboard")
        if not isinstance(board, dict):
            return 400, {"message": "bad request data: dashboard is required"}
        title = board.get("title")
        if not isinstance(title, str) or not title.strip():
            return 400, {"message": "Dashboard title cannot be empty"}
        uid = board.get("uid") or f"d{self._next_id:08d}"
        if len(uid) > 40:
            return 400, {"message": "uid too long, max 40 characters"}
        folder_uid = body.get("folderUid") or ""
        if folder_uid and folder_uid not in self.folders:
            return 400, {"message": "Folder not found"}
        overwrite = body.get("overwrite") is True
        if board.get("id") is not None and not any(d["id"] == board["id"] for d in self.dashboards.values()):
            return 404, {"message": "Dashboard not found", "status": "not-found"}
        existing = self.dashboards.get(uid)
        if existing and not overwrite and board.get("version") != existing["version"]:
            return 412, {"message": "The dashboard has been changed by someone else", "status": "version-mismatch"}
        same_name = [u for u, d in self.dashboards.items()
                     if u != uid and d["folderUid"] == folder_uid and d["dashboard"]["title"] == title]
        if same_name and not overwrite:
            return 412, {"message": "A dashboard with the same name in the folder already exists",
                         "status": "name-exists"}
        if same_name:  # Grafana saves over the same-titled dashboard: its id, its uid
            uid = same_name[0]
            existing = self.dashboards[uid]
        if uid in self.provisioned:
            return 400, {"message": "Cannot save provisioned dashboard"}
        version = existing["version"] + 1 if existing else 1
        ident = existing["id"] if existing else self._next_id
        if not existing:
            self._next_id += 1
        url = f"/d/{uid}/{slugify(title)}"
        stored = dict(board, uid=uid, id=ident, version=version)
        self.dashboards[uid] = {"dashboard": stored, "folderUid": folder_uid, "version": version, "id": ident,
                                "message": body.get("message"), "url": url}
        return 200, {"id": ident, "uid": uid, "url": url, "status": "success", "version": version,
                     "slug": slugify(title), "folderUid": folder_uid}
