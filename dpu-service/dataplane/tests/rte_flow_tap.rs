//! The `rte_flow` provider against DPDK's `net_tap`, whose flow rules are
//! TC flower filters on its TAP interface:
//!
//! - every shape of rule the provider makes validates on `net_tap` once
//!   the parts `net_tap` cannot express are taken out, and each of those
//!   parts alone makes it refuse (the list is the one `docs/offload.md`
//!   gives);
//! - on ports without an embedded switch the provider only drops, and
//!   says why it refuses the rest;
//! - inside a Linux guest whose kernel has TC flower (this host's has
//!   not), a drop rule the provider creates drops the flow's frames in
//!   the kernel, before DPDK sees them, and only that flow's; removed, the
//!   flow reaches DPDK again.
//!
//! Needs root (TAP interfaces); the guest test needs the kernel-nvme
//! harness and Debian's archive (the guest kernel's TC modules).
#![cfg(feature = "dpdk")]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dpdk::flow::{self, FlowAttach, FlowFate, FlowSpec, FlowVlan, FlowVlanOp};
use dpu_dataplane::offload::rte_flow::{FlowMode, RteFlowNic};
use dpu_dataplane::offload::{FlowAction, FlowMatch, FlowPort, FlowRule, Provider, Refusal};
use dpu_dataplane::wire::FlowKey;
use dpu_dataplane::worker::{Egress, Tunnel, VlanOp};

/// The TAP interface of this process's port (names are 15 bytes at most).
fn iface() -> String {
    format!("rft{}", std::process::id() % 1_000_000)
}

struct Rig {
    port: dpdk::Port,
    _pool: Arc<dpdk::Mempool>,
}

/// EAL with one net_tap port, once per process. `DPU_FLOW_PMDS` lists
/// (`:`-separated) driver plugins to load: in the guest, where DPDK's
/// own plugin folder is not.
fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let pmd_paths = std::env::var_os("DPU_FLOW_PMDS")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        let eal = dpdk::Eal::init(&dpdk::EalConfig {
            lcores: Some("0".into()),
            no_huge: true,
            no_pci: true,
            memory_mb: Some(128),
            file_prefix: Some(format!("rft-{}", std::process::id())),
            vdevs: vec![format!("net_tap0,iface={}", iface())],
            pmd_paths,
            log_level: Some("lib.eal:error".into()),
            // In the guest, what net_tap does with TC is the point.
            extra: if std::env::var_os("DPU_FLOW_GUEST").is_some() {
                vec!["--log-level".into(), "pmd.net.tap:debug".into()]
            } else {
                Vec::new()
            },
            ..Default::default()
        })
        .expect("EAL with a net_tap port (root and /dev/net/tun)");
        let pool = Arc::new(dpdk::Mempool::new(&eal, "rft", 1023, 0, 2176).expect("pool"));
        // Fewer descriptors than the pool has buffers: net_tap fills
        // its receive ring from the pool at start.
        let cfg = dpdk::PortConfig {
            rx_descriptors: 256,
            tx_descriptors: 256,
            ..Default::default()
        };
        let port = dpdk::Port::open(&eal, "net_tap0", &cfg, pool.clone()).expect("net_tap0 opens");
        Rig { port, _pool: pool }
    })
}

fn flow_port(p: &dpdk::Port) -> FlowPort {
    FlowPort {
        name: p.name().to_string(),
        id: p.id(),
        driver: p.driver().to_string(),
        switch_domain: p.switch_domain(),
    }
}

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

fn key4(proto: u8, sport: u16, dport: u16) -> FlowKey {
    FlowKey {
        src: u128::from(u32::from(Ipv4Addr::new(10, 7, 0, 1))),
        dst: u128::from(u32::from(Ipv4Addr::new(10, 7, 0, 2))),
        src_port: sport,
        dst_port: dport,
        proto,
        v6: false,
    }
}

fn key6(proto: u8, sport: u16, dport: u16) -> FlowKey {
    FlowKey {
        src: u128::from("fd00::1".parse::<Ipv6Addr>().unwrap()),
        dst: u128::from("fd00::2".parse::<Ipv6Addr>().unwrap()),
        src_port: sport,
        dst_port: dport,
        proto,
        v6: true,
    }
}

