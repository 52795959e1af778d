"""deploy/k8s, checked offline: every overlay rendered with the kustomize subset in
``kustomize_subset.py``, validated against Kubernetes' own schemas (kubernetes-validate ships
them for many versions), then checked against the gateway it deploys: settings names, the
policy and the Services it points at, the vLLM flags speclane relies on, probes, resources.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from gateway.settings import Settings
from gateway.state.policyfile import PolicyHolder
from policies.compiled import load_policy
from policies.model import Engine, PoolKind
from tests.deploy.kustomize_subset import KustomizeError, Obj, render

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "k8s" / "base"
OVERLAYS = {p.name: p for p in sorted((DEPLOY / "k8s" / "overlays").iterdir()) if p.is_dir()}
# The oldest and the newest minor version the manifests are meant for.
KUBERNETES_VERSIONS = ("1.30", "1.37")
ACCELERATORS = {"trainium": "aws.amazon.com/neuron", "gpu": "nvidia.com/gpu"}
SETTINGS_ENV = {f"SPECLANE_{name.upper()}": name for name in Settings.model_fields}
# Kubernetes' quantity syntax (the schemas accept any string).
QUANTITY = re.compile(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[mkMGTPE])?$")


@functools.cache
def rendered(name: str) -> tuple[Obj, ...]:
    return tuple(render(BASE if name == "base" else OVERLAYS[name]))


def find(objects: tuple[Obj, ...], kind: str, name: str | None = None) -> list[Obj]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    (found,) = find(objects, kind, name)
    return found


def pod_spec(deployment: Obj) -> Obj:
    spec: Obj = deployment["spec"]["template"]["spec"]
    return spec


def gateway_container(objects: tuple[Obj, ...]) -> Obj:
    containers: list[Obj] = pod_spec(one(objects, "Deployment", "speclane"))["containers"]
    (container,) = containers
    return container


def env_of(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def flag(args: list[str], name: str) -> str | None:
    """A command-line flag's value, written as ``--name value`` or ``--name=value``."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def selects(selector: dict[str, str], deployment: Obj) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return bool(selector) and selector.items() <= labels.items()


def policy_of(objects: tuple[Obj, ...]) -> str:
    text: str = one(objects, "ConfigMap", "speclane-policy")["data"]["policy.yaml"]
    return text


overlays = pytest.mark.parametrize("overlay", sorted(OVERLAYS))


def test_there_are_overlays_for_trainium_and_gpu() -> None:
    assert set(OVERLAYS) == {"trainium", "gpu"}


@pytest.mark.parametrize("name", ["base", *sorted(OVERLAYS)])
def test_every_object_is_valid_for_kubernetes(name: str) -> None:
    objects = rendered(name)
    assert objects
    for obj in objects:
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = "/".join(map(str, exc.path))
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} ({version}): {where}: {exc}")


def test_the_secret_example_is_valid_and_is_what_the_gateway_reads() -> None:
    example = yaml.safe_load((BASE / "secret.example.yaml").read_text())
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(example, version, strict=True)
    ref = env_of(gateway_container(rendered("base")))["SPECLANE_ADMIN_TOKEN"]["secretKeyRef"]
    assert ref["name"] == example["metadata"]["name"]
    assert ref["key"] in example["stringData"]
    assert "REPLACE-ME" in example["stringData"][ref["key"]]
    # Never applied by `kubectl apply -k`: it would overwrite the real token.
    assert not find(rendered("base"), "Secret")


def test_the_example_policy_and_the_base_configmap_are_the_same_file() -> None:
    assert (DEPLOY / "policy.example.yaml").read_bytes() == (BASE / "policy.yaml").read_bytes()
    assert policy_of(rendered("base")) == (DEPLOY / "policy.example.yaml").read_text()


@pytest.mark.parametrize("name", ["base", *sorted(OVERLAYS)])
def test_the_policy_loads_cleanly_with_speclanes_loader(name: str) -> None:
    policy = load_policy(policy_of(rendered(name)), f"{name}/policy.yaml")
    assert policy.warnings == ()


@overlays
def test_every_container_has_resources_and_probes(overlay: str) -> None:
    for deployment in find(rendered(overlay), "Deployment"):
        for container in pod_spec(deployment)["containers"]:
            where = f"{deployment['metadata']['name']}/{container['name']}"
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert "memory" in resources.get("limits", {}), where
            for kind in ("requests", "limits"):
                for resource, amount in resources[kind].items():
                    assert QUANTITY.match(str(amount)), f"{where}: {resource}: {amount!r}"
            assert "readinessProbe" in container, where
            assert "livenessProbe" in container, where


