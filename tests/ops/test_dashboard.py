"""config/grafana/callbridge.json: valid, and it shows every metric the daemon exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase

from bridge.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "config" / "grafana" / "callbridge.json"
ALWAYS_THERE = {"le", "instance", "job"}  # added by histograms and by Prometheus


def _dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _exprs(d: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(d) for t in p.get("targets", [])]


def _exported() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Series name a query must use -> (metric type, label names), from the
    daemon's own registry."""
    m = Metrics()
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for attr in vars(m).values():
        if not isinstance(attr, MetricWrapperBase):
            continue
        (family,) = attr.describe()
        suffix = {"counter": "_total", "histogram": "_bucket"}.get(family.type, "")
        out[family.name + suffix] = (family.type, tuple(attr._labelnames))
    return out


def test_is_a_grafana_dashboard() -> None:
    d = _dashboard()
    assert d["uid"] == "callbridge" and d["title"]
    assert 36 <= d["schemaVersion"] <= 41
    ids = [p["id"] for p in _panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in _panels(d):
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"][
            "w"
        ] <= 24
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"] and p["description"], p["title"]
    names = [v["name"] for v in d["templating"]["list"]]
    assert names == ["datasource", "instance"]


def test_every_exported_metric_is_on_a_panel() -> None:
    exported = _exported()
    assert len(exported) >= 16  # sanity: the registry was read
    text = "\n".join(_exprs(_dashboard()))
    missing = [name for name in exported if not re.search(rf"\b{name}\b", text)]
    assert missing == []


def test_histograms_are_shown_as_p50_p95_p99() -> None:
    exprs = _exprs(_dashboard())
    for name, (kind, _) in _exported().items():
        if kind != "histogram":
            continue
        quantiles = {
            m.group(1)
            for e in exprs
            if name in e
            for m in [re.match(r"histogram_quantile\((0\.\d+),", e)]
            if m
        }
        assert quantiles == {"0.5", "0.95", "0.99"}, name


@pytest.mark.parametrize("expr", _exprs(_dashboard()))
def test_queries_are_well_formed(expr: str) -> None:
    exported = _exported()
    assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")
    used = re.findall(r"\b(callbridge_\w+)\b", expr)
    assert used and all(u in exported for u in used), f"unknown metric in {expr}"
    # counters are only read through rate(); every selector follows the node variable
    for u in used:
        if exported[u][0] in ("counter", "histogram"):
            assert f"rate({u}{{" in expr, expr
        assert f'{u}{{instance=~"$instance"}}' in expr, expr
    labels = {label for u in used for label in exported[u][1]} | ALWAYS_THERE
    for group in re.findall(r"by \(([^)]*)\)", expr):
        by = {g.strip() for g in group.split(",") if g.strip()}
        assert by <= labels, f"{expr}: labels {by - labels} do not exist"
