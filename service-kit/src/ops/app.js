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
// reads "at least".
const COUNT_LIMIT = 10000;

function formatStat(key, value, stats) {
  if (typeof value === "number" && key.endsWith("Seconds")) return `${value.toFixed(1)} s`;
  if (stats.exact === false && value >= COUNT_LIMIT) return `≥ ${value}`;
  return String(value);
}

async function refreshStats() {
  try {
    const response = await fetch(config.stats, { cache: "no-store" });
    if (!response.ok) throw new Error(await problemDetail(response));
    const stats = await response.json();
    const tiles = config.tiles.map(({ key, label, alert }) =>
      el("div", {
        className: alert && stats[key] > 0 ? "tile alert" : "tile",
        title: key,
      }, [
        el("div", { className: "muted", textContent: label }),
        el("div", { className: "value", id: `stat-${key}`, textContent: formatStat(key, stats[key], stats) }),
      ]));
    document.getElementById("stats").replaceChildren(...tiles);
    document.getElementById("updated").textContent =
      `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    document.getElementById("updated").textContent = `stats unavailable: ${error.message}`;
  }
}

function cell(column, item) {
  const value = item[column.key];
  const text = value === null || value === undefined
    ? ""
    : typeof value === "object" ? JSON.stringify(value) : String(value);
  return el("td", { className: column.key === "error" || column.key === "lastError" ? "error" : "", textContent: text });
}

async function act(id, action) {
  const response = await fetch(`${config.dead}/${encodeURIComponent(id)}/${action.name}`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}` },
  });
  if (response.ok) {
    setStatus(`${action.label}: ${id} done`, "good");
  } else {
    setStatus(`${action.label}: ${id} refused (${response.status}): ${await problemDetail(response)}`, "bad");
  }
  await Promise.all([refreshStats(), refreshDead(), refreshAudit()]);
}

// Takes `action` on every dead letter the applied filters match, one request after another
// while the service answers a cursor (a replay handles a bounded number per request).
async function actOnAll(action) {
  const described = filters.toString() ? `matching ${filters}` : "of this service";
  const preview = await previewMatching();
  if (preview === null) return;
  if (preview.count === 0) {
    setStatus(`${action.label} all: no dead letter ${described}`, "muted");
    return;
  }
  const many = preview.more ? `more than ${preview.count}` : String(preview.count);
  const first = preview.first.join(", ");
  if (!window.confirm(`${action.label} ${many} dead letter(s) ${described}?\nFirst: ${first}`)) return;
  const params = new URLSearchParams(filters);
  let count = 0;
  let notApplied = 0;
  for (;;) {
    const response = await fetch(`${config.dead}/${action.name}?${params}`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
    });
    if (!response.ok) {
      setStatus(`${action.label} all: refused (${response.status}): ${await problemDetail(response)}`, "bad");
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
  await Promise.all([refreshStats(), refreshDead(), refreshAudit()]);
}

// What a bulk action would take: how many dead letters the applied filters match (up to a
// page) and the first ones, read from the list endpoint before asking to confirm.
async function previewMatching() {
  const query = new URLSearchParams(filters);
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
  const response = await fetch("/ops/audit?limit=20", {
    headers: { authorization: `Bearer ${token}` },
    cache: "no-store",
  });
  const section = document.getElementById("audit-section");
  if (!response.ok) {
    section.hidden = true;
    return;
  }
  const page = await response.json();
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
  const inputs = config.filters.map(({ key, label }) => {
    const input = el("input", { id: `filter-${key}`, name: key, type: "text" });
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

async function refreshDead() {
  if (!token) return;
  const query = new URLSearchParams(filters);
  query.set("limit", "200");
  const response = await fetch(`${config.dead}?${query}`, {
    headers: { authorization: `Bearer ${token}` },
    cache: "no-store",
  });
  const table = document.getElementById("dead");
  if (!response.ok) {
    table.hidden = true;
    const reason = response.status === 401 ? "the token was refused"
      : response.status === 403 ? "no token is configured on this service"
      : await problemDetail(response);
    document.getElementById("dead-summary").textContent = "";
    document.getElementById("filter-form").hidden = true;
    setStatus(`Dead letters unavailable: ${reason}`, "bad");
    if (response.status === 401 || response.status === 403) token = "";
    return;
  }
  const page = await response.json();
  document.getElementById("dead-head").replaceChildren(
    ...config.columns.map(({ label }) => el("th", { textContent: label })),
    el("th", { textContent: "Action" }));
  const rows = page.items.map((item) => {
    const buttons = config.actions.map((action) => {
      const button = el("button", { type: "button", textContent: action.label });
      button.dataset.action = action.name;
      button.addEventListener("click", () => {
        button.disabled = true;
        act(item.id, action);
      });
      return button;
    });
    const row = el("tr", {}, [
      ...config.columns.map((column) => cell(column, item)),
      el("td", { className: "actions" }, buttons),
    ]);
    row.dataset.id = String(item.id);
    return row;
  });
  document.getElementById("dead-rows").replaceChildren(...rows);
  document.getElementById("filter-form").hidden = false;
  table.hidden = rows.length === 0;
  document.getElementById("dead-summary").textContent = rows.length === 0
    ? (filters.toString() ? "No dead letters match the filters." : "No dead letters.")
    : `${rows.length} dead letter(s)${page.nextCursor ? ", the oldest 200 shown" : ""}.`;
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
  filters = new URLSearchParams();
  for (const { key } of config.filters) {
    const value = document.getElementById(`filter-${key}`).value.trim();
    if (value) filters.set(key, value);
  }
  setStatus("");
  refreshDead();
});

showFilters();

function tick() {
  refreshStats();
  refreshDead();
  refreshAudit();
}
tick();
setInterval(tick, REFRESH_MS);
