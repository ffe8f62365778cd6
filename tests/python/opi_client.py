"""OPI's NVMe front end through pydpu (PyPI), a client generated from
OPI's protos and not from ours, against a running dpu-service.

    opi_client.py --target HOST:PORT --keep ID --port P --other-port Q   # an admin caller
    opi_client.py --target HOST:PORT --reader      # a caller with the reader role
    opi_client.py --target HOST:PORT --namespaces  # namespaces on volume Malloc1

As an admin: pydpu's own `storage subsystem` CLI sequence (create, list,
get, stats, delete) must run without an RPC error; then pydpu's
NvmeSubsystem objects and its stubs drive create, get, list with paging,
stats, update (the model number and the one allowed host), delete and
delete with allow_missing, and the refusals name OPI's fields. The
subsystem ID given with --keep is created and left in place, with host
NQN H1 allowed and an NVMe/TCP controller `tcp0` on 127.0.0.1:--port,
for the caller to find through dpu.v1 and connect to. Controllers: create,
get, list, an update that changes nothing, and the refusals (a moved
address, QoS, queue sizes, a CNTLID, a PCIe function, stats); a second
controller on 127.0.0.1:--other-port is created and deleted.

With --namespaces (volume Malloc1 must exist, a RAM volume with no
namespace): pydpu's NvmeNamespace objects on Malloc1 drive create, get,
list, stats, an update repeating the spec and delete, the refusals name
OPI's fields (a second namespace on the volume, a taken ID, a changed
field, no volume); then pydpu's own `storage namespace` CLI sequence,
whose subsystem pydpu names `opi-` and a fresh uuid1: the client fixes
the two uuid1 values pydpu draws (its subsystem's, its namespace's) and
creates that subsystem through OPI first, as pydpu's CLI does not. It
leaves nothing behind.

As a reader: lists and gets answer, every change is PERMISSION_DENIED.
Exits non-zero, saying what failed, on any difference.
"""

import argparse
import subprocess
import sys

import grpc
from google.protobuf import field_mask_pb2
from pydpu.proto.v1 import frontend_nvme_pb2 as fe
from pydpu.proto.v1 import frontend_nvme_pb2_grpc as fe_grpc
from pydpu.storage import NvmeNamespace, NvmeSubsystem

# pydpu's stubs import their common types as a top-level module (its
# proto directory is on sys.path once pydpu.proto.v1 is imported): the
# same module, so the same message classes.
import opicommon_pb2 as opicommon  # noqa: E402

H1 = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000d1"
H2 = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000d2"


def fail(msg):
    sys.exit(f"opi_client: {msg}")


def expect_error(call, code, field=None):
    try:
        call()
    except grpc.RpcError as e:
        if e.code() != code:
            fail(f"expected {code}, got {e.code()}: {e.details()}")
        if field and field not in e.details():
            fail(f"the {code} error does not name {field}: {e.details()}")
        return e
    fail(f"expected {code}, the call succeeded")


