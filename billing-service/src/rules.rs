//! What billing does with a message it can read: apply it through the inbox (one at a time, or
//! a batch in one transaction), and judge the outcome: acknowledge, deliver again later, or keep
//! as a dead letter. The rules, in order: `docs/messages.md`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_nats::HeaderMap;
use jetstream_outbox::headers;
use jetstream_outbox::inbox::{self, Digest};
use jetstream_outbox::{BatchError, Inbox, InboxError, Outcome};
use tracing::Instrument as _;

use crate::invoices::{self, ApplyError, Change};
use crate::parse::{header, parse};
use crate::reason::DeadReason;

/// What to do with a message, decided (and applied) by [`Rules::verdict`].
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Applied now or before: acknowledge.
    Ack,
    /// Not applicable yet: deliver again later.
    Retry(String),
    /// A transient failure of the database (logged): deliver again later. `reached` when
    /// it came after a connection was had, so that the effect may have been committed.
    Failed {
        /// Whether what was sent may have reached the database (and been committed).
        reached: bool,
    },
    /// Can never be applied as it is: keep as a dead letter.
    Dead(DeadReason),
}

/// How billing treats one message: the rules in the module documentation.
#[derive(Debug, Clone)]
pub struct Rules {
    inbox: Inbox,
    max_retries: i64,
    not_yet: Arc<Mutex<HashMap<String, i64>>>,
}

/// Messages whose not-yet outcomes are counted at once; past this the counts start over (a
/// message then waits longer before it is dead, never less long).
const NOT_YET_TRACKED: usize = 100_000;

/// A message billing can apply: its inbox key and content, and the change it asks for.
#[derive(Debug, Clone)]
pub struct Applicable {
    id: String,
    digest: Digest,
    change: Change,
}

impl Applicable {
    /// The message's inbox key (its `ce-id`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The digest of its type and body.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }
}

/// Whether a not-yet outcome counts toward the message's allowed retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NotYet {
    /// The consumer's delivery: it does, up to `CONSUMER_MAX_RETRIES`.
    Counted,
    /// An operator's replay: it does not.
    NotCounted,
}

impl Rules {
    /// Rules over `inbox`; `max_retries` bounds how often a message may be not applicable yet.
    pub fn new(inbox: Inbox, max_retries: i64) -> Self {
        Self {
            inbox,
            max_retries,
            not_yet: Arc::default(),
        }
    }

    /// Counts one more not-yet outcome of message `id`, and returns how many there were.
    fn not_yet_again(&self, id: &str) -> i64 {
        let mut counts = self.not_yet.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.len() >= NOT_YET_TRACKED && !counts.contains_key(id) {
            counts.clear();
        }
        let count = counts.entry(id.to_owned()).or_default();
        *count += 1;
        *count
    }

