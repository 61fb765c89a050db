//! What a phase costs the machine: the CPU time of the services and of the PostgreSQL server,
//! read from `/proc`, and the WAL the server wrote.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// The cost of a steady phase, per 1,000 orders.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Cost {
    /// CPU seconds of the PostgreSQL server, every process of it (`None` when its processes
    /// are not this machine's, or not readable).
    pub postgres_cpu_secs: Option<f64>,
    /// CPU seconds of orders-service, its instances together.
    pub orders_cpu_secs: f64,
    /// CPU seconds of billing-service.
    pub billing_cpu_secs: f64,
    /// Bytes of WAL the server wrote per order, all of it (both services' databases, and
    /// whatever else ran on the server meanwhile).
    pub wal_bytes: f64,
}

/// The readings [`Cost`] is the difference of.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    postgres: Option<f64>,
    orders: f64,
    billing: f64,
    wal: f64,
}

impl Reading {
    /// Reads them now: `orders` and `billing` are the services' process ids, `pool` any
    /// connection to the server.
    pub async fn take(pool: &PgPool, orders: &[u32], billing: u32) -> anyhow::Result<Self> {
        let wal: f64 =
            sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8")
                .fetch_one(pool)
                .await?;
        let (backend, port): (i32, Option<i32>) =
            sqlx::query_as("SELECT pg_backend_pid(), inet_client_port()")
                .fetch_one(pool)
                .await?;
        let cpu = |pid: u32| stat(pid).map_or(0.0, |s| s.own_secs);
        Ok(Self {
            postgres: u32::try_from(backend)
                .ok()
                .filter(|pid| is_backend(*pid, port))
                .and_then(server_cpu_secs),
            orders: orders.iter().copied().map(cpu).sum(),
            billing: cpu(billing),
            wal,
        })
    }

    /// The cost between `self` and the later `end`, for `orders` orders.
    pub fn until(&self, end: &Self, orders: u64) -> Cost {
        let per_1000 = 1000.0 / orders.max(1) as f64;
        Cost {
            postgres_cpu_secs: self
                .postgres
                .zip(end.postgres)
                .map(|(start, end)| (end - start) * per_1000),
            orders_cpu_secs: (end.orders - self.orders) * per_1000,
            billing_cpu_secs: (end.billing - self.billing) * per_1000,
            wal_bytes: (end.wal - self.wal) / orders.max(1) as f64,
        }
    }
}

/// A process's CPU time, from `/proc/PID/stat`.
struct Stat {
    parent: u32,
    /// User and system time of the process itself.
    own_secs: f64,
    /// That of its children that have ended and been waited for.
    children_secs: f64,
}

/// `/proc/PID/stat`'s times are in USER_HZ, which Linux fixes at 100 for user space.
const TICKS_PER_SEC: f64 = 100.0;

fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: the fields start after its end.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    Some(Stat {
        parent: fields.get(1)?.parse().ok()?,
        own_secs: (ticks(11)? + ticks(12)?) / TICKS_PER_SEC,
        children_secs: (ticks(13)? + ticks(14)?) / TICKS_PER_SEC,
    })
}

/// Whether this machine's process `pid` is the backend of a connection from `port`: the
/// backend's process id is the server's, which in a container names another process here.
fn is_backend(pid: u32, port: Option<i32>) -> bool {
    let Ok(title) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let title = String::from_utf8_lossy(&title);
    // PostgreSQL sets its backends' title to "postgres: user database host(port) state".
    title.starts_with("postgres") && port.is_none_or(|port| title.contains(&format!("({port})")))
}

/// The CPU seconds of the server that runs the backend `backend`: its postmaster, with the
/// children that have ended, and every child still running. `None` unless it runs here.
fn server_cpu_secs(backend: u32) -> Option<f64> {
    let postmaster = stat(backend)?.parent;
    let main = stat(postmaster)?;
    let children: f64 = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .filter(|s| s.parent == postmaster)
        .map(|s| s.own_secs + s.children_secs)
        .sum();
    Some(main.own_secs + main.children_secs + children)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::stat;

    #[test]
    fn this_process_is_read_with_its_parent_and_growing_cpu_time() {
        let me = std::process::id();
        let before = stat(me).expect("this process's stat");
        let start = Instant::now();
        let mut spun = 0_u64;
        while start.elapsed() < Duration::from_millis(300) {
            spun = std::hint::black_box(spun.wrapping_add(1));
        }
        let wall = start.elapsed().as_secs_f64();
        let after = stat(me).expect("this process's stat");
        assert_eq!(after.parent, std::os::unix::process::parent_id());
        let used = after.own_secs - before.own_secs;
        // The spin's ticks, and no more than every core for as long (other tests run too).
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        assert!(
            used > 0.0 && used <= wall * cores + 0.02,
            "{used} CPU seconds in {wall} s on {cores} cores"
        );
    }
}
