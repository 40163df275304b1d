"""The multiwindow, multi-burn-rate alert windows for an SLO window: one definition, read by the rules and the
dashboards.

Each alert stands for a share of the error budget spent within its long window (SRE Workbook, chapter 5): 2 %
in 1h and 5 % in 6h page, 10 % in 3d opens a ticket; the short window (1/12 of the long one) ends the alert
once the burn stops. Its burn-rate factor is that share times the SLO window over the long window, as Sloth
computes it: 14.4x, 6x and 1x for 30 days.

- For 28 and 30 days the windows are the Workbook's, as in Sloth's two built-in window sets (for 28 days the
  factors are therefore 13.44x, 5.6x and 0.93x).
- Any other SLO window scales the windows with it, as Pyrra does, so the factors stay those of 30 days and an
  alert still means the same share of the budget. Pyrra rounds the scaled windows to the minute, which changes
  the share; a window whose scaled windows are not whole seconds, or whose shortest window would be under a
  minute (a rate over fewer scrapes than that is noise), is refused instead.
"""

from __future__ import annotations

from dataclasses import dataclass

DAY_S = 86_400
WORKBOOK_WINDOW_S = 30 * DAY_S
WORKBOOK_WINDOWS_FOR_S = (28 * DAY_S, 30 * DAY_S)  # Sloth's built-in window sets
SHORTEST_WINDOW_S = 60
PAGE, TICKET = "page", "ticket"

# (kind, share of the budget spent, long window, short window) for a 30-day SLO window.
_WORKBOOK = (
    (PAGE, 0.02, 3600, 300),
    (PAGE, 0.05, 6 * 3600, 1800),
    (TICKET, 0.10, 3 * DAY_S, 6 * 3600),
)


class UnsupportedWindow(ValueError):
    """An SLO window for which the burn-rate windows cannot be derived."""


@dataclass(frozen=True)
class BurnWindow:
    kind: str  # PAGE or TICKET
    budget_share: float  # share of the window's error budget spent over `long_s` at `factor`
    long_s: int
    short_s: int
    factor: float  # burn rate: the SLI over the budget's rate

    @property
    def factor_text(self) -> str:
        return format(self.factor, ".4g") + "x"

    @property
    def long(self) -> str:
        return promql_duration(self.long_s)

    @property
    def short(self) -> str:
        return promql_duration(self.short_s)


def promql_duration(seconds: float) -> str:
    """A PromQL duration for whole seconds, largest units first (30d, 6h, 1h24m, 1m10s)."""
    rest, parts = round(seconds), []
    for unit, size in (("d", DAY_S), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or "0s"


def _scaled(seconds: int, scale: float, window_s: float) -> int:
    scaled = seconds * scale
    if abs(scaled - round(scaled)) > 1e-6:
        raise UnsupportedWindow(
            f"SLO window {promql_duration(window_s)}: its burn-rate window {promql_duration(seconds)} scales to "
            f"{scaled:g}s, not a whole number of seconds; use a window of whole days")
    return round(scaled)


def burn_windows(window_s: float) -> tuple[BurnWindow, ...]:
    """The burn-rate alert windows for an SLO window of `window_s` seconds, fastest first."""
    scale = 1.0 if window_s in WORKBOOK_WINDOWS_FOR_S else window_s / WORKBOOK_WINDOW_S
    out = []
    for kind, share, long_s, short_s in _WORKBOOK:
        long_scaled, short_scaled = _scaled(long_s, scale, window_s), _scaled(short_s, scale, window_s)
        out.append(BurnWindow(kind, share, long_scaled, short_scaled, round(share * window_s / long_scaled, 9)))
    shortest = min(w.short_s for w in out)
    if shortest < SHORTEST_WINDOW_S:
        raise UnsupportedWindow(
            f"SLO window {promql_duration(window_s)}: its shortest burn-rate window would be {shortest}s; "
            f"multiwindow burn-rate alerts need an SLO window of at least "
            f"{promql_duration(WORKBOOK_WINDOW_S * SHORTEST_WINDOW_S / 300)}")
    return tuple(out)


def sli_windows(window_s: float) -> tuple[str, ...]:
    """Every window the burn-rate alerts read, shortest first (each once)."""
    seconds = sorted({s for w in burn_windows(window_s) for s in (w.short_s, w.long_s)})
    return tuple(promql_duration(s) for s in seconds)


def budget_spent_in(window_s: float, factor: float) -> str:
    """How long a budget of `window_s` lasts at `factor`, in words ("about 2 days")."""
    hours = window_s / factor / 3600
    if hours >= 48:
        return f"about {round(hours / 24)} days"
    return f"about {round(hours)} hours" if round(hours) != 1 else "about an hour"


def window_days(window_s: float) -> str:
    """The SLO window as an adjective: "30-day"."""
    return format(window_s / DAY_S, ".6g") + "-day"
