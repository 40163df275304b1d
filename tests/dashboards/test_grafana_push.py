"""Provisioning the dashboards into Grafana, against a protocol-faithful fake of its HTTP API: the folder, idempotent
pushes, no dashboard replaced that is not sloscope's own, clear one-line errors (behind a reverse proxy too), and
the token taken from the environment or a file only."""

from __future__ import annotations

import pytest

from sloscope.commands.cli import main
from sloscope.dashboards import grafana as grafana_boards
from sloscope.dashboards.cli import read_token
from sloscope.dashboards.provision import PushError, push
from tests.fakes.grafana_api import FakeGrafana
from tests.dashboards.test_dashboards import boards  # noqa: F401 (a fixture)

TOKEN = "glsa_fake_0123456789"


@pytest.fixture
def grafana():
    with FakeGrafana(token=TOKEN) as fake:
        yield fake


def test_push_creates_the_folder_and_is_idempotent(grafana, boards):
    first = push(boards, grafana.url, TOKEN)
    assert first.folder_created and first.grafana_version == grafana.version
    assert [d["uid"] for d in first.dashboards] == list(boards) and {d["version"] for d in first.dashboards} == {1}
    health = grafana.calls("GET", "/api/health")
    assert health, "the health endpoint is checked first"
    for req in grafana.requests:
        if req["path"] != "/api/health":
            assert req["headers"]["Authorization"] == f"Bearer {TOKEN}"
    create = grafana.calls("POST", "/api/folders")
    assert len(create) == 1 and create[0]["body"] == {"title": "sloscope", "uid": "sloscope"}
    posts = grafana.calls("POST", "/api/dashboards/db")
    assert len(posts) == 3
    for post in posts:
        body = post["body"]
        assert body["overwrite"] is False and body["folderUid"] == "sloscope"
        assert body["dashboard"]["uid"] in boards and body["dashboard"]["id"] is None
        assert {k: v for k, v in body["dashboard"].items() if k != "id"} == boards[body["dashboard"]["uid"]]

    second = push(boards, grafana.url, TOKEN)
    assert not second.folder_created and len(grafana.calls("POST", "/api/folders")) == 1
    assert [d["version"] for d in second.dashboards] == [2, 2, 2]
    replaced = grafana.calls("POST", "/api/dashboards/db")[3:]
    assert [p["body"]["dashboard"]["version"] for p in replaced] == [1, 1, 1], "replaces the version it read"
    assert set(grafana.dashboards) == set(boards) and len(grafana.folders) == 1
    for uid, saved in grafana.dashboards.items():
        assert saved["folderUid"] == "sloscope"
        assert {k: v for k, v in saved["dashboard"].items() if k not in ("id", "version")} == boards[uid]


def test_push_errors_have_clear_messages(grafana, boards):
    with pytest.raises(PushError, match=r"refused the token \(401.*GRAFANA_TOKEN"):
        push(boards, grafana.url, "wrong-token")
    assert not grafana.dashboards

    push(boards, grafana.url, TOKEN)
    with pytest.raises(PushError, match=r"another folder titled 'sloscope'.*--folder-title"):
        push(boards, grafana.url, TOKEN, folder_uid="other-uid")

    grafana.fail[("POST", "/api/dashboards/db")] = (403, {"message": "Access denied"})
    with pytest.raises(PushError, match=r"may not do this \(403 Access denied\)"):
        push(boards, grafana.url, TOKEN)
    grafana.fail[("POST", "/api/dashboards/db")] = (500, {"message": "database is locked"})
    with pytest.raises(PushError, match=r"failed with 500: database is locked"):
        push(boards, grafana.url, TOKEN)


def test_no_overwrite_pushes_nothing_while_a_dashboard_exists(grafana, boards):
    node = {uid: b for uid, b in boards.items() if uid == grafana_boards.NODE_UID}
    push(node, grafana.url, TOKEN)
    with pytest.raises(PushError) as refused:
        push(boards, grafana.url, TOKEN, overwrite=False)
    message = str(refused.value)
    assert "nothing pushed: sloscope-node (version 1) exist" in message and "without --no-overwrite" in message
    assert "changed" not in message, "nobody changed it: it only exists"
    assert set(grafana.dashboards) == {grafana_boards.NODE_UID} and grafana.dashboards[grafana_boards.NODE_UID]["version"] == 1
    assert len(grafana.calls("POST", "/api/dashboards/db")) == 1


