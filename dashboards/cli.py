"""`sloscope dashboards build|push` and `sloscope report`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sloscope.slo_spec import SpecError, load_spec

from sloscope.alerts.burn import UnsupportedWindow, burn_windows
from sloscope.analytics.cli import add_range_arguments
from sloscope.analytics.errors import StoreError
from sloscope.analytics.rca import analysed_range, newest_request
from sloscope.analytics.stores import add_store_arguments, open_store, store_url

from sloscope.dashboards import provision
from sloscope.dashboards.grafana import DEFAULT_DATASOURCE_UID, build_all, exporter_gaps, file_name
from sloscope.dashboards.report import Report

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_OUT = Path("var/dashboards")
DEFAULT_REPORT = Path("var/report.html")
TOKEN_ENV = "GRAFANA_TOKEN"


class _RefuseSecret(argparse.Action):
    """A token on the command line would show in `ps` and shell history: refuse it without echoing it."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string}: pass the token in ${TOKEN_ENV} or with --token-file FILE, never on the "
                     f"command line")


def register(subparsers) -> None:
    dash = subparsers.add_parser(
        "dashboards", help="build Grafana dashboards from the SLO spec, or provision them into Grafana",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Grafana dashboards generated from the SLO spec (grafana-foundation-sdk), over the metrics "
        "`sloscope serve` exports at /metrics:\n"
        "  sloscope-slo-overview  per tier: latency percentile vs objective, error ratio, burn rates, budget left\n"
        "  sloscope-node          GPU, SPDK/NVMe and kernel signals of the selected nodes, incident causes\n"
        "  sloscope-incidents     incidents with their top causes, linking to the node dashboard over their time\n"
        "Remediation actions are annotations. The Prometheus data source is a template variable whose default is\n"
        "--datasource-uid.")
    sub = dash.add_subparsers(dest="dashboards_command", metavar="ACTION", required=True)

    def common(p):
        p.add_argument("--slo", type=Path, metavar="SLO.yaml", help="SLO spec (default: the built-in spec)")
        p.add_argument("--datasource-uid", default=DEFAULT_DATASOURCE_UID, metavar="UID",
                       help="uid of the Prometheus data source in Grafana (default: %(default)s)")

    build = sub.add_parser("build", help="write the dashboards as JSON files",
                           description="Write one JSON file per dashboard (<uid>.json), as Grafana stores them: "
                           "import them, provision them from files, or push them with `sloscope dashboards push`.")
    build.add_argument("-o", "--output", type=Path, default=DEFAULT_OUT, metavar="DIR",
                       help="directory to write to (default: %(default)s)")
    common(build)
    build.set_defaults(func=run_build)

    push = sub.add_parser(
        "push", help="provision the dashboards into Grafana (HTTP API)", allow_abbrev=False,
        description="Provision the dashboards into a Grafana folder through its HTTP API (grafana-client): the "
        "folder is created if missing (by uid); dashboards keep their uids and replace their earlier versions, so "
        "pushing again is safe; a dashboard of another uid (the same title in the folder, say) is never replaced. "
        "--url includes Grafana's sub-path, if it has one (http://HOST/grafana). The token (a service-account token "
        f"that may write dashboards and folders) is read from ${TOKEN_ENV} or the first line of --token-file, never "
        "from the command line. Exit status: 0 pushed, 1 Grafana refused or could not be reached (the message says "
        "why), 2 usage error.")
    push.add_argument("--url", required=True, help="Grafana base URL, e.g. http://grafana:3000")
    push.add_argument("--token-file", type=Path, metavar="FILE",
                      help=f"file whose first line is the token (default: ${TOKEN_ENV})")
    push.add_argument("--token", nargs="?", action=_RefuseSecret, help=argparse.SUPPRESS)
    push.add_argument("--folder-uid", default=provision.DEFAULT_FOLDER_UID,
                      help="folder uid for new dashboards; one that exists stays in its folder (default: %(default)s)")
    push.add_argument("--folder-title", default=provision.DEFAULT_FOLDER_TITLE,
                      help="folder title, used when it is created (default: %(default)s)")
    push.add_argument("--no-overwrite", action="store_true",
                      help="push nothing when any of the dashboards exists in Grafana (e.g. edited there)")
    push.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default: %(default)s)")
    common(push)
    push.set_defaults(func=run_push)

    report = subparsers.add_parser(
        "report", help="write a self-contained HTML report of the incidents and their causes",
        description="Analyse the store (as `sloscope rca` does) and write one self-contained HTML file: per "
        "incident, the SLI against the objective with the incident shaded, each top cause's signals on the same "
        "time axis with their onset, the evidence tables, and the remediation suggested and taken (from the "
        "remediation audit, if the database has one). Charts are inline SVG; viewing needs no network.")
    add_store_arguments(report)
    report.add_argument("--slo", type=Path, metavar="SLO.yaml",
                        help="SLO spec (default: the spec last used with this database, else the built-in spec)")
    report.add_argument("-o", "--output", type=Path, default=DEFAULT_REPORT, metavar="FILE",
                        help="HTML file to write (default: %(default)s)")
    add_range_arguments(report)
    report.add_argument("--top", type=int, default=3, help="causes shown per incident (default: %(default)s)")
    report.add_argument("--grafana-url", metavar="URL",
                        help="link each incident to the node dashboard in this Grafana")
    report.set_defaults(func=run_report)


