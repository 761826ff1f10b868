// The operator page: workers and their slots, the queue, live sessions, recordings.
// Reads GET /v1/admin/overview (and /health), sending the admin token when one is given.

import { Player } from "./audio.js";
import { clock } from "./messages.js";

const $ = (id) => document.getElementById(id);
const REFRESH_MS = 2000;
let player = null;
let timer = null;

function headers() {
  const token = $("admin-token").value.trim();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

function notice(text) {
  $("notice").textContent = text;
  $("notice").dataset.kind = "error";
  $("notice").hidden = !text;
}

function cell(row, text, attrs = {}) {
  const td = document.createElement("td");
  td.textContent = text;
  Object.assign(td.dataset, attrs);
  row.append(td);
  return td;
}

function fill(tbody, items, render, empty) {
  const rows = items.map((item) => {
    const tr = document.createElement("tr");
    render(tr, item);
    return tr;
  });
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell(tr, empty);
    td.colSpan = 5;
    td.className = "muted";
    rows.push(tr);
  }
  tbody.replaceChildren(...rows);
}

function renderWorkers(workers) {
  fill(
    $("workers"),
    workers,
    (tr, w) => {
      cell(tr, w.worker_id);
      cell(tr, w.backend?.label || w.backend?.backend || w.backend || "—");
      cell(tr, w.host ? `${w.host} / ${w.pid}` : "—");
      cell(tr, w.alive ? "yes" : "no");
      const td = cell(tr, "");
      for (const s of w.slot_states || []) {
        const chip = document.createElement("span");
        chip.className = "slot";
        chip.dataset.state = s.state;
        chip.textContent = s.holder ? `${s.state}: ${s.holder}` : s.state;
        chip.title = s.slot_id;
        td.append(chip, " ");
      }
    },
    "No worker has registered.",
  );
}

function renderQueue(q) {
  $("queue-length").textContent = String(q.length);
  $("queue-here").textContent = String(q.waiting_here);
  $("live-slots").textContent = String(q.live_slots);
  $("mean-hold").textContent = String(q.mean_hold_s);
  fill(
    $("tickets"),
    q.tickets,
    (tr, t) => {
      cell(tr, String(t.position));
      cell(tr, t.ticket_id);
      cell(tr, `${t.estimated_wait_s} s`);
    },
    "Nobody is waiting.",
  );
}

function renderSessions(sessions) {
  fill(
    $("sessions"),
    sessions,
    (tr, s) => {
      cell(tr, s.session_id);
      cell(tr, s.mode || "—");
      cell(tr, s.state || "—");
      cell(tr, `${clock(s.elapsed_s)} / ${clock(s.limit_s)}`);
      cell(tr, s.slot_id || "—");
    },
    "No session on this gateway.",
  );
}

function renderRecordings(rec) {
  $("recordings-off").hidden = rec.enabled;
  fill(
    $("recordings"),
    rec.items,
    (tr, r) => {
      const td = cell(tr, "");
      const b = document.createElement("button");
      b.type = "button";
      b.className = "link";
      b.textContent = r.id;
      b.addEventListener("click", () => openRecording(r.id));
      td.append(b);
      cell(tr, r.mode || "—");
      cell(tr, new Date(r.started_at * 1000).toLocaleString());
      cell(tr, r.durations ? clock(r.durations.total_s) : "—");
      cell(tr, r.close_reason || "—");
      cell(tr, `${Math.round((r.bytes || 0) / 1024)} KiB`);
    },
    rec.enabled ? "No recording yet." : "—",
  );
}

function renderCounters(counters) {
  fill(
    $("counters"),
    Object.entries(counters),
    (tr, [name, value]) => {
      cell(tr, name);
      cell(tr, String(value));
    },
    "—",
  );
}

// A recording (GET /v1/recordings/{id}): its metadata and transcript, and its output.wav played
// back (16-bit PCM at 24 kHz after the 44-byte header the gateway writes).
async function openRecording(id) {
  const path = `/v1/recordings/${encodeURIComponent(id)}`;
  const r = await fetch(path, { headers: headers() });
  if (!r.ok) return notice(`Recording ${id} could not be read (HTTP ${r.status}).`);
  const rec = await r.json();
  const t = await fetch(`${path}/files/transcript.txt`, { headers: headers() });
  const transcript = t.ok ? await t.text() : "";
  const files = rec.files.map((f) => f.name).join(", ");
  $("recording").hidden = false;
  $("recording-title").textContent = id;
  $("recording-body").textContent =
    `${transcript || "(no text)"}\n\nfiles: ${files}\n\n${JSON.stringify(rec.meta, null, 2)}`;
  const zip = $("recording-zip");
  zip.hidden = false;
  zip.onclick = () => download(`${path}.zip`, `${id}.zip`);
  const play = $("recording-play");
  play.hidden = !rec.meta.output?.audio_samples;
  play.onclick = async () => {
    const w = await fetch(`${path}/files/output.wav`, { headers: headers() });
    if (!w.ok) return notice(`output.wav of ${id} could not be read (HTTP ${w.status}).`);
    const pcm16 = new Int16Array((await w.arrayBuffer()).slice(44));
    const samples = Float32Array.from(pcm16, (v) => v / 32768);
    player ??= new Player();
    await player.start();
    player.flush();
    player.push(samples);
  };
}

// The zip needs the admin header, so it is fetched here and handed to the browser as a blob.
async function download(url, name) {
  const r = await fetch(url, { headers: headers() });
  if (!r.ok) return notice(`${name} could not be downloaded (HTTP ${r.status}).`);
  const a = document.createElement("a");
  a.href = URL.createObjectURL(await r.blob());
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
}

async function refresh() {
  try {
    const h = await fetch("/health", { cache: "no-store" });
    const health = await h.json();
    $("health").textContent = health.status;
    $("version").textContent = health.version ? `v${health.version}` : "";
  } catch {
    $("health").textContent = "unreachable";
  }
  let r;
  try {
    r = await fetch("/v1/admin/overview", { headers: headers(), cache: "no-store" });
  } catch {
    return notice("The gateway cannot be reached.");
  }
  if (r.status === 401) {
    return notice("This gateway requires the admin token. Enter it above.");
  }
  if (r.status === 403) {
    return notice(
      "This gateway has no admin token configured (OMNISERVE_ADMIN_TOKEN) and is not bound to " +
        "loopback, so its operator endpoints are off.",
    );
  }
  if (!r.ok) return notice(`The gateway answered HTTP ${r.status}.`);
  notice("");
  const o = await r.json();
  $("gateway-id").textContent = o.gateway.gateway_id;
  $("uptime").textContent = clock(o.gateway.uptime_s);
  renderWorkers(o.workers);
  renderQueue(o.queue);
  renderSessions(o.sessions);
  renderRecordings(o.recordings);
  renderCounters(o.counters);
  $("updated").textContent = new Date().toLocaleTimeString();
  document.body.dataset.loaded = "true";
}

function schedule() {
  clearInterval(timer);
  if ($("auto").checked) timer = setInterval(refresh, REFRESH_MS);
}

$("admin-token").value = sessionStorage.getItem("omniserve.admin-token") || "";
$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("omniserve.admin-token", $("admin-token").value.trim());
  refresh();
});
$("refresh").addEventListener("click", refresh);
$("auto").addEventListener("change", schedule);
schedule();
refresh();
