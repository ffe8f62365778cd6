//! The Linux kernel's NVMe/TCP initiator (Debian 13's 6.12, which speaks
//! DH-HMAC-CHAP) against this crate's target over loopback, through the
//! `kernel-nvme` tool's QEMU guest: connects with the right secrets
//! (unidirectional and bidirectional, SHA-256/ffdhe2048 and
//! SHA-512/ffdhe4096 and null), writes and reads back with `dd`, and is
//! refused with a wrong host secret, a wrong controller secret, and no
//! secret. In the other role, `nvmf-perf` (this crate's host side)
//! authenticates to the guest kernel's own target. Needs the trixie guest
//! of the `kernel-nvme` tool (downloaded once); run with
//! `KERNEL_NVME_RUN=/path/to/kernel-nvme/run.sh cargo test -p dpu-nvmeof
//! --test kernel_auth -- --ignored --nocapture`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::Ordering;

use dpu_nvmeof::auth::{DhGroup, HashId, HostKeys, Secret};
use dpu_nvmeof::{BackendSpec, NamespaceConfig, SubsystemConfig, Target, TargetConfig};
use dpu_nvmeof::{TcpConfig, TcpTransport};

const NQN: &str = "nqn.2024-01.io.dpu:auth-kernel";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6b0c2d2e-3b7a-4e55-9a37-0d9e4a1c5a01";
/// `src/auth/vectors.py`'s host key (SHA-256 transformation) and
/// controller key (48 bytes, none).
const SECRET: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const CTRL_SECRET: &str =
    "DHHC-1:00:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";
/// Key 5a repeated, indicator 00 (a wrong secret of the right form).
const WRONG: &str = "DHHC-1:00:WlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWloj0TmR:";

fn serve(target: &Target) -> (TcpTransport, SocketAddr) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut cfg = TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            serial: "AUTH1".into(),
            model: "auth".into(),
            allow_any_host: false,
            allowed_hosts: [HOST.to_string()].into_iter().collect::<BTreeSet<_>>(),
            max_namespaces: 4,
            namespaces: vec![NamespaceConfig {
                eui64: None,
                nsid: 1,
                block_size: 512,
                uuid: [1; 16],
                nguid: [2; 16],
                backend: BackendSpec::Ram { size: 16 << 20 },
                qos: Default::default(),
            }],
            listeners: vec![any],
            host_qos: Default::default(),
        }],
        discovery: None,
    };
    let transport = TcpTransport::with_config(target.clone(), &TcpConfig::default()).unwrap();
    assert!(transport.set_listeners(&cfg.listen_addrs()).is_empty());
    let bound = transport.bound()[&any];
    cfg.subsystems[0].listeners = vec![bound];
    assert!(target.apply(&cfg).is_empty());
    (transport, bound)
}

fn keys(ctrl: bool, hash: HashId, group: DhGroup) -> HostKeys {
    let mut k = HostKeys::new(
        Secret::parse(SECRET).unwrap(),
        ctrl.then(|| Secret::parse(CTRL_SECRET).unwrap()),
    );
    k.hashes = vec![hash];
    k.dh_groups = vec![group];
    k
}

