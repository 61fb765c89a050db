// The ops page: polls the service's stats and, once a token is typed in, its dead letters,
// with one button per admin action, and the audit log of operator actions. Everything the page shows comes from the same
// JSON endpoints an operator can curl; text is always inserted as text, never as HTML, because
// dead letters carry whatever a broken or hostile producer sent.
"use strict";

const config = JSON.parse(document.getElementById("ops-config").textContent);
const REFRESH_MS = 2000;
let token = "";
// The filters the list shows and the bulk buttons act on: those applied, not those typed.
let filters = new URLSearchParams();
// The last filters the service accepted.
let acceptedFilters = new URLSearchParams();

// A reply is drawn only if no later request's reply was drawn before it, and only while the
// token it was sent with is still the page's: a reply arriving late (under load, or after an
// action or a new token) would draw what was true before, or clear the token typed since.
// Replies slower than the refreshes are still drawn, in order.
const requestsMade = new Map();
const repliesDrawn = new Map();
function newRequest(name, { withToken = true } = {}) {
  const made = (requestsMade.get(name) ?? 0) + 1;
  requestsMade.set(name, made);
  const sentWith = token;
  const current = () => made > (repliesDrawn.get(name) ?? 0) && (!withToken || token === sentWith);
  return {
    token: sentWith,
    current,
    // True, and the reply counted as drawn, when it is still to be drawn.
    claim: () => {
      if (!current()) return false;
      repliesDrawn.set(name, made);
      return true;
    },
  };
}

// Makes the replies to every request `name` made so far stale: they asked for what the page
// no longer shows (other filters).
function staleSoFar(name) {
  repliesDrawn.set(name, requestsMade.get(name) ?? 0);
}

const el = (tag, props = {}, children = []) => {
  const node = document.createElement(tag);
  Object.assign(node, props);
  node.append(...children);
  return node;
};

function setStatus(text, kind) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = kind || "muted";
}

async function problemDetail(response) {
  try {
    const body = await response.json();
    return body.detail || body.title || response.statusText;
  } catch {
    return response.statusText;
  }
}

// Counts stop at a limit (the stats stay cheap with millions of rows): one that reached it
// reads "at least", unless the stats estimate it (a `…Margin` beside it).
const COUNT_LIMIT = 10000;
// The counts the services count up to COUNT_LIMIT and no further (`exact` is false then).
const CAPPED = new Set(["dead", "parked"]);

function formatBytes(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let unit = 0;
  while (bytes >= 1024 && unit < units.length - 1) {
    bytes /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${bytes} B` : `${bytes.toFixed(1)} ${units[unit]}`;
}

function formatStat(key, value, stats) {
  if (typeof value === "number" && key.endsWith("Seconds")) return `${value.toFixed(1)} s`;
  if (typeof value === "number" && key.endsWith("Bytes")) return formatBytes(value);
  const margin = stats[`${key}Margin`];
  if (margin > 0) return `≈ ${value.toLocaleString()} ± ${margin.toLocaleString()}`;
  if (CAPPED.has(key) && stats.exact === false && value >= COUNT_LIMIT) {
    return `≥ ${value.toLocaleString()}`;
  }
  return typeof value === "number" ? value.toLocaleString() : String(value);
}

// A count above zero, or a state other than "ok".
function isAlarming(value) {
  return typeof value === "string" ? value !== "ok" : value > 0;
}

function formatDuration(seconds) {
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 90 * 60) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

// How long the backlog takes to drain: the backlog over how fast it shrank in the last minute
// of the charts' samples (a database-wide count, so every relay's work shows in it).
let drainRate = null;

function drainText(stats) {
  const backlog = stats[config.drain.backlog];
  if (!(backlog > 0)) return "nothing pending";
  if (drainRate === null) return "–";
  if (drainRate <= 0) return "not draining";
  return `~${formatDuration(backlog / drainRate)}`;
}

async function refreshStats() {
  const request = newRequest("stats", { withToken: false });
  try {
    const response = await fetch(config.stats, { cache: "no-store" });
    if (!response.ok) throw new Error(await problemDetail(response));
    const stats = await response.json();
    if (!request.claim()) return;
    // A tile whose value the stats leave out belongs to a feature this instance runs without.
    const tiles = config.tiles.filter(({ key }) => key in stats).map(({ key, label, alert }) =>
      el("div", {
        className: alert && isAlarming(stats[key]) ? "tile alert" : "tile",
        title: key,
      }, [
        el("div", { className: "muted", textContent: label }),
        el("div", { className: "value", id: `stat-${key}`, textContent: formatStat(key, stats[key], stats) }),
      ]));
    if (config.drain) {
      tiles.push(el("div", { className: "tile", title: "the backlog over how fast it shrank in the last minute" }, [
        el("div", { className: "muted", textContent: "Drains in" }),
        el("div", { className: "value", id: "stat-drain", textContent: drainText(stats) }),
      ]));
    }
    document.getElementById("stats").replaceChildren(...tiles);
    document.getElementById("updated").textContent =
      `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    if (!request.claim()) return;
    document.getElementById("updated").textContent = `stats unavailable: ${error.message}`;
  }
}

