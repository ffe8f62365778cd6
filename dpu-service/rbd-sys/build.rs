//! Builds rbd-sys against the system's librbd and librados headers
//! (Debian: `librbd-dev`, `librados-dev`; they ship no pkg-config files,
//! so the libraries are linked by name). For a cross target the headers
//! and libraries come from a sysroot: `BINDGEN_EXTRA_CLANG_ARGS_<target>`
//! carries `--sysroot`, as for dpdk-sys (see `cross/`).

use std::path::PathBuf;

/// Functions bound (all exported by librados.so.2 / librbd.so.1).
const FUNCTIONS: &[&str] = &[
    "rados_create2",
    "rados_conf_set",
    "rados_connect",
    "rados_shutdown",
    "rados_ioctx_create",
    "rados_ioctx_destroy",
    "rados_ioctx_set_namespace",
    "rados_pool_lookup",
    "rbd_version",
    "rbd_create",
    "rbd_remove",
    "rbd_open",
    "rbd_close",
    "rbd_get_size",
    "rbd_resize",
    "rbd_update_watch",
    "rbd_update_unwatch",
    "rbd_aio_create_completion",
    "rbd_aio_get_return_value",
    "rbd_aio_get_arg",
    "rbd_aio_release",
    "rbd_aio_read",
    "rbd_aio_write2",
    "rbd_aio_flush",
    "rbd_aio_discard",
    "rbd_aio_write_zeroes",
];

/// Constants bound.
const VARS: &[&str] = &["LIBRADOS_OP_FLAG_FADVISE_.*", "RBD_FEATURE_.*"];

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-env-changed=RBD_SYS_LIB_DIR");
    if let Ok(dir) = std::env::var("RBD_SYS_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
    }
    println!("cargo:rustc-link-lib=dylib=rbd");
    println!("cargo:rustc-link-lib=dylib=rados");

    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
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
    for v in VARS {
        b = b.allowlist_var(v);
    }
    let bindings = b.generate().unwrap_or_else(|e| {
        panic!(
            "\n\nrbd-sys: bindgen cannot read rbd/librbd.h and rados/librados.h: {e}\n\
             Install Ceph's client development files (Debian: `apt-get install librbd-dev librados-dev`),\n\
             or build without the `rbd` feature (`--no-default-features`).\n"
        )
    });
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
}
