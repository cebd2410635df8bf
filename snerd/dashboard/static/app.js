// The snerd dashboard page: renders /api/snapshot, then follows /ws (falling back to polling
// /api/snapshot every 2 s while the WebSocket is down). Every value is set as text, never as
// HTML. <body data-version="N" data-source="ws|http"> says what was rendered last and how it
// arrived. The buttons (retry, cancel, pause, resume; on the dead letters, "retry all" of a
// type and "Purge dead letters", which asks for a confirmation first) POST to
// /api/act/<action> with the session's CSRF token from /api/session; a read-only dashboard
// shows none.
"use strict";

const TOTALS = ["live", "waiting", "delayed", "retrying", "in_flight", "completed", "dead_letters"];
const POLL_MS = 2000;
const RECONNECT_MS = 5000;

let statusFilter = "";
let socket = null;
let pollTimer = null;
// The session's CSRF token and whether writes are refused (from /api/session).
let session = { csrf: null, read_only: true };
const LIVE = new Set(["waiting", "delayed", "retrying", "in_flight"]);

function button(action, label, field, value, shard) {
  const td = document.createElement("td");
  if (session.read_only) return td;
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.dataset.action = action;
  b.dataset.field = field;
  b.dataset.value = value === null ? "" : value;
  b.dataset.whole = value === null ? "1" : "";
  if (shard !== undefined) b.dataset.shard = String(shard);
  td.append(b);
  return td;
}

async function act(b) {
  const body = { [b.dataset.field]: b.dataset.whole ? null : b.dataset.value };
  if (b.dataset.shard !== undefined) body.shard = Number(b.dataset.shard);
  await send(b.dataset.action, body, b);
}

// "Purge dead letters": the type, and a day (if one is given) or an age; confirmed first.
async function purge(b) {
  const type = document.getElementById("purge-type").value;
  const day = document.getElementById("purge-before").value;
  const age = document.getElementById("purge-age");
  const body = { task_type: type || null };
  let when = "of any age";
  if (day) {
    body.before = day;
    when = `that finished before ${day}`;
  } else if (age.value !== "any") {
    body.older_than_s = Number(age.value);
    when = `older than ${age.selectedOptions[0].textContent}`;
  }
  const what = type ? `of type ${type}` : "of every type";
  if (!window.confirm(`Purge the dead letters and cancelled tasks ${what} ${when}? ` +
                      "They are forgotten for good.")) return;
  await send("purge", body, b);
}

async function send(action, body, b) {
  const out = document.getElementById("action-result");
  b.disabled = true;
  try {
    const response = await fetch(`/api/act/${action}`, {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", "x-csrf-token": session.csrf || "" },
      body: JSON.stringify(body),
    });
    const answer = await response.json();
    out.textContent = response.ok ? describe(answer) : `refused: ${answer.error}`;
    out.dataset.state = response.ok ? "ok" : "refused";
  } catch (err) {
    out.textContent = String(err);
    out.dataset.state = "refused";
  } finally {
    b.disabled = false;
    poll();
  }
}

function describe(a) {
  const pending = (a.pending_shards || a.pending || []);
  const later = pending.length ? `; pending on ${pending.join(", ")}` : "";
  if (a.action === "purged" || a.action === "requeued") {
    const what = a.task_type === null ? "" : ` of type ${a.task_type}`;
    const done = a.action === "purged" ? `purged ${a.count} task(s)`
      : `put back ${a.count} dead letter(s)`;
    return `${done}${what}${later}`;
  }
  if (a.action === "paused") {
    const what = a.task_type === null ? "the whole queue" : `type ${a.task_type}`;
    return `${what} ${a.paused ? "paused" : "resumed"}${later}`;
  }
  const done = a.action === "cancelled" ? a.cancelled : a.retried;
  return `${a.task_id}: ${done ? a.action : `not ${a.action}`} (found ${a.found})${later}`;
}

