//! Connections handed from one request to the next, around the pool's check on return.
//!
//! sqlx pings every connection as it goes back to its pool (`return_to_pool`, sqlx 0.9; not
//! configurable), a round trip that cost `POST /orders`, a one-statement request, as much as
//! its statement: with it skipped, orders-service served 25–35% more orders a second on the
//! same machine (docs/performance.md). A request that ended well hands its connection here to
//! the next request instead; a request that did not (an error, a cancelled future) drops it,
//! and the pool checks it as usual.
//!
//! Requests hold at most their share of the pool, handed on or in use, so the background work
//! that shares it (a relay, a cleanup, the operator's views) always finds a connection however
//! many requests queue; they queue here, fairly, for as long as the pool's acquire timeout. A
//! connection not handed on within [`KEEP`] goes back to the pool.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How long a connection waits here for the next request before it goes back to the pool.
pub const KEEP: Duration = Duration::from_secs(1);

/// The connections of a service's requests: cheap to clone, every clone shares them.
#[derive(Debug, Clone)]
pub struct Connections {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    /// One permit per connection requests may hold.
    share: Arc<Semaphore>,
    /// Connections handed back, most recent last.
    kept: Mutex<Vec<(PoolConnection<Postgres>, Instant)>>,
}

impl Connections {
    /// Requests of `pool` hold at most `share` of its connections (at least one). Spawns the
    /// task that returns unused connections to the pool: call it inside a Tokio runtime.
    pub fn new(pool: PgPool, share: u32) -> Self {
        let inner = Arc::new(Inner {
            pool,
            share: Arc::new(Semaphore::new(share.max(1) as usize)),
            kept: Mutex::new(Vec::new()),
        });
        tokio::spawn(return_unused(Arc::downgrade(&inner)));
        Self { inner }
    }

    /// Three quarters of `pool`'s connections for requests, the rest for background work.
    pub fn for_requests(pool: PgPool) -> Self {
        let share = pool.options().get_max_connections() * 3 / 4;
        Self::new(pool, share)
    }

    /// The pool the connections come from.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The connection the last request handed back, or one from the pool; waits for the
    /// requests' share as long as the pool's acquire timeout.
    pub async fn acquire(&self) -> sqlx::Result<Reused> {
        let inner = &self.inner;
        let timeout = inner.pool.options().get_acquire_timeout();
        let permit = tokio::time::timeout(timeout, Arc::clone(&inner.share).acquire_owned())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let (fresh, stale) = {
            let mut kept = inner.lock();
            match kept.pop() {
                Some((conn, since)) if since.elapsed() < KEEP => (Some(conn), Vec::new()),
                // The rest were handed back earlier still.
                Some(latest) => {
                    let mut stale = std::mem::take(&mut *kept);
                    stale.push(latest);
                    (None, stale)
                }
                None => (None, Vec::new()),
            }
        };
        drop(stale);
        let conn = match fresh {
            Some(conn) => conn,
            None => inner.pool.acquire().await?,
        };
        Ok(Reused {
            conn: Some(conn),
            _permit: permit,
            home: Arc::downgrade(inner),
        })
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(PoolConnection<Postgres>, Instant)>> {
        // The vector stays whole whatever panicked while it was held.
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every [`KEEP`], returns the connections kept that long to the pool; ends with the
/// [`Connections`].
async fn return_unused(inner: Weak<Inner>) {
    let mut ticks = tokio::time::interval(KEEP / 4);
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let unused: Vec<_> = {
            let mut kept = inner.lock();
            let fresh = kept.partition_point(|(_, since)| since.elapsed() >= KEEP);
            kept.drain(..fresh).collect()
        };
        drop(unused);
    }
}

/// A connection of [`Connections`]: [`Reused::hand_back`] it once the request went well;
/// dropped, it returns to the pool, which checks it.
#[derive(Debug)]
pub struct Reused {
    conn: Option<PoolConnection<Postgres>>,
    _permit: OwnedSemaphorePermit,
    home: Weak<Inner>,
}

impl Reused {
    /// Keeps the connection for the next request. Only for a connection whose last
    /// statement completed: one left mid-statement or mid-transaction is dropped instead.
    pub fn hand_back(mut self) {
        let (Some(conn), Some(home)) = (self.conn.take(), self.home.upgrade()) else {
            return;
        };
        home.lock().push((conn, Instant::now()));
    }
}

impl Deref for Reused {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn.as_ref().expect("a connection until handed back")
    }
}

impl DerefMut for Reused {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("a connection until handed back")
    }
}

