#!/usr/bin/env python3
"""The data-plane worker beside dpdk-testpmd io forwarding, in one sitting.

Both forward packets that net_pcap replays forever (infinite_rx=1) from the
same capture into net_null, on one worker core (CPU 1; EAL's main thread on
CPU 0), with the worker thread at SCHED_FIFO 10. Rounds alternate: testpmd,
then the worker (benches/forward.rs, empty pipeline), each for --secs after
a warm-up. Prints every round, the medians and the worker/testpmd ratio.

testpmd: Debian 12 ships no dpdk-testpmd, so unless --testpmd names one
this builds it once from the source of the installed DPDK version (the
orig tarball from deb.debian.org), with -O3 for generic x86-64/arm64 as
the Rust worker is built, into target/testpmd/.

Run as root (SCHED_FIFO, hugepages when reserved):

    python3 ../shared/bench/gen_data.py      # /tmp/vswitch-bench/data/plain/traffic.pcap
    python3 dpu-service/dataplane/bench/compare-testpmd.py --rounds 3 --secs 5
"""

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
CONTROL_CPU, WORKER_CPU = 0, 1

TESTPMD_SOURCES = """5tswap.c cmdline.c cmdline_flow.c cmdline_mtr.c cmdline_tm.c
cmd_flex_item.c config.c csumonly.c flowgen.c icmpecho.c ieee1588fwd.c iofwd.c
macfwd.c macswap.c noisy_vnf.c parameters.c rxonly.c shared_rxq_fwd.c testpmd.c
txonly.c util.c bpf_cmd.c""".split()
# Libraries testpmd's driver-specific commands call (PMDs are plugins, so
# pkg-config's --libs does not list them).
TESTPMD_LIBS = """net_ixgbe net_i40e net_bnxt net_dpaa bus_dpaa mempool_dpaa
net_mlx5 net_bond latencystats bitratestats metrics pdump gro gso bpf""".split()


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def build_testpmd():
    ver = subprocess.check_output(["pkg-config", "--modversion", "libdpdk"], text=True).strip()
    out = os.path.join(TARGET, "testpmd", ver)
    exe = os.path.join(out, "dpdk-testpmd")
    if os.path.exists(exe):
        return exe
    os.makedirs(out, exist_ok=True)
    tarball = os.path.join(out, "dpdk.orig.tar.xz")
    if not os.path.exists(tarball):
        url = "http://deb.debian.org/debian/pool/main/d/dpdk/dpdk_%s.orig.tar.xz" % ver
        print("fetching", url, flush=True)
        sh(["curl", "-fsSL", "-o", tarball + ".part", url])
        os.rename(tarball + ".part", tarball)
    src = os.path.join(out, "dpdk-stable-%s" % ver)
    sh(["tar", "xf", tarball, "-C", out, "dpdk-stable-%s/app/test-pmd" % ver,
        "dpdk-stable-%s/lib/eal/linux/include" % ver, "dpdk-stable-%s/drivers/net/mlx5" % ver])
    app = os.path.join(src, "app/test-pmd")
    cflags = subprocess.check_output(["pkg-config", "--cflags", "libdpdk"], text=True).split()
    libs = subprocess.check_output(["pkg-config", "--libs", "libdpdk"], text=True).split()
    cmd = (["gcc", "-O3", "-DALLOW_EXPERIMENTAL_API", "-DALLOW_INTERNAL_API",
            "-Wno-deprecated-declarations", "-I" + app,
            "-I" + os.path.join(src, "lib/eal/linux/include"),
            "-I" + os.path.join(src, "drivers/net/mlx5")] + cflags
           + [os.path.join(app, f) for f in TESTPMD_SOURCES]
           + [os.path.join(src, "drivers/net/mlx5/mlx5_testpmd.c"), "-o", exe + ".part"]
           + libs + ["-Wl,--no-as-needed"] + ["-lrte_" + l for l in TESTPMD_LIBS]
           + ["-ljansson", "-lm"])
    print("building testpmd %s" % ver, flush=True)
    sh(cmd, stderr=subprocess.DEVNULL)
    os.rename(exe + ".part", exe)
    return exe


def build_worker_bench():
    out = subprocess.run(["cargo", "bench", "--locked", "-p", "dpu-dataplane", "--bench", "forward",
                          "--no-run"], cwd=ROOT, check=True, capture_output=True, text=True)
    m = re.findall(r"Executable .*\((.*forward-[0-9a-f]+)\)", out.stderr)
    if not m:
        sys.exit("cannot find the forward benchmark in cargo's output:\n" + out.stderr)
    return os.path.join(ROOT, m[-1]) if not os.path.isabs(m[-1]) else m[-1]


