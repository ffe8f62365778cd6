#!/usr/bin/env python3
"""A gRPC client nobody on this project wrote: PyPI's grpcio with the
reflection and health-checking packages, and no .proto files or generated
code from this repository. Message types are built at run time from the
server's reflection service, calls go through grpcio's generic stubs.

Usage: foreign_client.py --target HOST:PORT
Prints one line per check; exits non-zero with a message on the first failure.
"""

import argparse
import secrets
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

DPU_SERVICES = [
    "dpu.v1.InfoService",
    "dpu.v1.TenantService",
    "dpu.v1.PortService",
    "dpu.v1.FilterService",
    "dpu.v1.StorageService",
    "dpu.v1.TelemetryService",
]
TIMEOUT = 10  # seconds, per call


class CheckFailed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise CheckFailed(what)
    print(f"ok   {what}", flush=True)


class Reflected:
    """Calls methods by name, with message types taken from server reflection."""

    def __init__(self, channel):
        self.channel = channel
        self.db = ProtoReflectionDescriptorDatabase(channel)
        self.pool = descriptor_pool.DescriptorPool(self.db)

    def services(self):
        return list(self.db.get_services())

    def _method(self, service, method):
        try:
            md = self.pool.FindServiceByName(service).FindMethodByName(method)
        except KeyError as e:
            raise CheckFailed(f"reflection does not describe {service}/{method}: {e}") from e
        req_cls = message_factory.GetMessageClass(md.input_type)
        resp_cls = message_factory.GetMessageClass(md.output_type)
        return f"/{service}/{method}", req_cls, resp_cls

    def _request(self, req_cls, fields):
        # Field names as in the .proto; enum values by name.
        return json_format.ParseDict(fields, req_cls())

    def call(self, service, method, **fields):
        """Unary call; the response message, or grpc.RpcError."""
        path, req_cls, resp_cls = self._method(service, method)
        stub = self.channel.unary_unary(
            path,
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        return stub(self._request(req_cls, fields), timeout=TIMEOUT)

    def stream(self, service, method, **fields):
        """Server-streaming call; an iterator of responses that can be cancel()ed."""
        path, req_cls, resp_cls = self._method(service, method)
        stub = self.channel.unary_stream(
            path,
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        return stub(self._request(req_cls, fields), timeout=TIMEOUT)


def rpc_ok(what, fn):
    """Runs a call that must succeed; a failure names the call and its status."""
    try:
        return fn()
    except grpc.RpcError as e:
        raise CheckFailed(f"{what} failed: {e.code().name}: {e.details()}") from e


def expect_error(what, fn, code, mentions=None):
    try:
        fn()
    except grpc.RpcError as e:
        check(e.code() == code, f"{what} fails with {code.name} (got {e.code().name}: {e.details()!r})")
        if mentions is not None:
            check(mentions in (e.details() or ""), f"{what}: error details mention {mentions!r}")
        return
    raise CheckFailed(f"{what}: expected {code.name}, but the call succeeded")


def check_health(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ["", "dpu.v1.TenantService"]:
        label = f"service {service!r}"
        resp = rpc_ok(
            f"Health/Check for {label}",
            lambda: health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT),
        )
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        check(resp.status == health_pb2.HealthCheckResponse.SERVING, f"health of {label} is SERVING (got {status})")


def check_reflection(api):
    services = rpc_ok("reflection ListServices", api.services)
    for s in DPU_SERVICES + ["grpc.health.v1.Health"]:
        check(s in services, f"reflection lists {s}")


def check_info(api):
    info = rpc_ok("GetServiceInfo", lambda: api.call("dpu.v1.InfoService", "GetServiceInfo"))
    check(info.api_version == "dpu.v1", f"GetServiceInfo api_version is 'dpu.v1' (got {info.api_version!r})")


def check_tenant(api, tid):
    name = f"tenants/{tid}"
    created = rpc_ok(
        "CreateTenant",
        lambda: api.call(
            "dpu.v1.TenantService",
            "CreateTenant",
            tenant_id=tid,
            tenant={"display_name": "made by grpcio", "default_policy": "DEFAULT_POLICY_DENY"},
        ),
    )
    check(created.name == name, f"CreateTenant returns {name} (got {created.name!r})")
    got = rpc_ok("GetTenant", lambda: api.call("dpu.v1.TenantService", "GetTenant", name=name))
    check(got.name == name, f"GetTenant returns name {name} (got {got.name!r})")
    check(got.display_name == "made by grpcio", "GetTenant returns the display_name that was set")


def check_filter(api, tid):
    parent = f"tenants/{tid}"
    added = rpc_ok(
        "AddRule",
        lambda: api.call(
            "dpu.v1.FilterService",
            "AddRule",
            parent=parent,
            rule={
                "priority": 10,
                "dst_prefix": "10.0.0.0/24",
                "ip_protocol": 6,
                "dst_ports": {"first": 80, "last": 80},
                "action": "RULE_ACTION_ALLOW",
                "stateful": True,
            },
        ),
    )
    check(added.rule_set_version == 1, f"AddRule makes rule_set_version 1 (got {added.rule_set_version})")
    listed = rpc_ok("ListRules", lambda: api.call("dpu.v1.FilterService", "ListRules", parent=parent))
    check(len(listed.rules) == 1, f"ListRules returns one rule (got {len(listed.rules)})")
    rule = listed.rules[0]
    check(
        rule.priority == 10 and rule.dst_prefix == "10.0.0.0/24" and rule.ip_protocol == 6
        and rule.dst_ports.first == 80 and rule.dst_ports.last == 80 and rule.stateful,
        "ListRules returns the rule that was added",
    )


def check_errors(api, tid):
    expect_error(
        "CreateTenant with tenant_id 'Bad ID!'",
        lambda: api.call("dpu.v1.TenantService", "CreateTenant", tenant_id="Bad ID!", tenant={}),
        grpc.StatusCode.INVALID_ARGUMENT,
        mentions="tenant_id",
    )
    expect_error(
        "GetTenant of a missing tenant",
        lambda: api.call("dpu.v1.TenantService", "GetTenant", name=f"tenants/missing-{tid}"),
        grpc.StatusCode.NOT_FOUND,
    )


def check_storage(api, sid):
    name = f"subsystems/{sid}"
    rpc_ok(
        "CreateSubsystem",
        lambda: api.call(
            "dpu.v1.StorageService",
            "CreateSubsystem",
            subsystem_id=sid,
            subsystem={"nqn": f"nqn.2024-01.io.example:{sid}", "allow_any_host": True},
        ),
    )
    print(f"ok   CreateSubsystem {name}", flush=True)
    subs = rpc_ok("ListSubsystems", lambda: api.call("dpu.v1.StorageService", "ListSubsystems", page_size=1000))
    check(any(s.name == name for s in subs.subsystems), f"ListSubsystems contains {name}")


def check_telemetry(api):
    snapshots = api.stream("dpu.v1.TelemetryService", "WatchCounters", interval_ms=100)
    seen = 0
    try:
        for _ in snapshots:
            seen += 1
            if seen == 2:
                break
    except grpc.RpcError as e:
        raise CheckFailed(f"WatchCounters failed after {seen} snapshots: {e.code().name}: {e.details()}") from e
    finally:
        snapshots.cancel()
    check(seen >= 2, f"WatchCounters streams at least 2 snapshots (got {seen}), then is cancelled")


def cleanup(api, tid, sid):
    rpc_ok(
        "DeleteTenant",
        lambda: api.call("dpu.v1.TenantService", "DeleteTenant", name=f"tenants/{tid}", force=True),
    )
    print(f"ok   DeleteTenant tenants/{tid} (force)", flush=True)
    rpc_ok(
        "DeleteSubsystem",
        lambda: api.call("dpu.v1.StorageService", "DeleteSubsystem", name=f"subsystems/{sid}", force=True),
    )
    print(f"ok   DeleteSubsystem subsystems/{sid} (force)", flush=True)


def cleanup_quietly(api, tid, sid):
    """After a failure: remove what this run may have created, ignoring errors."""
    for service, method, name in [
        ("dpu.v1.TenantService", "DeleteTenant", f"tenants/{tid}"),
        ("dpu.v1.StorageService", "DeleteSubsystem", f"subsystems/{sid}"),
    ]:
        try:
            api.call(service, method, name=name, force=True)
        except Exception:  # noqa: BLE001 - best effort only
            pass


def run(channel):
    rpc_ok("waiting for the channel", lambda: grpc.channel_ready_future(channel).result(timeout=TIMEOUT))
    check_health(channel)
    api = Reflected(channel)
    check_reflection(api)
    check_info(api)
    tid = "py-" + secrets.token_hex(4)
    sid = "py-" + secrets.token_hex(4)
    try:
        check_tenant(api, tid)
        check_filter(api, tid)
        check_errors(api, tid)
        check_storage(api, sid)
        check_telemetry(api)
    except BaseException:
        cleanup_quietly(api, tid, sid)
        raise
    cleanup(api, tid, sid)


def main():
    parser = argparse.ArgumentParser(
        description="Checks a dpu-service through gRPC reflection and health only (no generated code)."
    )
    parser.add_argument("--target", required=True, help="HOST:PORT of the plain-text gRPC listener")
    args = parser.parse_args()
    with grpc.insecure_channel(args.target) as channel:
        try:
            run(channel)
        except grpc.FutureTimeoutError:
            print(f"FAIL no gRPC connection to {args.target} within {TIMEOUT}s", file=sys.stderr)
            return 1
        except CheckFailed as e:
            print(f"FAIL {e}", file=sys.stderr)
            return 1
        except grpc.RpcError as e:
            print(f"FAIL unexpected RPC error: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