def _spec(path: Path | None, command: str):
    try:
        spec = load_spec(path)
        burn_windows(spec.window_s)  # the burn-rate panels need them
        return spec
    except (SpecError, UnsupportedWindow) as exc:
        print(f"sloscope {command}: {exc}", file=sys.stderr)
        return None


def _print_gaps() -> None:
    gaps = exporter_gaps()
    if gaps:
        names = ", ".join(f"{g.panel} ({g.series})" for g in gaps)
        print(f"note: left out until `sloscope serve` exports their series: {names}", file=sys.stderr)


def build_files(spec, out: Path, datasource_uid: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for uid, board in build_all(spec, datasource_uid).items():
        path = out / file_name(uid)
        path.write_text(json.dumps(board, indent=2, ensure_ascii=False) + "\n")
        written.append(path)
    return written


def run_build(args) -> int:
    spec = _spec(args.slo, "dashboards build")
    if spec is None:
        return EXIT_USAGE
    try:
        written = build_files(spec, args.output, args.datasource_uid)
    except OSError as exc:
        print(f"sloscope dashboards build: {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    for path in written:
        print(path)
    _print_gaps()
    return EXIT_OK


def read_token(token_file: Path | None) -> str:
    """The token from --token-file (first line) or $GRAFANA_TOKEN; ValueError says what is missing."""
    if token_file is not None:
        try:
            lines = token_file.read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"--token-file {token_file}: {exc.strerror or exc}") from None
        token = lines[0].strip() if lines else ""
        if not token:
            raise ValueError(f"--token-file {token_file}: the first line is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ValueError(f"no Grafana token: set ${TOKEN_ENV} or pass --token-file FILE")
    return token


def run_push(args) -> int:
    spec = _spec(args.slo, "dashboards push")
    if spec is None:
        return EXIT_USAGE
    try:
        token = read_token(args.token_file)
    except ValueError as exc:
        print(f"sloscope dashboards push: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = provision.push(build_all(spec, args.datasource_uid), args.url, token, folder_uid=args.folder_uid,
                                folder_title=args.folder_title, overwrite=not args.no_overwrite, timeout=args.timeout)
    except provision.PushError as exc:
        print(f"sloscope dashboards push: {exc}", file=sys.stderr)
        return EXIT_FAILED
    folder = f"folder {result.folder_uid}" + (" (created)" if result.folder_created else "")
    print(f"pushed {len(result.dashboards)} dashboards to {args.url} (Grafana {result.grafana_version or '?'}), "
          f"{folder}:")
    for d in result.dashboards:
        print(f"  {d['uid']}  version {d['version']}  {d['url'] or ''}")
    _print_gaps()
    return EXIT_OK


def write_report(db: Path | str, spec_path: Path | None, out: Path, *, since: str | None = None,
                 until: str | None = None, top: int = 3, grafana_url: str | None = None,
                 password_file: Path | None = None) -> dict:
    """Write the HTML report from `db`, a DuckDB file or a store URL (analytics/stores.py); returns {"path",
    "incidents", "charts"}. Raises StoreError, SpecError, ValueError."""
    url = db if isinstance(db, str) else f"duckdb:///{db}"
    with open_store(url, read_only=True, password_file=password_file) as store:
        spec = store.spec(spec_path)
        t_since, t_until = analysed_range(since or "", until or "", newest_request(store))
        report = Report(store, spec, top=top, grafana_url=grafana_url)
        html = report.render(t_since, t_until, db_label=str(store.path))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html)
    tmp.replace(out)
    return {"path": out, "incidents": html.count("<a href='#episode-"), "charts": html.count("<svg ")}


def run_report(args) -> int:
    try:
        info = write_report(store_url(args), args.slo, args.output, since=args.since, until=args.until, top=args.top,
                            grafana_url=args.grafana_url, password_file=args.store_password_file)
    except (StoreError, SpecError, ValueError) as exc:
        print(f"sloscope report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"sloscope report: {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {info['path']}: {info['incidents']} incident(s), {info['charts']} charts")
    return EXIT_OK
