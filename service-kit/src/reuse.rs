//! Connections handed from one request to the next, around the pool's check on return.
//!
//! sqlx pings every connection as it goes back to its pool (`return_to_pool`, sqlx 0.9; not
//! configurable), a round trip that cost `POST /orders`, a one-statement request, as much as
//! its statement (docs/performance.md has the measurement). A request that ended well hands its connection here to
//! the next request instead; a request that did not (an error, a cancelled future) drops it,
//! and the pool checks it as usual.
//!
//! Requests hold at most their share of the pool, handed on or in use: all but [`BACKGROUND`]
//! connections, so the work that shares it (a cleanup, the relays' wake-up, the operator's
//! views) always finds one however many requests queue; they queue here, fairly, for as long
//! as the pool's acquire timeout. A pool of fewer than twice [`BACKGROUND`] is shared as it
//! is, with no hand-over. A connection not handed on within [`KEEP`] goes back to the pool,
//! and so does one handed on for [`LEND_FOR`], so that the pool still checks each connection
//! now and then and retires it at its `max_lifetime`.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Connection as _, PgConnection, PgPool, Postgres};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How long a connection waits here for the next request before it goes back to the pool.
pub const KEEP: Duration = Duration::from_secs(1);

/// How long a connection may go from request to request before it goes back to the pool.
pub const LEND_FOR: Duration = Duration::from_secs(10);

/// Connections of a pool left to the work that shares it with requests: a cleanup, the
/// `NOTIFY` of `jetstream_outbox::Wakeup::across_processes` and the operator's views. (A relay is
/// best given a pool of its own: `infra::connect_db_open`.)
pub const BACKGROUND: u32 = 3;

/// The connections of a service's requests: cheap to clone, every clone shares them.
#[derive(Debug, Clone)]
pub struct Connections {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    /// One permit per connection requests may hold; `None`: no hand-over.
    share: Option<Arc<Semaphore>>,
    /// Connections handed back, most recent last.
    kept: Mutex<Vec<Kept>>,
}

/// A connection handed back, waiting for the next request.
#[derive(Debug)]
struct Kept {
    conn: PoolConnection<Postgres>,
    /// When it was taken from the pool.
    lent_at: Instant,
    /// When it was handed back.
    handed_back_at: Instant,
}

impl Connections {
    /// Requests of `pool` hold at most `share` of its connections, handed from one to the next;
    /// with a share of 0 they take them from the pool and give them back, as without this. Spawns
    /// the task that returns unused connections to the pool: call it inside a Tokio runtime.
    pub fn new(pool: PgPool, share: u32) -> Self {
        let inner = Arc::new(Inner {
            pool,
            share: (share > 0).then(|| Arc::new(Semaphore::new(share as usize))),
            kept: Mutex::new(Vec::new()),
        });
        if inner.share.is_some() {
            tokio::spawn(return_unused(Arc::downgrade(&inner)));
        }
        Self { inner }
    }

    /// All of `pool`'s connections but [`BACKGROUND`] for requests, handed from one to the
    /// next; a pool of fewer than twice that is left as it is, shared by all, with no hand-over,
    /// rather than let only one or two requests run at once.
    pub fn for_requests(pool: PgPool) -> Self {
        let max = pool.options().get_max_connections();
        let share = if max >= 2 * BACKGROUND {
            max - BACKGROUND
        } else {
            0
        };
        Self::new(pool, share)
    }

