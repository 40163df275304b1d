"""Provisioning the dashboards into Grafana through its HTTP API, with grafana-client (GrafanaApi).

What a push does, in Grafana HTTP API terms:
1. GET /api/health: is Grafana there (and its database ok)?
2. GET /api/folders/<uid>: the folder, by uid; 404: POST /api/folders {"uid", "title"} creates it.
3. per dashboard, POST /api/dashboards/db {"dashboard": {..., "uid", "id": null}, "folderUid", "overwrite": true,
   "message"}: the same uids every time, so a push replaces sloscope's own earlier versions and pushing twice
   leaves the same dashboards (Grafana keeps the versions in its history).

The token goes in `Authorization: Bearer` (a Grafana service-account token; it needs to write dashboards and
folders). Every documented error becomes a PushError whose message says what happened and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import niquests
from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaServerError, GrafanaTimeoutError

DEFAULT_FOLDER_UID = "sloscope"
DEFAULT_FOLDER_TITLE = "sloscope"
PUSH_MESSAGE = "provisioned by sloscope dashboards push"


class PushError(RuntimeError):
    """A push that could not complete; the message is for people."""


@dataclass
class PushResult:
    url: str
    folder_uid: str
    folder_created: bool
    grafana_version: str | None
    dashboards: list[dict] = field(default_factory=list)  # uid, title, version, url, status


def _normal_url(url: str) -> str:
    """grafana-client appends `api` to the URL's path, so the path must end with a slash."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PushError(f"--url {url!r}: expected http(s)://HOST[:PORT][/PATH] of the Grafana server")
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def connect(url: str, token: str, timeout: float = 10.0) -> GrafanaApi:
    if not token:
        raise PushError("no Grafana token: set GRAFANA_TOKEN or pass --token-file (a service-account token with "
                        "permission to write dashboards and folders)")
    return GrafanaApi.from_url(_normal_url(url), credential=token, timeout=timeout)


def _message(exc: GrafanaException) -> str:
    response = exc.response
    if isinstance(response, dict):
        return str(response.get("message") or response)
    return str(response or exc.message)


def _explain(exc: Exception, what: str, url: str) -> PushError:
    if isinstance(exc, GrafanaTimeoutError):
        return PushError(f"{what}: Grafana at {url} did not answer in time ({exc.message})")
    if isinstance(exc, GrafanaServerError):
        return PushError(f"{what}: Grafana at {url} failed with {exc.status_code}: {_message(exc)}")
    if isinstance(exc, GrafanaClientError):
        status = exc.status_code
        if status == 401:
            return PushError(f"{what}: Grafana at {url} refused the token (401 {_message(exc)}): check GRAFANA_TOKEN "
                             f"or --token-file (a valid, unexpired service-account token)")
        if status == 403:
            return PushError(f"{what}: the token may not do this (403 {_message(exc)}): give the service account "
                             f"the Editor role, or write access to dashboards and folders")
        return PushError(f"{what}: Grafana answered {status}: {_message(exc)}")
    if isinstance(exc, (niquests.exceptions.RequestException, GrafanaException, OSError)):
        return PushError(f"{what}: cannot reach Grafana at {url}: {exc}")
    return PushError(f"{what}: {exc}")


def health(api: GrafanaApi, url: str) -> dict:
    """GET /api/health (no authentication needed): {"database": "ok", "version": ...}."""
    try:
        info = api.client.GET("/health")
    except Exception as exc:
        raise _explain(exc, "health check", url) from None
    if not isinstance(info, dict):
        raise PushError(f"health check: {url} does not look like Grafana (GET /api/health answered {info!r:.80})")
    if info.get("database") not in (None, "ok"):
        raise PushError(f"health check: Grafana at {url} reports its database as {info.get('database')!r}")
    return info


def ensure_folder(api: GrafanaApi, url: str, uid: str, title: str) -> bool:
    """Make sure the folder `uid` exists; True if it was created now."""
    try:
        api.folder.get_folder(uid)
        return False
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise _explain(exc, f"folder {uid!r}", url) from None
    except Exception as exc:
        raise _explain(exc, f"folder {uid!r}", url) from None
    try:
        api.folder.create_folder(title, uid=uid)
    except GrafanaClientError as exc:
        if exc.status_code == 409:
            raise PushError(f"folder {uid!r}: Grafana has another folder titled {title!r} ({_message(exc)}): pass "
                            f"--folder-title with another title, or --folder-uid with that folder's uid") from None
        raise _explain(exc, f"creating folder {uid!r}", url) from None
    except Exception as exc:
        raise _explain(exc, f"creating folder {uid!r}", url) from None
    return True


def save_dashboard(api: GrafanaApi, url: str, board: dict, folder_uid: str, *, overwrite: bool = True) -> dict:
    uid = board.get("uid")
    payload = {"dashboard": {**board, "id": None}, "folderUid": folder_uid, "overwrite": overwrite,
               "message": PUSH_MESSAGE}
    try:
        return api.dashboard.update_dashboard(payload)
    except GrafanaClientError as exc:
        if exc.status_code == 412:
            status = exc.response.get("status") if isinstance(exc.response, dict) else None
            if status == "version-mismatch":
                raise PushError(f"dashboard {uid!r}: it exists in Grafana and was changed there (412 version-mismatch)"
                                f"; push without --no-overwrite to replace it with the generated one") from None
            if status == "name-exists":
                raise PushError(f"dashboard {uid!r}: another dashboard titled {board.get('title')!r} exists in folder "
                                f"{folder_uid!r} (412 name-exists); rename or move it, or push without "
                                f"--no-overwrite to replace it") from None
            if status == "plugin-dashboard":
                raise PushError(f"dashboard {uid!r}: a plugin provides a dashboard with this uid (412 "
                                f"plugin-dashboard); remove the plugin's dashboard first") from None
            raise PushError(f"dashboard {uid!r}: precondition failed (412 {status}: {_message(exc)})") from None
        if exc.status_code == 400:
            raise PushError(f"dashboard {uid!r}: Grafana rejected it (400 {_message(exc)})") from None
        raise _explain(exc, f"dashboard {uid!r}", url) from None
    except Exception as exc:
        raise _explain(exc, f"dashboard {uid!r}", url) from None


def push(boards: dict[str, dict], url: str, token: str, *, folder_uid: str = DEFAULT_FOLDER_UID,
         folder_title: str = DEFAULT_FOLDER_TITLE, overwrite: bool = True, timeout: float = 10.0) -> PushResult:
    """Provision `boards` (uid -> dashboard JSON) into the folder `folder_uid` (created if missing)."""
    api = connect(url, token, timeout)
    info = health(api, url)
    created = ensure_folder(api, url, folder_uid, folder_title)
    result = PushResult(url, folder_uid, created, info.get("version"))
    for uid, board in boards.items():
        answer = save_dashboard(api, url, board, folder_uid, overwrite=overwrite)
        answer = answer if isinstance(answer, dict) else {}
        result.dashboards.append({"uid": answer.get("uid", uid), "title": board.get("title"),
                                  "version": answer.get("version"), "url": answer.get("url"),
                                  "status": answer.get("status")})
    return result