document.addEventListener("click", (event) => {
  const b = event.target.closest("button[data-action]");
  if (b) act(b);
});
document.getElementById("purge-button").addEventListener("click", (event) => purge(event.target));

function option(value, text) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  return o;
}

// The types of the dead letters shown, each with a "retry all"; and the purge's type choice.
function renderDeadTypes(dead) {
  const counts = new Map();
  for (const d of dead) counts.set(d.type, (counts.get(d.type) || 0) + 1);
  const types = [...counts.keys()].sort();
  fill("dead-types", types, (t) => [cell(t), cell(counts.get(t), "num"),
    button("retry_dead", "retry all", "task_type", t)], "no dead letters");
  const select = document.getElementById("purge-type");
  if (!select) return;  // (read-only: the purge controls are gone)
  const chosen = select.value;
  select.replaceChildren(option("", "all types"), ...types.map((t) => option(t, t)));
  select.value = chosen;
  if (select.value !== chosen) select.value = "";
}

function renderTypes(stats) {
  const paused = new Map((stats.paused || []).map((p) => [p.task_type, p]));
  const types = new Set([...Object.keys((stats.totals || {}).types || {})]);
  for (const p of stats.paused || []) if (p.task_type !== null) types.add(p.task_type);
  const rows = [null, ...[...types].sort()];
  fill("types", rows, (t) => {
    const p = paused.get(t);
    const state = p ? (p.everywhere ? "paused" : `paused on ${p.shards.join(", ")}`) : "running";
    const action = p ? "resume" : "pause";
    return [cell(t === null ? "(whole queue)" : t), cell(state, `state ${p ? "paused" : "running"}`),
      button(action, action, "task_type", t)];
  }, "no task types");
}

// A task id as a link to its page (/task/<id>); the id is the link's text, never HTML.
function taskCell(id) {
  const td = document.createElement("td");
  const a = document.createElement("a");
  a.href = `/task/${encodeURIComponent(id)}`;
  a.textContent = String(id);
  a.className = "task-link";
  td.append(a);
  return td;
}