fn rule(
    in_port: u16,
    vni: Option<u32>,
    vlan: Option<u16>,
    key: FlowKey,
    action: FlowAction,
) -> FlowRule {
    FlowRule {
        tenant: 1,
        matches: FlowMatch {
            in_port,
            vni,
            vlan,
            src_mac: MAC_A,
            dst_mac: MAC_B,
            key,
        },
        action,
        idle: Duration::from_secs(10),
        rule: None,
    }
}

fn out(port: usize, vlan: VlanOp, decap: u16, tunnel: Option<Tunnel>) -> FlowAction {
    FlowAction::Forward(Egress {
        port,
        vlan,
        decap,
        tunnel,
    })
}

/// Every shape of rule the provider makes: the connections' forwarding
/// rules (IPv4 and IPv6, each tag operation, into and out of VXLAN) and
/// the drop rules of denied flows (TCP, UDP, ICMP, another protocol).
fn shapes() -> Vec<(&'static str, FlowRule)> {
    let tunnel = Tunnel {
        src_mac: MAC_A,
        dst_mac: MAC_B,
        src_ip: u32::from(Ipv4Addr::new(192, 0, 2, 1)),
        dst_ip: u32::from(Ipv4Addr::new(192, 0, 2, 2)),
        vni: 5001,
        resolve: false,
    };
    let tcp4 = key4(6, 40000, 80);
    let tcp6 = key6(6, 40000, 80);
    vec![
        (
            "tcp4 forward",
            rule(0, None, None, tcp4, out(1, VlanOp::Keep, 0, None)),
        ),
        (
            "tcp6 forward",
            rule(0, None, None, tcp6, out(1, VlanOp::Keep, 0, None)),
        ),
        (
            "tcp4 tagged, tag removed",
            rule(0, None, Some(10), tcp4, out(1, VlanOp::Strip, 0, None)),
        ),
        (
            "tcp4 untagged, tag added",
            rule(0, None, None, tcp4, out(1, VlanOp::Push(20), 0, None)),
        ),
        (
            "tcp4 tagged, tag changed",
            rule(0, None, Some(10), tcp4, out(1, VlanOp::Set(20), 0, None)),
        ),
        (
            "tcp4 into VXLAN",
            rule(0, None, None, tcp4, out(1, VlanOp::Keep, 0, Some(tunnel))),
        ),
        (
            "tcp4 out of VXLAN",
            rule(1, Some(5001), None, tcp4, out(0, VlanOp::Keep, 50, None)),
        ),
        ("tcp4 drop", rule(0, None, None, tcp4, FlowAction::Drop)),
        (
            "udp4 drop, tagged",
            rule(0, None, Some(10), key4(17, 5000, 53), FlowAction::Drop),
        ),
        (
            "udp6 drop",
            rule(0, None, None, key6(17, 5000, 53), FlowAction::Drop),
        ),
        (
            "icmp4 drop",
            rule(0, None, None, key4(1, 8, 0), FlowAction::Drop),
        ),
        (
            "icmp6 drop",
            rule(0, None, None, key6(58, 128, 0), FlowAction::Drop),
        ),
        (
            "gre4 drop",
            rule(0, None, None, key4(47, 0, 0), FlowAction::Drop),
        ),
    ]
}

/// The parts of a rule net_tap cannot express, each with the change
/// that takes it out.
type Removal = (&'static str, fn(&FlowSpec) -> bool, fn(&mut FlowSpec));

fn removals() -> Vec<Removal> {
    vec![
        (
            "transfer rule from a represented port",
            |s| matches!(s.attach, FlowAttach::Transfer { .. }),
            |s| s.attach = FlowAttach::Ingress,
        ),
        (
            "forward to a represented port",
            |s| matches!(s.fate, FlowFate::Port(_)),
            |s| s.fate = FlowFate::Drop,
        ),
        ("VXLAN match", |s| s.vni.is_some(), |s| s.vni = None),
        (
            "untagged frames only (has_vlan)",
            |s| s.vlan == FlowVlan::None,
            |s| s.vlan = FlowVlan::Any,
        ),
        (
            "TCP flags",
            |s| s.tcp_flags_clear != 0,
            |s| s.tcp_flags_clear = 0,
        ),
        ("VXLAN decapsulation", |s| s.decap, |s| s.decap = false),
        (
            "tag pop, push or change",
            |s| s.vlan_op != FlowVlanOp::Keep,
            |s| s.vlan_op = FlowVlanOp::Keep,
        ),
        (
            "VXLAN encapsulation",
            |s| s.encap.is_some(),
            |s| s.encap = None,
        ),
        ("count", |s| s.count, |s| s.count = false),
        ("age", |s| s.age.is_some(), |s| s.age = None),
    ]
}

/// Protocols whose rules net_tap cannot express at all: it matches
/// ports of TCP and UDP and no ICMP item.
fn inexpressible_protocol(s: &FlowSpec) -> Option<&'static str> {
    match (s.proto, s.src_ip) {
        (1, IpAddr::V4(_)) => Some("ICMP type and code"),
        (58, IpAddr::V6(_)) => Some("ICMPv6 type and code"),
        _ => None,
    }
}

