"""Checks dpu-service's DPF objects (images/dpf/) and the Helm chart's side
of DPF's DPUService contract; run by images/check-manifests.sh.

Usage:
  check_dpf.py values OUT
      Writes to OUT the values DPF (v24.10) hands the chart when a
      DPUDeployment deploys images/dpf/'s DPUServiceTemplate and
      DPUServiceConfiguration, and prints the template's release name.
  check_dpf.py check DEFAULT_RENDER VALUES_DPF_RENDER DEPLOY_RENDER CONFIG_OUT
      DEFAULT_RENDER: the chart rendered with its own values;
      VALUES_DPF_RENDER: with images/dpf/values-dpf.yaml;
      DEPLOY_RENDER: with the values `values` wrote.
      Writes DEPLOY_RENDER's configuration to CONFIG_OUT for the daemon's
      --check-config.

The checks: every document of images/dpf/*.yaml (values-dpf.yaml aside)
against the JSON schema of its kind in images/dpf/schemas/ (derived from
DPF's CRDs by derive_schemas.py); the template's chart is this chart (name,
version), both objects' values are the chart's values (no unknown key),
the template's resourceRequirements are the DaemonSet's requests; the
DPUServiceInterfaces name exactly the configuration's [[ports]], each of
the type its role needs; and in the renders, that every DPF value lands
(serviceID label, node affinity beside the chart's nodeSelector, labels,
annotations, updateStrategy) without breaking what the chart sets itself.
"""

import copy
import glob
import json
import os
import re
import sys
import tomllib

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHART = os.path.join(ROOT, "images/helm/dpu-service")
PRODUCTION = os.path.join(ROOT, "dpu-service/daemon/config/production.toml")
GROUP_VERSION = "svc.dpu.nvidia.com/v1alpha1"
SERVICE_LABEL = "svc.dpu.nvidia.com/service"
INTERFACE_LABEL = "svc.dpu.nvidia.com/interface"
# The DPUDeployment the simulated DPF deploys the template and configuration
# with (its namespace, its name, the service's key in .spec.services).
DEPLOYMENT_NS, DEPLOYMENT = "dpf-operator-system", "dpu-service"
# Chart values whose keys are the user's (label names, resource names, ...).
FREE_FORM = {"nodeSelector", "resources", "serviceDaemonSet", "updateStrategy"}

sys.path.insert(0, os.path.dirname(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import check_manifests  # noqa: E402  (the chart's DPU properties)

failures = check_manifests.failures


def need(ok, what):
    if not ok:
        failures.append(what)


def load(path):
    return [d for d in yaml.safe_load_all(open(path)) if d is not None]


def dpf_objects():
    """{kind: [(path, object)]} of images/dpf/*.yaml, values-dpf.yaml aside."""
    out = {}
    for path in sorted(glob.glob(os.path.join(HERE, "*.yaml"))):
        if os.path.basename(path) == "values-dpf.yaml":
            continue
        for doc in load(path):
            out.setdefault(doc.get("kind"), []).append((os.path.relpath(path, ROOT), doc))
    return out


def one(objs, kind):
    got = objs.get(kind, [])
    need(len(got) == 1, f"images/dpf: exactly one {kind}, got {len(got)}")
    return got[0][1] if got else {}


def coalesce(dst, src):
    """DPF's MergeMaps (Helm's coalesce): dst wins, tables merge, a key only
    in src is copied (a null too)."""
    for k, v in src.items():
        if k not in dst:
            dst[k] = copy.deepcopy(v)
        elif isinstance(dst[k], dict) and isinstance(v, dict):
            coalesce(dst[k], v)
    return dst


def service_id(name):
    return f"dpudeployment_{DEPLOYMENT}_{name}"


def version_selector(name):
    """The serviceDaemonSet.nodeSelector a DPUDeployment gives its DPUService."""
    return {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": f"svc.dpu.nvidia.com/dpuservice-{name}-version", "operator": "In", "values": ["v1"]},
        {"key": "svc.dpu.nvidia.com/owned-by-dpudeployment", "operator": "In",
         "values": [f"{DEPLOYMENT_NS}_{DEPLOYMENT}"]},
    ]}]}