    /// The pool the connections come from.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The connection the last request handed back, or one from the pool; waits for the
    /// requests' share and the pool for as long as the pool's acquire timeout, in all.
    pub async fn acquire(&self) -> sqlx::Result<Reused> {
        let inner = &self.inner;
        let Some(share) = &inner.share else {
            return Ok(Reused {
                conn: Some(inner.pool.acquire().await?),
                lent_at: Instant::now(),
                permit: None,
                home: Weak::new(),
            });
        };
        let deadline = Instant::now() + inner.pool.options().get_acquire_timeout();
        let permit = tokio::time::timeout_at(deadline, Arc::clone(share).acquire_owned())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let (fresh, stale) = {
            let mut kept = inner.lock();
            match kept.pop() {
                Some(latest) if latest.handed_back_at.elapsed() < KEEP => {
                    (Some(latest), Vec::new())
                }
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
        let (conn, lent_at) = if let Some(kept) = fresh {
            (kept.conn, kept.lent_at)
        } else {
            let conn = tokio::time::timeout_at(deadline, inner.pool.acquire())
                .await
                .map_err(|_| sqlx::Error::PoolTimedOut)??;
            (conn, Instant::now())
        };
        Ok(Reused {
            conn: Some(conn),
            lent_at,
            permit: Some(permit),
            home: Arc::downgrade(inner),
        })
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        // The vector stays whole whatever panicked while it was held.
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every quarter of [`KEEP`], returns the connections kept that long to the pool; ends with the
/// [`Connections`].
async fn return_unused(inner: Weak<Inner>) {
    let mut ticks = tokio::time::interval(KEEP / 4);
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let unused: Vec<_> = {
            let mut kept = inner.lock();
            let fresh = kept.partition_point(|kept| kept.handed_back_at.elapsed() >= KEEP);
            kept.drain(..fresh).collect()
        };
        drop(unused);
    }
}

/// A connection of [`Connections`]: [`Reused::hand_back`] it once the request went well.
/// Dropped, it returns to the pool, which checks it, and its place in the requests' share is
/// given up only once it is back: a request cut off mid-statement (a timeout, a failure) does
/// not let the next one take a connection of the pool's reserve while its own is still busy.
#[derive(Debug)]
pub struct Reused {
    conn: Option<PoolConnection<Postgres>>,
    lent_at: Instant,
    permit: Option<OwnedSemaphorePermit>,
    home: Weak<Inner>,
}

impl Reused {
    /// Keeps the connection for the next request. A connection left in a transaction, or with
    /// a rollback still to send (a transaction dropped), or handed on for [`LEND_FOR`] already,
    /// is dropped instead (see [`Reused`]); so must be one whose last statement did not
    /// complete, but that is for the caller to know: hand back only after a request went well.
    pub fn hand_back(mut self) {
        let Some(home) = self.home.upgrade() else {
            return;
        };
        let lent_at = self.lent_at;
        let reusable = |conn: &mut PoolConnection<Postgres>| {
            !(conn.is_in_transaction() || conn.should_flush() || lent_at.elapsed() >= LEND_FOR)
        };
        if let Some(conn) = self.conn.take_if(reusable) {
            home.lock().push(Kept {
                conn,
                lent_at,
                handed_back_at: Instant::now(),
            });
        }
    }
}

impl Drop for Reused {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if conn.is_in_transaction() {
            // The pool's check is a ping, which would leave the transaction open for whoever
            // takes the connection next.
            conn.close_on_drop();
            return;
        }
        let (Some(permit), Ok(runtime)) =
            (self.permit.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        runtime.spawn(async move {
            // Ready again once the statement it was cut off in has ended; the pool checks it
            // once more on the way in, as for any connection.
            let _ = conn.ping().await;
            drop(conn);
            drop(permit);
        });
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
    use jetstream_outbox::testing::eventually;
    use sqlx::postgres::PgPoolOptions;

    use super::*;

    async fn backend(conn: &mut PgConnection) -> i32 {
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(conn)
            .await
            .unwrap()
    }

    /// A pool of `size` connections to the test's database, all open.
    async fn pool_of(pool: &PgPool, size: u32) -> PgPool {
        let pool = PgPoolOptions::new()
            .max_connections(size)
            .min_connections(size)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with((*pool.connect_options()).clone())
            .await
            .unwrap();
        eventually(
            "the pool's connections open",
            Duration::from_secs(30),
            || {
                let open = pool.size() == size && pool.num_idle() == size as usize;
                async move { open.then_some(()) }
            },
        )
        .await;
        pool
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
        let third = tokio::time::timeout(Duration::from_millis(300), connections.acquire());
        assert!(third.await.is_err(), "a third request waits");
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
    async fn a_pool_too_small_for_a_share_is_used_as_it_is(pool: PgPool) {
        // The largest pool that still hands nothing over.
        let size = 2 * BACKGROUND - 1;
        let pool = pool_of(&pool, size).await;
        let connections = Connections::for_requests(pool.clone());
        let mut conn = connections.acquire().await.unwrap();
        backend(&mut conn).await;
        assert_eq!(pool.num_idle(), size as usize - 1);
        conn.hand_back();
        assert!(connections.inner.lock().is_empty());
        eventually_idle(&pool, size as usize).await;
    }

    #[sqlx::test]
    async fn a_connection_left_unused_goes_back_to_the_pool(pool: PgPool) {
        let pool = pool_of(&pool, 2).await;
        let connections = Connections::new(pool.clone(), 2);
        connections.acquire().await.unwrap().hand_back();
        assert_eq!(pool.num_idle(), 1);
        eventually_idle(&pool, 2).await;
    }

    /// A pool of two and its requests' connections, sharing both.
    async fn two(pool: &PgPool) -> (PgPool, Connections) {
        let pool = pool_of(pool, 2).await;
        let connections = Connections::new(pool.clone(), 2);
        (pool, connections)
    }

    /// Hands `conn` back and checks that it went back to the pool, not to the next request.
    async fn handed_back_to_the_pool(conn: Reused, (pool, connections): (PgPool, Connections)) {
        conn.hand_back();
        assert!(connections.inner.lock().is_empty(), "not kept");
        eventually_idle(&pool, 2).await;
    }

    #[sqlx::test]
    async fn a_connection_lent_for_long_goes_back_to_the_pool(pool: PgPool) {
        let both = two(&pool).await;
        let mut conn = both.1.acquire().await.unwrap();
        conn.lent_at -= LEND_FOR;
        handed_back_to_the_pool(conn, both).await;
    }

    #[sqlx::test]
    async fn a_connection_with_a_rollback_to_send_goes_back_to_the_pool(pool: PgPool) {
        let both = two(&pool).await;
        let mut conn = both.1.acquire().await.unwrap();
        // As a transaction left by `?` leaves it: its rollback queued, not sent; the pool's
        // check on return sends it.
        drop(sqlx::Connection::begin(&mut *conn).await.unwrap());
        handed_back_to_the_pool(conn, both).await;
    }

    #[sqlx::test]
    async fn a_connection_in_a_transaction_is_closed(pool: PgPool) {
        let (_small, connections) = two(&pool).await;
        let mut conn = connections.acquire().await.unwrap();
        let pid = backend(&mut conn).await;
        std::mem::forget(sqlx::Connection::begin(&mut *conn).await.unwrap());
        conn.hand_back();
        assert!(connections.inner.lock().is_empty(), "not kept");
        eventually("its session ended", Duration::from_secs(30), || async {
            let sessions: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            (sessions == 0).then_some(())
        })
        .await;
    }

    #[sqlx::test]
    async fn a_connection_cut_off_mid_statement_holds_its_share_until_back(pool: PgPool) {
        let (_small, connections) = two(&pool).await;
        let share = connections.inner.share.clone().unwrap();
        let mut conn = connections.acquire().await.unwrap();
        let sleep = sqlx::query("SELECT pg_sleep(0.5)").execute(&mut *conn);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), sleep)
                .await
                .is_err()
        );
        drop(conn);
        assert_eq!(share.available_permits(), 1, "still held while busy");
        eventually("the share given back", Duration::from_secs(30), || {
            let back = share.available_permits() == 2;
            async move { back.then_some(()) }
        })
        .await;
    }
}