#[test]
fn every_shape_validates_on_net_tap_but_for_what_net_tap_cannot_express() {
    let rig = rig();
    let tap = rig.port.id();
    let switch = RteFlowNic::transfer(vec![flow_port(&rig.port), flow_port(&rig.port)], tap, 1024);
    let mut report = Vec::new();
    for (id, (name, r)) in (1u64..).zip(shapes()) {
        let (on, full) = switch.spec(id, &r).expect(name);
        assert_eq!(on, tap);
        assert!(
            matches!(full.attach, FlowAttach::Transfer { from } if from == tap),
            "{name}: {full:?}"
        );
        assert!(
            full.count && full.age == Some((10, id)),
            "{name}: count and age"
        );
        // The whole transfer rule: net_tap has no eSwitch.
        assert!(
            flow::validate(tap, &full).is_err(),
            "{name}: net_tap took a transfer rule"
        );
        let mut subset = full;
        for (_, has, take) in removals() {
            if has(&subset) {
                take(&mut subset);
            }
        }
        if let Some(why) = inexpressible_protocol(&full) {
            let e = flow::validate(tap, &subset).expect_err(name);
            assert!(e.is_unsupported(), "{name}: {e}");
            report.push(format!("{name}: not on net_tap ({why})"));
            continue;
        }
        flow::validate(tap, &subset)
            .unwrap_or_else(|e| panic!("{name}: the net_tap part {subset:?} was refused: {e}"));
        // Each part taken out, put back alone, is refused.
        let mut missing = Vec::new();
        for (what, has, _) in removals() {
            if !has(&full) {
                continue;
            }
            let mut one = subset;
            restore(&mut one, &full, what);
            let e = flow::validate(tap, &one)
                .err()
                .unwrap_or_else(|| panic!("{name}: net_tap took {what}: {one:?}"));
            assert!(e.is_unsupported(), "{name}, {what}: {e}");
            missing.push(what);
        }
        report.push(format!("{name}: validates without {}", missing.join(", ")));
    }
    println!("{}", report.join("\n"));
}

/// Puts back into `one` the part `what` of `full`.
fn restore(one: &mut FlowSpec, full: &FlowSpec, what: &str) {
    match what {
        "transfer rule from a represented port" => one.attach = full.attach,
        "forward to a represented port" => one.fate = full.fate,
        "VXLAN match" => one.vni = full.vni,
        "untagged frames only (has_vlan)" => one.vlan = full.vlan,
        "TCP flags" => one.tcp_flags_clear = full.tcp_flags_clear,
        "VXLAN decapsulation" => one.decap = full.decap,
        "tag pop, push or change" => one.vlan_op = full.vlan_op,
        "VXLAN encapsulation" => one.encap = full.encap,
        "count" => one.count = full.count,
        "age" => one.age = full.age,
        other => panic!("no such part {other}"),
    }
}

