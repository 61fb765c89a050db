//! The replication connection's settings, from the database URL the pool is made from.

use std::path::PathBuf;
use std::time::Duration;

use pgwire_replication::{ReplicationConfig, SslMode, TlsConfig};

use super::WalError;

/// How often the stream reports the position it confirmed.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// The settings to stream `slot` of the database at `database_url` (a `postgres://` URL),
/// publication `publication`. TLS follows `sslmode` as libpq and sqlx do (`prefer` when
/// unset), with `sslrootcert`.
pub(super) fn replication_config(
    database_url: &str,
    slot: &str,
    publication: &str,
) -> Result<ReplicationConfig, WalError> {
    let url = url::Url::parse(database_url).map_err(|error| WalError::Url(error.to_string()))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(WalError::Url(format!("the scheme is {:?}", url.scheme())));
    }
    let query = |name: &str| {
        url.query_pairs()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.into_owned())
    };
    for unsupported in [
        "host", "user", "password", "port", "dbname", "sslcert", "sslkey",
    ] {
        if query(unsupported).is_some() {
            return Err(WalError::Url(format!(
                "the parameter {unsupported:?} is not supported: put it in the URL's parts"
            )));
        }
    }
    let host = url.host_str().map_or("localhost", |host| {
        host.trim_start_matches('[').trim_end_matches(']')
    });
    let user = decoded(url.username())?;
    let password = decoded(url.password().unwrap_or(""))?;
    let database = decoded(url.path().trim_start_matches('/'))?;
    let database = if database.is_empty() {
        user.clone()
    } else {
        database
    };
    let root = query("sslrootcert").map(PathBuf::from);
    let tls = match query("sslmode").as_deref() {
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
        ] {
            assert!(
                matches!(replication_config(url, "s", "p"), Err(WalError::Url(_))),
                "{url}"
            );
        }
    }
}