def test_a_push_never_replaces_another_dashboard_of_the_same_title(grafana, boards):
    """Grafana's `overwrite: true` saves over a same-titled dashboard of another uid in the folder (and the pushed
    one takes its uid): a push, with or without --no-overwrite, must refuse instead."""
    grafana.folders["sloscope"] = {"id": 50, "uid": "sloscope", "title": "sloscope"}
    theirs = {"uid": "someone-elses", "title": "sloscope / SLO overview", "id": 99, "version": 4, "panels": []}
    grafana.dashboards["someone-elses"] = {"dashboard": theirs, "folderUid": "sloscope", "version": 4, "id": 99,
                                           "message": None, "url": "/d/someone-elses/x"}
    for overwrite in (True, False):
        with pytest.raises(PushError, match=r"another dashboard titled 'sloscope / SLO overview' \(another uid\) "
                           r"exists in folder 'sloscope' \(412 name-exists\); it is not replaced"):
            push(boards, grafana.url, TOKEN, overwrite=overwrite)
        assert grafana.dashboards["someone-elses"]["dashboard"] == theirs
        assert grafana_boards.OVERVIEW_UID not in grafana.dashboards


def test_a_provisioned_dashboard_is_refused_with_what_to_do(grafana, boards):
    push(boards, grafana.url, TOKEN)
    grafana.provisioned.add(grafana_boards.NODE_UID)
    with pytest.raises(PushError, match=r"'sloscope-node': Grafana provisions it from a file \(400 Cannot save "
                       r"provisioned dashboard\): update that file with `sloscope dashboards build`"):
        push(boards, grafana.url, TOKEN)


def test_push_under_a_sub_path_and_one_line_errors_from_a_reverse_proxy(boards):
    with FakeGrafana(token=TOKEN, sub_path="/grafana") as proxied:
        result = push(boards, proxied.url, TOKEN)
        assert proxied.url.endswith("/grafana") and [d["version"] for d in result.dashboards] == [1, 1, 1]
        root = proxied.url.removesuffix("/grafana")
        with pytest.raises(PushError) as wrong_path:
            push(boards, root, TOKEN)
        message = str(wrong_path.value)
        assert "\n" not in message and "<" not in message, message
        assert "no Grafana API at" in message and "answered 404: 404 Not Found)" in message and "sub-path" in message
        proxied.fail[("POST", "/api/dashboards/db")] = (502, "<html>\r\n<head><title>502 Bad Gateway</title></head>"
                                                           "\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
                                                           "</center>\r\n</body>\r\n</html>\r\n")
        with pytest.raises(PushError) as bad_gateway:
            push(boards, proxied.url, TOKEN)
        assert str(bad_gateway.value) == (f"dashboard 'sloscope-slo-overview': Grafana at {proxied.url} failed "
                                          f"with 502: 502 Bad Gateway")


def test_push_reports_an_unreachable_grafana(boards):
    fake = FakeGrafana().start()
    url = fake.url
    fake.stop()
    with pytest.raises(PushError) as refused:
        push(boards, url, TOKEN, timeout=2)
    assert str(refused.value) == f"health check: cannot reach Grafana at {url}: Connection refused"
    with pytest.raises(PushError, match=r"expected http\(s\)://HOST"):
        push(boards, "grafana:3000", TOKEN)


def test_push_command_reads_the_token_from_env_or_file_only(grafana, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    assert main(["dashboards", "push", "--url", grafana.url]) == 2
    assert "GRAFANA_TOKEN" in capsys.readouterr().err
    for flag in (["--token", TOKEN], [f"--token={TOKEN}"]):
        with pytest.raises(SystemExit):
            main(["dashboards", "push", "--url", grafana.url, *flag])
        err = capsys.readouterr().err
        assert TOKEN not in err and "never on the command line" in err
    with pytest.raises(SystemExit):  # not an abbreviation of --token-file
        main(["dashboards", "push", "--url", grafana.url, "--tok", TOKEN])
    assert "unrecognized arguments" in capsys.readouterr().err
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert main(["dashboards", "push", "--url", grafana.url + "/", "--token-file", str(token_file),
                 "--folder-uid", "slo", "--folder-title", "SLOs"]) == 0
    out = capsys.readouterr().out
    assert "folder slo (created)" in out and all(uid in out for uid in grafana_boards.BUILDERS)
    assert grafana.folders["slo"]["title"] == "SLOs"
    monkeypatch.setenv("GRAFANA_TOKEN", "nope")
    assert main(["dashboards", "push", "--url", grafana.url]) == 1
    assert "401" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="first line is empty"):
        read_token(empty)