#[test]
fn without_an_embedded_switch_the_provider_only_drops_and_says_why() {
    let rig = rig();
    let mut nic = RteFlowNic::new(vec![flow_port(&rig.port)], 64).expect("provider");
    assert_eq!(
        nic.mode(),
        FlowMode::Ingress,
        "net_tap is in no switch domain"
    );
    // net_tap validates none of: counters, ages, untagged-only, TCP flags.
    assert_eq!(nic.port_caps(0), Some([false, false, false, false]));
    let fwd = rule(
        0,
        None,
        Some(10),
        key4(6, 1, 2),
        out(0, VlanOp::Keep, 0, None),
    );
    match nic.insert(1, &fwd) {
        Err(Refusal::Unsupported(why)) => assert!(why.contains("no embedded switch"), "{why}"),
        other => panic!("a forward on net_tap: {other:?}"),
    }
    let untagged = rule(0, None, None, key4(17, 1, 2), FlowAction::Drop);
    match nic.insert(2, &untagged) {
        Err(Refusal::Unsupported(why)) => assert!(why.contains("untagged"), "{why}"),
        other => panic!("an untagged drop on net_tap: {other:?}"),
    }
    // ICMP: refused by the driver, then by the shape remembered.
    let icmp = rule(0, None, Some(10), key4(1, 8, 0), FlowAction::Drop);
    for id in [3, 4] {
        match nic.insert(id, &icmp) {
            Err(Refusal::Unsupported(why)) => assert!(why.contains("item"), "{why}"),
            other => panic!("an ICMP drop on net_tap: {other:?}"),
        }
    }
    // A tagged UDP drop validates; this host's kernel has no TC flower,
    // so creating it fails, saying so, and nothing is held.
    let (port, spec) = nic
        .spec(
            5,
            &rule(0, None, Some(10), key4(17, 1, 2), FlowAction::Drop),
        )
        .expect("a tagged drop is expressible");
    assert_eq!(port, rig.port.id());
    assert!(!spec.count && spec.age.is_none());
    flow::validate(port, &spec).expect("net_tap validates the tagged drop");
    if !kernel_has_flower() {
        match nic.insert(
            5,
            &rule(0, None, Some(10), key4(17, 1, 2), FlowAction::Drop),
        ) {
            Err(Refusal::Failed(why)) => assert!(why.contains("create"), "{why}"),
            other => panic!("a drop on a kernel without TC flower: {other:?}"),
        }
        assert_eq!(nic.installed(), 0);
    }
}

/// This host's kernel has TC flower (its configuration says).
fn kernel_has_flower() -> bool {
    let out = Command::new("sh")
        .args([
            "-c",
            "zcat /proc/config.gz 2>/dev/null | grep -q '^CONFIG_NET_CLS_FLOWER=[ym]'",
        ])
        .status();
    out.is_ok_and(|s| s.success())
}

/// The TC modules the guest loads: the TAP device, the queueing
/// disciplines net_tap attaches its filters to, flower and its drop
/// action.
const GUEST_MODULES: &[&str] = &[
    "tun",
    "8021q",
    "sch_multiq",
    "sch_ingress",
    "cls_flower",
    "act_gact",
];

