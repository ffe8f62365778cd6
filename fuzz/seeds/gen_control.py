#!/usr/bin/env python3
"""Writes the seed inputs of the control-plane fuzz targets next to this
file: fuzz/seeds/<target>/<name>. Run it again after changing an input
format; the seeds are committed, so the fuzz runs (and their replay by
`cargo test -p dpu-fuzz`) need no Python."""

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def pb_varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_field(num, wire, payload):
    key = pb_varint(num << 3 | wire)
    if wire == 0:
        return key + pb_varint(payload)
    return key + pb_varint(len(payload)) + payload


def pb_str(num, s):
    return pb_field(num, 2, s.encode() if isinstance(s, str) else s)


def filter_rule(name="", priority=0, src="", dst="", src_ports=None, dst_ports=None, proto=None,
                icmp_type=None, icmp_code=None, action=1, stateful=False, description=""):
    m = b""
    if name:
        m += pb_str(1, name)
    if priority:
        m += pb_field(2, 0, priority)
    if src:
        m += pb_str(3, src)
    if dst:
        m += pb_str(4, dst)
    for num, r in [(5, src_ports), (6, dst_ports)]:
        if r is not None:
            m += pb_field(num, 2, pb_field(1, 0, r[0]) + pb_field(2, 0, r[1]))
    for num, v in [(7, proto), (8, icmp_type), (9, icmp_code)]:
        if v is not None:
            m += pb_field(num, 0, v)
    if action:
        m += pb_field(10, 0, action)
    if stateful:
        m += pb_field(11, 0, 1)
    if description:
        m += pb_str(12, description)
    return m


def replace_rules(parent, rules, expected=None):
    m = pb_str(1, parent)
    for r in rules:
        m += pb_field(2, 2, r)
    if expected is not None:
        m += pb_field(3, 0, expected)
    return m


def rule_proto_seeds():
    t = "tenants/fuzz"
    return {
        "web_dns_ping": replace_rules(
            t,
            [
                filter_rule("tenants/fuzz/rules/web", 10, "10.0.0.0/8", "192.168.1.0/24", dst_ports=(80, 443), proto=6, stateful=True),
                filter_rule("", 20, dst_ports=(53, 53), proto=17, description="dns"),
                filter_rule("tenants/fuzz/rules/ping", 30, "2001:db8::/32", "", proto=58, icmp_type=128, icmp_code=0),
                filter_rule("", 40, "10.0.0.7", action=2),
            ],
            expected=0,
        ),
        "empty": replace_rules(t, []),
        "bad": replace_rules(
            t,
            [
                filter_rule("tenants/other/rules/x", 1),
                filter_rule("", 1, "10.0.0.1/24", "::/0", src_ports=(9, 1), proto=1, icmp_code=3, action=7),
            ],
            expected=5,
        ),
    }


def opi_subsystem_spec(nqn, serial="", model="", max_ns=0, hostnqn="", psk=b""):
    m = pb_str(1, nqn)
    if serial:
        m += pb_str(2, serial)
    if model:
        m += pb_str(3, model)
    if max_ns:
        m += pb_field(4, 0, max_ns & (2**64 - 1))
    if hostnqn:
        m += pb_str(5, hostnqn)
    if psk:
        m += pb_str(6, psk)
    return m


def opi_controller_spec(traddr, trsvcid, adrfam=1, trtype=4, cntlid=None, max_nsq=0, max_limit=None, pcie=False):
    m = b""
    if cntlid is not None:
        m += pb_field(1, 0, cntlid)
    m += pb_field(2, 0, trtype)
    if pcie:
        m += pb_field(3, 2, b"")
    else:
        m += pb_field(4, 2, pb_str(1, traddr) + pb_str(2, trsvcid) + pb_field(3, 0, adrfam))
    if max_nsq:
        m += pb_field(5, 0, max_nsq)
    if max_limit:
        m += pb_field(11, 2, pb_field(3, 0, max_limit))
    return m


def opi_namespace_spec(volume="", host_nsid=0, nguid="", eui64=0, uuid=""):
    m = b""
    if host_nsid:
        m += pb_field(2, 0, host_nsid & (2**64 - 1))
    if nguid:
        m += pb_str(3, nguid)
    if eui64:
        m += pb_field(4, 0, eui64 & (2**64 - 1))
    if uuid:
        m += pb_str(5, uuid)
    if volume:
        m += pb_str(6, volume)
    return m


