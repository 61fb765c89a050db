//! `inbox::consume`, the one-message-at-a-time loop, against the real nats-server and
//! PostgreSQL: it acknowledges as the caller's function answers, delivers a message again after
//! an error, keeps what can never be applied whole as a dead letter, and stops when told.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{AckKind, consumer::pull};
use common::{TestStream, count_up, counter, create_counter, migrate};
use jetstream_outbox::inbox::{
    self, ConsumeConfig, ConsumeError, DeadLetterFilter, Digest, NewDeadLetter,
};
use jetstream_outbox::testing::eventually;
use jetstream_outbox::{Inbox, headers};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

#[sqlx::test(migrations = false)]
async fn consume_acknowledges_as_told_and_delivers_a_failure_again(pool: PgPool) {
    migrate(&pool).await;
    create_counter(&pool).await;
    let stream = TestStream::new().await;
    let publish = |id: Option<&str>, body: &'static str| {
        let mut message_headers = HeaderMap::new();
        if let Some(id) = id {
            message_headers.insert(headers::ID, id);
        }
        message_headers.append("x-note", "first");
        message_headers.append("x-note", "second");
        let jetstream = stream.jetstream.clone();
        let subject = format!("{}.Counted.c1", stream.prefix);
        async move {
            let ack = jetstream.publish_with_headers(subject, message_headers, body.into());
            ack.await.unwrap().await.unwrap();
        }
    };
    publish(Some("m-1"), "one").await;
    publish(Some("m-2"), "fails once").await;
    publish(None, "no id").await;
    publish(Some("m-1"), "one").await;

    let config = pull::Config {
        durable_name: Some("counter".into()),
        ..Default::default()
    };
    let consumer = stream
        .stream()
        .await
        .get_or_create_consumer("counter", config)
        .await
        .unwrap();
    let inbox = Inbox::new(pool.clone(), "counter");
    let calls = Arc::new(AtomicUsize::new(0));
    let failed_once = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let consuming = {
        let (calls, failed_once, stop) = (calls.clone(), failed_once.clone(), stop.clone());
        // No wait before a failed message comes again: the test is about that it does.
        let mut config = ConsumeConfig::default();
        config.retry_after = Duration::ZERO;
        tokio::spawn(async move {
            inbox::consume(&consumer, &inbox, &stop, &config, |inbox, message| {
                let (calls, failed_once) = (calls.clone(), failed_once.clone());
                Box::pin(async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let Some(id) = inbox::message_id(message) else {
                        let letter = NewDeadLetter::of_message(message, "no valid ce-id");
                        inbox.dead_letter(letter).await?;
                        return Ok(AckKind::Ack);
                    };
                    if &message.payload[..] == b"fails once"
                        && failed_once.fetch_add(1, Ordering::SeqCst) == 0
                    {
                        return Err(sqlx::Error::PoolTimedOut);
                    }
                    count_up(inbox, id, &Digest::of(&[&message.payload])).await;
                    Ok(AckKind::Ack)
                })
            })
            .await
        })
    };

    // In stream order m-2 comes again last (after its Nak): once it is counted, all four were
    // handled.
    let inbox = Inbox::new(pool.clone(), "counter");
    eventually("every message handled", WAIT, || async {
        let dead = inbox.dead(&DeadLetterFilter::all(), 0, 10).await.unwrap();
        (counter(&pool).await == 2 && dead.len() == 1).then_some(())
    })
    .await;
    assert!(calls.load(Ordering::SeqCst) >= 5, "five deliveries");
    assert!(
        failed_once.load(Ordering::SeqCst) >= 2,
        "m-2 was delivered again"
    );
    let dead = inbox.dead(&DeadLetterFilter::all(), 0, 10).await.unwrap();
    let [letter] = &dead[..] else {
        panic!("one dead letter expected, found {dead:?}")
    };
    assert_eq!(letter.message_id, None);
    assert_eq!(letter.subject, format!("{}.Counted.c1", stream.prefix));
    assert_eq!(letter.payload, b"no id");
    assert_eq!(letter.deliveries, 1);
    let restored = letter.header_map();
    let notes: Vec<&str> = restored
        .get_all("x-note")
        .map(async_nats::HeaderValue::as_str)
        .collect();
    assert_eq!(notes, ["first", "second"], "the headers kept whole");

    stop.cancel();
    tokio::time::timeout(WAIT, consuming)
        .await
        .expect("the loop stops when told")
        .unwrap()
        .unwrap();
    assert_eq!(counter(&pool).await, 2, "the copy of m-1 ran nothing");
    // Everything was acknowledged: nothing is left for a consumer started again.
    let jetstream_stream = stream.stream().await;
    eventually("every message acknowledged", WAIT, || async {
        let info = jetstream_stream.consumer_info("counter").await.ok()?;
        (info.num_pending == 0 && info.num_ack_pending == 0).then_some(())
    })
    .await;
    stream.delete().await;
}

/// A consumer deleted under the loop ends it with an error, not as if it had been told to stop.
#[sqlx::test(migrations = false)]
async fn consume_ends_with_an_error_when_its_consumer_is_deleted(pool: PgPool) {
    migrate(&pool).await;
    let stream = TestStream::new().await;
    let config = pull::Config {
        durable_name: Some("doomed".into()),
        ..Default::default()
    };
    let jetstream_stream = stream.stream().await;
    let consumer = jetstream_stream
        .get_or_create_consumer("doomed", config)
        .await
        .unwrap();
    let applied = Arc::new(AtomicUsize::new(0));
    let consuming = {
        let (applied, inbox) = (applied.clone(), Inbox::new(pool.clone(), "doomed"));
        tokio::spawn(async move {
            let (stop, config) = (CancellationToken::new(), ConsumeConfig::default());
            inbox::consume(&consumer, &inbox, &stop, &config, |_, _| {
                applied.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok::<_, sqlx::Error>(AckKind::Ack) })
            })
            .await
        })
    };
    // One message through the loop: its pull request is open on the broker.
    let subject = format!("{}.Counted.c1", stream.prefix);
    let ack = stream
        .jetstream
        .publish(subject, "one".into())
        .await
        .unwrap();
    ack.await.unwrap();
    eventually("the message applied", WAIT, || async {
        (applied.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;

    jetstream_stream.delete_consumer("doomed").await.unwrap();
    let ended = tokio::time::timeout(WAIT, consuming)
        .await
        .expect("the loop ends")
        .unwrap();
    assert!(
        matches!(ended, Err(ConsumeError::Ended(_))),
        "ended with {ended:?}"
    );
    stream.delete().await;
}
