//! The `/ops` pages in a real browser: Debian's Chromium driven by playwright-core
//! (`e2e/browser/ops-page.mjs`) clicks an admin action on a dead letter, and the test checks
//! the action's effect in the database and on the stream.
//!
//! Needs `node`, `/usr/bin/chromium` (or `CHROMIUM_PATH`) and `npm ci` run in `e2e/browser`
//! (`scripts/test` does that). Without them the tests say so and pass, except under `CI`,
//! where they fail.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::jetstream;
use e2e::{Names, RunningApp, eventually};
use jetstream_outbox::headers;
use serde_json::{Value, json};
use service_kit::testing;

const TOKEN: &str = "ops-page-token";
const READ_TOKEN: &str = "ops-page-read-token";
const WAIT: Duration = Duration::from_secs(30);

/// The browser-test folder, or why the browser tests cannot run here.
fn browser_setup() -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("browser");
    let chromium = std::env::var("CHROMIUM_PATH").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).exists() {
        return Err(format!(
            "no Chromium at {chromium} (apt-get install chromium)"
        ));
    }
    if !dir.join("node_modules/playwright-core").exists() {
        return Err(format!(
            "playwright-core missing (npm ci --prefix {})",
            dir.display()
        ));
    }
    if std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_err()
    {
        return Err("node is not installed".into());
    }
    Ok(dir)
}

/// The browser-test folder; `None`, said, when the browser tests cannot run here, except under
/// `CI`, where that fails the test.
fn browser_dir() -> Option<PathBuf> {
    match browser_setup() {
        Ok(dir) => Some(dir),
        Err(reason) if std::env::var_os("CI").is_some() => panic!("browser test: {reason}"),
        Err(reason) => {
            eprintln!("SKIPPED the browser part of this test: {reason}");
            None
        }
    }
}

/// After the click on one dead letter, a click that takes `action` on every letter the filter
/// `key=value` matches.
struct Bulk {
    action: &'static str,
    key: &'static str,
    value: String,
    /// Besides: the start of the reason "Show" gives for the group of items with no type
    /// (empty: no such group).
    wider_group: &'static str,
}

/// Runs the browser script against `url`, which must show `expect_detail` in the dead item's
/// details and, for orders-service, the broker's tile "ok"; `None` when the browser tests
/// cannot run here.
async fn drive_ops_page(
    service: &str,
    url: &str,
    dead_id: &str,
    action: &str,
    expect_detail: &str,
    bulk: Bulk,
) -> Option<()> {
    // Kept in the test build's folder: what the page looked like at the end.
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ops-{service}.png"));
    let dir = browser_dir()?;
    let screenshot = screenshot.display().to_string();
    let env = [
        ("OPS_URL", url),
        ("ADMIN_TOKEN", TOKEN),
        ("READ_TOKEN", READ_TOKEN),
        ("SCREENSHOT", &screenshot),
        ("DEAD_ID", dead_id),
        ("ACTION", action),
        ("EXPECT_DETAIL", expect_detail),
        ("BULK_ACTION", bulk.action),
        ("FILTER_KEY", bulk.key),
        ("FILTER_VALUE", &bulk.value),
        ("EXPECT_BROKER", if service == "orders" { "ok" } else { "" }),
        ("WIDER_GROUP", bulk.wider_group),
    ];
    run_script(&dir, "ops-page.mjs", &env).await;
    eprintln!("the page at the end: {screenshot}");
    Some(())
}