// The charts of the last hour, drawn as SVG from /ops/history (the service's own samples).
const SVG = "http://www.w3.org/2000/svg";
const CHART_W = 360;
const CHART_H = 90;
const HOUR_MS = 3600 * 1000;
const MIN_SPAN_MS = 60 * 1000;

function svg(tag, attributes) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  return node;
}

function formatValue(value, unit) {
  if (value === null || value === undefined) return "–";
  if (unit === "s") return value < 1 ? `${(value * 1000).toFixed(0)} ms` : `${value.toFixed(2)} s`;
  if (unit === "/s") return `${value < 10 ? value.toFixed(1) : value.toFixed(0)}/s`;
  return Math.round(value).toLocaleString();
}

function formatSpan(ms) {
  const minutes = Math.round(ms / 60000);
  return minutes <= 1 ? "minute" : minutes >= 60 ? "hour" : `${minutes} minutes`;
}

// One path per line: a segment per run of known values, x by time over the span shown.
function linePath(at, values, start, span, top) {
  let path = "";
  let drawing = false;
  values.forEach((value, i) => {
    if (value === null || value === undefined) { drawing = false; return; }
    const x = ((Date.parse(at[i]) - start) / span) * CHART_W;
    const y = CHART_H - (value / top) * (CHART_H - 4) - 2;
    path += `${drawing ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)} `;
    drawing = true;
  });
  return path.trim();
}

async function refreshCharts() {
  let history;
  try {
    const response = await fetch("/ops/history", { cache: "no-store" });
    if (!response.ok) throw new Error(await problemDetail(response));
    history = await response.json();
  } catch (error) {
    document.getElementById("charts-note").textContent = `(unavailable: ${error.message})`;
    return;
  }
  // The x axis spans what is held, up to the hour, so the first minutes fill the chart too.
  // The newest sample is the right edge: the service's clock, not the browser's.
  const now = history.at.length ? Date.parse(history.at[history.at.length - 1]) : Date.now();
  const oldest = history.at.length ? Date.parse(history.at[0]) : now;
  const span = Math.min(Math.max(now - oldest, MIN_SPAN_MS), HOUR_MS);
  const start = now - span;
  document.getElementById("charts-note").textContent = history.at.length < 2
    ? "(collecting…)"
    : `(the last ${formatSpan(span)}, a sample every ${history.intervalSeconds} s)`;
  if (config.drain) {
    const minute = Math.max(2, Math.round(60 / history.intervalSeconds) + 1);
    const at = history.at.slice(-minute);
    const values = (history.values[config.drain.series] || []).slice(-minute);
    const first = values.findIndex((v) => v !== null && v !== undefined);
    const last = values.length - 1;
    drainRate = first >= 0 && first < last && values[last] !== null && values[last] !== undefined
      ? (values[first] - values[last]) / ((Date.parse(at[last]) - Date.parse(at[first])) / 1000)
      : null;
  }
  const cards = config.charts.map((chart, c) => {
    const series = chart.lines.map((line) => history.values[line.key] || []);
    // A loop, not Math.max(...): an hour of short samples is more arguments than a call takes.
    let max = 0;
    for (const values of series) {
      for (const v of values) if (v !== null && v !== undefined && v > max) max = v;
    }
    const top = max || 1;
    const plot = svg("svg", { viewBox: `0 0 ${CHART_W} ${CHART_H}`, role: "img",
      "aria-label": chart.title, class: "chart" });
    plot.append(svg("line", { x1: 0, y1: CHART_H - 1, x2: CHART_W, y2: CHART_H - 1, class: "axis" }));
    chart.lines.forEach((line, l) => {
      const d = linePath(history.at, series[l], start, span, top);
      if (d) plot.append(svg("path", { d, class: `line line-${l}`, "data-key": line.key }));
    });
    const legend = chart.lines.map((line, l) => {
      const latest = series[l].length ? series[l][series[l].length - 1] : null;
      return el("span", { className: `legend line-${l}` }, [
        el("span", { className: "swatch" }),
        `${line.label} ${formatValue(latest, chart.unit)}`,
      ]);
    });
    const figure = el("figure", { className: "card", id: `chart-${c}` }, [
      el("figcaption", {}, [el("strong", { textContent: chart.title }),
        el("span", { className: "muted max", textContent: ` max ${formatValue(max, chart.unit)}` })]),
      plot,
      el("div", { className: "legends" }, legend),
    ]);
    figure.dataset.max = String(max);
    return figure;
  });
  document.getElementById("charts").replaceChildren(...cards);
}

