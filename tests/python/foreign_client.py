#!/usr/bin/env python3
"""A gRPC client nobody on this project wrote: PyPI's grpcio with the
reflection and health-checking packages, and no .proto files or generated
code from this repository. Message types are built at run time from the
server's reflection service, calls go through grpcio's generic stubs.

Usage: foreign_client.py --target HOST:PORT
Exits non-zero with a message on the first failed check.
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
TIMEOUT = 10


class CheckFailed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise CheckFailed(what)
    print(f"ok   {what}")


class Reflected:
    """Calls methods by name, with types taken from server reflection."""

    def __init__(self, channel):
        self.channel = channel
        self.db = ProtoReflectionDescriptorDatabase(channel)
        self.pool = descriptor_pool.DescriptorPool(self.db)

    def services(self):
        return list(self.db.get_services())

    def _method(self, service, method):
        sd = self.pool.FindServiceByName(service)
        md = sd.FindMethodByName(method)
        req_cls = message_factory.GetMessageClass(md.input_type)
        resp_cls = message_factory.GetMessageClass(md.output_type)
        return f"/{service}/{method}", req_cls, resp_cls

    def call(self, service, method, **fields):
        path, req_cls, resp_cls = self._method(service, method)
        req = json_format.ParseDict(fields, req_cls())
        stub = self.channel.unary_unary(
            path,
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        return stub(req, timeout=TIMEOUT)

    def stream(self, service, method, **fields):
        path, req_cls, resp_cls = self._method(service, method)
        req = json_format.ParseDict(fields, req_cls())
        stub = self.channel.unary_stream(
            path,
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        return stub(req, timeout=TIMEOUT)


def expect_error(fn, code, mentions):
    try:
        fn()
    except grpc.RpcError as e:
        check(e.code() == code, f"error is {code.name} (got {e.code().name}: {e.details()})")
        check(mentions in (e.details() or ""), f"error message mentions {mentions!r}")
        return
    raise CheckFailed(f"expected {code.name}, the call succeeded")


def check_health(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ["", "dpu.v1.TenantService"]:
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
        check(
            resp.status == health_pb2.HealthCheckResponse.SERVING,
            f"health of {service or 'the server'} is SERVING",
        )


def check_reflection(api):
    services = api.services()
    for s in DPU_SERVICES + ["grpc.health.v1.Health"]:
        check(s in services, f"reflection lists {s}")


def check_calls(api):
    info = api.call("dpu.v1.InfoService", "GetServiceInfo")
    check(info.api_version == "dpu.v1", "GetServiceInfo reports api_version dpu.v1")

    tid = "py-" + secrets.token_hex(4)
    tenant = api.call(
        "dpu.v1.TenantService",
        "CreateTenant",
        tenant_id=tid,
        tenant={"display_name": "made by grpcio", "default_policy": "DEFAULT_POLICY_DENY"},
    )
    check(tenant.name == f"tenants/{tid}", "CreateTenant returns the resource name")
    got = api.call("dpu.v1.TenantService", "GetTenant", name=f"tenants/{tid}")
    check(got.display_name == "made by grpcio", "GetTenant returns what was created")

    added = api.call(
        "dpu.v1.FilterService",
        "AddRule",
        parent=f"tenants/{tid}",
        rule={
            "priority": 10,
            "dst_prefix": "10.0.0.0/24",
            "ip_protocol": 6,
            "dst_ports": {"first": 80, "last": 80},
            "action": "RULE_ACTION_ALLOW",
            "stateful": True,
        },
    )
    check(added.rule_set_version == 1, "AddRule bumps the rule-set version to 1")
    rules = api.call("dpu.v1.FilterService", "ListRules", parent=f"tenants/{tid}")
    check(len(rules.rules) == 1 and rules.rules[0].dst_prefix == "10.0.0.0/24", "ListRules returns the rule")

    expect_error(
        lambda: api.call("dpu.v1.TenantService", "CreateTenant", tenant_id="Bad ID!", tenant={}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "tenant_id",
    )
    expect_error(
        lambda: api.call("dpu.v1.TenantService", "GetTenant", name="tenants/missing-" + tid),
        grpc.StatusCode.NOT_FOUND,
        "tenants/missing-",
    )

    sid = "py-" + secrets.token_hex(4)
    api.call(
        "dpu.v1.StorageService",
        "CreateSubsystem",
        subsystem_id=sid,
        subsystem={"nqn": f"nqn.2024-01.io.example:{sid}", "allow_any_host": True},
    )
    subs = api.call("dpu.v1.StorageService", "ListSubsystems")
    check(any(s.name == f"subsystems/{sid}" for s in subs.subsystems), "ListSubsystems contains the new subsystem")

    snapshots = api.stream("dpu.v1.TelemetryService", "WatchCounters", interval_ms=100)
    seen = 0
    for snap in snapshots:
        seen += 1
        if seen == 2:
            snapshots.cancel()
            break
    check(seen == 2, "WatchCounters streams snapshots")

    api.call("dpu.v1.TenantService", "DeleteTenant", name=f"tenants/{tid}", force=True)
    api.call("dpu.v1.StorageService", "DeleteSubsystem", name=f"subsystems/{sid}", force=True)
    expect_error(
        lambda: api.call("dpu.v1.TenantService", "GetTenant", name=f"tenants/{tid}"),
        grpc.StatusCode.NOT_FOUND,
        tid,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="HOST:PORT of dpu-service (plain text)")
    args = parser.parse_args()
    with grpc.insecure_channel(args.target) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
            check_health(channel)
            api = Reflected(channel)
            check_reflection(api)
            check_calls(api)
        except (CheckFailed, grpc.RpcError, grpc.FutureTimeoutError) as e:
            print(f"FAIL {e}", file=sys.stderr)
            return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
