#!/usr/bin/env python3
"""Checks that our OPI storage (or network) contract is wire-compatible with OPI's.

    tests/python/run.sh opi-wire DESCRIPTOR_SET [--package storage|network]
        [--reference-dir DIR]...

DESCRIPTOR_SET is an encoded FileDescriptorSet of our
proto/opi_api/storage/v1/*.proto (dpu_proto::OPI_STORAGE_DESCRIPTOR_SET),
or with --package network of our proto/opi_api/network/*/v1alpha1/*.proto
(dpu_proto::OPI_NETWORK_DESCRIPTOR_SET: the EVPN gateway and the common
network types it imports); proto/tests/opi_descriptor.rs writes each and
runs this. The reference is the generated OPI stubs pydpu (PyPI, pinned
in requirements.txt) ships in pydpu/proto/v1/, imported as they are (so
they must load), or the *_pb2.py modules in DIR (repeat it where the
stubs are spread over several directories, as opi-api's network ones
are).

For every message, enum and service of the reference's files of the
chosen contract (CONTRACTS below) it compares, by fully-qualified name: fields (name, number, type, label,
proto3 `optional`, type name, oneof, packed), nested types, enum values
(names and numbers), methods (input and output types, streaming). Every
difference is printed. Exit status 1 when there is one, when a symbol
is missing, or when ours declares one the reference lacks and ALLOWED
below does not list it.
"""

import argparse
import importlib
import importlib.util
import os
import sys

from google.protobuf import descriptor_pb2

# Per contract (--package), pydpu's module names (their .proto files'
# names) of the files we implement, each with the package it must declare.
CONTRACTS = {
    "storage": {
        "opicommon": "opi_api.storage.v1",
        "frontend_nvme": "opi_api.storage.v1",
        "backend_malloc": "opi_api.storage.v1",
        "backend_aio": "opi_api.storage.v1",
        "backend_null": "opi_api.storage.v1",
        "backend_nvme": "opi_api.storage.v1",
    },
    # The EVPN gateway and the one common network file it imports.
    "network": {
        "networktypes": "opi_api.network.opinetcommon.v1alpha1",
        "component": "opi_api.network.evpn_gw.v1alpha1",
        "l2_xpu_infra_mgr": "opi_api.network.evpn_gw.v1alpha1",
        "l3_xpu_infra_mgr": "opi_api.network.evpn_gw.v1alpha1",
    },
}
# The chosen contract's modules (--package; storage by default).
MODULES = CONTRACTS["storage"]
# Symbols (fully qualified, no leading dot) ours may declare that the
# reference lacks, each with the reason. Empty: ours matches pydpu 0.2.1.
ALLOWED = {}

F = descriptor_pb2.FieldDescriptorProto
# What the messages call the reference: pydpu, or --reference-dir's stubs.
REF = "pydpu"
TYPES = {v: k[len("TYPE_"):].lower() for k, v in F.Type.items()}
LABELS = {v: k[len("LABEL_"):].lower() for k, v in F.Label.items()}


def reference_files(ref_dirs):
    """The reference's FileDescriptorProtos of MODULES, by module name."""
    if not ref_dirs:
        spec = importlib.util.find_spec("pydpu")
        if spec is None or not spec.submodule_search_locations:
            sys.exit("opi_wire: pydpu is not installed (tests/python/requirements.txt)")
        ref_dirs = [os.path.join(list(spec.submodule_search_locations)[0], "proto", "v1")]
    # The stubs import each other as top-level modules (import opicommon_pb2).
    sys.path[0:0] = ref_dirs
    files = {}
    for name, package in MODULES.items():
        module = importlib.import_module(name + "_pb2")
        fd = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(fd)
        if fd.package != package:
            sys.exit(f"opi_wire: {module.__file__} is package {fd.package!r}, not {package}")
        files[name] = fd
    return ", ".join(ref_dirs), files


def our_files(path):
    packages = set(MODULES.values())
    with open(path, "rb") as f:
        fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    return [fd for fd in fds.file if fd.package in packages]


def symbols(files):
    """{fully-qualified name: (kind, descriptor proto)} for every message,
    enum and service, nested ones included."""
    out = {}

    def message(prefix, m):
        name = f"{prefix}.{m.name}"
        out[name] = ("message", m)
        for n in m.nested_type:
            message(name, n)
        for e in m.enum_type:
            out[f"{name}.{e.name}"] = ("enum", e)

    for fd in files:
        for m in fd.message_type:
            message(fd.package, m)
        for e in fd.enum_type:
            out[f"{fd.package}.{e.name}"] = ("enum", e)
        for s in fd.service:
            out[f"{fd.package}.{s.name}"] = ("service", s)
    return out