function cell(column, item) {
  const value = item[column.key];
  const text = value === null || value === undefined
    ? ""
    : typeof value === "object" ? JSON.stringify(value) : String(value);
  return el("td", { className: column.key === "error" || column.key === "lastError" ? "error" : "", textContent: text });
}

// The service counts what waits behind a dead event up to a limit.
const WAITING_BEHIND_LIMIT = 100;

function waitingBehind(item) {
  return item.waitingBehind >= WAITING_BEHIND_LIMIT ? `${WAITING_BEHIND_LIMIT} or more` : String(item.waitingBehind);
}

// A skip cannot be undone: ask first, naming what waits behind the item.
function confirmSkip(item) {
  const behind = item.waitingBehind > 0
    ? `\n${waitingBehind(item)} later event(s) of ${item.aggregateType} ${item.aggregateId} wait behind it and go on without it.`
    : "";
  return window.confirm(`Skip ${item.id}? It is given up for good.${behind}`);
}

// Ids whose action is under way: their buttons stay disabled across the page's refreshes, so
// that a second click does not take one twice, nor another while it runs.
const acting = new Set();

async function act(id, action) {
  if (acting.has(id)) return;
  acting.add(id);
  let response;
  try {
    response = await fetch(`${config.dead}/${encodeURIComponent(id)}/${action.name}`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
    });
  } finally {
    acting.delete(id);
  }
  if (response.ok) {
    setStatus(`${action.label}: ${id} done`, "good");
    // Should it die again, its details are read anew.
    openDetails.delete(id);
    details.delete(id);
  } else {
    setStatus(`${action.label}: ${id} refused (${response.status}): ${await problemDetail(response)}`, "bad");
    // Open details show what the action left: its error and attempts may have changed.
    if (openDetails.has(id)) await loadDetail(id);
  }
  await Promise.all([refreshStats(), refreshDead(), refreshAudit()]);
}

// Takes `action` on every dead letter the applied filters match, one request after another
// while the service answers a cursor (a replay handles a bounded number per request).
async function actOnAll(action) {
  const bulkButtons = document.querySelectorAll("#bulk button");
  for (const button of bulkButtons) button.disabled = true;
  try {
    await actOnAllMatching(action);
  } catch (error) {
    setStatus(`${action.label} all: stopped: ${error.message}`, "bad");
  } finally {
    for (const button of bulkButtons) button.disabled = false;
  }
  await Promise.all([refreshStats(), refreshDead(), refreshAudit()]);
}

async function actOnAllMatching(action) {
  // The filters as they are now: the preview, the question and the action all use these.
  const applied = new URLSearchParams(filters);
  const described = applied.toString() ? `matching ${applied}` : "of this service";
  const preview = await previewMatching(applied);
  if (preview === null) return;
  if (preview.count === 0) {
    setStatus(`${action.label} all: no dead letter ${described}`, "muted");
    return;
  }
  const many = preview.more ? `more than ${preview.count}` : String(preview.count);
  const first = preview.first.join(", ");
  if (!window.confirm(`${action.label} ${many} dead letter(s) ${described}?\nFirst: ${first}`)) return;
  const params = new URLSearchParams(applied);
  // The token confirmed with, for every request: a refresh may clear the page's meanwhile.
  const sentWith = token;
  let count = 0;
  let notApplied = 0;
  for (;;) {
    const response = await fetch(`${config.dead}/${action.name}?${params}`, {
      method: "POST",
      headers: { authorization: `Bearer ${sentWith}` },
    });
    if (!response.ok) {
      // Earlier requests may have done some: say how many.
      const done = count ? `stopped after ${count} done` : "refused";
      setStatus(`${action.label} all: ${done} (${response.status}): ${await problemDetail(response)}`, "bad");
      break;
    }
    const outcome = await response.json();
    count += outcome.count;
    notApplied += outcome.notApplied;
    if (!outcome.nextCursor) {
      const left = notApplied ? `, ${notApplied} still not applicable` : "";
      setStatus(`${action.label} all: ${count} done${left}`, notApplied ? "bad" : "good");
      break;
    }
    params.set("cursor", outcome.nextCursor);
  }
}

