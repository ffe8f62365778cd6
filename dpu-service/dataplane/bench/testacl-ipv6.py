#!/usr/bin/env python3
"""rte_acl (dpdk-test-acl --ipv6) on the IPv6 forms of the rule sets.

Runs ../shared/bench/anchors.py's test-acl measurement (same calibration,
runs, medians, build time and memory, the same lock, CPU and SCHED_FIFO)
on the `<set>_v6` directories that ipv6-sets.py writes, with `--ipv6`
added to every dpdk-test-acl command. Before timing, each set's answers
(scalar) are checked against the IPv4 set's expected.csv: the IPv6 form
keeps every key's first matching rule. Prints one Markdown row per set
and algorithm; run as root.

    python3 dpu-service/dataplane/bench/ipv6-sets.py acl1_1k fw2_10k
    python3 dpu-service/dataplane/bench/testacl-ipv6.py acl1_1k_v6 fw2_10k_v6 \\
        --runs 3 --secs 3 --algs scalar,sse,avx2,avx512x16,avx512x32
"""

import argparse
import csv
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ANCHORS = os.path.join(HERE, "../../../../shared/bench/anchors.py")


def load_anchors():
    spec = importlib.util.spec_from_file_location("anchors", os.path.abspath(ANCHORS))
    a = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(a)
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sets", nargs="+", help="<set>_v6 names under --data")
    ap.add_argument("--data", default="/tmp/vswitch-bench/data")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--algs", default="scalar,sse,avx2,avx512x16,avx512x32")
    args = ap.parse_args()
    a = load_anchors()
    command = a.testacl_cmd

    def ipv6_cmd(rules, trace, alg, iters, verbose=0):
        return command(rules, trace, alg, iters, verbose) + ["--ipv6"]

    def verify(d):
        rc, out = a.run_capture(ipv6_cmd(os.path.join(d, "testacl.rules"),
                                         os.path.join(d, "testacl.trace"), "scalar", 1, 2), 300)
        got = [int(l.rsplit(":", 1)[1]) for l in out.splitlines() if l.startswith("ipv6_5tuple:")]
        got = [-1 if g == 0xFFFFFFFF else g for g in got]
        v4 = d[:-len("_v6")] if d.endswith("_v6") else d
        with open(os.path.join(v4, "expected.csv")) as f:
            exp = [int(r["global_rule"]) for r in csv.DictReader(f)]
        bad = sum(1 for x, y in zip(got, exp) if x != y) + abs(len(got) - len(exp))
        return {"packets": len(exp), "mismatches": bad}

    a.testacl_cmd = ipv6_cmd
    a.verify_testacl = verify
    res = a.bench_testacl(args.data, args.sets, args.runs, args.secs, args.algs.split(","))
    print("| set | algorithm | M lookups/s | build s | memory MB | mismatches |")
    print("|---|---|---|---|---|---|")
    for s, sv in res.items():
        for alg, v in sv["algs"].items():
            if "error" in v:
                print("| %s | %s | n/a (%s) | | | |" % (s, alg, v["error"]))
                continue
            mem = v["runtime_mem_bytes"] or v["build_mem_bytes"] or 0
            print("| %s | %s | %.2f | %s | %.2f | %d/%d |" % (
                s, alg, v["median_mpps"] or 0,
                "%.3f" % v["median_build_s"] if v["median_build_s"] is not None else "n/a",
                mem / 1e6, sv["verify"]["mismatches"], sv["verify"]["packets"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