def field_shape(m, f):
    """What of a field reaches the wire (or a generated client's API)."""
    oneof = None
    if f.HasField("oneof_index") and not f.proto3_optional:
        oneof = m.oneof_decl[f.oneof_index].name
    return {
        "number": f.number,
        "type": TYPES[f.type],
        "label": LABELS[f.label],
        "proto3_optional": f.proto3_optional,
        "type_name": f.type_name or None,
        "oneof": oneof,
        "packed": f.options.packed if f.options.HasField("packed") else None,
    }


def compare(name, kind, ref, ours, problems):
    def diff(what, a, b):
        if a != b:
            problems.append(f"{name}{what}: {REF} has {a!r}, ours {b!r}")

    if kind == "message":
        rf = {f.name: field_shape(ref, f) for f in ref.field}
        of = {f.name: field_shape(ours, f) for f in ours.field}
        for fname in rf:
            if fname not in of:
                problems.append(f"{name}.{fname}: field missing from ours (number {rf[fname]['number']})")
                continue
            for key in rf[fname]:
                diff(f".{fname} {key}", rf[fname][key], of[fname][key])
        for fname in of:
            if fname not in rf and f"{name}.{fname}" not in ALLOWED:
                problems.append(f"{name}.{fname}: field only in ours (number {of[fname]['number']})")
        diff(" nested types", sorted(n.name for n in ref.nested_type), sorted(n.name for n in ours.nested_type))
        diff(" nested enums", sorted(e.name for e in ref.enum_type), sorted(e.name for e in ours.enum_type))
        real = lambda m: sorted(
            o.name for i, o in enumerate(m.oneof_decl)
            if not any(f.proto3_optional for f in m.field if f.HasField("oneof_index") and f.oneof_index == i)
        )
        diff(" oneofs", real(ref), real(ours))
    elif kind == "enum":
        rv = {v.name: v.number for v in ref.value}
        ov = {v.name: v.number for v in ours.value}
        for vname in sorted(set(rv) | set(ov)):
            diff(f".{vname}", rv.get(vname, "(none)"), ov.get(vname, "(none)"))
        diff(" allow_alias", ref.options.allow_alias, ours.options.allow_alias)
    else:
        rm = {m.name: m for m in ref.method}
        om = {m.name: m for m in ours.method}
        for mname in rm:
            if mname not in om:
                problems.append(f"{name}.{mname}: method missing from ours")
                continue
            a, b = rm[mname], om[mname]
            diff(f".{mname} input", a.input_type, b.input_type)
            diff(f".{mname} output", a.output_type, b.output_type)
            diff(f".{mname} client_streaming", a.client_streaming, b.client_streaming)
            diff(f".{mname} server_streaming", a.server_streaming, b.server_streaming)
        for mname in om:
            if mname not in rm and f"{name}.{mname}" not in ALLOWED:
                problems.append(f"{name}.{mname}: method only in ours")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("descriptor_set", help="encoded FileDescriptorSet of our OPI storage (or network) protos")
    parser.add_argument(
        "--package",
        choices=sorted(CONTRACTS),
        default="storage",
        help="which contract: storage (opi_api.storage.v1, the default) or network "
        "(opi_api.network.evpn_gw.v1alpha1 and opi_api.network.opinetcommon.v1alpha1)",
    )
    parser.add_argument(
        "--reference-dir",
        action="append",
        help="directory of *_pb2.py to compare with, instead of pydpu's (repeatable)",
    )
    args = parser.parse_args()
    global REF, MODULES
    MODULES = CONTRACTS[args.package]
    if args.reference_dir:
        REF = "the reference"

    ref_dir, ref_files = reference_files(args.reference_dir)
    ours_list = our_files(args.descriptor_set)
    ref = symbols(ref_files.values())
    ours = symbols(ours_list)

    problems = []
    for name, (kind, r) in sorted(ref.items()):
        if name not in ours:
            problems.append(f"{name}: {kind} missing from ours")
            continue
        okind, o = ours[name]
        if okind != kind:
            problems.append(f"{name}: a {kind} in {REF}, a {okind} in ours")
            continue
        compare(name, kind, r, o, problems)
    for name, (kind, _) in sorted(ours.items()):
        if name not in ref and name not in ALLOWED:
            problems.append(f"{name}: {kind} only in ours (add it to ALLOWED with a reason if meant)")

    counts = {k: sum(1 for v in ref.values() if v[0] == k) for k in ("message", "enum", "service")}
    fields = sum(len(v[1].field) for v in ref.values() if v[0] == "message")
    methods = sum(len(v[1].method) for v in ref.values() if v[0] == "service")
    print(
        f"opi_wire: {', '.join(sorted(ref_files))} from {ref_dir} against "
        f"{len(ours_list)} files of {args.descriptor_set}: {counts['message']} messages "
        f"({fields} fields), {counts['enum']} enums, {counts['service']} services "
        f"({methods} methods)"
    )
    for p in problems:
        print(f"MISMATCH {p}")
    if problems:
        print(f"opi_wire: FAILED, {len(problems)} differences")
        return 1
    print("opi_wire: OK, wire-compatible")
    return 0


if __name__ == "__main__":
    sys.exit(main())
