"""deploy/k8s beyond the Deployments: images set through kustomize, the autoscaler, network
policies, Redis behind a password, and the Prometheus Operator's PodMonitors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.kustomize_subset import Obj, render
from tests.deploy.test_deploy_k8s import (
    BASE,
    DEPLOY,
    OVERLAYS,
    env_of,
    find,
    gateway_container,
    one,
    pod_spec,
    rendered,
    selects,
)

overlays = pytest.mark.parametrize("overlay", sorted(OVERLAYS))


def containers(objects: tuple[Obj, ...]) -> list[Obj]:
    return [c for d in find(objects, "Deployment") for c in pod_spec(d)["containers"]]


@overlays
def test_every_image_is_set_through_kustomize_and_pinned(overlay: str) -> None:
    for container in containers(rendered(overlay)):
        image = container["image"]
        last = image.rsplit("/", 1)[-1]
        assert ":" in last or "@" in image, f"{container['name']}: {image} has no tag"
    gateway = gateway_container(rendered(overlay))["image"]
    assert gateway.startswith("registry.example.com/speclane:"), gateway


def test_the_images_transformer_sets_names_tags_and_digests(tmp_path: Path) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "template": {
                "spec": {
                    "initContainers": [{"name": "i", "image": "localhost:5000/tool:1"}],
                    "containers": [
                        {"name": "a", "image": "app"},
                        {"name": "b", "image": "other:2"},
                    ],
                }
            }
        },
    }
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(deployment))
    (tmp_path / "kustomization.yaml").write_text(
        "kind: Kustomization\nresources: [d.yaml]\nimages:\n"
        "  - {name: app, newName: reg.example/app, newTag: '3'}\n"
        "  - {name: localhost:5000/tool, digest: 'sha256:ab'}\n"
    )
    (out,) = render(tmp_path)
    spec = out["spec"]["template"]["spec"]
    assert [c["image"] for c in spec["containers"]] == ["reg.example/app:3", "other:2"]
    assert spec["initContainers"][0]["image"] == "localhost:5000/tool@sha256:ab"


@overlays
def test_the_autoscaler_scales_the_gateway_within_its_disruption_budget(overlay: str) -> None:
    objects = rendered(overlay)
    (hpa,) = find(objects, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    gateway = one(objects, "Deployment", target["name"])
    assert target["kind"] == "Deployment" and gateway["metadata"]["name"] == "speclane"
    budget = one(objects, "PodDisruptionBudget", "speclane")
    assert hpa["spec"]["minReplicas"] > budget["spec"]["maxUnavailable"]
    assert hpa["spec"]["maxReplicas"] >= hpa["spec"]["minReplicas"] >= 2
    assert pod_spec(gateway)["containers"][0]["resources"]["requests"]["cpu"]  # utilisation base


def _allowed_from(policy: Obj) -> list[Obj]:
    return [peer for rule in policy["spec"]["ingress"] for peer in rule.get("from", [])]


@overlays
def test_only_gateways_reach_redis_and_the_model_servers(overlay: str) -> None:
    objects = rendered(overlay)
    gateway = one(objects, "Deployment", "speclane")
    policies = find(objects, "NetworkPolicy")
    guarded = {
        d["metadata"]["name"]
        for d in find(objects, "Deployment")
        for p in policies
        if selects(p["spec"]["podSelector"]["matchLabels"], d)
    }
    assert guarded == {d["metadata"]["name"] for d in find(objects, "Deployment")}
    for policy in policies:
        if selects(policy["spec"]["podSelector"]["matchLabels"], gateway):
            continue  # clients reach the gateway
        pods = [
            p["podSelector"]["matchLabels"] for p in _allowed_from(policy) if "podSelector" in p
        ]
        assert pods and all(selects(p, gateway) for p in pods), policy["metadata"]["name"]


@overlays
def test_redis_requires_the_password_the_gateways_send(overlay: str) -> None:
    objects = rendered(overlay)
    (redis,) = pod_spec(one(objects, "Deployment", "speclane-redis"))["containers"]
    env = env_of(redis)
    args = redis["args"]
    variable = args[args.index("--requirepass") + 1]
    assert variable.startswith("$(") and variable[2:-1] in env
    redis_secret = env[variable[2:-1]]["secretKeyRef"]
    gateway_secret = env_of(gateway_container(objects))["SPECLANE_REDIS_PASSWORD"]["secretKeyRef"]
    assert redis_secret == gateway_secret
    example = yaml.safe_load((BASE / "redis-secret.example.yaml").read_text())
    assert example["metadata"]["name"] == redis_secret["name"]
    assert "REPLACE-ME" in example["stringData"][redis_secret["key"]]
    for probe in ("readinessProbe", "livenessProbe"):
        assert "$REDIS_PASSWORD" in " ".join(redis[probe]["exec"]["command"])


@overlays
def test_the_pod_monitors_select_the_gateways_and_the_model_servers(overlay: str) -> None:
    monitors = render(DEPLOY / "k8s" / "monitoring")
    assert {m["kind"] for m in monitors} == {"PodMonitor"}
    objects = rendered(overlay)
    for monitor in monitors:
        selected = [
            d
            for d in find(objects, "Deployment")
            if selects(monitor["spec"]["selector"]["matchLabels"], d)
        ]
        assert selected, monitor["metadata"]["name"]
        for deployment in selected:
            ports = {p.get("name") for c in pod_spec(deployment)["containers"] for p in c["ports"]}
            for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