@overlays
def test_every_model_server_gets_its_accelerator(overlay: str) -> None:
    device = ACCELERATORS[overlay]
    ours = {"speclane", "speclane-redis"}
    servers = [
        d for d in find(rendered(overlay), "Deployment") if d["metadata"]["name"] not in ours
    ]
    assert servers
    for deployment in servers:
        spec = pod_spec(deployment)
        (container,) = spec["containers"]
        resources = container["resources"]
        assert resources["limits"][device] == resources["requests"][device]
        assert any(t["key"] == device for t in spec["tolerations"])
        assert spec["nodeSelector"]
        if overlay == "gpu":
            tensor_parallel = flag(container["args"], "--tensor-parallel-size")
            assert tensor_parallel == resources["limits"][device]


@overlays
def test_the_gateways_settings_exist_and_parse(overlay: str) -> None:
    env = env_of(gateway_container(rendered(overlay)))
    unknown = set(env) - set(SETTINGS_ENV)
    assert not unknown, f"not in gateway/settings.py: {sorted(unknown)}"
    plain = {SETTINGS_ENV[k]: v for k, v in env.items() if isinstance(v, str)}
    settings = Settings.model_validate(plain)
    assert settings.host == "0.0.0.0"
    (port,) = gateway_container(rendered(overlay))["ports"]
    assert port["containerPort"] == settings.port


@overlays
def test_the_policy_is_mounted_where_the_gateway_reads_it(overlay: str) -> None:
    objects = rendered(overlay)
    container = gateway_container(objects)
    path = Path(env_of(container)["SPECLANE_POLICY"])
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)]
    # A subPath mount would never see ConfigMap updates, and hot reload needs them.
    assert "subPath" not in mount
    volumes = pod_spec(one(objects, "Deployment", "speclane"))["volumes"]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    configmap = one(objects, "ConfigMap", volume["configMap"]["name"])
    assert path.name in configmap["data"]


def test_a_configmap_update_reaches_the_running_policy(tmp_path: Path) -> None:
    """The kubelet updates a mounted ConfigMap by writing a new directory and swapping the
    ``..data`` symlink that ``policy.yaml`` points through; the gateway's watch must see it."""

    def publish(version: str, objects: tuple[Obj, ...]) -> None:
        target = tmp_path / f"..{version}"
        target.mkdir()
        (target / "policy.yaml").write_text(policy_of(objects))
        (tmp_path / "..data_tmp").symlink_to(target.name)
        (tmp_path / "..data_tmp").replace(tmp_path / "..data")

    publish("1", rendered("trainium"))
    (tmp_path / "policy.yaml").symlink_to("..data/policy.yaml")
    holder = PolicyHolder.from_file(tmp_path / "policy.yaml")
    assert not holder.changed_on_disk()
    publish("2", rendered("gpu"))
    assert holder.changed_on_disk()
    assert asyncio.run(holder.reload()).changed
    assert "spec-eagle3" in holder.current.pools


@overlays
def test_the_gateway_reaches_redis_through_its_service(overlay: str) -> None:
    objects = rendered(overlay)
    url = urlsplit(env_of(gateway_container(objects))["SPECLANE_REDIS_URL"])
    service = one(objects, "Service", url.hostname or "")
    assert url.port in [p["port"] for p in service["spec"]["ports"]]
    assert selects(service["spec"]["selector"], one(objects, "Deployment", "speclane-redis"))


@overlays
def test_the_gateway_runs_a_worker_per_requested_cpu_sharing_state_in_redis(overlay: str) -> None:
    container = gateway_container(rendered(overlay))
    env = env_of(container)
    workers = Settings(workers=env["SPECLANE_WORKERS"], redis_url=env["SPECLANE_REDIS_URL"])
    assert workers.several_workers
    cpu = container["resources"]["requests"]["cpu"]
    assert str(workers.workers) == cpu, "one CPU requested per worker"


def _backend(objects: tuple[Obj, ...], endpoint: str) -> tuple[Obj, Obj]:
    """The Service an endpoint URL names, and the one container behind it on that port."""
    url = urlsplit(endpoint)
    host = (url.hostname or "").split(".")[0]
    services = find(objects, "Service", host)
    assert services, f"{endpoint}: no Service {host!r} in the overlay"
    (service,) = services
    port = url.port or (443 if url.scheme == "https" else 80)
    ports = [p for p in service["spec"]["ports"] if p["port"] == port]
    assert ports, f"{endpoint}: Service {host} has no port {port}"
    target = ports[0].get("targetPort", port)
    deployments = [
        d for d in find(objects, "Deployment") if selects(service["spec"]["selector"], d)
    ]
    assert len(deployments) == 1, (
        f"{endpoint}: Service {host} selects {len(deployments)} Deployments"
    )
    (deployment,) = deployments
    for container in pod_spec(deployment)["containers"]:
        for p in container.get("ports", []):
            if target in (p["containerPort"], p.get("name")):
                return service, container
    raise AssertionError(f"{endpoint}: no container of {host} listens on {target}")


