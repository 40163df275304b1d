"""Provisioning the dashboards into Grafana through its HTTP API, with grafana-client (GrafanaApi).

What a push does, in Grafana HTTP API terms:
1. GET /api/health: is Grafana there (and its database ok)?
2. GET /api/folders/<uid>: the folder, by uid; 404: POST /api/folders {"uid", "title"} creates it.
3. per dashboard, GET /api/dashboards/uid/<uid>: its version and folder (`meta.folderUid`) in Grafana, if it
   exists;
4. POST /api/dashboards/db {"dashboard": {..., "uid", "id": null, "version"}, "folderUid", "overwrite": false,
   "message"}: the same uids every time, so a push replaces sloscope's own earlier versions (at the version just
   read) and pushing twice leaves the same dashboards (Grafana keeps the versions in its history). `folderUid` is
   the pushed folder for a new dashboard only: one that exists is saved in the folder it is in, where someone may
   have moved it. Grafana's own `overwrite: true` is never sent: besides the dashboard of our uid it replaces any
   other dashboard of the same title in the folder, and the pushed one then takes that dashboard's uid.

The token goes in `Authorization: Bearer` (a Grafana service-account token; it needs to write dashboards and
folders). Every documented error becomes a PushError whose message says what happened and what to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import niquests
from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaServerError, GrafanaTimeoutError

DEFAULT_FOLDER_UID = "sloscope"
DEFAULT_FOLDER_TITLE = "sloscope"
PUSH_MESSAGE = "provisioned by sloscope dashboards push"
MESSAGE_MAX = 160
SUB_PATH_HINT = ": if Grafana is served under a sub-path (its root_url), give it in --url, e.g. http://HOST/grafana"


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


def _one_line(text: str) -> str:
    """An answer's text as one short line: a reverse proxy answers for Grafana with an HTML page (404 under the
    wrong sub-path, 502 while Grafana is down), which is told by its title."""
    if re.search(r"<(!doctype|html|head|body)\b", text, re.IGNORECASE):
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        text = title.group(1) if title else re.sub(r"<[^>]*>", " ", text)
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 3] + "..."


def _message(exc: GrafanaException) -> str:
    response = exc.response
    if isinstance(response, dict):
        return _one_line(str(response.get("message") or response))
    return _one_line(str(response or exc.message))


def _reason(exc: Exception) -> str:
    """The socket's words in a connection error, without the HTTP library's wrapping (pool, object addresses)."""
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)|(Failed to resolve '[^']+')", str(exc))
    return (found.group(1) or found.group(2)).strip() if found else str(exc)


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
        return PushError(f"{what}: cannot reach Grafana at {url}: {_reason(exc)}")
    return PushError(f"{what}: {exc}")


def health(api: GrafanaApi, url: str) -> dict:
    """GET /api/health (no authentication needed): {"database": "ok", "version": ...}."""
    try:
        info = api.client.GET("/health")
    except GrafanaClientError as exc:
        if exc.status_code == 404:
            raise PushError(f"health check: no Grafana API at {url} (GET /api/health answered 404: {_message(exc)})"
                            f"{SUB_PATH_HINT}") from None
        raise _explain(exc, "health check", url) from None
    except Exception as exc:
        raise _explain(exc, "health check", url) from None
    if not isinstance(info, dict):
        raise PushError(f"health check: {url} does not look like Grafana (GET /api/health answered "
                        f"{_one_line(str(info))!r}){SUB_PATH_HINT}")
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


@dataclass(frozen=True)
class Existing:
    """A dashboard of the pushed uid already in Grafana: the version a push replaces, and the uid of the folder it
    is in ("" for General; None when Grafana's answer did not say)."""
    version: int
    folder_uid: str | None


def existing_dashboard(api: GrafanaApi, url: str, uid: str) -> Existing | None:
    """The dashboard `uid` in Grafana: its version and folder; None when there is none."""
    try:
        found = api.dashboard.get_dashboard(uid)
    except GrafanaClientError as exc:
        if exc.status_code == 404:
            return None
        raise _explain(exc, f"dashboard {uid!r}", url) from None
    except Exception as exc:
        raise _explain(exc, f"dashboard {uid!r}", url) from None
    found = found if isinstance(found, dict) else {}
    meta = found.get("meta") or {}
    version = meta.get("version", (found.get("dashboard") or {}).get("version"))
    if not isinstance(version, int):
        raise PushError(f"dashboard {uid!r}: Grafana at {url} answered GET /api/dashboards/uid/{uid} without its "
                        f"version")
    folder_uid = meta.get("folderUid")
    return Existing(version, folder_uid if isinstance(folder_uid, str) else None)


def _refusal(exc: GrafanaClientError, uid: str, title: str | None, folder_uid: str) -> PushError | None:
    """What a 412 or 400 to POST /api/dashboards/db means for the user; None for the other errors."""
    message = _message(exc)
    if exc.status_code == 412:
        status = exc.response.get("status") if isinstance(exc.response, dict) else None
        if status == "version-mismatch":
            return PushError(f"dashboard {uid!r}: it was changed in Grafana while this push ran (412 "
                             f"version-mismatch); push again to replace it")
        if status == "name-exists":
            return PushError(f"dashboard {uid!r}: another dashboard titled {title!r} (another uid) exists in folder "
                             f"{folder_uid!r} (412 name-exists); it is not replaced: rename, move or delete it, or "
                             f"push into another folder with --folder-uid")
        if status == "plugin-dashboard":
            return PushError(f"dashboard {uid!r}: a plugin provides a dashboard with this uid (412 "
                             f"plugin-dashboard); remove the plugin's dashboard first")
        return PushError(f"dashboard {uid!r}: precondition failed (412 {status}: {message})")
    if exc.status_code == 400 and "provisioned" in message.lower():
        return PushError(f"dashboard {uid!r}: Grafana provisions it from a file (400 {message}): update that file "
                         f"with `sloscope dashboards build` instead, or take it out of the file provisioning first")
    if exc.status_code == 400:
        return PushError(f"dashboard {uid!r}: Grafana rejected it (400 {message})")
    return None


def save_dashboard(api: GrafanaApi, url: str, board: dict, folder_uid: str, existing: Existing | None) -> dict:
    """Create the dashboard in the folder `folder_uid` (`existing` None), or replace `existing`, the one of its uid
    read before, at its version and in its folder."""
    uid = board.get("uid")
    dashboard = {**board, "id": None}
    if existing is not None:
        dashboard["version"] = existing.version  # an edit made in Grafana since it was read is a 412, not lost
        if existing.folder_uid is not None:
            # Someone may have moved it there; and Grafana saves a dashboard sent without a folder into General.
            folder_uid = existing.folder_uid
    payload = {"dashboard": dashboard, "folderUid": folder_uid, "overwrite": False, "message": PUSH_MESSAGE}
    try:
        return api.dashboard.update_dashboard(payload)
    except GrafanaClientError as exc:
        raise (_refusal(exc, uid, board.get("title"), folder_uid) or _explain(exc, f"dashboard {uid!r}", url)) \
            from None
    except Exception as exc:
        raise _explain(exc, f"dashboard {uid!r}", url) from None


def push(boards: dict[str, dict], url: str, token: str, *, folder_uid: str = DEFAULT_FOLDER_UID,
         folder_title: str = DEFAULT_FOLDER_TITLE, overwrite: bool = True, timeout: float = 10.0) -> PushResult:
    """Provision `boards` (uid -> dashboard JSON): a new one into the folder `folder_uid` (created if missing), one
    that exists in Grafana replaced in the folder it is in. Without `overwrite`, nothing is pushed when any of them
    exists in Grafana."""
    api = connect(url, token, timeout)
    info = health(api, url)
    found = {uid: existing_dashboard(api, url, uid) for uid in boards}
    kept = [f"{uid} (version {e.version})" for uid, e in found.items() if e is not None]
    if kept and not overwrite:
        raise PushError(f"nothing pushed: {', '.join(kept)} exist in Grafana and --no-overwrite keeps them; push "
                        f"without --no-overwrite to replace them with the generated ones")
    created = ensure_folder(api, url, folder_uid, folder_title)
    result = PushResult(url, folder_uid, created, info.get("version"))
    for uid, board in boards.items():
        answer = save_dashboard(api, url, board, folder_uid, found[uid])
        answer = answer if isinstance(answer, dict) else {}
        result.dashboards.append({"uid": answer.get("uid", uid), "title": board.get("title"),
                                  "version": answer.get("version"), "url": answer.get("url"),
                                  "status": answer.get("status")})
    return result
