"""`dashboards push` and the folders of dashboards that already exist, against the fake of Grafana's HTTP API: one
that someone moved to another folder (or to General) is updated where it is; only a new one goes into
--folder-uid."""

from __future__ import annotations

import pytest
from grafana_client import GrafanaApi

from sloscope.dashboards import grafana as grafana_boards
from sloscope.dashboards.provision import push
from tests.fakes.grafana_api import FakeGrafana
from tests.dashboards.test_dashboards import boards  # noqa: F401 (a fixture)

TOKEN = "glsa_fake_0123456789"


@pytest.fixture
def grafana():
    with FakeGrafana(token=TOKEN) as fake:
        yield fake


def move(api: GrafanaApi, uid: str, folder_uid: str) -> None:
    """Move a dashboard as Grafana's UI does: save it, at the version read, with another folder."""
    found = api.dashboard.get_dashboard(uid)
    api.dashboard.update_dashboard({"dashboard": found["dashboard"], "folderUid": folder_uid, "overwrite": False})


@pytest.mark.parametrize("folder_uid, folder_title", [("team", "Team"), ("", "General")])
def test_a_dashboard_moved_to_another_folder_stays_there_when_pushed_again(grafana, boards, folder_uid,
                                                                           folder_title):
    first = {uid: board for uid, board in boards.items() if uid != grafana_boards.NODE_UID}
    push(first, grafana.url, TOKEN)
    api = GrafanaApi.from_url(grafana.url + "/", credential=TOKEN)
    if folder_uid:
        api.folder.create_folder(folder_title, uid=folder_uid)
    move(api, grafana_boards.OVERVIEW_UID, folder_uid)
    meta = api.dashboard.get_dashboard(grafana_boards.OVERVIEW_UID)["meta"]
    assert (meta["folderUid"], meta["folderTitle"], meta["version"]) == (folder_uid, folder_title, 2)
    assert meta["folderId"] == (grafana.folders[folder_uid]["id"] if folder_uid else 0)

    changed = {**boards, grafana_boards.OVERVIEW_UID: {**boards[grafana_boards.OVERVIEW_UID], "description": "pushed again"}}
    result = push(changed, grafana.url, TOKEN)

    overview = grafana.dashboards[grafana_boards.OVERVIEW_UID]
    assert overview["folderUid"] == folder_uid, "moved back into --folder-uid"
    assert overview["version"] == 3 and overview["dashboard"]["description"] == "pushed again"
    assert [p["body"]["folderUid"] for p in grafana.calls("POST", "/api/dashboards/db")
            if p["body"]["dashboard"]["uid"] == grafana_boards.OVERVIEW_UID][-1] == folder_uid
    assert grafana.dashboards[grafana_boards.NODE_UID]["folderUid"] == "sloscope", "a new dashboard goes into --folder-uid"
    assert {uid: d["folderUid"] for uid, d in grafana.dashboards.items() if uid != grafana_boards.OVERVIEW_UID} == {
        uid: "sloscope" for uid in boards if uid != grafana_boards.OVERVIEW_UID}
    assert [d["version"] for d in result.dashboards if d["uid"] == grafana_boards.NODE_UID] == [1]
