// The snerd dashboard page: renders /api/snapshot, then follows /ws (falling back to polling
// /api/snapshot every 2 s while the WebSocket is down). Every value is set as text, never as
// HTML. <body data-version="N" data-source="ws|http"> says what was rendered last and how it
// arrived.
"use strict";

const TOTALS = ["live", "waiting", "delayed", "retrying", "in_flight", "completed", "dead_letters"];
const POLL_MS = 2000;
const RECONNECT_MS = 5000;

let statusFilter = "";
let socket = null;
let pollTimer = null;

function cell(text, cls) {
  const td = document.createElement("td");
  if (text === null || text === undefined) {
    td.textContent = "-";
    td.className = cls === "num" ? "num none" : "none";
  } else {
    td.textContent = String(text);
    if (cls) td.className = cls;
  }
  return td;
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
    return [taskCell(t.id), cell(t.type), status, cell(`shard-${t.shard}`),
      cell(t.retry_count, "num"), cell(when), cell(t.error, "error-text")];
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
    cell(d.error || "(no error recorded)", "error-text"),
  ], "no dead letters");
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

poll().then(connect);
