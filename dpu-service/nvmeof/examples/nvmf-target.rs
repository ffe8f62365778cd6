//! A bare NVMe/TCP target for benchmarks: the same target and transport the
//! daemon runs, without the control plane. Serves one subsystem with one
//! namespace to any host until killed.
//!
//! ```text
//! cargo run --release -p dpu-nvmeof --example nvmf-target -- \
//!     [--listen 127.0.0.1:4420] [--ram 1G | --null 1G] [--nqn NQN]
//! ```

use std::collections::BTreeSet;

use dpu_nvmeof::{
    BackendSpec, NamespaceConfig, SubsystemConfig, Target, TargetConfig, TcpTransport,
};

fn size(s: &str) -> u64 {
    let (n, m) = match s.as_bytes().last() {
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    n.parse::<u64>().expect("a size such as 1G") * m
}

fn main() {
    let mut listen = "127.0.0.1:4420".to_string();
    let mut nqn = "nqn.2024-01.io.dpu-service:dev".to_string();
    let mut backend = BackendSpec::Ram { size: 1 << 30 };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--listen" => listen = v,
            "--nqn" => nqn = v,
            "--ram" => backend = BackendSpec::Ram { size: size(&v) },
            "--null" => backend = BackendSpec::Null { size: size(&v) },
            _ => panic!("unknown argument {a}"),
        }
    }
    let addr = listen.parse().expect("--listen HOST:PORT");
    let config = TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: nqn.clone(),
            serial: "bench".into(),
            model: "dpu-service".into(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 32,
            namespaces: vec![NamespaceConfig {
                nsid: 1,
                block_size: 512,
                uuid: [1; 16],
                nguid: [2; 16],
                backend,
            }],
            listeners: vec![addr],
        }],
        discovery: None,
    };
    let target = Target::new();
    if let Some(e) = target.apply(&config).first() {
        panic!("{e}");
    }
    let transport = TcpTransport::new(target);
    if let Some((a, e)) = transport.set_listeners(&config.listen_addrs()).first() {
        panic!("listen {a}: {e}");
    }
    println!("serving {nqn} on {listen}");
    loop {
        std::thread::park();
    }
}