#[test]
#[ignore = "boots a QEMU guest with Debian 13's kernel"]
fn linux_initiator_authenticates() {
    let Ok(run) = std::env::var("KERNEL_NVME_RUN") else {
        panic!("set KERNEL_NVME_RUN to the kernel-nvme tool's run.sh");
    };
    assert!(Secret::parse(WRONG).is_ok());
    let target = Target::new();
    let (_transport, addr) = serve(&target);
    // One guest run per policy.
    let connect = |extra: &str| {
        format!(
            "nvme connect -t tcp -a $TARGET_ADDR -s $TARGET_PORT -n {NQN} --hostnqn {HOST} -i 1 {extra}"
        )
    };
    let io = format!(
        "dev=$(nvme-wait-ns {NQN} 1 20); dd if=/dev/urandom of=/tmp/w bs=4096 count=64; \
         dd if=/tmp/w of=$dev bs=4096 count=64 oflag=direct; \
         dd if=$dev of=/tmp/r bs=4096 count=64 iflag=direct; cmp /tmp/w /tmp/r; \
         nvme disconnect -n {NQN}"
    );
    let cases: [(&str, HostKeys, String, bool); 6] = [
        (
            "sha256/ffdhe2048",
            keys(false, HashId::Sha256, DhGroup::Ffdhe2048),
            connect(&format!("--dhchap-secret {SECRET}")),
            true,
        ),
        (
            "sha512/ffdhe4096 bidirectional",
            keys(true, HashId::Sha512, DhGroup::Ffdhe4096),
            connect(&format!(
                "--dhchap-secret {SECRET} --dhchap-ctrl-secret {CTRL_SECRET}"
            )),
            true,
        ),
        (
            "sha512/null bidirectional",
            keys(true, HashId::Sha512, DhGroup::Null),
            connect(&format!(
                "--dhchap-secret {SECRET} --dhchap-ctrl-secret {CTRL_SECRET}"
            )),
            true,
        ),
        (
            "wrong host secret",
            keys(false, HashId::Sha256, DhGroup::Ffdhe2048),
            connect(&format!("--dhchap-secret {WRONG}")),
            false,
        ),
        (
            "wrong controller secret",
            keys(true, HashId::Sha256, DhGroup::Null),
            connect(&format!(
                "--dhchap-secret {SECRET} --dhchap-ctrl-secret {WRONG}"
            )),
            false,
        ),
        (
            "no secret",
            keys(false, HashId::Sha256, DhGroup::Null),
            connect(""),
            false,
        ),
    ];
    let mut failures = Vec::new();
    for (name, k, cmd, ok) in cases {
        target.set_host_keys(NQN, HOST, Some(k));
        let h = target.health(NQN);
        let before = (
            h.auth_succeeded.load(Ordering::Relaxed),
            h.auth_failed.load(Ordering::Relaxed),
        );
        let script = if ok {
            format!("modprobe nvme-tcp; {cmd}; {io}")
        } else {
            format!("modprobe nvme-tcp; if {cmd}; then exit 1; fi")
        };
        let out = Command::new("bash")
            .arg(&run)
            .args(["--kernel-suite", "trixie", "--timeout", "240", "--target"])
            .arg(addr.to_string())
            .args(["--hostnqn", HOST, "--"])
            .arg(&script)
            .output()
            .expect("run kernel-nvme");
        let log = String::from_utf8_lossy(&out.stdout);
        let after = (
            h.auth_succeeded.load(Ordering::Relaxed),
            h.auth_failed.load(Ordering::Relaxed),
        );
        println!(
            "== {name}: {:?}, authentications {before:?} -> {after:?}",
            out.status.code()
        );
        for l in log
            .lines()
            .filter(|l| l.contains("nvme") || l.contains("exit"))
        {
            println!("   {l}");
        }
        let counted = if ok {
            after.0 >= before.0 + 2
        } else {
            after.1 > before.1
        };
        if !out.status.success() || !counted {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "failed: {failures:?}");
}

/// The other role: `nvmf-perf`, with this crate's host-side DH-HMAC-CHAP,
/// against the Linux target (nvmet in the guest, SHA-512 and ffdhe4096,
/// bidirectional): the right secrets connect every queue and run I/O, a
/// wrong host secret is refused by Linux, a wrong controller secret is
/// caught by our host.
#[test]
#[ignore = "boots a QEMU guest with Debian 13's kernel"]
fn our_host_authenticates_to_the_linux_target() {
    let Ok(run) = std::env::var("KERNEL_NVME_RUN") else {
        panic!("set KERNEL_NVME_RUN to the kernel-nvme tool's run.sh");
    };
    let cfs = "/sys/kernel/config/nvmet";
    let script = format!(
        "mkdir {cfs}/hosts/{HOST}\n\
         echo '{SECRET}' > {cfs}/hosts/{HOST}/dhchap_key\n\
         echo '{CTRL_SECRET}' > {cfs}/hosts/{HOST}/dhchap_ctrl_key\n\
         echo 'hmac(sha512)' > {cfs}/hosts/{HOST}/dhchap_hash\n\
         echo ffdhe4096 > {cfs}/hosts/{HOST}/dhchap_dhgroup\n\
         echo 0 > {cfs}/subsystems/$KERNEL_TARGET_NQN/attr_allow_any_host\n\
         ln -s {cfs}/hosts/{HOST} {cfs}/subsystems/$KERNEL_TARGET_NQN/allowed_hosts/{HOST}\n"
    );
    let perf = env!("CARGO_BIN_EXE_nvmf-perf");
    let one = |secret: &str, ctrl: &str| {
        format!(
            "{perf} --addr 127.0.0.1:$KERNEL_TARGET_PORT --nqn $KERNEL_TARGET_NQN --hostnqn {HOST} \
             --dhchap-secret '{secret}' --dhchap-ctrl-secret '{ctrl}' --job randread:4k:1 --time 1"
        )
    };
    let host_cmd = format!(
        "{} && ! {} && ! {}",
        one(SECRET, CTRL_SECRET),
        one(WRONG, CTRL_SECRET),
        one(SECRET, WRONG)
    );
    let dir = std::env::temp_dir().join(format!("kernel-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script_file = dir.join("nvmet-hosts.sh");
    std::fs::write(&script_file, script).unwrap();
    let out = Command::new("bash")
        .arg(&run)
        .args([
            "--kernel-suite",
            "trixie",
            "--timeout",
            "300",
            "--kernel-target",
            "4431",
            "--script",
        ])
        .arg(&script_file)
        .arg("--host-cmd")
        .arg(&host_cmd)
        .output()
        .expect("run kernel-nvme");
    let _ = std::fs::remove_dir_all(&dir);
    let log = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    for l in log
        .lines()
        .filter(|l| l.contains("Error") || l.contains("randread") || l.contains("exit status"))
    {
        println!("   {l}");
    }
    assert!(out.status.success(), "{log}");
    assert!(log.contains("randread 4k QD1"), "the right secrets ran I/O");
    assert!(log.contains("the controller refused: reason 0x01, explanation 0x01"));
    assert!(log.contains("the controller's response is wrong"));
}
