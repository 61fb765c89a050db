//! Replaying dead letters, one or in bulk: each held while its effect runs through the rules,
//! closed when it applied, each action in the audit log.

use axum::extract::State;
use service_kit::admin::{Admin, AdminRefusals};
use service_kit::audit;
use service_kit::dead::BulkOutcome;
use service_kit::pagination::{self, Page};
use service_kit::problem::Problem;
use service_kit::{ApiError, Json, Path, Query};

use super::{ActionResult, DeadListParams, described, filter};
use crate::AppState;
use crate::consumer::Verdict;

/// Replays every open dead letter matching the filters (all of them without a filter) through
/// the inbox, oldest first, as `POST /inbox/dead/{id}/retry` does one: applied ones are closed,
/// the others stay open. A request handles `limit` of them; `nextCursor` says where the next
/// one goes on. Exactly-once holds however often it runs, also beside the consumer (admin).
#[utoipa::path(post, path = "/inbox/dead/retry", tag = "inbox", params(DeadListParams),
    security(("admin" = [])), responses(
    (status = 200, description = "`count` letters applied and closed, `notApplied` left open",
        body = BulkOutcome),
    (status = 422, description = "Bad limit, cursor or filter", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
pub(super) async fn replay_matching(
    admin: Admin,
    State(state): State<AppState>,
    Query(params): Query<DeadListParams>,
) -> Result<Json<BulkOutcome>, ApiError> {
    let limit = pagination::limit(params.limit)?;
    let mut after = pagination::after_number(params.cursor.as_deref())?;
    let filter = filter(
        params.event_type,
        params.error_contains,
        params.error_class,
        params.since,
        params.until,
    )?;
    let letters = state.rules.inbox().dead(&filter, after, limit + 1).await?;
    let Page {
        items: letters,
        next_cursor,
    } = Page::of(letters, limit, |d| d.id.to_string());
    let mut outcome = BulkOutcome {
        next_cursor,
        ..BulkOutcome::default()
    };
    let mut not_yet = Vec::new();
    // Letters applied before a failure stay applied, each closed on its own: the audit row
    // that counts them comes after them, also when an error stops the replay.
    let done = async {
        for letter in letters {
            after = letter.id;
            match replay(&state, letter.id, None).await? {
                Some(Verdict::Ack) => outcome.count += 1,
                Some(Verdict::Retry(_)) => not_yet.push(letter.id),
                Some(Verdict::Dead(_)) => outcome.not_applied += 1,
                Some(Verdict::Failed { reached }) => {
                    outcome.not_applied += 1;
                    return Err(database_failed(letter.id, reached));
                }
                None => {} // closed meanwhile
            }
        }
        // An OrderPaid letter older than its OrderPlaced letter applies once the latter has.
        if outcome.count > 0 {
            // Taken one by one from the front: those left when an error stops it are counted.
            not_yet.reverse();
            while let Some(id) = not_yet.last().copied() {
                let verdict = replay(&state, id, None).await?;
                not_yet.pop();
                match verdict {
                    Some(Verdict::Ack) => outcome.count += 1,
                    Some(Verdict::Failed { reached }) => {
                        outcome.not_applied += 1;
                        return Err(database_failed(id, reached));
                    }
                    Some(_) => outcome.not_applied += 1,
                    None => {}
                }
            }
        }
        Ok::<_, ApiError>(())
    }
    .await;
    outcome.not_applied += not_yet.len() as u64;
    let stopped = if done.is_err() {
        ", stopped by an error"
    } else {
        ""
    };
    let target = format!(
        "{} up to letter {after} ({} not applied{stopped})",
        described(&filter),
        outcome.not_applied
    );
    // The letters' effects and closings committed one by one: this row comes after them.
    let recorded = audit::record(&state.pool, &admin.name, "replay", &target, outcome.count)
        .await
        .map(audit::Recorded::committed);
    if let Err(error) = &recorded {
        tracing::error!(error = %error, target, count = outcome.count,
            "letters replayed, but the replay is not in the audit log");
    }
    done?;
    recorded?;
    Ok(Json(outcome))
}

/// Applies open dead letter `id` again through the rules, and closes it when that worked;
/// `None` if it is not open. The letter is held meanwhile, so a skip of it waits and then
/// finds it applied, rather than recording as skipped a letter this applies. With an `actor`,
/// the replay's audit row is written in the hold's transaction before the effect runs (so
/// that a row that cannot be written stops it), and commits with the letter's closing.
async fn replay(
    state: &AppState,
    id: i64,
    actor: Option<&str>,
) -> Result<Option<Verdict>, ApiError> {
    let Some(mut held) = state.rules.inbox().hold_dead_letter(id).await? else {
        return Ok(None);
    };
    let recorded = match actor {
        Some(actor) => {
            let target = format!("dead letter {id}");
            Some(audit::record(held.connection(), actor, "replay", &target, 1).await?)
        }
        None => None,
    };
    let letter = held.letter();
    let verdict = state
        .rules
        .replay_verdict(&letter.header_map(), &letter.payload)
        .await;
    if verdict == Verdict::Ack {
        held.close().await?;
        if let Some(recorded) = recorded {
            recorded.committed();
        }
    }
    // Otherwise the hold is dropped: the letter stays open and the row is rolled back.
    Ok(Some(verdict))
}

/// Applies a dead letter again through the inbox, e.g. after the cause was fixed (admin).
/// Exactly-once still holds: a message applied before is recognised as a duplicate.
#[utoipa::path(post, path = "/inbox/dead/{id}/retry", tag = "inbox",
    params(("id" = i64, Path, description = "Dead letter id", minimum = 1)),
    security(("admin" = [])), responses(
    (status = 200, description = "Applied; the dead letter is closed", body = ActionResult),
    (status = 404, description = "No open dead letter with this id", body = Problem,
        content_type = "application/problem+json"),
    (status = 409, description = "Still not applicable; the dead letter stays", body = Problem,
        content_type = "application/problem+json"),
    (status = 422, description = "The message can never be applied", body = Problem,
        content_type = "application/problem+json"),
    AdminRefusals,
))]
pub(super) async fn retry(
    admin: Admin,
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<ActionResult>, ApiError> {
    let verdict = replay(&state, id, Some(&admin.name))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no open dead letter {id}")))?;
    if matches!(verdict, Verdict::Retry(_) | Verdict::Dead(_)) {
        // Nothing changed: the attempt is recorded on its own, and its verdict answered even
        // when the row cannot be written. (After a failure of the database, only the log
        // tells: another connection may not be had either.)
        let target = format!("dead letter {id}");
        let recorded = audit::record(&state.pool, &admin.name, "replay", &target, 0).await;
        if let Err(error) = recorded.map(audit::Recorded::committed) {
            tracing::error!(error = %error, target,
                "a replay that applied nothing is not in the audit log");
        }
    }
    match verdict {
        Verdict::Ack => Ok(Json(ActionResult {
            id,
            outcome: "applied",
        })),
        Verdict::Retry(reason) => Err(ApiError::conflict(format!(
            "still not applicable: {reason}"
        ))),
        Verdict::Dead(reason) => Err(ApiError::validation("message", reason.to_string())),
        Verdict::Failed { reached } => Err(database_failed(id, reached)),
    }
}

/// A replay of letter `id` stopped by a failure of the database (logged where it happened):
/// a 503 when no connection could be had, so that nothing was applied; else a 500, as for
/// any connection lost mid-request, since the effect may have been committed (a replay
/// again then finds the message a duplicate and closes its letter).
fn database_failed(id: i64, reached: bool) -> ApiError {
    if reached {
        ApiError::internal(anyhow::anyhow!(
            "the replay of dead letter {id} failed in the database"
        ))
    } else {
        ApiError::unavailable(
            "no database connection could be had in time, so nothing was applied and the \
             letter stays open: try again",
        )
    }
}