// What a bulk action would take: how many dead letters the applied filters match (up to a
// page) and the first ones, read from the list endpoint before asking to confirm.
async function previewMatching(applied) {
  const query = new URLSearchParams(applied);
  query.set("limit", "200");
  const response = await fetch(`${config.dead}?${query}`, {
    headers: { authorization: `Bearer ${token}` },
    cache: "no-store",
  });
  if (!response.ok) {
    setStatus(`Preview refused (${response.status}): ${await problemDetail(response)}`, "bad");
    return null;
  }
  const page = await response.json();
  return {
    count: page.items.length,
    more: Boolean(page.nextCursor),
    first: page.items.slice(0, 5).map((item) => String(item.id)),
  };
}

async function refreshAudit() {
  if (!token) return;
  const request = newRequest("audit");
  const response = await fetch("/ops/audit?limit=20", {
    headers: { authorization: `Bearer ${request.token}` },
    cache: "no-store",
  });
  const section = document.getElementById("audit-section");
  if (!response.ok) {
    if (!request.claim()) return;
    section.hidden = true;
    return;
  }
  const page = await response.json();
  if (!request.claim()) return;
  const rows = page.items.map((entry) => el("tr", {}, [
    el("td", { textContent: new Date(entry.at).toLocaleString() }),
    el("td", { textContent: entry.actor }),
    el("td", { textContent: entry.action }),
    el("td", { textContent: entry.target }),
    el("td", { textContent: String(entry.count) }),
  ]));
  document.getElementById("audit-rows").replaceChildren(...rows);
  document.getElementById("audit").hidden = rows.length === 0;
  document.getElementById("audit-summary").textContent =
    rows.length === 0 ? "No operator action yet." : "";
  section.hidden = false;
}

function showFilters() {
  const inputs = config.filters.map(({ key, label, hint }) => {
    const input = el("input", { id: `filter-${key}`, name: key, type: "text", placeholder: hint });
    return el("label", {}, [label, input]);
  });
  document.getElementById("filters").replaceChildren(...inputs);
  const buttons = config.actions.map((action) => {
    const button = el("button", { type: "button", textContent: `${action.label} all matching` });
    button.dataset.bulk = action.name;
    button.addEventListener("click", () => actOnAll(action));
    return button;
  });
  document.getElementById("bulk").replaceChildren(...buttons);
}

// What a type filter takes (the service refuses other values).
const TOKEN = /^[A-Za-z0-9_:@-]{1,128}$/;

// The longest error text a filter takes (the service refuses longer).
const FILTER_TEXT_MAX = 500;

// Dead items grouped by type and error class (by error text where there is no class); "Show"
// puts a group's values in the filters (a type only when the filter takes it), and says when
// the filters cannot name the group exactly, so that a bulk action is not taken on more.
async function refreshGroups() {
  const box = document.getElementById("groups-box");
  const request = newRequest("groups");
  const response = await fetch(`${config.dead}/groups`, {
    headers: { authorization: `Bearer ${request.token}` },
    cache: "no-store",
  });
  if (!response.ok) {
    if (!request.claim()) return;
    box.hidden = true;
    return;
  }
  const { groups } = await response.json();
  if (!request.claim()) return;
  const keys = new Set(config.filters.map(({ key }) => key));
  const rows = groups.map((group) => {
    const show = el("button", { type: "button", textContent: "Show" });
    show.addEventListener("click", () => {
      for (const { key } of config.filters) document.getElementById(`filter-${key}`).value = "";
      if (keys.has("eventType") && group.eventType && TOKEN.test(group.eventType)) {
        document.getElementById("filter-eventType").value = group.eventType;
      }
      if (group.errorClass && keys.has("errorClass")) {
        document.getElementById("filter-errorClass").value = group.errorClass;
      } else if (keys.has("errorContains") && group.error) {
        document.getElementById("filter-errorContains").value = group.error.slice(0, FILTER_TEXT_MAX);
      }
      document.getElementById("filter-form").requestSubmit();
      const wider = widerThanGroup(group, keys);
      if (wider.length > 0) {
        setStatus(`The list may show more than this group: ${wider.join("; ")}.`, "warn");
      }
    });
    return el("tr", {}, [
      el("td", { textContent: group.count.toLocaleString() }),
      el("td", { textContent: group.eventType ?? "–" }),
      el("td", { textContent: group.errorClass ?? "–" }),
      el("td", {
        className: "error",
        textContent: group.errorClass ? `e.g. ${group.error}` : group.error,
      }),
      el("td", { textContent: new Date(group.oldest).toLocaleString() }),
      el("td", { textContent: new Date(group.newest).toLocaleString() }),
      el("td", {}, [show]),
    ]);
  });
  document.getElementById("groups-rows").replaceChildren(...rows);
  box.hidden = groups.length === 0;
}