#[test]
fn a_drop_rule_drops_in_a_guest_kernel_with_tc_flower() {
    let harness = harness();
    let pkg = guest_kernel_package(&harness);
    let modules = guest_modules(&pkg);
    let share = tempfile::tempdir().expect("tempdir");
    let dir = share.path();
    let exe = std::env::current_exe().expect("this test binary");
    let me = dir.join("rte_flow_tap");
    std::fs::copy(&exe, &me).expect("copying the test binary");
    // DPDK's plugins the guest needs, and every library they and this
    // binary load (the guest's userland is this host's, without DPDK).
    // A plugin is loaded by the name the others link it by, so that it
    // is loaded once.
    let libs = dir.join("lib");
    std::fs::create_dir_all(&libs).unwrap();
    // iproute2's ip for the VLAN interfaces (the guest's is busybox's).
    std::fs::copy("/bin/ip", dir.join("ip")).expect("iproute2's ip");
    let mut loaded = vec![exe.clone(), PathBuf::from("/bin/ip")];
    let mut plugins = Vec::new();
    for p in [
        "librte_bus_vdev.so",
        "librte_mempool_ring.so",
        "librte_net_tap.so",
    ] {
        let (src, soname) = dpdk_plugin(p);
        std::fs::copy(&src, libs.join(&soname))
            .unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        plugins.push(format!("/mnt/host/lib/{soname}"));
        loaded.push(src);
    }
    for l in shared_libraries(&loaded) {
        let name = l.file_name().unwrap();
        std::fs::copy(&l, libs.join(name)).unwrap_or_else(|e| panic!("{}: {e}", l.display()));
    }
    let mods = dir.join("modules");
    std::fs::create_dir_all(&mods).unwrap();
    let mut order = String::new();
    for m in &modules {
        let name = m.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::copy(m, mods.join(&name)).unwrap();
        order.push_str(&name);
        order.push('\n');
    }
    std::fs::write(mods.join("order"), order).unwrap();
    let script = dir.join("guest.sh");
    std::fs::write(
        &script,
        format!(
            "cd /mnt/host\n\
             for m in $(cat modules/order); do insmod modules/$m || grep -q \"^${{m%.ko}} \" /proc/modules; done\n\
             [ -e /dev/net/tun ] || {{ mkdir -p /dev/net; mknod /dev/net/tun c 10 200; }}\n\
             mkdir -p /var/run\n\
             # EAL loads plugins only from folders no one else may write.\n\
             chmod go-w / /mnt /mnt/host /mnt/host/lib\n\
             LD_LIBRARY_PATH=/mnt/host/lib DPU_FLOW_GUEST=1 DPU_FLOW_IP=/mnt/host/ip DPU_FLOW_PMDS={} \
             ./rte_flow_tap --exact guest_side_of_the_tc_flower_test --ignored --nocapture --test-threads 1\n",
            plugins.join(":")
        ),
    )
    .unwrap();
    let out = Command::new(&harness)
        .arg("--share")
        .arg(dir)
        .args(["--timeout", "400", "--mem", "1024", "--script"])
        .arg(&script)
        .output()
        .expect("running the kernel-nvme harness");
    let console = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{console}");
    assert!(
        out.status.success(),
        "the guest failed ({}):\n{console}",
        out.status
    );
    for line in [
        "guest: with the rule, the dropped flow reached DPDK 0 of 32 times",
        "guest: the other flows reached DPDK 32 and 32 of 32 times",
        "guest: without the rule, the flow reached DPDK 32 of 32 times",
        // The kernel's own count: the filter dropped them.
        "Sent 1920 bytes 32 pkt (dropped 32, overlimits 0 requeues 0)",
    ] {
        assert!(console.contains(line), "missing {line:?}:\n{console}");
    }
}

/// The kernel-nvme harness: `$KERNEL_NVME_RUN`, else the shared tools
/// beside the repository.
fn harness() -> PathBuf {
    if let Some(p) = std::env::var_os("KERNEL_NVME_RUN") {
        return PathBuf::from(p);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [
        repo.join("../shared/tools/kernel-nvme/run.sh"),
        PathBuf::from("/work/shared/tools/kernel-nvme/run.sh"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .expect("the kernel-nvme harness (set KERNEL_NVME_RUN to its run.sh)")
}

/// The Debian package of the guest's kernel, from the harness's cache
/// (built first if it is not yet).
fn guest_kernel_package(harness: &Path) -> String {
    let cache = std::env::var_os("KERNEL_NVME_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("kernel-nvme"))
        })
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/kernel-nvme")
        });
    let stamp = cache.join("stamp");
    if !stamp.exists() {
        let st = Command::new(harness)
            .args(["--timeout", "300", "--", "true"])
            .status()
            .expect("building the guest image");
        assert!(
            st.success(),
            "the kernel-nvme harness could not build its guest"
        );
    }
    let s = std::fs::read_to_string(&stamp).expect("the harness's stamp");
    s.split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no kernel package in {}: {s:?}", stamp.display()))
        .to_string()
}