def deploy_values(objs):
    """What DPF v24.10 passes to Helm: the DPUDeployment merges the
    configuration's values over the template's into a DPUService, with the
    configuration's serviceDaemonSet labels and annotations, its own node
    selector and a service ID; the DPUService controller adds the ID as
    the svc.dpu.nvidia.com/service label and sets serviceDaemonSet over
    the values."""
    tmpl, conf = one(objs, "DPUServiceTemplate"), one(objs, "DPUServiceConfiguration")
    name = conf["spec"]["deploymentServiceName"]
    sc = conf["spec"].get("serviceConfiguration", {})
    values = coalesce(copy.deepcopy(sc.get("helmChart", {}).get("values", {})),
                      tmpl["spec"]["helmChart"].get("values", {}))
    sds = copy.deepcopy(sc.get("serviceDaemonSet", {}))
    sds["nodeSelector"] = version_selector(name)
    sds.setdefault("labels", {})[SERVICE_LABEL] = service_id(name)
    return coalesce({"serviceDaemonSet": sds}, values), tmpl["spec"]["helmChart"]["source"].get("releaseName", "")


def check_schemas(objs):
    for kind, items in objs.items():
        path = os.path.join(HERE, "schemas", f"{str(kind).lower()}.json")
        if not os.path.exists(path):
            need(False, f"{items[0][0]}: {kind}: no schema in images/dpf/schemas/")
            continue
        validator = jsonschema.Draft202012Validator(json.load(open(path)))
        for where, doc in items:
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
                at = "/".join(str(p) for p in e.absolute_path) or "(document)"
                need(False, f"{where}: {kind} {doc.get('metadata', {}).get('name')}: {at}: {e.message}")


def unknown_keys(values, chart_values, prefix=""):
    out = []
    for k, v in (values or {}).items():
        if k not in chart_values:
            out.append(prefix + k)
        elif isinstance(v, dict) and isinstance(chart_values[k], dict) and k not in FREE_FORM:
            out += unknown_keys(v, chart_values[k], f"{prefix}{k}.")
    return out


def port_name(spec):
    """The port DPF's SFC controller names from a ServiceInterface spec."""
    t = spec.get("interfaceType")
    if t == "physical":
        return spec["physical"]["interfaceName"]
    if t == "pf":
        return f"pf{spec['pf']['pfID']}hpf"
    if t == "vf":
        return f"pf{spec['vf']['pfID']}vf{spec['vf']['vfID']}"
    return None