/// Runs the browser script `script` in `dir` with `env`; fails with its output if it fails.
async fn run_script(dir: &Path, script: &str, env: &[(&str, &str)]) {
    let output = tokio::process::Command::new("node")
        .arg(script)
        .current_dir(dir)
        .envs(env.iter().copied())
        .output()
        .await
        .expect("node runs");
    assert!(
        output.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Updates `stream`'s configuration with `change`.
async fn change_stream(
    js: &jetstream::Context,
    stream: &str,
    change: impl FnOnce(&mut jetstream::stream::Config),
) {
    let mut config = js
        .get_stream(stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    change(&mut config);
    js.update_stream(config).await.unwrap();
}

/// The stream takes no more messages: the broker is full, and `/ops`'s tile says so,
/// highlighted.
async fn full_broker_on_the_tile(js: &jetstream::Context, stream: &str, url: &str) {
    change_stream(js, stream, |full| {
        full.max_messages = 2;
        full.discard = jetstream::stream::DiscardPolicy::New;
    })
    .await;
    let placed = reqwest::Client::new()
        .post(format!("{url}/orders"))
        .json(&json!({"id": "o-ops-3", "customer": "ada", "totalMinor": 700}))
        .send()
        .await
        .unwrap();
    assert_eq!(placed.status(), 201);
    eventually("the relay to see the broker full", WAIT, || async {
        let stats = get_json(format!("{url}/outbox/stats")).await;
        (stats["broker"] == "storage full").then_some(())
    })
    .await;
    tile_shows("orders", url, "broker", "storage full", true).await;
}

/// Loads `url`'s `/ops` until the tile `key` shows `value`, highlighted or not as `alert` says;
/// `None` when the browser tests cannot run here.
async fn tile_shows(service: &str, url: &str, key: &str, value: &str, alert: bool) -> Option<()> {
    let screenshot =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ops-{service}-{key}.png"));
    let dir = browser_dir()?;
    let screenshot = screenshot.display().to_string();
    let alert = alert.to_string();
    let env = [
        ("OPS_URL", url),
        ("KEY", key),
        ("VALUE", value),
        ("ALERT", &alert),
        ("SCREENSHOT", &screenshot),
    ];
    run_script(&dir, "ops-tile.mjs", &env).await;
    eprintln!("the tile: {screenshot}");
    Some(())
}

async fn get_json(url: String) -> Value {
    reqwest::Client::new()
        .get(url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Events that died because the stream refused them are published once the stream takes them
/// again: one by a click on its Retry, the other by "Retry all matching" an error filter.
#[tokio::test]
async fn orders_ops_page_retries_a_dead_event() {
    let names = Names::unique();
    let mut config = names.orders_config();
    config.common.admin_token = Some(TOKEN.into());
    config.common.read_token = Some(READ_TOKEN.into());
    // Samples every half second (the default is five), so that the charts draw within the test.
    config.common.ops_history_interval = Duration::from_millis(500);
    config.relay.max_attempts = 1;
    let (common, stream) = (config.common.clone(), config.stream.clone());
    let orders = RunningApp::orders(config).await;
    // A stream that takes no message this large refuses the publish: a refusal counts toward
    // RELAY_MAX_ATTEMPTS (an unreachable broker or a missing stream would not).
    let client = async_nats::connect(testing::nats_url()).await.unwrap();
    let js = jetstream::new(client);
    change_stream(&js, &names.stream, |refusing| {
        refusing.max_message_size = 16;
    })
    .await;

    for id in ["o-ops-1", "o-ops-2"] {
        let placed = reqwest::Client::new()
            .post(format!("{}/orders", orders.url))
            .json(&json!({"id": id, "customer": "ada", "totalMinor": 700}))
            .send()
            .await
            .unwrap();
        assert_eq!(placed.status(), 201);
    }
    let dead = eventually("the dead events", WAIT, || async {
        let page = get_json(format!("{}/outbox/dead", orders.url)).await;
        let items = page["items"].as_array()?;
        (items.len() == 2).then(|| items.clone())
    })
    .await;
    let event_id = dead[0]["id"].as_str().unwrap().to_owned();
    let other_id = dead[1]["id"].as_str().unwrap().to_owned();
    // The stream refused both for their size: one class of error, whatever its words name.
    assert_eq!(dead[1]["errorClass"], "too-large", "{dead:?}");
    let bulk = Bulk {
        action: "retry",
        key: "errorClass",
        value: "too-large".to_owned(),
        wider_group: "",
    };

    service_kit::infra::ensure_stream(
        &js,
        &service_kit::infra::stream_spec(&common, &stream),
        &service_kit::infra::Refusals::default(),
    )
    .await
    .unwrap();

    if drive_ops_page(
        "orders",
        &orders.url,
        &event_id,
        "retry",
        r#""customer": "ada""#,
        bulk,
    )
    .await
    .is_some()
    {
        let stream_ids = eventually("both events on the stream", WAIT, || async {
            let mut stream = js.get_stream(&names.stream).await.ok()?;
            let state = stream.info().await.ok()?.state.clone();
            if state.messages < 2 {
                return None;
            }
            let mut ids = Vec::new();
            for seq in state.first_sequence..=state.last_sequence {
                let message = stream.get_raw_message(seq).await.ok()?;
                ids.push(
                    message
                        .headers
                        .get(async_nats::header::NATS_MESSAGE_ID)?
                        .to_string(),
                );
            }
            Some(ids)
        })
        .await;
        assert_eq!(stream_ids, [event_id, other_id]);
        let statuses: Vec<String> =
            sqlx::query_scalar("SELECT status FROM outbox_events ORDER BY seq")
                .fetch_all(&orders.pool)
                .await
                .unwrap();
        assert_eq!(statuses, ["published", "published"]);

        full_broker_on_the_tile(&js, &names.stream, &orders.url).await;
    }
    orders.stop().await;
    names.clean_up().await;
}

/// Messages billing can never apply are closed as skipped: one by a click on its Skip, the
/// other by "Skip all matching" an event-type filter.
#[tokio::test]
async fn billing_ops_page_skips_a_dead_letter() {
    let names = Names::unique();
    let mut config = names.billing_config();
    config.common.admin_token = Some(TOKEN.into());
    config.common.read_token = Some(READ_TOKEN.into());
    // Samples every half second (the default is five), so that the charts draw within the test.
    config.common.ops_history_interval = Duration::from_millis(500);
    let consumer = config.consumer.name.clone();
    let billing = RunningApp::billing(config).await;

    let js = jetstream::new(async_nats::connect(testing::nats_url()).await.unwrap());
    for (id, order) in [("m-ops-poison", "o-ops-2"), ("m-ops-poison-2", "o-ops-3")] {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(headers::ID, id);
        headers.insert(headers::TYPE, "OrderPlaced");
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
        js.publish_with_headers(
            format!("{}.OrderPlaced.{order}", names.prefix),
            headers,
            "<b>not json</b>".into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let dead = eventually("the dead letters", WAIT, || async {
        let page = get_json(format!("{}/inbox/dead", billing.url)).await;
        let items = page["items"].as_array()?;
        (items.len() == 2).then(|| items.clone())
    })
    .await;
    let id = dead[0]["id"].as_i64().unwrap();
    // A letter with no type, in a group of its own that no filter names exactly.
    let untyped = jetstream_outbox::inbox::NewDeadLetter::new("elsewhere", b"?", "no type");
    jetstream_outbox::Inbox::new(billing.pool.clone(), consumer)
        .dead_letter(untyped)
        .await
        .unwrap();
    let bulk = Bulk {
        action: "skip",
        key: "eventType",
        value: "OrderPlaced".into(),
        wider_group: "the filters cannot ask for no type",
    };

    if drive_ops_page(
        "billing",
        &billing.url,
        &id.to_string(),
        "skip",
        "<b>not json</b>",
        bulk,
    )
    .await
    .is_some()
    {
        let resolutions: Vec<Option<String>> =
            sqlx::query_scalar("SELECT resolution FROM inbox_dead ORDER BY id")
                .fetch_all(&billing.pool)
                .await
                .unwrap();
        assert_eq!(
            resolutions,
            [Some("skipped".into()), Some("skipped".into()), None]
        );
    }
    billing.stop().await;
    names.clean_up().await;
}