/// The guest kernel's TC modules and what they depend on, in load
/// order: from its Debian package, downloaded once into the target
/// folder.
fn guest_modules(pkg: &str) -> Vec<PathBuf> {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<binary>
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the target folder")
        .to_path_buf();
    // Named by the package and the modules, so a changed list is fetched.
    let cache = target
        .join("guest-modules")
        .join(format!("{pkg}+{}", GUEST_MODULES.join("+")));
    let order = cache.join("order");
    if !order.exists() {
        let work = target.join("guest-modules").join(format!("{pkg}.work"));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).unwrap();
        let download = || {
            Command::new("apt-get")
                .args(["download", "-q", "-o", "APT::Sandbox::User=root", pkg])
                .current_dir(&work)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !download() {
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
            assert!(download(), "apt-get download {pkg} failed");
        }
        let deb = std::fs::read_dir(&work)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .expect("the downloaded package");
        let root = work.join("root");
        run_ok(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
        let mods = if root.join("lib/modules").exists() {
            root.join("lib/modules")
        } else {
            root.join("usr/lib/modules")
        };
        let kver = std::fs::read_dir(&mods)
            .unwrap()
            .filter_map(Result::ok)
            .next()
            .expect("a kernel version")
            .file_name()
            .to_string_lossy()
            .into_owned();
        let base = mods.parent().unwrap().parent().unwrap().to_path_buf();
        run_ok(Command::new("depmod").arg("-b").arg(&base).arg(&kver));
        let files = cache.join("files");
        std::fs::create_dir_all(&files).unwrap();
        let mut list = Vec::new();
        for m in GUEST_MODULES {
            let out = Command::new("modprobe")
                .arg("-d")
                .arg(&base)
                .args(["-S", &kver, "--show-depends", m])
                .output()
                .expect("modprobe");
            let text = String::from_utf8_lossy(&out.stdout);
            for l in text.lines() {
                let mut w = l.split_whitespace();
                if w.next() != Some("insmod") {
                    continue; // built in
                }
                let f = PathBuf::from(w.next().unwrap());
                let name = f.file_name().unwrap().to_string_lossy().into_owned();
                if !list.contains(&name) {
                    std::fs::copy(&f, files.join(&name)).unwrap();
                    list.push(name);
                }
            }
        }
        std::fs::write(&order, list.join("\n")).unwrap();
        let _ = std::fs::remove_dir_all(&work);
    }
    std::fs::read_to_string(&order)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| cache.join("files").join(l))
        .collect()
}

fn run_ok(cmd: &mut Command) {
    let st = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(st.success(), "{cmd:?}: {st}");
}

/// A DPDK driver plugin of this host's DPDK, by file name: its file and
/// its soname (the name others link it by).
fn dpdk_plugin(name: &str) -> (PathBuf, String) {
    let out = Command::new("pkg-config")
        .args(["--variable=libdir", "libdpdk"])
        .output()
        .expect("pkg-config");
    let libdir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let dpdk = libdir.join("dpdk");
    let file = std::fs::read_dir(&dpdk)
        .unwrap_or_else(|e| panic!("{}: {e}", dpdk.display()))
        .filter_map(Result::ok)
        .map(|e| e.path().join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no {name} under {}", dpdk.display()));
    let out = Command::new("objdump")
        .arg("-p")
        .arg(&file)
        .output()
        .expect("objdump");
    let soname = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("SONAME")
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| panic!("{} has no SONAME", file.display()));
    (std::fs::canonicalize(&file).unwrap(), soname)
}

/// The shared libraries `bins` load, as `ldd` finds them (but the
/// dynamic loader).
fn shared_libraries(bins: &[PathBuf]) -> Vec<PathBuf> {
    let mut libs: Vec<PathBuf> = Vec::new();
    for b in bins {
        let out = Command::new("ldd").arg(b).output().expect("ldd");
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((_, right)) = l.split_once("=>") else {
                continue;
            };
            let Some(path) = right
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/'))
            else {
                continue;
            };
            let named = PathBuf::from(path);
            if !libs.iter().any(|x| x.file_name() == named.file_name()) {
                // Copied under the name the loader asks for.
                libs.push(named);
            }
        }
    }
    libs
}

/// One UDP flow the guest's kernel sends through the TAP interface:
/// over the VLAN interface of `vlan`, from `.1:5000` to `.2:dst_port`
/// of its subnet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KernelFlow {
    vlan: u16,
    dst_port: u16,
}

impl KernelFlow {
    fn src(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 7, u8::try_from(self.vlan).unwrap(), 1)
    }

    fn dst(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 7, u8::try_from(self.vlan).unwrap(), 2)
    }

    /// The flow's key, as the switch would have parsed it.
    fn key(&self) -> FlowKey {
        FlowKey {
            src: u128::from(u32::from(self.src())),
            dst: u128::from(u32::from(self.dst())),
            src_port: 5000,
            dst_port: self.dst_port,
            proto: 17,
            v6: false,
        }
    }

    /// Whether `frame` is one of the flow's.
    fn is(&self, f: &[u8]) -> bool {
        f.len() >= 42
            && f[12..14] == [0x81, 0x00]
            && u16::from_be_bytes([f[14], f[15]]) & 0x0fff == self.vlan
            && f[16..18] == [0x08, 0x00]
            && f[27] == 17
            && f[30..34] == self.src().octets()
            && f[34..38] == self.dst().octets()
            && u16::from_be_bytes([f[40], f[41]]) == self.dst_port
    }
}