function fill(table, rows, cells, empty) {
  const body = document.querySelector(`#${table} tbody`);
  if (rows.length === 0) {
    const tr = document.createElement("tr");
    const td = cell(empty, "empty");
    td.colSpan = document.querySelectorAll(`#${table} thead th`).length;
    tr.append(td);
    body.replaceChildren(tr);
    return;
  }
  body.replaceChildren(...rows.map((row) => {
    const tr = document.createElement("tr");
    tr.append(...cells(row));
    return tr;
  }));
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

function renderTasks(rows) {
  fill("tasks", rows, (t) => {
    const when = t.finished_at || t.next_run;
    const status = cell(t.status.replace("_", " "), `status ${t.status}`);
    let control = document.createElement("td");
    if (LIVE.has(t.status)) control = button("cancel", "cancel", "task_id", t.id);
    if (t.status === "dead_letter" || t.status === "cancelled") {
      control = button("retry", "retry", "task_id", t.id, t.shard);
    }
    return [taskCell(t.id), cell(t.type), status, cell(`shard-${t.shard}`),
      cell(t.retry_count, "num"), cell(when), cell(t.error, "error-text"), control];
  }, statusFilter ? `no ${statusFilter.replace("_", " ")} tasks` : "no tasks");
}

async function getJSON(path) {
  const response = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function loadFilteredTasks() {
  if (!statusFilter) return;
  try {
    renderTasks(await getJSON(`/api/tasks?status=${encodeURIComponent(statusFilter)}`));
  } catch (err) {
    showError(String(err));
  }
}

function showError(text) {
  const p = document.getElementById("error");
  p.textContent = text || "";
  p.hidden = !text;
}

function render(snap, source) {
  const stats = snap.stats || {};
  showError(snap.error || stats.error || "");
  document.getElementById("queue").textContent =
    `${stats.queue || ""} in ${snap.directory} (${stats.shards ?? "?"} ` +
    `${stats.shards === 1 ? "shard" : "shards"})`;
  document.getElementById("updated").textContent = `as of ${snap.at}`;
  const totals = stats.totals || {};
  for (const key of TOTALS) {
    document.getElementById(`n-${key}`).textContent = totals[key] ?? "-";
  }
  document.getElementById("n-dead_letters").parentElement
    .classList.toggle("bad", (totals.dead_letters || 0) > 0);
  fill("shards", stats.per_shard || [], (s) => [
    cell(s.shard), cell(s.owner_text), cell(s.epoch, "num"), cell(s.live, "num"),
    cell(s.in_flight, "num"), cell(s.completed, "num"), cell(s.dead_letters, "num"),
    cell(s.log_exists ? bytes(s.log_bytes) : "-", "num"), cell(s.corrupt_lines, "num"),
  ], "no shards");
  fill("daemons", snap.daemons || [], (d) => [
    cell(d.node), cell(d.beat, "num"),
    cell(d.seen_ago_s === null ? d.seen : `${d.seen_ago_s} s ago`),
    cell(d.shards.join(", ") || "none"), cell(d.types ? d.types.join(", ") || "none" : "-"),
  ], "no daemon has a heartbeat in membership.json");
  if (statusFilter) {
    loadFilteredTasks();
  } else {
    renderTasks(snap.tasks || []);
  }
  fill("dead", snap.dead_letters || [], (d) => [
    taskCell(d.id), cell(d.type), cell(d.attempts, "num"), cell(d.at), cell(`shard-${d.shard}`),
    cell(d.error || "(no error recorded)", "error-text"), button("retry", "retry", "task_id", d.id, d.shard),
  ], "no dead letters");
  renderDeadTypes(snap.dead_letters || []);
  renderTypes(stats);
  // Progress messages: only a dashboard an SDK serves sees them (newest first).
  const section = document.getElementById("progress-section");
  section.hidden = !Array.isArray(snap.progress);
  if (Array.isArray(snap.progress)) {
    const list = document.getElementById("progress");
    list.replaceChildren(...snap.progress.slice().reverse().map((p) => {
      const li = document.createElement("li");
      li.textContent = `${p.at}  ${p.task_id}  ${JSON.stringify(p.data)}`;
      return li;
    }));
  }
  document.body.dataset.version = String(snap.version);
  document.body.dataset.source = source;
}

function setConnection(text) {
  const span = document.getElementById("connection");
  span.textContent = text;
  span.dataset.state = text;
}

async function poll() {
  try {
    render(await getJSON("/api/snapshot"), "http");
    if (!socket || socket.readyState !== WebSocket.OPEN) setConnection("polling");
  } catch (err) {
    setConnection("offline");
    showError(String(err));
  }
}

function startPolling() {
  if (pollTimer === null) pollTimer = setInterval(poll, POLL_MS);
}

function stopPolling() {
  if (pollTimer !== null) clearInterval(pollTimer);
  pollTimer = null;
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss://" : "ws://";
  socket = new WebSocket(`${scheme}${location.host}/ws`);
  socket.onopen = () => { setConnection("live"); stopPolling(); };
  socket.onmessage = (event) => render(JSON.parse(event.data), "ws");
  socket.onclose = () => {
    socket = null;
    setConnection("polling");
    startPolling();
    setTimeout(connect, RECONNECT_MS);
  };
}

document.getElementById("status-filter").addEventListener("change", (event) => {
  statusFilter = event.target.value;
  poll();
});

async function start() {
  try {
    session = await getJSON("/api/session");
  } catch (err) {
    showError(String(err));
  }
  document.body.dataset.readOnly = String(session.read_only);
  const tools = document.getElementById("dead-tools");
  if (session.read_only) tools.remove(); else tools.hidden = false;
  await poll();
  connect();
}

start();
