//! Builds dpdk-sys against the DPDK that pkg-config (`libdpdk`) finds: for
//! the host, or for a cross target through `PKG_CONFIG_SYSROOT_DIR` /
//! `PKG_CONFIG_LIBDIR` (see `cross/`).
//!
//! Order matters for GNU ld with `--as-needed`: the C shim is compiled
//! first, then DPDK's link flags are emitted, so the libraries the shim
//! needs come after it on the link line.

use std::path::PathBuf;
use std::process::Command;

/// DPDK functions bound directly (exported, not static inline).
const FUNCTIONS: &[&str] = &[
    "rte_eal_init",
    "rte_eal_cleanup",
    "rte_eal_process_type",
    "rte_strerror",
    "rte_version",
    "rte_socket_id",
    "rte_lcore_count",
    "rte_thread_register",
    "rte_thread_unregister",
    "rte_pktmbuf_pool_create",
    "rte_pktmbuf_free_bulk",
    "rte_mempool_free",
    "rte_mempool_avail_count",
    "rte_mempool_in_use_count",
    "rte_eth_dev_count_avail",
    "rte_eth_dev_get_port_by_name",
    "rte_eth_dev_get_name_by_port",
    "rte_eth_dev_info_get",
    "rte_eth_dev_configure",
    "rte_eth_dev_socket_id",
    "rte_eth_rx_queue_setup",
    "rte_eth_tx_queue_setup",
    "rte_eth_dev_start",
    "rte_eth_dev_stop",
    "rte_eth_dev_close",
    "rte_eth_promiscuous_enable",
    "rte_eth_dev_set_mtu",
    "rte_eth_dev_get_mtu",
    "rte_eth_link_get_nowait",
    "rte_eth_stats_get",
    "rte_eth_stats_reset",
    "rte_eth_macaddr_get",
    "rte_eth_xstats_get",
    "rte_eth_xstats_get_names",
    "rte_eth_dev_rss_hash_update",
    "rte_eth_find_next",
    "rte_flow_destroy",
    "rte_flow_flush",
    "dpdk_shim_.*",
];

/// Types bound explicitly (others only as the functions need them).
const TYPES: &[&str] = &[
    "rte_mbuf",
    "rte_mempool",
    "rte_eth_conf",
    "rte_eth_dev_info",
    "rte_eth_link",
    "rte_eth_stats",
    "rte_ether_addr",
    "rte_eth_rss_conf",
    "rte_eth_rxconf",
    "rte_eth_txconf",
    "rte_eth_xstat",
    "rte_eth_xstat_name",
    "rte_proc_type_t",
    "rte_flow_error",
    "dpdk_shim_flow",
];

/// Constants bound explicitly.
const VARS: &[&str] = &[
    "RTE_MAX_ETHPORTS",
    "RTE_MAX_LCORE",
    "RTE_ETHER_MAX_LEN",
    "RTE_ETH_XSTATS_NAME_SIZE",
    "RTE_MBUF_DEFAULT_BUF_SIZE",
    "RTE_PKTMBUF_HEADROOM",
    "RTE_ETH_LINK_UP",
    "RTE_ETH_LINK_DOWN",
    "RTE_ETH_LINK_FULL_DUPLEX",
    "RTE_ETH_MQ_RX_RSS",
    "RTE_ETH_MQ_RX_NONE",
    "RTE_ETH_RSS_.*",
    "RTE_ETH_DEV_SWITCH_DOMAIN_ID_INVALID",
    "SOCKET_ID_ANY",
    // The release of the headers read (rte_build_config.h), for the tests
    // and check-versions.sh.
    "RTE_VER_YEAR",
    "RTE_VER_MONTH",
    "RTE_VER_MINOR",
    "DPDK_SHIM_FLOW_.*",
];

fn pkg_config_cflags() -> Vec<String> {
    let pc = std::env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into());
    let out = Command::new(&pc).args(["--cflags", "libdpdk"]).output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        _ => missing(),
    }
}

/// (year, month) of a DPDK version such as "24.11.8".
fn release(version: &str) -> (u32, u32) {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(y), Some(m)) => (y, m),
        _ => panic!("dpdk-sys: cannot read the DPDK version {version:?} from pkg-config"),
    }
}

fn missing() -> ! {
    panic!(
        "\n\ndpdk-sys: pkg-config cannot find `libdpdk`.\n\
         Install DPDK's development files (Debian: `apt-get install libdpdk-dev`),\n\
         or, when cross-compiling, point PKG_CONFIG_SYSROOT_DIR and PKG_CONFIG_LIBDIR\n\
         at an arm64 DPDK sysroot (see cross/).\n"
    );
}

fn main() {
    for v in [
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    for f in [
        "wrapper.h",
        "shim/shim.h",
        "shim/shim.c",
        "shim/flow.h",
        "shim/flow.c",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }

    // 1. Probe without emitting link metadata yet.
    let lib = pkg_config::Config::new()
        .cargo_metadata(false)
        .probe("libdpdk")
        .unwrap_or_else(|_| missing());
    let cflags = pkg_config_cflags();

    // 2. The shim, compiled with DPDK's own flags for this target.
    let release = release(&lib.version);
    let mut build = cc::Build::new();
    build
        .file("shim/shim.c")
        .file("shim/flow.c")
        .warnings(true)
        .opt_level(3);
    // The shim refuses headers of another release than pkg-config's.
    build.define("DPDK_SYS_VER_YEAR", release.0.to_string().as_str());
    build.define("DPDK_SYS_VER_MONTH", release.1.to_string().as_str());
    for f in &cflags {
        build.flag(f);
    }
    build.compile("dpdk_shim");

    // 3. Now DPDK's libraries, after the shim on the link line.
    pkg_config::Config::new()
        .probe("libdpdk")
        .unwrap_or_else(|_| missing());
    println!("cargo:version={}", lib.version);
    println!("cargo:rustc-env=DPDK_SYS_VERSION={}", lib.version);

    // DPDK 24.07 moved fields of struct rte_mbuf and struct rte_eth_link
    // into anonymous unions (bindgen names them `__bindgen_anon_N`);
    // `src/fields.rs` reads them either way.
    println!("cargo::rustc-check-cfg=cfg(dpdk_anon_unions)");
    if release >= (24, 7) {
        println!("cargo:rustc-cfg=dpdk_anon_unions");
    }

    // 4. Bindings: allow-listed items only.
    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(&cflags)
        .use_core()
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for f in FUNCTIONS {
        b = b.allowlist_function(f);
    }
    for t in TYPES {
        b = b.allowlist_type(t);
    }
    for v in VARS {
        b = b.allowlist_var(v);
    }
    let bindings = b.generate().expect("bindgen failed on the DPDK headers");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
}