// Why the filters "Show" sets for `group` may match more than the group.
function widerThanGroup(group, keys) {
  const wider = [];
  if (keys.has("eventType") && !group.eventType) {
    wider.push("the filters cannot ask for no type");
  } else if (keys.has("eventType") && !TOKEN.test(group.eventType)) {
    wider.push("its type is not one the type filter takes");
  }
  if (!(group.errorClass && keys.has("errorClass"))) {
    if (!group.error) {
      wider.push("it has no error text to filter by");
    } else if (group.error.length > FILTER_TEXT_MAX) {
      wider.push(`the error filter takes its first ${FILTER_TEXT_MAX} characters`);
    } else {
      wider.push("the error filter also takes errors that contain its error");
    }
  }
  return wider;
}

// Rows whose details are open, kept across the refreshes, and what was read of each: the
// list leaves bodies out (a dead item is often one too large), the item's own URL has them.
const openDetails = new Set();
const details = new Map();

async function loadDetail(id) {
  const response = await fetch(`${config.dead}/${encodeURIComponent(id)}`, {
    headers: { authorization: `Bearer ${token}` },
    cache: "no-store",
  });
  if (response.ok) {
    details.set(id, await response.json());
    return true;
  }
  setStatus(`Details of ${id} unavailable: ${await problemDetail(response)}`, "bad");
  return false;
}

function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

// Bytes that are not UTF-8, sixteen to a line: offset, hex, and the printable ones.
function hexDump(hex) {
  const lines = [];
  for (let at = 0; at < hex.length; at += 32) {
    const chunk = hex.slice(at, at + 32).match(/../g) || [];
    const ascii = chunk.map((b) => {
      const code = parseInt(b, 16);
      return code >= 0x20 && code < 0x7f ? String.fromCharCode(code) : ".";
    }).join("");
    lines.push(`${(at / 2).toString(16).padStart(8, "0")}  ${chunk.join(" ").padEnd(47)}  ${ascii}`);
  }
  return lines.join("\n");
}

// Everything known of a dead item: its error in full, its headers, its body.
function detailText(item) {
  const parts = [];
  const error = item.error ?? item.lastError;
  if (error) parts.push(`Error\n${error}`);
  if (item.attempts !== undefined) parts.push(`Attempts: ${item.attempts}`);
  if (item.deliveries !== undefined) parts.push(`Deliveries: ${item.deliveries}`);
  if (item.waitingBehind !== undefined) {
    parts.push(`Waiting behind it: ${waitingBehind(item)} later event(s) of ${item.aggregateType} ${item.aggregateId}`);
  }
  if (item.traceparent) parts.push(`Traceparent: ${item.traceparent}`);
  if (item.headers) {
    const lines = Object.entries(item.headers).flatMap(([name, values]) =>
      values.map((value) => `${name}: ${typeof value === "string" ? value : JSON.stringify(value)}`));
    parts.push(`Headers\n${lines.join("\n") || "(none)"}`);
  }
  if (item.payload !== undefined) parts.push(`Payload\n${JSON.stringify(item.payload, null, 2)}`);
  if (item.body) {
    parts.push(item.body.text !== null && item.body.text !== undefined
      ? `Body\n${pretty(item.body.text)}`
      : `Body (not UTF-8, ${item.body.hex.length / 2} bytes)\n${hexDump(item.body.hex)}`);
  }
  return parts.join("\n\n");
}

