//! The replication connection's settings, from the database URL the pool is made from.

use std::path::PathBuf;
use std::time::Duration;

use pgwire_replication::{ReplicationConfig, SslMode, TlsConfig};

use super::WalError;

/// How often the stream reports the position it confirmed.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// The settings to stream `slot` of the database at `database_url` (a `postgres://` URL),
/// publication `publication`. TLS follows `sslmode` (or sqlx's `ssl-mode`; `prefer` when
/// unset, `allow` taken as `prefer`), with `sslrootcert` (or `ssl-root-cert`, `ssl-ca`).
/// What this connection cannot honour is refused rather than ignored: parameters naming
/// another host, user or client certificate, a Unix socket, no user. The `PG*` environment
/// variables and a password file are not read.
pub(super) fn replication_config(
    database_url: &str,
    slot: &str,
    publication: &str,
) -> Result<ReplicationConfig, WalError> {
    let url = url::Url::parse(database_url).map_err(|error| WalError::Url(error.to_string()))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(WalError::Url(format!("the scheme is {:?}", url.scheme())));
    }
    // The last of the names libpq and sqlx know a parameter by, as sqlx reads it.
    let query = |names: &[&str]| {
        url.query_pairs()
            .filter(|(key, _)| names.contains(&key.as_ref()))
            .last()
            .map(|(_, value)| value.into_owned())
    };
    for unsupported in [
        "host", "hostaddr", "user", "password", "port", "dbname", "sslcert", "sslkey", "ssl-cert",
        "ssl-key",
    ] {
        if query(&[unsupported]).is_some() {
            return Err(WalError::Url(format!(
                "the parameter {unsupported:?} is not supported here: put it in the URL's parts"
            )));
        }
    }
    let host = decoded(url.host_str().map_or("localhost", |host| {
        host.trim_start_matches('[').trim_end_matches(']')
    }))?;
    if host.starts_with('/') {
        return Err(WalError::Url("a Unix socket is not supported here".into()));
    }
    let user = decoded(url.username())?;
    if user.is_empty() {
        return Err(WalError::Url("the URL names no user".into()));
    }
    let password = decoded(url.password().unwrap_or(""))?;
    let database = decoded(url.path().trim_start_matches('/'))?;
    let database = if database.is_empty() {
        user.clone()
    } else {
        database
    };
    let root = query(&["sslrootcert", "ssl-root-cert", "ssl-ca"]).map(PathBuf::from);
    let mode = query(&["sslmode", "ssl-mode"]);
    if mode.as_deref() == Some("verify-full") && host.parse::<std::net::IpAddr>().is_ok() {
        return Err(WalError::Url(
            "sslmode=verify-full needs a host name, not an IP address".into(),
        ));
    }
    let tls = match mode.as_deref() {
        Some("disable") => TlsConfig::disabled(),
        None | Some("allow" | "prefer") => TlsConfig {
            mode: SslMode::Prefer,
            ..TlsConfig::disabled()
        },
        Some("require") => TlsConfig::require(),
        Some("verify-ca") => TlsConfig::verify_ca(root),
        Some("verify-full") => TlsConfig::verify_full(root),
        Some(other) => return Err(WalError::Url(format!("unknown sslmode {other:?}"))),
    };
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, publication)
            .with_port(url.port().unwrap_or(5432))
            .with_tls(tls)
            .with_status_interval(STATUS_INTERVAL)
            .with_application_name(format!("outbox-wal/{slot}")),
    )
}

/// A URL part with its `%XX` escapes decoded.
fn decoded(text: &str) -> Result<String, WalError> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| WalError::Url("a part is not UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_gives_the_replication_connection() {
        let config = replication_config(
            "postgres://relay:p%40ss@db.example:6543/orders?sslmode=require",
            "orders_relay",
            "outbox_inserts",
        )
        .expect("a good URL");
        assert_eq!(config.host, "db.example");
        assert_eq!(config.port, 6543);
        assert_eq!(config.password, "p@ss");
        assert_eq!(config.database, "orders");
        assert!(config.tls.mode.requires_tls());
    }

    #[test]
    fn tls_is_preferred_unless_the_url_says_otherwise() {
        let mode = |url: &str| {
            replication_config(url, "s", "p")
                .expect("a good URL")
                .tls
                .mode
        };
        assert_eq!(mode("postgres://u@[::1]/db"), SslMode::Prefer);
        assert_eq!(mode("postgres://u@h/db?sslmode=disable"), SslMode::Disable);
        // sqlx's own spelling, and the last one given, as sqlx reads them.
        assert_eq!(
            mode("postgres://u@h/db?ssl-mode=verify-full"),
            SslMode::VerifyFull
        );
        assert_eq!(
            mode("postgres://u@h/db?sslmode=disable&sslmode=require"),
            SslMode::Require
        );
        // sqlx's own parameters are not the replication connection's business.
        assert_eq!(
            mode("postgres://u@h/db?statement-cache-capacity=100"),
            SslMode::Prefer
        );
        assert_eq!(
            replication_config("postgres://u@[::1]:5433/db", "s", "p")
                .expect("an IPv6 host")
                .host,
            "::1"
        );
    }

    #[test]
    fn bad_urls_are_refused() {
        for url in [
            "mysql://u@h/db",
            "postgres://u@h/db?sslmode=sometimes",
            "postgres://u@h/db?host=/var/run/postgresql",
            "postgres://%2Fvar%2Frun%2Fpostgresql/db",
            "postgres://h/db",
            "postgres://u@127.0.0.1/db?sslmode=verify-full",
        ] {
            assert!(
                matches!(replication_config(url, "s", "p"), Err(WalError::Url(_))),
                "{url}"
            );
        }
    }
}
