// A task's page: renders /api/task/<id> (the id is this page's own address after /task/),
// again every 2 s. Every value is set as text, never as HTML. <body data-state="..."> says
// the state rendered last ("unknown" for an id no file holds, "error" for a refused one).
"use strict";

const REFRESH_MS = 2000;
const taskId = decodeURIComponent(location.pathname.slice("/task/".length));

//: The details shown, in order, with their labels.
const DETAILS = [
  ["state", "state"], ["task_type", "type"], ["shard", "shard"], ["attempts", "attempts"],
  ["runs", "runs"], ["max_retries", "max retries"], ["last_error", "last error"],
  ["enqueued_at", "enqueued"], ["started_at", "started"], ["finished_at", "finished"],
  ["outcome", "outcome"], ["cron", "cron"], ["stale_records", "stale records"],
];

function showError(text) {
  const p = document.getElementById("error");
  p.textContent = text || "";
  p.hidden = !text;
}

function renderDetails(report) {
  const rows = [];
  for (const [key, label] of DETAILS) {
    let value = report[key];
    if (key === "shard" && value !== null) value = `shard-${value}`;
    rows.push([label, value, key]);
  }
  if (report.has_result) rows.push(["result", JSON.stringify(report.result), "result"]);
  if (report.waiting_in_inbox) {
    rows.push(["inbox", "its shard's owner has not taken it in yet", "inbox"]);
  }
  document.querySelector("#details tbody").replaceChildren(...rows.map(([label, value, key]) => {
    const tr = document.createElement("tr");
    tr.dataset.key = key;
    const th = document.createElement("th");
    th.textContent = label;
    let cls = key === "last_error" ? "error-text" : "";
    if (key === "state") cls = `status ${value}`;
    tr.append(th, cell(value, cls));
    return tr;
  }));
}

function renderStory(steps) {
  const body = document.querySelector("#story tbody");
  if (steps.length === 0) {
    const tr = document.createElement("tr");
    const td = cell("no record of this task", "empty");
    td.colSpan = 9;
    tr.append(td);
    body.replaceChildren(tr);
    return;
  }
  body.replaceChildren(...steps.map((s, i) => {
    const tr = document.createElement("tr");
    tr.dataset.kind = s.kind;
    if (s.stale !== null) tr.classList.add("stale");
    let what = s.note;
    if (s.error && !what.includes(s.error)) what += `: ${s.error}`;
    if (s.stale !== null) what += ` (stale: ${s.stale})`;
    const step = cell(s.stale !== null ? `${s.kind} (stale)` : s.kind, `step ${s.kind}`);
    tr.append(
      cell(i + 1, "num"), cell(s.at, "nowrap"), step, cell(`shard-${s.shard}`, "nowrap"),
      cell(s.source === "log" ? "log" : `inbox/${s.source}`, "nowrap"), cell(s.node),
      cell(s.epoch, "num"), cell(s.attempt, "num"), cell(what, "what"),
    );
    return tr;
  }));
}

async function load() {
  let response;
  try {
    response = await fetch(`/api/task/${encodeURIComponent(taskId)}`,
      { credentials: "same-origin", cache: "no-store" });
  } catch (err) {
    showError(String(err));
    return;
  }
  const report = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  document.getElementById("updated").textContent = `as of ${new Date().toISOString()}`;
  if (response.status === 404) {
    showError(`No task ${JSON.stringify(taskId)} in this queue: no shard's log or inbox holds it.`);
  } else if (!response.ok) {
    showError(report.error || `HTTP ${response.status}`);
    document.body.dataset.state = "error";
    return;
  } else {
    showError((report.errors || []).join("; "));
  }
  renderDetails(report);
  renderStory(report.story || []);
  document.body.dataset.state = report.state;
}

document.getElementById("task-title").textContent = `task ${taskId}`;
document.title = `snerd task ${taskId}`;
load();
setInterval(load, REFRESH_MS);