/// Runs iproute2's `ip` (carried into the guest as `DPU_FLOW_IP`).
fn ip(args: &str) {
    let ip = std::env::var_os("DPU_FLOW_IP").unwrap_or_else(|| "ip".into());
    let out = Command::new(&ip)
        .args(args.split(' '))
        .output()
        .expect("ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Gives the TAP interface MAC A and a VLAN interface for each of
/// `vlans`, whose peer `.2` is at MAC B: the kernel then sends tagged
/// frames from A to B as it would for a host.
fn kernel_vlans(vlans: &[u16]) {
    let tap = iface();
    ip(&format!("link set dev {tap} address 02:00:00:00:00:0a"));
    for v in vlans {
        let dev = format!("{tap}.{v}");
        ip(&format!("link add link {tap} name {dev} type vlan id {v}"));
        ip(&format!("link set dev {dev} up"));
        ip(&format!("addr add 10.7.{v}.1/24 dev {dev}"));
        ip(&format!(
            "neigh add 10.7.{v}.2 lladdr 02:00:00:00:00:0b dev {dev}"
        ));
    }
}

/// Sends 32 datagrams of each of `flows` from the guest's kernel and
/// counts, per flow, how many frames reach DPDK within two seconds.
fn send_and_count(rx: &mut dpdk::RxQueue, flows: &[KernelFlow]) -> Vec<usize> {
    for f in flows {
        let sock = std::net::UdpSocket::bind((f.src(), 5000)).expect("bind");
        for _ in 0..32 {
            sock.send_to(&[0xab; 18], (f.dst(), f.dst_port))
                .expect("send");
        }
    }
    let mut seen = vec![0; flows.len()];
    let mut batch = dpdk::MbufBatch::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        if rx.recv(&mut batch) == 0 {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        for m in batch.as_slice() {
            if let Some(i) = flows.iter().position(|f| f.is(m.data())) {
                seen[i] += 1;
            }
        }
        batch.retain(|_| false);
    }
    seen
}

#[test]
#[ignore = "runs inside the guest that a_drop_rule_drops_in_a_guest_kernel_with_tc_flower boots"]
fn guest_side_of_the_tc_flower_test() {
    assert!(
        std::env::var_os("DPU_FLOW_GUEST").is_some(),
        "runs inside the guest a_drop_rule_drops_in_a_guest_kernel_with_tc_flower boots"
    );
    let rig = rig();
    let mut rx = rig.port.rx_queue(0).expect("rx queue");
    kernel_vlans(&[7, 8]);
    let mut nic = RteFlowNic::new(vec![flow_port(&rig.port)], 64).expect("provider");
    assert_eq!(nic.mode(), FlowMode::Ingress);
    let flows = [
        KernelFlow {
            vlan: 7,
            dst_port: 9,
        }, // the dropped flow
        KernelFlow {
            vlan: 7,
            dst_port: 10,
        }, // another port
        KernelFlow {
            vlan: 8,
            dst_port: 9,
        }, // the same ports on another VLAN
    ];
    let dropped = rule(0, None, Some(7), flows[0].key(), FlowAction::Drop);
    nic.insert(1, &dropped)
        .expect("the drop rule is created in TC flower");
    let seen = send_and_count(&mut rx, &flows);
    // What the kernel says it did with them.
    let tc = Command::new("tc")
        .args(["-s", "filter", "show", "dev", &iface()])
        .output()
        .expect("tc");
    println!("{}", String::from_utf8_lossy(&tc.stdout));
    println!(
        "guest: with the rule, the dropped flow reached DPDK {} of 32 times",
        seen[0]
    );
    println!(
        "guest: the other flows reached DPDK {} and {} of 32 times",
        seen[1], seen[2]
    );
    nic.remove(1).expect("the rule is removed");
    let seen = send_and_count(&mut rx, &flows[..1]);
    println!(
        "guest: without the rule, the flow reached DPDK {} of 32 times",
        seen[0]
    );
}
