// The ops page: polls the service's stats and, once an admin token is typed in, its dead
// letters, with one button per admin action. Everything the page shows comes from the same
// JSON endpoints an operator can curl; text is always inserted as text, never as HTML, because
// dead letters carry whatever a broken or hostile producer sent.
"use strict";

const config = JSON.parse(document.getElementById("ops-config").textContent);
const REFRESH_MS = 2000;
let token = "";

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

function formatStat(key, value) {
  if (typeof value === "number" && key.endsWith("Seconds")) return `${value.toFixed(1)} s`;
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
        el("div", { className: "value", id: `stat-${key}`, textContent: formatStat(key, stats[key]) }),
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
  await Promise.all([refreshStats(), refreshDead()]);
}

async function refreshDead() {
  if (!token) return;
  const response = await fetch(`${config.dead}?limit=200`, {
    headers: { authorization: `Bearer ${token}` },
    cache: "no-store",
  });
  const table = document.getElementById("dead");
  if (!response.ok) {
    table.hidden = true;
    const reason = response.status === 401 ? "the token was refused"
      : response.status === 403 ? "ADMIN_TOKEN is not configured on this service"
      : await problemDetail(response);
    document.getElementById("dead-summary").textContent = "";
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
  table.hidden = rows.length === 0;
  document.getElementById("dead-summary").textContent = rows.length === 0
    ? "No dead letters."
    : `${rows.length} dead letter(s)${page.nextCursor ? ", the oldest 200 shown" : ""}.`;
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  token = document.getElementById("token").value.trim();
  setStatus("");
  refreshDead();
});

function tick() {
  refreshStats();
  refreshDead();
}
tick();
setInterval(tick, REFRESH_MS);
