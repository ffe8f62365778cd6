#!/usr/bin/env python3
"""Derives the JSON schemas in images/dpf/schemas/ from DPF's CRDs.

Usage: derive_schemas.py DPF_SOURCE_DIR [DPF_VERSION]

DPF_SOURCE_DIR is a checkout of github.com/NVIDIA/doca-platform; its
config/dpuservice/crd/bases/svc.dpu.nvidia.com_<plural>.yaml are read for
the kinds images/dpf/ uses. Each schema is the v1alpha1 openAPIV3Schema
made into what the API server enforces, as JSON Schema (draft 2020-12):

- descriptions dropped;
- unknown fields refused (the API server prunes them, and kubectl's strict
  field validation refuses them): additionalProperties false wherever an
  object lists its properties, except under
  x-kubernetes-preserve-unknown-fields;
- x-kubernetes-int-or-string as an integer or a string;
- the CEL rules (x-kubernetes-validations) this script knows turned into
  JSON Schema; an unknown rule stops it;
- apiVersion and kind fixed, metadata.name required.
"""

import json
import os
import sys

import yaml

GROUP, VERSION = "svc.dpu.nvidia.com", "v1alpha1"
KINDS = {
    "DPUServiceTemplate": "dpuservicetemplates",
    "DPUServiceConfiguration": "dpuserviceconfigurations",
    "DPUServiceInterface": "dpuserviceinterfaces",
}
# ServiceInterfaceSpec's rule: the field named by interfaceType is set
# (ovn has none).
INTERFACE_TYPE_RULE = (
    "(self.interfaceType == 'vlan' && has(self.vlan)) || (self.interfaceType == 'pf' && has(self.pf)) || "
    "(self.interfaceType == 'vf' && has(self.vf)) || (self.interfaceType == 'physical' && has(self.physical)) || "
    "(self.interfaceType == 'service' && has(self.service)) || (self.interfaceType == 'ovn')"
)


def interface_type_rule():
    cases = [{"properties": {"interfaceType": {"const": t}}, "required": [t]}
             for t in ("vlan", "pf", "vf", "physical", "service")]
    cases.append({"properties": {"interfaceType": {"const": "ovn"}}})
    return {"anyOf": cases}


def convert(node):
    if isinstance(node, list):
        return [convert(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    for key, value in node.items():
        if key == "description" or key.startswith("x-kubernetes-"):
            continue
        if key == "properties":
            out[key] = {k: convert(v) for k, v in value.items()}
        else:
            out[key] = convert(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if "properties" in node and "additionalProperties" not in node and not preserve:
        out["additionalProperties"] = False
    rules = node.get("x-kubernetes-validations", [])
    for rule in rules:
        text = " ".join(rule["rule"].split())
        if text != INTERFACE_TYPE_RULE:
            sys.exit(f"derive_schemas: unknown CEL rule {text!r}: translate it here")
        out.setdefault("allOf", []).append(interface_type_rule())
    return out


def derive(crd_path, kind, dpf_version):
    crd = yaml.safe_load(open(crd_path))
    assert crd["spec"]["group"] == GROUP and crd["spec"]["names"]["kind"] == kind, crd_path
    [ver] = [v for v in crd["spec"]["versions"] if v["name"] == VERSION]
    schema = convert(ver["schema"]["openAPIV3Schema"])
    props = schema["properties"]
    props["apiVersion"] = {"const": f"{GROUP}/{VERSION}"}
    props["kind"] = {"const": kind}
    props["metadata"] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
                     "maxLength": 253},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["name"],
    }
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata", "spec"})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": f"{kind} {GROUP}/{VERSION}, derived by images/dpf/derive_schemas.py from DPF's CRD "
                    f"(github.com/NVIDIA/doca-platform {dpf_version}, "
                    f"config/dpuservice/crd/bases/{os.path.basename(crd_path)}; Apache-2.0)",
        **schema,
    }


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    src = sys.argv[1]
    dpf_version = sys.argv[2] if len(sys.argv) == 3 else "unknown version"
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")
    os.makedirs(out_dir, exist_ok=True)
    for kind, plural in KINDS.items():
        crd = os.path.join(src, "config/dpuservice/crd/bases", f"{GROUP}_{plural}.yaml")
        with open(os.path.join(out_dir, f"{kind.lower()}.json"), "w") as f:
            json.dump(derive(crd, kind, dpf_version), f, indent=1, sort_keys=False)
            f.write("\n")


main()
