//! TLS files for a server of the tests, made with the `openssl` command.

use std::path::{Path, PathBuf};
use std::process::Stdio;

/// A CA and a server certificate for 127.0.0.1 that it signed, as PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA's certificate: what clients trust.
    pub ca: PathBuf,
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// Makes a fresh CA and server certificate in `dir` with the `openssl` command.
    pub fn generate(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("TLS folder");
        let openssl = |args: &[&str]| {
            let status = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("openssl runs");
            assert!(status.success(), "openssl {args:?} failed");
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &["req", "-x509", "-days", "1", "-subj", "/CN=e2e test CA"][..],
                &ec,
                &["-keyout", "ca.key", "-out", "ca.pem"],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req", "-subj", "/CN=127.0.0.1"][..],
                &ec,
                &["-keyout", "server.key", "-out", "server.csr"],
            ]
            .concat(),
        );
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("ext file");
        openssl(&[
            "x509",
            "-req",
            "-days",
            "1",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ]);
        Self {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        }
    }
}
