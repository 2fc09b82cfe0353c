"""The run report as a person sees it: rendered by headless Chromium, with every section there
and not one network request."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from pipeline import report

pytestmark = pytest.mark.pipeline

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]


def chromium(page: str, tmp_path, *args) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (.ci/run does)")
    profile = tmp_path / f"profile-{len(os.listdir(tmp_path))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args,
                           f"file://{page}"], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def page(taxi_run, tmp_path_factory):
    """The report of the shared taxi run (by its id: other tests run the pipeline again)."""
    config, summary = taxi_run
    from pipeline import local_runner

    config = local_runner.local_config(config)
    path = str(tmp_path_factory.mktemp("report") / "report.html")
    return report.write_report(config.metadata_path, config.pipeline_name, path,
                               summary.run_id)


def test_rendered_page_holds_statistics_metrics_and_chart(page, tmp_path):
    rendered = chromium(page, tmp_path, "--dump-dom")
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    dom = rendered.stdout
    tables = re.findall(r'<table class="statistics" data-split="(\w+)">(.*?)</table>', dom, re.S)
    assert sorted(split for split, _ in tables) == ["eval", "train"]
    for _, table in tables:
        assert "<td>fare</td><td>FLOAT</td>" in table
        assert table.count('<svg class="histogram"') >= 10
    assert re.search(r"<td>accuracy</td><td>[0-9.]+</td>", dom)
    assert "Blessed by the Evaluator" in dom
    assert re.search(r'<img id="input-wait-chart"[^>]*src="data:image/png;base64,', dom)
    assert '<table class="schema">' in dom and 'id="anomalies"' in dom
    screenshot = tmp_path / "report.png"
    shot = chromium(page, tmp_path, f"--screenshot={screenshot}", "--window-size=1280,2400")
    assert shot.returncode == 0 and screenshot.stat().st_size > 50_000


def page_requests(page: str, tmp_path) -> list[str]:
    """URLs the page itself asked the network for, from Chromium's net log. The browser's own
    background traffic (updates, accounts) is logged too, but under other isolation keys; what
    a file:// page requests carries the file:// key."""
    netlog = tmp_path / f"netlog-{len(os.listdir(tmp_path))}.json"
    result = chromium(page, tmp_path, f"--log-net-log={netlog}", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [event["params"]["url"] for event in log["events"]
            if event["type"] == start and str(event["params"].get(
                "network_isolation_key", "")).startswith("file://")]


def test_page_makes_no_network_request(page, tmp_path):
    fetching = tmp_path / "fetching.html"  # the check catches a page that does fetch
    fetching.write_text('<img src="http://img.example.invalid/x.png">'
                        '<script src="https://cdn.example.invalid/a.js"></script>')
    assert sorted(page_requests(str(fetching), tmp_path)) == [
        "http://img.example.invalid/x.png", "https://cdn.example.invalid/a.js"]
    assert page_requests(page, tmp_path) == []
