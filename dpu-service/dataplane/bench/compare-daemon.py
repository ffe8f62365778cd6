#!/usr/bin/env python3
"""The switch worker inside the daemon against the bare worker benchmark,
side by side: rounds alternate between `benches/forward.rs` (one worker,
the switch loaded from a bench set's rules.json) and `dpu-service` with the
same ports, tenants and rules, the worker pinned to the same CPU in both
and every other thread free to use the others (the daemon keeps its own
off the worker's CPU). Both read the set's pcap forever
through DPDK's net_pcap (`infinite_rx=1`) into net_null, without
hugepages; the figure is packets received and processed per second (the
daemon's from its port counter on /metrics, over the same window after
the same warm-up). The daemon's worker polls every port it has, so its
net_null port is made with `no-rx=1`: net_null otherwise receives empty
frames of its own, which the bare benchmark (polling only the pcap port)
never sees.

    python3 ../shared/bench/gen_data.py      # /tmp/vswitch-bench/data/<set>/
    cargo bench -p dpu-dataplane --bench forward --no-run
    cargo build --release --bins
    python3 dpu-service/dataplane/bench/compare-daemon.py --set plain --rounds 3

Prints each round, the medians and the ratio. Holds /tmp/bench.lock
around each timed run, as ../shared/bench does; every process it starts
is ended by its PID.
"""

import argparse
import fcntl
import glob
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
RELEASE = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def locked():
    f = open("/tmp/bench.lock", "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def bare(forward, data, secs, warmup, cpu):
    out = subprocess.run(
        [forward, "--pcap", f"{data}/traffic.pcap",
         "--rules", f"{data}/rules.json", "--secs", str(secs), "--warmup", str(warmup),
         "--runs", "1", "--cpu", str(cpu)],
        capture_output=True, text=True, check=True).stdout
    return float(re.findall(r"([0-9.]+) Mpps", out)[-1])


def rules_of(tenant):
    """A bench tenant's rules as the API's FilterRule JSON."""
    out = []
    for i, r in enumerate(tenant["rules"]):
        rule = {
            "priority": i,
            "srcPrefix": r["src"],
            "dstPrefix": r["dst"],
            "action": "RULE_ACTION_ALLOW" if r["action"] == "allow" else "RULE_ACTION_DENY",
        }
        if r.get("proto") is not None:
            rule["ipProtocol"] = r["proto"]
            if r["proto"] in (6, 17):
                rule["srcPorts"] = {"first": r["sport"][0], "last": r["sport"][1]}
                rule["dstPorts"] = {"first": r["dport"][0], "last": r["dport"][1]}
        out.append(rule)
    return out


def rx_packets(metrics):
    body = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
    m = re.search(r'^dpu_port_rx_packets_total\{port="rx"\} (\d+)$', body, re.M)
    return int(m.group(1)) if m else 0


def daemon(data, secs, warmup, cpu, work):
    grpc, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    config = os.path.join(work, "config.toml")
    with open(config, "w") as f:
        f.write(f"""
[log]
level = "warn"
[dataplane]
workers = 1
worker_cpus = [{cpu}]
idle = "busy"
lcores = "0"
no_huge = true
memory_mb = 1024
mbufs = 131071
file_prefix = "dp-daemon-bench-{os.getpid()}"
[[ports]]
id = "rx"
role = "uplink"
driver = "dpdk"
device = "net_pcap0,rx_pcap={data}/traffic.pcap,infinite_rx=1"
[[ports]]
id = "tx"
role = "vf"
driver = "dpdk"
device = "net_null0,no-rx=1"
""")
    state = tempfile.mkdtemp(dir=work)
    log = open(os.path.join(work, "daemon.log"), "w")
    p = subprocess.Popen([os.path.join(RELEASE, "dpu-service"), "--config", config,
                          "--state-dir", state, "--grpc-listen", grpc,
                          "--metrics-listen", metrics], stdout=log, stderr=log)
    try:
        dpuctl = [os.path.join(RELEASE, "dpuctl"), "--endpoint", f"http://{grpc}"]
        for _ in range(200):
            if subprocess.run(dpuctl + ["tenant", "list"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        doc = json.load(open(f"{data}/rules.json"))
        for t in doc["tenants"]:
            ports = []
            for a in t["attachments"]:
                ports += ["--port", f"{['rx', 'tx'][a['port']]}.{a['vlan']}"]
            subprocess.run(dpuctl + ["tenant", "create", t["name"], "--default-policy",
                                     t["default_action"]] + ports, check=True, capture_output=True)
            if t["rules"]:
                path = os.path.join(work, f"{t['name']}.json")
                with open(path, "w") as f:
                    json.dump(rules_of(t), f)
                subprocess.run(dpuctl + ["rule", "replace", t["name"], "--file", path],
                               check=True, capture_output=True)
        time.sleep(warmup)
        lock = locked()
        a, t0 = rx_packets(metrics), time.monotonic()
        time.sleep(secs)
        b, t1 = rx_packets(metrics), time.monotonic()
        lock.close()
        return (b - a) / (t1 - t0) / 1e6
    finally:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="plain", help="bench set under --data (default plain)")
    ap.add_argument("--data", default="/tmp/vswitch-bench/data")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--cpu", type=int, default=1, help="the worker's CPU in both")
    args = ap.parse_args()
    data = os.path.join(args.data, args.set)
    forwards = sorted(glob.glob(os.path.join(RELEASE, "deps", "forward-*")), key=os.path.getmtime)
    forwards = [f for f in forwards if os.access(f, os.X_OK) and not f.endswith(".d")]
    if not forwards:
        sys.exit("no forward bench: cargo bench -p dpu-dataplane --bench forward --no-run")
    forward = forwards[-1]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for r in range(1, args.rounds + 1):
            with locked():
                b = bare(forward, data, args.secs, args.warmup, args.cpu)
            d = daemon(data, args.secs, args.warmup, args.cpu, work)
            rows.append((b, d))
            print(f"round {r}: bare worker {b:.2f} Mpps, daemon {d:.2f} Mpps, ratio {d / b:.2f}", flush=True)
    mb = statistics.median(b for b, _ in rows)
    md = statistics.median(d for _, d in rows)
    print(f"median ({args.set}): bare worker {mb:.2f} Mpps, daemon {md:.2f} Mpps, ratio {md / mb:.2f}")


if __name__ == "__main__":
    main()