#[cfg(test)]
mod tests {
    use outbox_core::testing::eventually;
    use sqlx::postgres::PgPoolOptions;

    use super::*;

    async fn backend(conn: &mut PgConnection) -> i32 {
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(conn)
            .await
            .unwrap()
    }

    /// A pool of `size` on the test's database, failing an acquire after 300 ms.
    async fn pool_of(pool: &PgPool, size: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(Duration::from_millis(300))
            .connect_with((*pool.connect_options()).clone())
            .await
            .unwrap()
    }

    async fn eventually_idle(pool: &PgPool, idle: usize) {
        eventually("the connection back in the pool", KEEP * 10, || async {
            (pool.num_idle() == idle).then_some(())
        })
        .await;
    }

    #[sqlx::test]
    async fn a_connection_handed_back_serves_the_next_request_without_the_pool(pool: PgPool) {
        let pool = pool_of(&pool, 2).await;
        let connections = Connections::new(pool.clone(), 2);
        let mut first = connections.acquire().await.unwrap();
        let pid = backend(&mut first).await;
        first.hand_back();
        assert_eq!(
            connections.inner.lock().len(),
            1,
            "kept, not back in the pool"
        );
        let mut second = connections.acquire().await.unwrap();
        assert!(connections.inner.lock().is_empty());
        assert_eq!(backend(&mut second).await, pid);
    }

    #[sqlx::test]
    async fn requests_hold_their_share_and_background_work_still_gets_a_connection(pool: PgPool) {
        let pool = pool_of(&pool, 3).await;
        let connections = Connections::new(pool.clone(), 2);
        let held = [
            connections.acquire().await.unwrap(),
            connections.acquire().await.unwrap(),
        ];
        assert!(matches!(
            connections.acquire().await,
            Err(sqlx::Error::PoolTimedOut)
        ));
        let mut background = pool.acquire().await.unwrap();
        backend(&mut background).await;
        // Handed back, a connection serves the request that waits.
        let [first, _second] = held;
        let waiting = tokio::spawn({
            let connections = connections.clone();
            async move { connections.acquire().await.map(drop) }
        });
        first.hand_back();
        waiting.await.unwrap().unwrap();
    }

    #[sqlx::test]
    async fn a_connection_left_unused_goes_back_to_the_pool(pool: PgPool) {
        let pool = pool_of(&pool, 2).await;
        let connections = Connections::new(pool.clone(), 2);
        connections.acquire().await.unwrap().hand_back();
        eventually_idle(&pool, 1).await;
    }

    #[sqlx::test]
    async fn a_connection_dropped_mid_transaction_goes_back_to_the_pool_rolled_back(pool: PgPool) {
        sqlx::query("CREATE TABLE t (n int)")
            .execute(&pool)
            .await
            .unwrap();
        let small = pool_of(&pool, 2).await;
        let connections = Connections::new(small.clone(), 2);
        let mut conn = connections.acquire().await.unwrap();
        // As a request's future dropped mid-transaction leaves it.
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut *tx)
            .await
            .unwrap();
        drop(tx);
        drop(conn);
        assert!(
            connections.inner.lock().is_empty(),
            "only one handed back is kept"
        );
        eventually_idle(&small, 1).await;
        let mut next = connections.acquire().await.unwrap();
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(&mut *next)
            .await
            .unwrap();
        assert_eq!(rows, 0);
    }
}
