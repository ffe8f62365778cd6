"""Checks the properties a DPU deployment of dpu-service needs, in the static
pod and in the Helm chart rendered under two release names.

Usage: check_manifests.py STATIC_POD RENDERED_A RENDERED_B RENDERED_A_OTHER_CONFIG PRODUCTION_TOML CONFIG_OUT
RENDERED_A_OTHER_CONFIG is release A rendered with a changed `config`.
Writes the chart's configuration (from RENDERED_A) to CONFIG_OUT so the
caller can give it to dpu-service --check-config. images/dpf/check_dpf.py
imports it for the same properties in the chart rendered with DPF's values.
"""

import hashlib
import re
import sys
import tomllib

import yaml

CAPS = {"IPC_LOCK", "SYS_RAWIO", "SYS_NICE", "NET_ADMIN", "NET_RAW"}
MOUNTS = {"/dev/hugepages", "/dev/infiniband", "/dev/vfio", "/var/lib/dpu-service"}
HEALTH_PORT = 50052
failures = []


def need(ok, what):
    if not ok:
        failures.append(what)


def documents(path):
    """The rendered stream split as Helm does, with each document's text."""
    text = open(path).read()
    docs = []
    for part in re.split(r"^---\n", text, flags=re.M):
        if part.strip():
            docs.append((yaml.safe_load(part), part))
    return docs


def check_pod_spec(where, spec):
    need(spec.get("hostNetwork") is True, f"{where}: hostNetwork")
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    need(any(v.get("emptyDir", {}).get("medium") == "HugePages" for v in vols.values()),
         f"{where}: an emptyDir with medium HugePages")
    [c] = [c for c in spec["containers"] if c["name"] == "dpu-service"]
    res = c.get("resources", {})
    req, lim = res.get("requests", {}), res.get("limits", {})
    huge = [k for k in req if k.startswith("hugepages-")]
    need(huge and all(req[k] == lim.get(k) for k in huge), f"{where}: hugepages requested = limited")
    cpu = str(req.get("cpu", ""))
    need(cpu.isdigit() and cpu == str(lim.get("cpu")), f"{where}: whole CPUs, requests = limits ({cpu!r})")
    need(req.get("memory") == lim.get("memory"), f"{where}: memory requests = limits (Guaranteed QoS)")
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
    need(MOUNTS <= mounts, f"{where}: mounts {sorted(MOUNTS - mounts)} missing")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        p = c.get(probe, {})
        need(p.get("grpc", {}).get("port") == HEALTH_PORT, f"{where}: {probe} is a gRPC probe on {HEALTH_PORT}")
    sc = c.get("securityContext", {})
    need(sc.get("privileged") is not True, f"{where}: not privileged")
    caps = sc.get("capabilities", {})
    need(caps.get("drop") == ["ALL"], f"{where}: drops ALL capabilities")
    need(set(caps.get("add", [])) == CAPS, f"{where}: adds exactly {sorted(CAPS)}")
    need(sc.get("readOnlyRootFilesystem") is True, f"{where}: read-only root file system")
    psc = spec.get("securityContext", {})
    need(psc.get("runAsNonRoot") is True and psc.get("runAsUser") == 10001, f"{where}: runs as uid 10001")
    ports = {p["containerPort"] for p in c.get("ports", [])}
    need({50051, HEALTH_PORT, 9464, 4420, 8009} <= ports, f"{where}: container ports")
    return c


def check_chart(path, release):
    docs = documents(path)
    kinds = [d["kind"] for d, _ in docs]
    need(kinds.count("DaemonSet") == 1, f"{path}: exactly one DaemonSet, got {kinds}")
    need(not {"Deployment", "StatefulSet", "Pod", "Job"} & set(kinds), f"{path}: no other workload")
    for d, _ in docs:
        need(d["metadata"]["name"].startswith(release), f"{path}: {d['kind']} {d['metadata']['name']} not named from release {release}")
    [(ds, _)] = [x for x in docs if x[0]["kind"] == "DaemonSet"]
    [(cm, cm_text)] = [x for x in docs if x[0]["kind"] == "ConfigMap"]
    spec = ds["spec"]["template"]["spec"]
    check_pod_spec(f"{path} DaemonSet", spec)
    need(spec.get("nodeSelector", {}).get("kubernetes.io/arch") == "arm64", f"{path}: DaemonSet selects arm64 nodes")
    got = ds["spec"]["template"]["metadata"].get("annotations", {}).get("checksum/config", "")
    need(re.fullmatch(r"[0-9a-f]{64}", got) is not None, f"{path}: checksum/config annotation ({got!r})")
    vols = {v["name"]: v for v in spec["volumes"]}
    need(vols["config"]["configMap"]["name"] == cm["metadata"]["name"], f"{path}: the pod mounts the chart's ConfigMap")
    return ds, cm


def main():
    static_path, a_path, b_path, a2_path, prod_path, config_out = sys.argv[1:7]
    pod = yaml.safe_load(open(static_path))
    need(pod["kind"] == "Pod", f"{static_path}: a Pod")
    check_pod_spec(static_path, pod["spec"])

    ds_a, cm_a = check_chart(a_path, "dpu")
    ds_b, _ = check_chart(b_path, "edge-dpu-service")
    need(ds_a["metadata"]["name"] != ds_b["metadata"]["name"], "two releases give two object names")
    ds_a2, _ = check_chart(a2_path, "dpu")
    checksum = lambda ds: ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    need(checksum(ds_a) != checksum(ds_a2), "a configuration change changes checksum/config (pods roll)")

    config_text = cm_a["data"]["config.toml"]
    config = tomllib.loads(config_text)
    need("listen" in config.get("grpc", {}), "the chart's configuration has grpc.listen")
    need(config["grpc"].get("health_listen", "").endswith(f":{HEALTH_PORT}"), "grpc.health_listen is the probes' port")
    # The chart ships the repository's BlueField configuration (an empty
    # table, e.g. a header over commented-out settings, is no setting).
    tables = lambda c: {k: v for k, v in c.items() if v != {}}
    prod = tables(tomllib.load(open(prod_path, "rb")))
    need(tables(config) == prod, f"the chart's config differs from {prod_path}")
    open(config_out, "w").write(config_text)

    if failures:
        for f in failures:
            print("manifest check:", f, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