def admin(target, keep, port, other_port):
    # pydpu's CLI: it prints an RPC error instead of failing, so its output
    # is read.
    out = subprocess.run(
        [sys.executable, "-m", "pydpu", "--address", target, "storage", "subsystem"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    text = out.stdout + out.stderr
    if out.returncode != 0 or "StatusCode" in text or "status =" in text:
        fail(f"pydpu's storage subsystem sequence failed:\n{text}")
    if "nvmeSubsystems/opi-" not in text or "firmware_revision" not in text:
        fail(f"pydpu's sequence printed no subsystem:\n{text}")

    # pydpu's objects: create, get, list, stats, delete.
    s = NvmeSubsystem(nqn="nqn.2022-09.io.spdk:opi-objects", model="OPI Model", serial="OPI SN", ns=10)
    made = s.create(target)
    if made.name != s.name or made.spec.nqn != s.nqn or made.spec.max_namespaces != 10:
        fail(f"create answered {made}")
    if made.spec.model_number != "OPI Model" or made.spec.serial_number != "OPI SN":
        fail(f"create lost the model or serial: {made}")
    if not made.status.firmware_revision.startswith("dpu"):
        fail(f"no firmware revision: {made}")
    if s.get(target) != made:
        fail(f"get differs from create: {s.get(target)}")
    if s.name not in [x.name for x in s.list(target).nvme_subsystems]:
        fail("list lacks the subsystem made")
    st = s.stats(target).stats
    if st.read_ops_count != 0 or st.write_ops_count != 0:
        fail(f"a new subsystem has I/O counted: {st}")
    s.delete(target)
    expect_error(lambda: s.get(target), grpc.StatusCode.NOT_FOUND)

    with grpc.insecure_channel(target) as ch:
        stub = fe_grpc.FrontendNvmeServiceStub(ch)

        def create(id_, nqn, **spec):
            return stub.CreateNvmeSubsystem(
                fe.CreateNvmeSubsystemRequest(
                    nvme_subsystem_id=id_,
                    nvme_subsystem=fe.NvmeSubsystem(spec=fe.NvmeSubsystemSpec(nqn=nqn, **spec)),
                )
            )

        # The one kept for dpu.v1 to see, allowing H1 only.
        kept = create(keep, "nqn.2022-09.io.spdk:opi-kept", hostnqn=H1, model_number="OPI Model")
        if kept.name != f"nvmeSubsystems/{keep}" or kept.spec.hostnqn != H1:
            fail(f"create with a host answered {kept}")
        # A server-chosen ID.
        anon = create("", "nqn.2022-09.io.spdk:opi-anon")
        if not anon.name.startswith("nvmeSubsystems/opi-"):
            fail(f"a server-chosen name looks like {anon.name}")

        # Paging: five more, read two at a time.
        for i in range(5):
            create(f"page-{i}", f"nqn.2022-09.io.spdk:opi-page{i}")
        seen, token, pages = [], "", 0
        while True:
            r = stub.ListNvmeSubsystems(fe.ListNvmeSubsystemsRequest(page_size=2, page_token=token))
            if len(r.nvme_subsystems) > 2:
                fail(f"a page of 2 held {len(r.nvme_subsystems)}")
            seen += [x.name for x in r.nvme_subsystems]
            pages += 1
            token = r.next_page_token
            if not token:
                break
        want = {f"nvmeSubsystems/page-{i}" for i in range(5)} | {kept.name, anon.name}
        if not want <= set(seen) or len(seen) != len(set(seen)) or pages < 4:
            fail(f"paging saw {seen} in {pages} pages")

        # Update: the model number, then the allowed host; what cannot
        # change is refused naming the field.
        up = stub.UpdateNvmeSubsystem(
            fe.UpdateNvmeSubsystemRequest(
                nvme_subsystem=fe.NvmeSubsystem(
                    name="nvmeSubsystems/page-0",
                    spec=fe.NvmeSubsystemSpec(nqn="nqn.2022-09.io.spdk:opi-page0", model_number="Model 2"),
                ),
                update_mask=field_mask_pb2.FieldMask(paths=["spec.model_number"]),
            )
        )
        if up.spec.model_number != "Model 2":
            fail(f"update answered {up}")
        up = stub.UpdateNvmeSubsystem(
            fe.UpdateNvmeSubsystemRequest(
                nvme_subsystem=fe.NvmeSubsystem(
                    name="nvmeSubsystems/page-0",
                    spec=fe.NvmeSubsystemSpec(nqn="nqn.2022-09.io.spdk:opi-page0", hostnqn=H2),
                ),
                update_mask=field_mask_pb2.FieldMask(paths=["spec.hostnqn"]),
            )
        )
        got = stub.GetNvmeSubsystem(fe.GetNvmeSubsystemRequest(name="nvmeSubsystems/page-0"))
        if got.spec.hostnqn != H2 or got.spec.model_number != "Model 2":
            fail(f"after the updates: {got}")
        expect_error(
            lambda: stub.UpdateNvmeSubsystem(
                fe.UpdateNvmeSubsystemRequest(
                    nvme_subsystem=fe.NvmeSubsystem(
                        name="nvmeSubsystems/page-0",
                        spec=fe.NvmeSubsystemSpec(nqn="nqn.2022-09.io.spdk:other"),
                    ),
                    update_mask=field_mask_pb2.FieldMask(paths=["*"]),
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "nvme_subsystem.spec.nqn",
        )
        # allow_missing: an update creates, a delete of nothing succeeds.
        made = stub.UpdateNvmeSubsystem(
            fe.UpdateNvmeSubsystemRequest(
                nvme_subsystem=fe.NvmeSubsystem(
                    name="nvmeSubsystems/upserted", spec=fe.NvmeSubsystemSpec(nqn="nqn.2022-09.io.spdk:opi-up")
                ),
                allow_missing=True,
            )
        )
        if made.name != "nvmeSubsystems/upserted":
            fail(f"update with allow_missing answered {made}")

        # Refusals name OPI's fields.
        expect_error(lambda: create("bad", "not-an-nqn"), grpc.StatusCode.INVALID_ARGUMENT, "nvme_subsystem.spec.nqn")
        expect_error(
            lambda: create("bad", "nqn.2022-09.io.spdk:x", max_namespaces=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "nvme_subsystem.spec.max_namespaces",
        )
        expect_error(
            lambda: create("bad", "nqn.2022-09.io.spdk:x", psk=b"NVMeTLSkey-1:01:x:", hostnqn=H1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "nvme_subsystem.spec.psk",
        )
        expect_error(lambda: create("Bad_ID", "nqn.2022-09.io.spdk:x"), grpc.StatusCode.INVALID_ARGUMENT, "nvme_subsystem_id")
        expect_error(lambda: create(keep, "nqn.2022-09.io.spdk:again"), grpc.StatusCode.ALREADY_EXISTS)
        expect_error(
            lambda: stub.GetNvmeSubsystem(fe.GetNvmeSubsystemRequest(name="subsystems/x")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "name",
        )
        expect_error(
            lambda: stub.CreateNvmeNamespace(fe.CreateNvmeNamespaceRequest(parent=kept.name)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "nvme_namespace",
        )

        # Controllers of the kept subsystem: an NVMe/TCP one on --port,
        # left in place for the caller to connect to.
        def ctrl(**spec):
            return fe.NvmeController(
                spec=fe.NvmeControllerSpec(
                    trtype=opicommon.NVME_TRANSPORT_TYPE_TCP,
                    fabrics_id=opicommon.FabricsEndpoint(
                        traddr="127.0.0.1", trsvcid=str(port), adrfam=opicommon.NVME_ADDRESS_FAMILY_IPV4
                    ),
                    **spec,
                )
            )

        c = stub.CreateNvmeController(
            fe.CreateNvmeControllerRequest(parent=kept.name, nvme_controller_id="tcp0", nvme_controller=ctrl())
        )
        want = f"{kept.name}/nvmeControllers/tcp0"
        if c.name != want or c.spec.fabrics_id.trsvcid != str(port) or not c.status.active:
            fail(f"create controller answered {c}")
        if stub.GetNvmeController(fe.GetNvmeControllerRequest(name=want)) != c:
            fail("get controller differs from create")
        listed = stub.ListNvmeControllers(fe.ListNvmeControllersRequest(parent=kept.name)).nvme_controllers
        if [x.name for x in listed] != [want]:
            fail(f"list controllers: {listed}")
        same = ctrl()
        same.name = want
        if stub.UpdateNvmeController(fe.UpdateNvmeControllerRequest(nvme_controller=same)) != c:
            fail("an update that changes nothing changed something")
        moved = ctrl()
        moved.name = want
        moved.spec.fabrics_id.trsvcid = str(other_port)
        expect_error(
            lambda: stub.UpdateNvmeController(fe.UpdateNvmeControllerRequest(nvme_controller=moved)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "nvme_controller.spec.fabrics_id",
        )
        for spec, field in [
            (dict(max_limit=opicommon.QosLimit(rw_iops_kiops=5)), "nvme_controller.spec.max_limit"),
            (dict(max_nsq=8), "nvme_controller.spec.max_nsq"),
            (dict(nvme_controller_id=7), "nvme_controller.spec.nvme_controller_id"),
        ]:
            expect_error(
                lambda: stub.CreateNvmeController(
                    fe.CreateNvmeControllerRequest(parent=kept.name, nvme_controller_id="bad", nvme_controller=ctrl(**spec))
                ),
                grpc.StatusCode.INVALID_ARGUMENT,
                field,
            )
        pcie = fe.NvmeController(spec=fe.NvmeControllerSpec(pcie_id=opicommon.PciEndpoint()))
        expect_error(
            lambda: stub.CreateNvmeController(
                fe.CreateNvmeControllerRequest(parent=kept.name, nvme_controller_id="pf0", nvme_controller=pcie)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "nvme_controller.spec.pcie_id",
        )
        expect_error(
            lambda: stub.StatsNvmeController(fe.StatsNvmeControllerRequest(name=want)),
            grpc.StatusCode.UNIMPLEMENTED,
            "StatsNvmeSubsystem",
        )
        # A second controller, deleted again (and again, allowed to miss).
        other = ctrl()
        other.spec.fabrics_id.trsvcid = str(other_port)
        stub.CreateNvmeController(
            fe.CreateNvmeControllerRequest(parent=kept.name, nvme_controller_id="tcp1", nvme_controller=other)
        )
        stub.DeleteNvmeController(fe.DeleteNvmeControllerRequest(name=f"{kept.name}/nvmeControllers/tcp1"))
        stub.DeleteNvmeController(
            fe.DeleteNvmeControllerRequest(name=f"{kept.name}/nvmeControllers/tcp1", allow_missing=True)
        )

        # Delete all but the kept one; a second delete is NOT_FOUND unless
        # allowed to miss.
        for name in [anon.name, "nvmeSubsystems/upserted"] + [f"nvmeSubsystems/page-{i}" for i in range(5)]:
            stub.DeleteNvmeSubsystem(fe.DeleteNvmeSubsystemRequest(name=name))
        expect_error(
            lambda: stub.DeleteNvmeSubsystem(fe.DeleteNvmeSubsystemRequest(name=anon.name)),
            grpc.StatusCode.NOT_FOUND,
        )
        stub.DeleteNvmeSubsystem(fe.DeleteNvmeSubsystemRequest(name=anon.name, allow_missing=True))
    print("opi_client: admin sequence OK")


# What pydpu's NvmeNamespace sends: its UUID and NGUID (in UUID text
# form), its EUI-64 as an integer, NSID 1.
PYDPU_UUID = "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb"
PYDPU_EUI64 = 1967554867335598546
# The uuid1 values the CLI sequence is given: its subsystem's, its
# namespace's.
CLI_UUIDS = ["0e7a1e5c-8f2b-11ef-9a2d-0242ac120002", "0e7a1e5c-8f2b-11ef-9a2d-0242ac120003"]
CLI = """
import sys, uuid
ids = iter(uuid.UUID(u) for u in sys.argv[2:4])
uuid.uuid1 = lambda *a, **k: next(ids)
sys.argv = ["pydpu", "--address", sys.argv[1], "storage", "namespace"]
from pydpu.cli import main
main()
"""


def check_namespace(n, name, nsid=1):
    """n is pydpu's namespace on Malloc1 as created, named name, served."""
    if n.name != name:
        fail(f"namespace named {n.name}, not {name}")
    sp = n.spec
    if sp.volume_name_ref != "Malloc1" or sp.host_nsid != nsid or sp.eui64 != PYDPU_EUI64:
        fail(f"namespace spec {sp}")
    if sp.uuid != PYDPU_UUID or sp.nguid != PYDPU_UUID.replace("-", ""):
        fail(f"namespace UUID or NGUID {sp}")
    if n.status.state != fe.NvmeNamespaceStatus.STATE_ENABLED or n.status.oper_state != fe.NvmeNamespaceStatus.OPER_STATE_ONLINE:
        fail(f"namespace not served: {n.status}")


def namespaces(target):
    s = NvmeSubsystem(nqn="nqn.2022-09.io.spdk:opi-ns", model="OPI Model", serial="OPI SN", ns=10)
    s.create(target)
    n = NvmeNamespace(subsystem=s, volume="Malloc1")
    made = n.create(target)
    check_namespace(made, n.name)
    if n.get(target) != made:
        fail(f"get differs from create: {n.get(target)}")
    if [x.name for x in n.list(target).nvme_namespaces] != [n.name]:
        fail(f"list: {n.list(target)}")
    st = n.stats(target).stats
    if st.read_ops_count != 0 or st.write_ops_count != 0:
        fail(f"a new namespace has I/O counted: {st}")
    # pydpu's update sends its spec again, mask "*": nothing changes.
    if n.update(target) != made:
        fail(f"an update repeating the spec answered {n.update(target)}")

    with grpc.insecure_channel(target) as ch:
        stub = fe_grpc.FrontendNvmeServiceStub(ch)

        def create(id_, **spec):
            return stub.CreateNvmeNamespace(
                fe.CreateNvmeNamespaceRequest(
                    parent=s.name,
                    nvme_namespace_id=id_,
                    nvme_namespace=fe.NvmeNamespace(spec=fe.NvmeNamespaceSpec(**spec)),
                )
            )

        # The NSID names it too.
        if stub.GetNvmeNamespace(fe.GetNvmeNamespaceRequest(name=f"{s.name}/nvmeNamespaces/1")) != made:
            fail("the namespace is not found by its NSID")
        # One namespace per volume, per ID; a change refused by field; a
        # volume required.
        expect_error(
            lambda: create("second", volume_name_ref="mallocVolumes/Malloc1"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "nvme_namespace.spec.volume_name_ref",
        )
        expect_error(
            lambda: create(n.id, volume_name_ref="volumes/Malloc1"),
            grpc.StatusCode.ALREADY_EXISTS,
            "nvme_namespace_id",
        )
        expect_error(lambda: create("novol"), grpc.StatusCode.INVALID_ARGUMENT, "nvme_namespace.spec.volume_name_ref")
        expect_error(
            lambda: create("badnguid", volume_name_ref="Malloc1", nguid="1b4e28ba"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "nvme_namespace.spec.nguid",
        )
        expect_error(lambda: create("Bad_ID", volume_name_ref="Malloc1"), grpc.StatusCode.INVALID_ARGUMENT, "nvme_namespace_id")
        moved = fe.NvmeNamespace(name=n.name, spec=fe.NvmeNamespaceSpec(volume_name_ref="Malloc1", eui64=7))
        expect_error(
            lambda: stub.UpdateNvmeNamespace(
                fe.UpdateNvmeNamespaceRequest(nvme_namespace=moved, update_mask=field_mask_pb2.FieldMask(paths=["*"]))
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "nvme_namespace.spec.eui64",
        )

        n.delete(target)
        expect_error(lambda: n.get(target), grpc.StatusCode.NOT_FOUND)
        expect_error(lambda: n.delete(target), grpc.StatusCode.NOT_FOUND)
        stub.DeleteNvmeNamespace(fe.DeleteNvmeNamespaceRequest(name=n.name, allow_missing=True))
        s.delete(target)

        # pydpu's CLI, on the subsystem it names, made here first.
        sub = f"opi-{CLI_UUIDS[0]}"
        stub.CreateNvmeSubsystem(
            fe.CreateNvmeSubsystemRequest(
                nvme_subsystem_id=sub,
                nvme_subsystem=fe.NvmeSubsystem(spec=fe.NvmeSubsystemSpec(nqn="nqn.2022-09.io.spdk:opi1")),
            )
        )
        out = subprocess.run(
            [sys.executable, "-c", CLI, target] + CLI_UUIDS,
            capture_output=True,
            text=True,
            timeout=60,
        )
        text = out.stdout + out.stderr
        if out.returncode != 0 or "StatusCode" in text or "status =" in text:
            fail(f"pydpu's storage namespace sequence failed:\n{text}")
        want = f"nvmeSubsystems/{sub}/nvmeNamespaces/opi-{CLI_UUIDS[1]}"
        if want not in text or 'volume_name_ref: "Malloc1"' not in text:
            fail(f"pydpu's sequence printed no namespace {want}:\n{text}")
        # It deleted its namespace; the subsystem goes now.
        left = stub.ListNvmeNamespaces(fe.ListNvmeNamespacesRequest(parent=f"nvmeSubsystems/{sub}"))
        if left.nvme_namespaces:
            fail(f"pydpu's sequence left {left}")
        stub.DeleteNvmeSubsystem(fe.DeleteNvmeSubsystemRequest(name=f"nvmeSubsystems/{sub}"))
    print("opi_client: namespace sequence OK")


def reader(target):
    with grpc.insecure_channel(target) as ch:
        stub = fe_grpc.FrontendNvmeServiceStub(ch)
        names = [x.name for x in stub.ListNvmeSubsystems(fe.ListNvmeSubsystemsRequest()).nvme_subsystems]
        for name in names:
            stub.GetNvmeSubsystem(fe.GetNvmeSubsystemRequest(name=name))
            stub.StatsNvmeSubsystem(fe.StatsNvmeSubsystemRequest(name=name))
        expect_error(
            lambda: stub.CreateNvmeSubsystem(
                fe.CreateNvmeSubsystemRequest(
                    nvme_subsystem_id="by-reader",
                    nvme_subsystem=fe.NvmeSubsystem(spec=fe.NvmeSubsystemSpec(nqn="nqn.2022-09.io.spdk:r")),
                )
            ),
            grpc.StatusCode.PERMISSION_DENIED,
        )
        for name in names:
            expect_error(
                lambda: stub.DeleteNvmeSubsystem(fe.DeleteNvmeSubsystemRequest(name=name)),
                grpc.StatusCode.PERMISSION_DENIED,
            )
    print(f"opi_client: reader sequence OK ({len(names)} subsystems read, changes refused)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--keep", default="opi-kept")
    p.add_argument("--port", type=int, default=24420, help="the TCP port of the kept subsystem's controller")
    p.add_argument(
        "--other-port", type=int, default=24421, help="a free TCP port for a second controller, created and deleted"
    )
    p.add_argument("--reader", action="store_true")
    p.add_argument("--namespaces", action="store_true")
    a = p.parse_args()
    if a.reader:
        reader(a.target)
    elif a.namespaces:
        namespaces(a.target)
    else:
        admin(a.target, a.keep, a.port, a.other_port)


if __name__ == "__main__":
    main()