    /// Forgets the not-yet count of message `id`: it was applied or dead-lettered.
    fn settled(&self, id: &str) {
        self.not_yet
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// The inbox the rules apply messages through.
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// Decides what to do with a message and, when it can, applies it through the inbox.
    pub async fn verdict(&self, headers: &HeaderMap, payload: &[u8]) -> Verdict {
        match Self::prepare(headers, payload) {
            Ok(applicable) => self.apply_one(applicable, NotYet::Counted).await,
            Err(verdict) => verdict,
        }
    }

    /// [`Rules::verdict`] for a dead letter an operator replays: a message not applicable yet
    /// stays so however often it is replayed, since the retries the consumer is allowed are
    /// not the operator's.
    pub async fn replay_verdict(&self, headers: &HeaderMap, payload: &[u8]) -> Verdict {
        match Self::prepare(headers, payload) {
            Ok(applicable) => self.apply_one(applicable, NotYet::NotCounted).await,
            Err(verdict) => verdict,
        }
    }

    /// The change a message asks for, or the verdict when none is to be applied: parsed and
    /// checked, its inbox key and digest taken.
    pub(crate) fn prepare(headers: &HeaderMap, payload: &[u8]) -> Result<Applicable, Verdict> {
        let change = match parse(headers, payload) {
            Ok(Some(change)) => change,
            Ok(None) => return Err(Verdict::Ack),
            Err(reason) => return Err(Verdict::Dead(reason)),
        };
        let (Some(id), Some(event_type)) =
            (header(headers, headers::ID), header(headers, headers::TYPE))
        else {
            return Err(Verdict::Dead(DeadReason::MissingHeader(headers::ID)));
        };
        // A copy has the same type and body; the subject names the same type and order.
        Ok(Applicable {
            id: id.to_owned(),
            digest: Digest::of(&[event_type.as_bytes(), payload]),
            change,
        })
    }

    /// Applies one message through the inbox.
    async fn apply_one(&self, applicable: Applicable, not_yet: NotYet) -> Verdict {
        let Applicable { id, digest, change } = applicable;
        let outcome = self
            .inbox
            .process(&id, &digest, move |conn| {
                Box::pin(async move {
                    let applied = invoices::apply(conn, &[(0, change)]).await;
                    applied.map(|_| ()).map_err(|(_, error)| error)
                })
            })
            .await;
        if matches!(outcome, Ok(Outcome::Processed(()))) {
            crate::failpoints::after_commit();
        }
        self.judge(&id, outcome, not_yet)
    }

    /// Applies a batch's messages (numbered as `spans`) in one inbox transaction (their
    /// changes in a statement per run of one kind, see `invoices::apply`), and returns each
    /// one's verdict. A message whose effect fails is taken out: the ones before it
    /// are applied together, then it is judged on its own, then the ones after it go on
    /// together, so each order's order holds and it never fails its batch-mates.
    pub(crate) async fn apply_all(
        &self,
        batch: Vec<(usize, Applicable)>,
        spans: &[tracing::Span],
    ) -> Vec<(usize, Verdict)> {
        let mut verdicts = Vec::with_capacity(batch.len());
        let mut groups = std::collections::VecDeque::from([batch]);
        while let Some(mut group) = groups.pop_front() {
            if group.len() < 2 {
                for (i, applicable) in group {
                    let verdict = self
                        .apply_one(applicable, NotYet::Counted)
                        .instrument(spans[i].clone())
                        .await;
                    verdicts.push((i, verdict));
                }
                continue;
            }
            let keys: Vec<(&str, Digest)> = group
                .iter()
                .map(|(_, a)| (a.id.as_str(), a.digest))
                .collect();
            let changes: Vec<Change> = group.iter().map(|(_, a)| a.change.clone()).collect();
            let outcome = self
                .inbox
                .process_batch_together(&keys, |conn, new| {
                    let changes: Vec<(usize, Change)> =
                        new.iter().map(|&i| (i, changes[i].clone())).collect();
                    Box::pin(async move { invoices::apply(conn, &changes).await })
                })
                .await;
            match outcome {
                Ok(outcomes) => {
                    if outcomes.iter().any(|o| matches!(o, Outcome::Processed(()))) {
                        crate::failpoints::after_commit();
                    }
                    for ((i, applicable), outcome) in group.into_iter().zip(outcomes) {
                        let verdict = spans[i]
                            .in_scope(|| self.judge(&applicable.id, Ok(outcome), NotYet::Counted));
                        verdicts.push((i, verdict));
                    }
                }
                Err(BatchError::Effect { index, error }) => {
                    let after = group.split_off(index + 1);
                    let failed = group.pop().into_iter().collect();
                    if let ApplyError::Database(_) = error {
                        // Laid at the first change of the statement that failed, not at the one
                        // at fault (`invoices::apply`): the rest goes one by one, so each is
                        // judged on its own error.
                        for single in after.into_iter().rev() {
                            groups.push_front(vec![single]);
                        }
                        groups.push_front(failed);
                        groups.push_front(group);
                    } else {
                        for part in [after, failed, group] {
                            groups.push_front(part);
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(error = ?error, "batch failed; applying its messages one by one");
                    for single in group.into_iter().rev() {
                        groups.push_front(vec![single]);
                    }
                }
            }
        }
        verdicts
    }

    /// The verdict on message `id` from what the inbox did with it.
    fn judge(
        &self,
        id: &str,
        outcome: Result<Outcome<()>, InboxError<ApplyError>>,
        not_yet: NotYet,
    ) -> Verdict {
        if !matches!(outcome, Err(InboxError::Effect(ApplyError::NotYet(_)))) {
            self.settled(id);
        }
        match outcome {
            Ok(Outcome::Processed(())) => {
                tracing::info!("message applied");
                Verdict::Ack
            }
            Ok(Outcome::Duplicate) => {
                tracing::info!("duplicate delivery ignored");
                Verdict::Ack
            }
            Ok(Outcome::IdReused) => Verdict::Dead(DeadReason::IdReused(id.to_owned())),
            Err(InboxError::Effect(ApplyError::NotYet(reason))) => {
                if not_yet == NotYet::NotCounted {
                    tracing::info!(reason, "not applicable yet; the dead letter stays");
                    return Verdict::Retry(reason);
                }
                let attempts = self.not_yet_again(id);
                if attempts >= self.max_retries {
                    self.settled(id);
                    return Verdict::Dead(DeadReason::NotYetTooOften { reason, attempts });
                }
                tracing::info!(reason, "not applicable yet; delivered again later");
                Verdict::Retry(reason)
            }
            Err(error) => {
                if let Some(code) = permanent_sqlstate(&error) {
                    return Verdict::Dead(DeadReason::RefusedByDatabase {
                        code,
                        error: error.to_string(),
                    });
                }
                let reached = match &error {
                    InboxError::Database(database)
                    | InboxError::Effect(ApplyError::Database(database)) => {
                        !service_kit::problem::no_connection(database)
                    }
                    _ => true,
                };
                if not_yet == NotYet::NotCounted {
                    tracing::warn!(error = ?error, "the database failed; the dead letter stays");
                } else {
                    tracing::warn!(error = ?error, "transient failure; delivered again later");
                }
                Verdict::Failed { reached }
            }
        }
    }
}

/// The SQLSTATE of a database error that no retry can fix ([`inbox::refused_for_good`]).
fn permanent_sqlstate(error: &InboxError<ApplyError>) -> Option<String> {
    let (InboxError::Database(database) | InboxError::Effect(ApplyError::Database(database))) =
        error
    else {
        return None;
    };
    inbox::refused_for_good(database).map(std::borrow::Cow::into_owned)
}
