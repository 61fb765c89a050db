//! Each command: its requests, and what it prints (tables, or the JSON answers with `--json`).

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use anyhow::bail;
use serde_json::Value;

use crate::cli::{Cli, Command, Filters};
use crate::client::{Client, Kind};

/// Widest cell of a table; longer text is cut with `…`.
const CELL: usize = 60;

/// Runs the command of `cli`.
pub(crate) async fn run(cli: Cli) -> anyhow::Result<()> {
    let client = Client::connect(&cli.url, cli.token).await?;
    let out = Output { json: cli.json };
    match cli.command {
        Command::Stats => {
            let stats = client.get(client.kind.stats(), &[]).await?;
            out.fields(&stats);
        }
        Command::List { filters, limit } => {
            let mut query = filters.query();
            query.push(("limit", limit.to_string()));
            let page = client.get(client.kind.dead(), &query).await?;
            out.table(&page, client.kind.columns());
            if !out.json && page["nextCursor"].is_string() {
                println!("(more: raise --limit, or narrow the filters)");
            }
        }
        Command::Groups => {
            let answer = client
                .get(&format!("{}/groups", client.kind.dead()), &[])
                .await?;
            if out.json {
                println!("{answer}");
            } else {
                out.table(
                    &serde_json::json!({ "items": answer["groups"] }),
                    &[
                        "count",
                        "eventType",
                        "errorClass",
                        "error",
                        "oldest",
                        "newest",
                    ],
                );
            }
        }
        Command::Show { id } => {
            let item = find(&client, &id).await?;
            out.pretty(&item);
        }
        Command::Retry { id } => {
            let done = client
                .post(&format!("{}/{id}/retry", client.kind.dead()), &[])
                .await?;
            out.fields(&done);
        }
        Command::Skip { id } => {
            let done = client
                .post(&format!("{}/{id}/skip", client.kind.dead()), &[])
                .await?;
            out.fields(&done);
        }
        Command::RetryAll { filters, yes } => bulk(&client, &out, "retry", &filters, yes).await?,
        Command::SkipAll { filters, yes } => bulk(&client, &out, "skip", &filters, yes).await?,
        Command::Audit { limit } => {
            let page = client
                .get("/ops/audit", &[("limit", limit.to_string())])
                .await?;
            out.table(&page, &["at", "actor", "action", "target", "count"]);
        }
    }
    Ok(())
}

/// The dead item `id`, whole.
async fn find(client: &Client, id: &str) -> anyhow::Result<Value> {
    client
        .get(&format!("{}/{id}", client.kind.dead()), &[])
        .await
}

/// Takes `action` on every dead item `filters` match: first shows how many and which, and asks
/// unless `yes`; then repeats the request while the service answers a cursor.
async fn bulk(
    client: &Client,
    out: &Output,
    action: &str,
    filters: &Filters,
    yes: bool,
) -> anyhow::Result<()> {
    if client.kind == Kind::Billing
        && (filters.aggregate_type.is_some() || filters.aggregate_id.is_some())
    {
        bail!("billing-service's dead letters have no --aggregate-type or --aggregate-id filter");
    }
    let mut query = filters.query();
    let mut preview = query.clone();
    preview.push(("limit", "200".to_owned()));
    let page = client.get(client.kind.dead(), &preview).await?;
    let items = page["items"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        println!("no {} matches", client.kind.noun());
        return Ok(());
    }
    let many = if page["nextCursor"].is_string() {
        format!("more than {}", items.len())
    } else {
        items.len().to_string()
    };
    let first: Vec<String> = items.iter().take(5).map(id_of).collect();
    let matching = if query.is_empty() {
        "(no filter: every one)".to_owned()
    } else {
        query
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    eprintln!(
        "{action}: {many} {}(s) matching {matching}; first: {}",
        client.kind.noun(),
        first.join(", ")
    );
    if !yes && !confirmed()? {
        bail!("nothing done");
    }
    let (mut count, mut not_applied) = (0, 0);
    loop {
        let outcome = client
            .post(&format!("{}/{action}", client.kind.dead()), &query)
            .await?;
        if out.json {
            println!("{outcome}");
        }
        count += outcome["count"].as_u64().unwrap_or(0);
        not_applied += outcome["notApplied"].as_u64().unwrap_or(0);
        match outcome["nextCursor"].as_str() {
            Some(cursor) => {
                query.retain(|(key, _)| *key != "cursor");
                query.push(("cursor", cursor.to_owned()));
            }
            None => break,
        }
    }
    if !out.json {
        let left = if not_applied > 0 {
            format!(", {not_applied} still not applicable")
        } else {
            String::new()
        };
        println!("{action}: {count} done{left}");
    }
    Ok(())
}

/// Asks on the terminal; without one, refuses (a script passes `--yes`).
fn confirmed() -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        bail!("not a terminal: pass --yes to act without being asked");
    }
    eprint!("go ahead? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// An item's id as text (a UUID for an event, a number for a letter).
fn id_of(item: &Value) -> String {
    match &item["id"] {
        Value::String(id) => id.clone(),
        other => other.to_string(),
    }
}

/// How answers are printed.
struct Output {
    json: bool,
}

impl Output {
    /// An object's fields, one per line.
    fn fields(&self, object: &Value) {
        if self.json {
            println!("{object}");
            return;
        }
        if let Some(fields) = object.as_object() {
            for (key, value) in fields {
                println!("{key}: {}", text(value));
            }
        }
    }

    /// A whole value, indented.
    fn pretty(&self, value: &Value) {
        if self.json {
            println!("{value}");
        } else {
            println!(
                "{}",
                serde_json::to_string_pretty(value).unwrap_or_default()
            );
        }
    }

    /// A page's items as a table of `columns`.
    fn table(&self, page: &Value, columns: &[&str]) {
        if self.json {
            println!("{page}");
            return;
        }
        let items = page["items"].as_array().cloned().unwrap_or_default();
        if items.is_empty() {
            println!("(none)");
            return;
        }
        let rows: Vec<Vec<String>> = items
            .iter()
            .map(|item| {
                columns
                    .iter()
                    .map(|column| cut(&text(&item[*column])))
                    .collect()
            })
            .collect();
        let widths: Vec<usize> = columns
            .iter()
            .enumerate()
            .map(|(i, column)| {
                rows.iter()
                    .map(|row| row[i].chars().count())
                    .chain([column.len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<String>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:width$}"))
                .collect();
            println!("{}", padded.join("  ").trim_end());
        };
        line(columns.iter().map(|column| (*column).to_owned()).collect());
        for row in rows {
            line(row);
        }
    }
}

/// A JSON value as a person reads it: strings without quotes, nothing for null.
fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// `text` on one line, at most [`CELL`] characters.
fn cut(text: &str) -> String {
    let one_line = text.replace(['\n', '\r', '\t'], " ");
    if one_line.chars().count() <= CELL {
        one_line
    } else {
        let kept: String = one_line.chars().take(CELL - 1).collect();
        format!("{kept}…")
    }
}