async function refreshDead() {
  if (!token) return;
  const request = newRequest("dead");
  const asked = new URLSearchParams(filters);
  const query = new URLSearchParams(asked);
  query.set("limit", "200");
  const response = await fetch(`${config.dead}?${query}`, {
    headers: { authorization: `Bearer ${request.token}` },
    cache: "no-store",
  });
  if (!request.current()) return;
  const table = document.getElementById("dead");
  if (response.status === 422 && asked.toString() !== acceptedFilters.toString()) {
    // A bad filter value: back to the filters accepted before, in the form too, so that the
    // list and the bulk buttons never cover more than the form shows.
    const detail = await problemDetail(response);
    if (!request.current()) return;
    setStatus(`Filter refused: ${detail}; the previous filters stay`, "bad");
    setFilters(acceptedFilters);
    refreshDead();
    return;
  }
  if (!response.ok) {
    const reason = response.status === 401 ? "the token was refused"
      : response.status === 403 ? "no token is configured on this service"
      : await problemDetail(response);
    if (!request.claim()) return;
    table.hidden = true;
    document.getElementById("dead-summary").textContent = "";
    document.getElementById("filter-form").hidden = true;
    document.getElementById("groups-box").hidden = true;
    setStatus(`Dead letters unavailable: ${reason}`, "bad");
    if (response.status === 401 || response.status === 403) token = "";
    return;
  }
  const page = await response.json();
  if (!request.claim()) return;
  acceptedFilters = asked;
  refreshGroups();
  document.getElementById("dead-head").replaceChildren(
    ...config.columns.map(({ label }) => el("th", { textContent: label })),
    el("th", { textContent: "Action" }));
  const rows = page.items.map((item) => {
    const buttons = config.actions.map((action) => {
      const button = el("button", {
        type: "button",
        textContent: action.label,
        disabled: acting.has(String(item.id)),
      });
      button.dataset.action = action.name;
      button.addEventListener("click", (event) => {
        if (action.name === "skip" && !confirmSkip(item)) return;
        for (const other of event.target.parentElement.querySelectorAll("button[data-action]")) {
          other.disabled = true;
        }
        act(String(item.id), action);
      });
      return button;
    });
    const id = String(item.id);
    const toggle = el("button", {
      type: "button",
      className: "details",
      textContent: openDetails.has(id) ? "Hide" : "Details",
    });
    toggle.addEventListener("click", async () => {
      if (openDetails.delete(id)) {
        refreshDead();
        return;
      }
      // Opened once loaded: a refresh meanwhile would show the list's item, which lacks the
      // body, as if it were all there is.
      if (await loadDetail(id)) openDetails.add(id);
      refreshDead();
    });
    const row = el("tr", {}, [
      ...config.columns.map((column) => cell(column, item)),
      el("td", { className: "actions" }, [toggle, ...buttons]),
    ]);
    row.dataset.id = id;
    if (!openDetails.has(id)) return [row];
    const detail = el("tr", { className: "detail" }, [
      el("td", { colSpan: config.columns.length + 1 }, [
        el("pre", { className: "detail-body", textContent: detailText(details.get(id) ?? item) }),
      ]),
    ]);
    detail.dataset.detailOf = id;
    return [row, detail];
  }).flat();
  document.getElementById("dead-rows").replaceChildren(...rows);
  document.getElementById("filter-form").hidden = false;
  table.hidden = rows.length === 0;
  document.getElementById("dead-summary").textContent = rows.length === 0
    ? (filters.toString() ? "No dead letters match the filters." : "No dead letters.")
    : `${page.items.length} dead letter(s)${page.nextCursor ? ", the oldest 200 shown" : ""}.`;
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  token = document.getElementById("token").value.trim();
  setStatus("");
  refreshDead();
  refreshAudit();
});

document.getElementById("filter-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const typed = new URLSearchParams();
  for (const { key } of config.filters) {
    const value = document.getElementById(`filter-${key}`).value.trim();
    if (value) typed.set(key, value);
  }
  filters = typed;
  staleSoFar("dead");
  setStatus("");
  refreshDead();
});

// Applies `applied` as the filters, and shows them in the form.
function setFilters(applied) {
  filters = new URLSearchParams(applied);
  staleSoFar("dead");
  for (const { key } of config.filters) {
    document.getElementById(`filter-${key}`).value = filters.get(key) ?? "";
  }
}

showFilters();

function tick() {
  refreshStats();
  refreshCharts();
  refreshDead();
  refreshAudit();
}
tick();
setInterval(tick, REFRESH_MS);
