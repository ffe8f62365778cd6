//! Test certificates made with the `openssl` command: a CA, and keys and
//! certificates it signs, all P-256 and valid for two days, in a folder
//! of the test's own.

use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};

/// Runs `openssl args..` in `dir`, failing with its stderr.
pub fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("running openssl")?;
    ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A self-signed CA, `ca.key`/`ca.crt`, with common name `cn`.
pub fn make_ca(dir: &Path, cn: &str) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            &format!("/CN={cn}"),
        ],
    )
}

/// A key and certificate `name.key`/`name.crt` with subject `subject` and
/// extensions `ext`, signed by `ca.crt`.
pub fn issue(dir: &Path, name: &str, subject: &str, ext: &str) -> Result<()> {
    std::fs::write(dir.join(format!("{name}.ext")), ext)?;
    let (key, csr, crt, extfile) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ],
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &extfile,
        ],
    )
}

/// A CA (`ca.crt`, common name `ca_cn`) and a server certificate
/// `server.crt` for localhost and 127.0.0.1 that it signs.
pub fn make_server_pki(dir: &Path, ca_cn: &str) -> Result<()> {
    make_ca(dir, ca_cn)?;
    issue(
        dir,
        "server",
        "/CN=server",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
}

/// [`make_server_pki`] and a client certificate `client.crt` with
/// common name `client`.
pub fn make_test_pki(dir: &Path) -> Result<()> {
    make_server_pki(dir, "dpu-test-ca")?;
    issue(dir, "client", "/CN=client", "extendedKeyUsage=clientAuth\n")
}