def opi_proto_seeds():
    """First byte: 0 CreateNvmeSubsystemRequest, 1 UpdateNvmeSubsystemRequest,
    2 CreateNvmeControllerRequest, 3 UpdateNvmeNamespaceRequest; the rest
    is the message."""
    host = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000d1"
    key = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"

    def create(spec, id_="opi-1"):
        return b"\x00" + pb_field(1, 2, pb_field(2, 2, spec)) + pb_str(2, id_)

    def update(spec, paths, allow_missing=False):
        mask = b"".join(pb_str(1, p) for p in paths)
        m = pb_field(1, 2, pb_str(1, "nvmeSubsystems/opi-1") + pb_field(2, 2, spec)) + pb_field(2, 2, mask)
        if allow_missing:
            m += pb_field(3, 0, 1)
        return b"\x01" + m

    def controller(spec, parent="nvmeSubsystems/opi-1", id_="tcp0"):
        return b"\x02" + pb_str(1, parent) + pb_field(2, 2, pb_field(2, 2, spec)) + pb_str(3, id_)

    def namespace(name, spec, paths=(), allow_missing=False):
        m = pb_field(1, 2, pb_str(1, name) + pb_field(2, 2, spec))
        if paths:
            m += pb_field(2, 2, b"".join(pb_str(1, p) for p in paths))
        if allow_missing:
            m += pb_field(3, 0, 1)
        return b"\x03" + m

    pydpu_uuid = "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb"
    return {
        "namespace_pydpu": namespace(
            "nvmeSubsystems/opi-1/nvmeNamespaces/opi-1b4e28ba-2fa1-11d2-883f-b9a761bde3fb",
            opi_namespace_spec("Malloc1", 1, pydpu_uuid, 1967554867335598546, pydpu_uuid),
            ["*"],
        ),
        "namespace_by_nsid": namespace(
            "nvmeSubsystems/opi-1/nvmeNamespaces/3",
            opi_namespace_spec("mallocVolumes/Malloc1", 3, pydpu_uuid.replace("-", ""), -1),
            ["spec.eui64", "name", "uuid"],
            True,
        ),
        "namespace_bad": namespace(
            "nvmeSubsystems/opi-1/nvmeNamespaces/0",
            opi_namespace_spec("aioVolumes/", -1, "1b4e28ba", 0, "nope"),
            ["colour"],
        ),
        "subsystem": create(opi_subsystem_spec("nqn.2022-09.io.spdk:opi1", "OPI SN", "OPI Model", 10)),
        "subsystem_host_key": create(opi_subsystem_spec("nqn.2022-09.io.spdk:opi2", hostnqn=host, psk=key)),
        "subsystem_bad": create(opi_subsystem_spec("nope", "x" * 21, max_ns=-1, psk=b"\xff"), "Bad_ID"),
        "update_all": update(opi_subsystem_spec("nqn.2022-09.io.spdk:opi1", model="Model 2"), ["*"]),
        "update_fields": update(opi_subsystem_spec("nqn.2022-09.io.spdk:opi1", hostnqn=host), ["spec.hostnqn", "model_number", "colour"], True),
        "controller_v4": controller(opi_controller_spec("127.0.0.1", "4420")),
        "controller_v6": controller(opi_controller_spec("::1", "", adrfam=0)),
        "controller_bad": controller(opi_controller_spec("10.0.0.1", "70000", adrfam=2, trtype=3, cntlid=5, max_nsq=8, max_limit=9)),
        "controller_pcie": controller(opi_controller_spec("", "", pcie=True)),
    }


def storage_proto_seeds():
    def volume(id_, backend_num, backend, block_size=0, uuid=""):
        v = pb_field(backend_num, 2, backend)
        if block_size:
            v += pb_field(6, 0, block_size)
        if uuid:
            v += pb_str(7, uuid)
        return b"\x00" + pb_str(1, id_) + pb_field(2, 2, v)

    def namespace(backend_num, backend, block_size=0):
        n = pb_field(backend_num, 2, backend)
        if block_size:
            n += pb_field(6, 0, block_size)
        return b"\x01" + pb_str(1, "subsystems/s") + pb_field(2, 2, n)

    size = lambda n: pb_field(1, 0, n)
    return {
        "volume_ram": volume("Malloc1", 2, size(1 << 20), 512, "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb"),
        "volume_file": volume("aio.disk_1", 3, pb_str(1, "/srv/vol/a.img") + pb_field(2, 0, 8192), 4096),
        "volume_bdev": volume("nvme0n1", 4, pb_str(1, "/dev/nvme0n1")),
        "volume_null": volume("", 5, size(1 << 40), 4096),
        "volume_bad": volume("0bad/id", 2, size(1000), 1024, "not-a-uuid"),
        "namespace_on_volume": namespace(15, b"volumes/Malloc1"),
        "namespace_on_volume_bs": namespace(15, b"Malloc1", 4096),
        "namespace_null": namespace(14, size(4096), 512),
        "namespace_bad_volume": namespace(15, b"volumes/a/b", 7),
    }


def main():
    for target, seeds in [("rule_proto", rule_proto_seeds()), ("opi_proto", opi_proto_seeds()),
                          ("storage_proto", storage_proto_seeds())]:
        d = os.path.join(HERE, target)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