def check_objects(objs, chart_meta, chart_values):
    tmpl, conf = one(objs, "DPUServiceTemplate"), one(objs, "DPUServiceConfiguration")
    need(set(objs) <= {"DPUServiceTemplate", "DPUServiceConfiguration", "DPUServiceInterface"},
         f"images/dpf: unexpected kinds {sorted(map(str, objs))}")
    for kind, items in objs.items():
        for where, doc in items:
            need(doc.get("apiVersion") == GROUP_VERSION, f"{where}: {kind}: apiVersion {GROUP_VERSION}")
    if not tmpl or not conf:
        return
    need(tmpl["spec"]["deploymentServiceName"] == conf["spec"]["deploymentServiceName"],
         "DPUServiceTemplate and DPUServiceConfiguration: the same deploymentServiceName")
    src = tmpl["spec"]["helmChart"]["source"]
    need(src.get("chart") == chart_meta["name"], f"DPUServiceTemplate: chart {src.get('chart')!r} is not {chart_meta['name']!r}")
    need(str(src.get("version")) == str(chart_meta["version"]),
         f"DPUServiceTemplate: chart version {src.get('version')!r} is not Chart.yaml's {chart_meta['version']!r}")
    for what, values in (("DPUServiceTemplate", tmpl["spec"]["helmChart"].get("values")),
                         ("DPUServiceConfiguration", conf["spec"].get("serviceConfiguration", {})
                          .get("helmChart", {}).get("values"))):
        bad = unknown_keys(values, chart_values)
        need(not bad, f"{what}: values the chart does not have: {bad}")

    # The configuration's ports are the DPUServiceInterfaces' ports.
    config = tomllib.loads(conf["spec"]["serviceConfiguration"]["helmChart"]["values"]["config"])
    tables = lambda c: {k: v for k, v in c.items() if v != {}}
    need(tables(config) == tables(tomllib.load(open(PRODUCTION, "rb"))),
         f"DPUServiceConfiguration: config differs from {os.path.relpath(PRODUCTION, ROOT)}")
    ports = {p["id"]: p for p in config.get("ports", [])}
    role_type = {"uplink": "physical", "host_pf": "pf", "vf": "vf"}
    seen = {}
    for where, d in objs.get("DPUServiceInterface", []):
        tpl = d["spec"]["template"]["spec"]["template"]
        spec, labels = tpl["spec"], tpl.get("metadata", {}).get("labels", {})
        name = port_name(spec)
        n = d["metadata"]["name"]
        need(name is not None, f"{where}: {n}: not a port of the DPU (type {spec.get('interfaceType')})")
        if name is None:
            continue
        need(name not in seen, f"{where}: {n}: port {name} also in {seen.get(name)}")
        seen[name] = n
        need(labels.get(INTERFACE_LABEL) == name, f"{where}: {n}: label {INTERFACE_LABEL}={name}")
        p = ports.get(name)
        need(p is not None, f"{where}: {n}: port {name} is not in the configuration's [[ports]] ({sorted(ports)})")
        if p is None:
            continue
        need(role_type.get(p.get("role")) == spec["interfaceType"],
             f"{where}: {n}: port {name} has role {p.get('role')}, not an interface of type {spec['interfaceType']}")
        # The PF index is the PCI function of the port's device.
        pf = spec.get("pf", spec.get("vf", {})).get("pfID")
        fn = re.match(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.([0-7])", p.get("device", ""))
        need(pf is None or (fn is not None and int(fn.group(1)) == pf),
             f"{where}: {n}: pfID {pf} is not the PCI function of {p.get('device')!r}")
        if spec["interfaceType"] == "vf":
            need(spec["vf"]["parentInterfaceRef"] == f"pf{pf}hpf", f"{where}: {n}: parentInterfaceRef pf{pf}hpf")
    need(set(seen) == set(ports), f"DPUServiceInterfaces {sorted(seen)} are not the configuration's ports {sorted(ports)}")
    return tmpl


def rendered(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    return docs, ds


def check_default(path):
    """The chart's own values: nothing of DPF's."""
    _, ds = rendered(path)
    meta = ds["spec"]["template"]["metadata"]
    need(SERVICE_LABEL not in meta["labels"] and SERVICE_LABEL not in ds["metadata"]["labels"],
         f"{path}: no {SERVICE_LABEL} label without a serviceID")
    need("affinity" not in ds["spec"]["template"]["spec"], f"{path}: no node affinity")
    need("annotations" not in ds["metadata"], f"{path}: no DaemonSet annotations")
    need(list(meta["annotations"]) == ["checksum/config"], f"{path}: pod annotations {list(meta['annotations'])}")


def check_dpf_render(path, values, release, chart_values, expect_labels):
    """A render with DPF's values: each one landed, the chart's own kept."""
    where = f"{path} DaemonSet"
    check_manifests.check_chart(path, release)
    _, ds = rendered(path)
    tmeta, spec = ds["spec"]["template"]["metadata"], ds["spec"]["template"]["spec"]
    sds = values.get("serviceDaemonSet", {})
    for scope, labels in (("pod template", tmeta["labels"]), ("DaemonSet", ds["metadata"]["labels"])):
        for k, v in expect_labels.items():
            need(labels.get(k) == v, f"{where}: {scope} label {k}={v!r}, got {labels.get(k)!r}")
        need(labels.get("app.kubernetes.io/name") == "dpu-service", f"{where}: {scope}: the chart's name label kept")
    need(ds["spec"]["selector"]["matchLabels"].items() <= tmeta["labels"].items(), f"{where}: the selector matches the pods")
    # nodeSelector: the chart's (less keys set to null) and DPF's, both.
    chart_sel = dict(chart_values["nodeSelector"])
    for k, v in values.get("nodeSelector", {}).items():
        if v is None:
            chart_sel.pop(k, None)
        else:
            chart_sel[k] = v
    need(spec.get("nodeSelector") == chart_sel, f"{where}: nodeSelector {spec.get('nodeSelector')}, want {chart_sel}")
    need(spec.get("nodeSelector", {}).get("kubernetes.io/arch") == "arm64", f"{where}: arm64 nodes")
    got_aff = spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    need(got_aff == sds["nodeSelector"], f"{where}: required node affinity is serviceDaemonSet.nodeSelector: {got_aff}")
    # Annotations: DPF's on the pods and the DaemonSet; checksum/config the chart's.
    for k, v in sds.get("annotations", {}).items():
        if k == "checksum/config":
            continue
        need(tmeta["annotations"].get(k) == v, f"{where}: pod annotation {k}")
        need(ds["metadata"].get("annotations", {}).get(k) == v, f"{where}: DaemonSet annotation {k}")
    need(re.fullmatch(r"[0-9a-f]{64}", tmeta["annotations"].get("checksum/config", "")) is not None,
         f"{where}: checksum/config stays the chart's")
    want_us = sds.get("updateStrategy") or chart_values["updateStrategy"]
    need(ds["spec"]["updateStrategy"] == want_us, f"{where}: updateStrategy {ds['spec']['updateStrategy']}, want {want_us}")
    return ds


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "values":
        values, release = deploy_values(dpf_objects())
        with open(sys.argv[2], "w") as f:
            yaml.safe_dump(values, f, sort_keys=False)
        print(release or "dpu-service")
    elif len(sys.argv) == 6 and sys.argv[1] == "check":
        default_path, vdpf_path, deploy_path, config_out = sys.argv[2:6]
        chart_meta = yaml.safe_load(open(os.path.join(CHART, "Chart.yaml")))
        chart_values = yaml.safe_load(open(os.path.join(CHART, "values.yaml")))
        objs = dpf_objects()
        check_schemas(objs)
        if failures:  # the checks below read the objects as the schemas shape them
            report()
        tmpl = check_objects(objs, chart_meta, chart_values)
        check_default(default_path)

        vdpf = yaml.safe_load(open(os.path.join(HERE, "values-dpf.yaml")))
        sds = vdpf.get("serviceDaemonSet", {})
        need(vdpf.get("serviceID") and all(sds.get(k) for k in ("nodeSelector", "labels", "annotations", "updateStrategy")),
             "values-dpf.yaml: sets serviceID and every serviceDaemonSet field")
        labels = {k: v for k, v in sds.get("labels", {}).items() if not k.startswith("app.kubernetes.io/")}
        labels[SERVICE_LABEL] = vdpf["serviceID"]
        check_dpf_render(vdpf_path, vdpf, "dpu", chart_values, labels)

        values, release = deploy_values(objs)
        sds = values["serviceDaemonSet"]
        ds = check_dpf_render(deploy_path, values, release, chart_values, sds["labels"])
        if tmpl:
            want = {k: str(v) for k, v in tmpl["spec"].get("resourceRequirements", {}).items()}
            [c] = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "dpu-service"]
            got = {k: str(v) for k, v in c["resources"]["requests"].items()}
            need(want == got, f"DPUServiceTemplate: resourceRequirements {want} are not the DaemonSet's requests {got}")
        [cm] = [d for d in rendered(deploy_path)[0] if d["kind"] == "ConfigMap"]
        open(config_out, "w").write(cm["data"]["config.toml"])
    else:
        sys.exit(__doc__)
    report()


def report():
    if failures:
        for f in failures:
            print("dpf check:", f, file=sys.stderr)
        sys.exit(1)


main()
