"""The dashboard's PromQL on a real Prometheus (Debian's ``prometheus`` package): every query
passes ``promtool check rules``, and evaluates on a Prometheus server that scraped a running
gateway, giving data wherever it reads speclane's own series.

Without the binaries the tests skip with the install command, except in CI (``CI=true``),
where they fail; ``tests/deploy/promtool.sh`` (run by ``make check``) installs them where it
can.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from tests.deploy import dashboard
from tests.deploy.test_deploy_live import drive, running
from tests.servers import free_port

pytestmark = pytest.mark.anyio
# a rate needs two scrapes inside its window: a minute holds them when some time out
GRAFANA = {"$__rate_interval": "1m", "$model": ".*", "$rule": ".*", "$slice": ".*"}


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        message = f"{name} is missing: apt-get install prometheus (tests/deploy/promtool.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def promql(expr: str) -> str:
    """A dashboard expression as Prometheus takes it: Grafana's variables filled in."""
    for variable, value in GRAFANA.items():
        expr = expr.replace(variable, value)
    return expr


def expressions() -> list[tuple[str, str]]:
    out = []
    for query in dashboard.queries(dashboard.load()):
        expr = query.expr
        if expr.startswith("label_values("):  # Grafana's own: only its selector is PromQL
            expr = expr[len("label_values(") : expr.rindex(",")]
        out.append((query.where, promql(expr)))
    return out


def test_every_dashboard_query_passes_promtool(tmp_path: Path) -> None:
    promtool = binary("promtool")
    rules = [
        {"record": f"dashboard:query_{i}", "expr": e} for i, (_, e) in enumerate(expressions())
    ]
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{len(rules)} rules found" in checked.stdout


@asynccontextmanager
async def prometheus(tmp: Path, target: str) -> AsyncIterator[httpx.AsyncClient]:
    """A Prometheus server scraping ``target`` every second."""
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "speclane", "static_configs": [{"targets": [target]}]}],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    command = [
        binary("prometheus"),
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with (tmp / "prometheus.log").open("w") as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as api:
                yield api
        finally:
            process.terminate()
            process.wait(timeout=30)


async def query(api: httpx.AsyncClient, expr: str) -> list[dict[str, object]]:
    response = await api.get("/api/v1/query", params={"query": expr})
    assert response.status_code == 200, f"{expr}: {response.text}"
    answer = response.json()
    assert answer["status"] == "success", answer
    result: list[dict[str, object]] = answer["data"]["result"]
    return result


async def scraped(api: httpx.AsyncClient, times: int, within_s: float) -> None:
    """Until Prometheus has scraped the gateway ``times`` times within the minute: scrapes
    that answered (``up`` is 1), since on a busy machine one can time out at the 1 s
    interval, and a failed scrape records ``up`` 0 and no series."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            found = await query(api, 'sum_over_time(up{job="speclane"}[1m])')
        except (httpx.TransportError, AssertionError):
            found = []
        if found and float(found[0]["value"][1]) >= times:  # type: ignore[index]
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"Prometheus did not scrape the gateway {times} times in {within_s} s")


@pytest.mark.long(12)
async def test_every_dashboard_query_evaluates_on_prometheus(tmp_path: Path) -> None:
    async with running(tmp_path) as (client, spec, services):
        target = str(client.base_url).removeprefix("http://").rstrip("/")
        async with prometheus(tmp_path, target) as api:
            await scraped(api, 2, within_s=60)
            await drive(client, spec, services)  # between scrapes: rates see it
            await drive(client, spec, services)
            await scraped(api, 6, within_s=60)
            ours = [(where, expr) for where, expr in expressions() if "vllm:" not in expr]
            empty = await without_data(api, ours, within_s=30)
    assert not empty, "queries with no data:\n" + "\n".join(empty)


async def without_data(api: httpx.AsyncClient, queries: list[tuple[str, str]], within_s: float):
    """The queries that still give no data after ``within_s``: on a busy machine a scrape
    can time out (at the 1 s interval), so a series may show up a scrape or two late."""
    deadline = time.monotonic() + within_s
    while True:
        empty = [f"{where}: {expr}" for where, expr in queries if not await query(api, expr)]
        if not empty or time.monotonic() > deadline:
            return empty
        queries = [(w, e) for w, e in queries if f"{w}: {e}" in empty]
        await asyncio.sleep(0.5)