@overlays
def test_every_pool_endpoint_is_a_vllm_service_serving_that_pool(overlay: str) -> None:
    objects = rendered(overlay)
    policy = load_policy(policy_of(objects))
    served = set()
    for name, pool in policy.pools.items():
        for endpoint in pool.endpoints:
            service, container = _backend(objects, endpoint)
            served.add(service["metadata"]["name"])
            args = container["args"]
            assert flag(args, "--served-model-name") == pool.model, endpoint
            (port,) = container["ports"]
            assert flag(args, "--port") == str(port["containerPort"]), endpoint
            # Merged chunks bias the chunk-counting acceptance signal (1 is the default).
            assert flag(args, "--stream-interval") in (None, "1"), endpoint
            spec_config = flag(args, "--speculative-config")
            if pool.kind is PoolKind.SPECULATIVE:
                assert spec_config is not None, f"{name}: no --speculative-config"
                k = json.loads(spec_config)["num_speculative_tokens"]
                assert k == pool.num_speculative_tokens, f"{name}: the server's k is {k}"
                # per-request metrics where the engine has them (vLLM >= 0.29); the
                # Neuron plugin's vLLM 0.11 would refuse the flags and not start
                per_request = flag(args, "--per-request-spec-decode-metrics")
                if pool.engine is Engine.VLLM:
                    assert per_request == "summary", name
                else:
                    assert per_request is None, f"{name}: {pool.engine.value} has no such flag"
                    assert "--enable-per-request-metrics" not in args, name
            else:
                assert spec_config is None, f"{name}: a standard pool speculates"
            for probe in ("readinessProbe", "livenessProbe"):
                assert container[probe]["httpGet"]["path"] == "/health", f"{name}: {probe}"
    model_servers = {
        s["metadata"]["name"]
        for s in find(objects, "Service")
        if s["metadata"]["name"].startswith("vllm-")
    }
    assert served == model_servers, "a vLLM Service that no pool uses"


@overlays
def test_selectors_select_what_they_mean(overlay: str) -> None:
    objects = rendered(overlay)
    deployments = find(objects, "Deployment")
    for deployment in deployments:
        assert selects(deployment["spec"]["selector"]["matchLabels"], deployment)
    for service in find(objects, "Service"):
        assert [d for d in deployments if selects(service["spec"]["selector"], d)], service
    gateway = one(objects, "Deployment", "speclane")
    assert gateway["spec"]["replicas"] == 3
    (budget,) = find(objects, "PodDisruptionBudget")
    assert selects(budget["spec"]["selector"]["matchLabels"], gateway)
    for spread in pod_spec(gateway)["topologySpreadConstraints"]:
        assert selects(spread["labelSelector"]["matchLabels"], gateway)
    service = one(objects, "Service", "speclane")
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(80, "http")]


def test_the_subset_refuses_what_it_does_not_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamePrefix: x-\n"
    )
    with pytest.raises(KustomizeError, match="namePrefix"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "kind: Kustomization\nconfigMapGenerator:\n"
        "  - name: p\n    behavior: replace\n    files: [p.yaml]\n"
        "    options: {disableNameSuffixHash: true}\n"
    )
    (tmp_path / "p.yaml").write_text("x: 1\n")
    with pytest.raises(KustomizeError, match="nothing to replace"):
        render(tmp_path)


def test_the_trainium_overlay_runs_the_trainium_example_policy() -> None:
    """The example for Qwen3-32B + Qwen3-1.7B at k=7 on Trainium2 is the overlay's policy,
    and its pools judge by speed: engine vllm-neuron, economic guardrail, no threshold."""
    example = ROOT / "policies" / "examples" / "trainium2-qwen3-32b-k7.yaml"
    schema_line = "# yaml-language-server: $schema=../policy.schema.json\n#\n"
    assert schema_line + policy_of(rendered("trainium")) == example.read_text()
    policy = load_policy(example.read_text())
    spec = policy.pools["spec-k7"]
    assert (spec.engine, spec.num_speculative_tokens) == (Engine.VLLM_NEURON, 7)
    assert all(r.guardrail.mode.value == "economic" for r in policy.rules)