def thread_id(pid, name, timeout=30):
    """The TID of thread `name` of process `pid`, once it exists."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for task in glob.glob("/proc/%d/task/*" % pid):
            try:
                if open(task + "/comm").read().strip() == name:
                    return int(os.path.basename(task))
            except OSError:
                pass
        time.sleep(0.1)
    return None


def realtime(tid):
    if tid:
        subprocess.run(["chrt", "-f", "-p", "10", str(tid)], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def huge_args(huge):
    return ["--in-memory"] if huge else ["--no-huge", "-m", "1024"]


def testpmd_round(exe, pcap, secs, warmup, huge):
    log = tempfile.NamedTemporaryFile("w+", prefix="testpmd-", suffix=".log", delete=False)
    cmd = (["stdbuf", "-oL", exe, "-l", "%d,%d" % (CONTROL_CPU, WORKER_CPU), "--main-lcore",
            str(CONTROL_CPU), "--no-pci", "--file-prefix", "cmp-tpmd-%d" % os.getpid(),
            "--log-level=lib.eal:warning"] + huge_args(huge)
           + ["--vdev=net_pcap0,rx_pcap=%s,infinite_rx=1" % pcap, "--vdev=net_null1,no-rx=1",
              "--", "-i", "--nb-cores=1", "--forward-mode=io", "--total-num-mbufs=131072",
              "--burst=32", "--rxq=1", "--txq=1", "--no-lsc-interrupt"])
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.monotonic()
        while "testpmd>" not in open(log.name).read():
            if p.poll() is not None or time.monotonic() - t0 > 60:
                raise RuntimeError("testpmd did not start:\n" + open(log.name).read()[-2000:])
            time.sleep(0.2)

        def say(line):
            p.stdin.write(line + "\n")
            p.stdin.flush()
        say("start")
        realtime(thread_id(p.pid, "rte-worker-%d" % WORKER_CPU, timeout=5))
        time.sleep(warmup)
        say("show port stats 1")
        ta = time.monotonic()
        time.sleep(secs)
        say("show port stats 1")
        tb = time.monotonic()
        say("stop")
        say("quit")
        p.stdin.close()
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = open(log.name).read()
    os.unlink(log.name)
    tx = [int(x) for x in re.findall(r"TX-packets:\s+(\d+)", text)]
    if len(tx) < 2:
        raise RuntimeError("no testpmd port statistics:\n" + text[-2000:])
    # The two `show port stats 1` are the first two TX counts printed.
    return (tx[1] - tx[0]) / (tb - ta) / 1e6


def worker_round(exe, pcap, secs, warmup, huge):
    cmd = [exe, "--pcap", pcap, "--secs", str(secs), "--warmup", str(warmup), "--runs", "1",
           "--cpu", str(WORKER_CPU)] + (["--huge"] if huge else [])
    # EAL's and the bench's own threads stay on the control CPU.
    p = subprocess.Popen(["taskset", "-c", "%d,%d" % (CONTROL_CPU, WORKER_CPU)] + cmd,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    realtime(thread_id(p.pid, "dp-worker-0"))
    out, _ = p.communicate(timeout=secs + warmup + 120)
    m = re.search(r"run 1: rx [\d.]+ Mpps, forwarded ([\d.]+) Mpps", out)
    if p.returncode != 0 or not m:
        raise RuntimeError("forward benchmark failed:\n" + out[-2000:])
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pcap", default="/tmp/vswitch-bench/data/plain/traffic.pcap")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--testpmd", help="a dpdk-testpmd to use instead of building one")
    ap.add_argument("--no-huge", action="store_true", help="4K pages even when hugepages are reserved")
    a = ap.parse_args()
    if not os.path.exists(a.pcap):
        sys.exit("%s is missing: run ../shared/bench/gen_data.py" % a.pcap)
    for tool in ("chrt", "taskset", "stdbuf", "pkg-config", "gcc", "curl"):
        if not shutil.which(tool):
            sys.exit("%s is not installed" % tool)
    huge = not a.no_huge and int(open("/proc/sys/vm/nr_hugepages").read()) >= 600
    testpmd = a.testpmd or build_testpmd()
    worker = build_worker_bench()
    print("pcap %s, %s, %d rounds of %.0f s" % (a.pcap, "hugepages" if huge else "4K pages",
                                               a.rounds, a.secs), flush=True)
    rows = []
    for r in range(1, a.rounds + 1):
        t = testpmd_round(testpmd, a.pcap, a.secs, a.warmup, huge)
        w = worker_round(worker, a.pcap, a.secs, a.warmup, huge)
        rows.append((t, w))
        print("round %d: testpmd io %.2f Mpps, dpu-dataplane worker %.2f Mpps, ratio %.2f"
              % (r, t, w, w / t), flush=True)
    mt = statistics.median(t for t, _ in rows)
    mw = statistics.median(w for _, w in rows)
    print("median: testpmd io %.2f Mpps, dpu-dataplane worker %.2f Mpps, ratio %.2f"
          % (mt, mw, mw / mt))


if __name__ == "__main__":
    main()
