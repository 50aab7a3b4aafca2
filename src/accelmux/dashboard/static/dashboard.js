// accelmux dashboard: plain JavaScript, no build step, nothing fetched from outside.
// Reads /admin/status (every second), /admin/events (server-sent decisions),
// /admin/history (memory timeline), /admin/explain/{id} and /v1/jobs.
"use strict";

const POLL_MS = 1000;
const HISTORY_MS = 2000;
const JOBS_MS = 3000;
const MAX_DECISIONS = 300;
const KEY_STORE = "accelmux.adminKey";
const PALETTE = ["#4f8cff", "#f2a93b", "#3fc98a", "#e5534b", "#a371f7", "#2fb9c9",
  "#e46fbd", "#c9b037", "#7d8cff", "#6fcf5a", "#ff8a5c", "#5ad1b0"];
const CATEGORIES = ["weights", "runtime", "kv", "active", "reserved", "leftover"];
const CATEGORY_NAMES = { weights: "weights", runtime: "runtime", kv: "KV cache",
  active: "active (in-flight leases)", reserved: "reserved (allocator cache)",
  leftover: "leftover (measured, not loaded)" };
const REFUSALS = new Set(["reject", "fail", "enqueue", "preempt"]);
const MEMORY_ACTIONS = new Set(["load", "unload", "resize", "preempt"]);

const state = {
  status: null,
  statusAt: 0,            // Date.now() when the last status arrived
  clockOffset: null,      // wall seconds minus manager seconds
  decisions: new Map(),   // key -> decision record
  history: null,
  historySince: null,
  jobs: null,
  jobsError: null,
  range: null,            // timeline range in seconds (null: automatic)
  filter: "all",
  selected: null,         // request id shown in the explanation panel
  sse: "closed",
  colors: new Map(),
  charts: {},             // device -> what its timeline chart drew (for the hover readout)
};

const $ = (sel) => document.querySelector(sel);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

function isLoopback() {
  const h = location.hostname;
  return h === "localhost" || h === "::1" || h === "[::1]" || /^127\./.test(h);
}

function adminKey() { return sessionStorage.getItem(KEY_STORE) || ""; }

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = adminKey();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

class HttpError extends Error {
  constructor(status, message, body) { super(message); this.status = status; this.body = body; }
}

async function api(path, opts) {
  const init = Object.assign({ cache: "no-store" }, opts || {});
  init.headers = headers(init.headers);
  const resp = await fetch(path, init);
  let body = null;
  const text = await resp.text();
  try { body = text ? JSON.parse(text) : null; } catch (e) { body = text; }
  if (!resp.ok) {
    const msg = body && body.error ? body.error.message : resp.status + " " + resp.statusText;
    if (resp.status === 401 || resp.status === 403) showKeyForm(true);
    throw new HttpError(resp.status, msg, body);
  }
  return body;
}

// ---- formatting ---------------------------------------------------------------------
function bytes(n) {
  if (n === null || n === undefined) return "–";
  const neg = n < 0;
  let v = Math.abs(n);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  const s = i === 0 ? String(Math.round(v)) : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  return (neg ? "−" : "") + s.replace(/\.0+$/, "").replace(/(\.\d*?)0+$/, "$1") + " " + units[i];
}

function duration(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  const h = Math.floor(s / 3600);
  return h + "h " + Math.floor((s % 3600) / 60) + "m";
}

function clockTime(wall) {
  const d = new Date(wall * 1000);
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(Math.floor(d.getMilliseconds() / 100));
}

function hhmm(secondsOfDay) {
  const s = ((secondsOfDay % 86400) + 86400) % 86400;
  return String(Math.floor(s / 3600)).padStart(2, "0") + ":" + String(Math.floor((s % 3600) / 60)).padStart(2, "0");
}

function color(name) {
  if (!state.colors.has(name)) state.colors.set(name, PALETTE[state.colors.size % PALETTE.length]);
  return state.colors.get(name);
}

function ledgerTotal(svc) {
  return CATEGORIES.reduce((acc, c) => acc + (svc.ledger[c] || 0), 0);
}

// ---- small DOM utilities ------------------------------------------------------------
const rendered = new Map();
function setHTML(el, html) {
  if (rendered.get(el) === html) return;
  rendered.set(el, html);
  el.innerHTML = html;
}

function toast(message, isError) {
  const el = $("#toast");
  el.textContent = message;
  el.className = "toast" + (isError ? " err" : "");
  el.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { el.hidden = true; }, 4000);
}

function showKeyForm(needed) {
  const form = $("#key-form");
  if (needed || !isLoopback()) form.hidden = false;
}

function setConn() {
  const el = $("#conn");
  const fresh = state.status && Date.now() - state.statusAt < 3500;
  el.className = "conn " + (fresh ? "on" : "off");
  el.textContent = fresh ? (state.sse === "open" ? "live" : "polling") : "offline";
  el.title = "status " + (fresh ? "fresh" : "stale") + ", decision stream " + state.sse;
}

function banner(message) {
  const el = $("#banner");
  el.hidden = !message;
  el.textContent = message || "";
}

// ---- status ---------------------------------------------------------------------------
async function pollStatus() {
  try {
    const st = await api("/admin/status");
    state.status = st;
    state.statusAt = Date.now();
    state.clockOffset = Date.now() / 1000 - st.time;
    for (const d of st.decisions || []) addDecision(d);
    banner(null);
    render();
  } catch (e) {
    banner(e.status === 401 || e.status === 403
      ? "The admin API refused the request (" + e.message + "). Enter the admin key above."
      : "Cannot read /admin/status: " + e.message);
  }
  setConn();
}

function render() {
  const st = state.status;
  if (!st) return;
  renderServer(st);
  renderDevices(st);
  renderServices(st);
  renderDecisions();
  renderWindows(st);
}

function renderServer(st) {
  const s = st.server || {};
  const parts = [];
  if (s.version) parts.push("v<b>" + esc(s.version) + "</b>");
  if (s.policy) parts.push("policy <b>" + esc(s.policy) + "</b>");
  if (s.uptime_s !== undefined) parts.push("up <b>" + duration(s.uptime_s) + "</b>");
  if (s.open_requests !== undefined) parts.push("<b>" + s.open_requests + "</b> open requests");
  if (s.stopping) parts.push('<b class="hot">stopping</b>');
  setHTML($("#server"), parts.join(" · "));
  const q = Object.entries(st.queues || {}).map(([cls, n]) =>
    '<span class="chip' + (n > 0 ? " hot" : "") + '">' + esc(cls) + " <b>" + n + "</b></span>");
  const met = Object.entries(st.slo_classes || {}).map(([cls, m]) =>
    '<span class="chip' + (m.attainment !== null && m.attainment < 0.9 ? " hot" : "") + '" title="' +
    m.met + " of " + m.requests + ' requests met their objectives">' + esc(cls) + " <b>" + percent(m.attainment) + "</b></span>");
  setHTML($("#queues"), (q.length ? '<span class="muted">queued</span> ' + q.join(" ") : "") +
    (met.length ? ' <span class="muted">objectives met</span> <span class="slo-classes">' + met.join(" ") + "</span>" : ""));
}

function percent(share) {
  return share === null || share === undefined ? "–" : Math.round(100 * share) + "%";
}

function renderDevices(st) {
  const out = [];
  for (const dev of st.devices) {
    const services = st.services.filter((s) => s.device === dev.name);
    const budget = dev.budget_bytes;
    const committed = dev.committed_bytes;
    const foreign = dev.foreign_bytes;
    const headroom = dev.headroom_bytes;
    const free = Math.max(0, dev.available_bytes);
    const outside = Math.max(0, dev.capacity_bytes - budget);
    const extra = (dev.overhead_bytes || 0) + (dev.parked_bytes || 0);
    const total = Math.max(dev.capacity_bytes, committed + extra + foreign + headroom + free + outside, 1);
    const segs = [];
    const seg = (cls, n, title, label, c) => {
      if (n <= 0) return;
      const pct = (100 * n) / total;
      const style = "width:" + pct.toFixed(3) + "%" + (c ? ";--c:" + c : "");
      const lbl = label && pct > 7 ? '<span class="lbl">' + esc(label) + "</span>" : "";
      segs.push('<div class="seg ' + cls + '" style="' + style + '" title="' + esc(title) + '">' + lbl + "</div>");
    };
    for (const s of services) {
      const c = color(s.name);
      let first = true;
      for (const cat of CATEGORIES) {
        const n = s.ledger[cat] || 0;
        if (n <= 0) continue;
        seg("cat-" + cat, n, s.name + " · " + CATEGORY_NAMES[cat] + ": " + bytes(n), first ? s.name : "", c);
        first = false;
      }
    }
    const overhead = dev.overhead_bytes || 0;
    const parked = dev.parked_bytes || 0;
    seg("overhead", overhead, "overhead (accelmux's workers beyond their services): " + bytes(overhead), "overhead");
    seg("parked", parked, "parked (host RAM the park budget holds): " + bytes(parked), "parked");
    seg("foreign", foreign, "foreign (processes outside accelmux): " + bytes(foreign), "foreign");
    seg("free", free, "free for new work: " + bytes(free), "free " + bytes(free));
    seg("headroom", headroom, "headroom kept for transient peaks: " + bytes(headroom), "headroom");
    seg("outside", outside, "outside the budget: " + bytes(outside), "outside budget");
    const measured = dev.measured && dev.measured.used_bytes !== undefined
      ? " · measured <b>" + bytes(dev.measured.used_bytes) + "</b>" : "";
    out.push(
      '<div class="device" data-device="' + esc(dev.name) + '">' +
      '<div class="device-head"><span class="name">' + esc(dev.name) + '</span><span class="facts">' +
      esc(dev.kind) + " · capacity <b>" + bytes(dev.capacity_bytes) + "</b> · budget <b>" + bytes(budget) +
      "</b> · committed <b>" + bytes(committed) + "</b> · foreign <b>" + bytes(foreign) +
      "</b> · headroom <b>" + bytes(headroom) + '</b> · available <b class="avail">' +
      bytes(dev.available_bytes) + "</b>" + measured + "</span></div>" +
      '<div class="bar">' + segs.join("") + "</div>" +
      '<div class="bar-scale"><span>0</span><span>' + bytes(total / 2) + "</span><span>" + bytes(total) + "</span></div>" +
      '<div class="why">' + diagnose(dev, services) + "</div></div>");
  }
  setHTML($("#devices"), out.join(""));
  const legendSvc = st.services.map((s) =>
    '<span><i class="sw" style="background:' + color(s.name) + '"></i>' + esc(s.name) + "</span>");
  const legendCat = CATEGORIES.map((c) =>
    '<span><i class="sw seg cat-' + c + '" style="--c:#9aa5b1"></i>' + CATEGORY_NAMES[c] + "</span>");
  legendCat.push('<span><i class="sw seg overhead"></i>overhead</span>',
    '<span><i class="sw seg parked"></i>parked</span>', '<span><i class="sw seg foreign"></i>foreign</span>',
    '<span><i class="sw seg headroom"></i>headroom</span>', '<span><i class="sw seg free"></i>free</span>');
  setHTML($("#legend"), '<div class="group">' + legendSvc.join("") + '</div><div class="sep"></div><div class="group">' + legendCat.join("") + "</div>");
}

function diagnose(dev, services) {
  const loaded = services.filter((s) => s.state === "loaded");
  const idle = loaded.filter((s) => s.inflight === 0);
  const idleBytes = idle.reduce((a, s) => a + ledgerTotal(s), 0);
  const running = services.reduce((a, s) => a + s.inflight, 0);
  const waiting = services.reduce((a, s) => a + s.waiting, 0);
  const kvUnused = services.reduce((a, s) => a + Math.max(0, s.kv_pool_bytes - s.kv_in_use_bytes), 0);
  const reserved = services.reduce((a, s) => a + (s.ledger.reserved || 0), 0);
  const active = services.reduce((a, s) => a + (s.ledger.active || 0), 0);
  const used = dev.committed_bytes + dev.foreign_bytes;
  const usable = Math.max(1, dev.budget_bytes - dev.headroom_bytes);
  const pct = Math.round((100 * used) / usable);
  const parts = [
    "<b>" + pct + "%</b> of the usable budget is held; <b>" + running + "</b> request(s) running" +
      (waiting ? ", <b class=\"hot\">" + waiting + "</b> waiting" : "") + ".",
    "<b>" + bytes(idleBytes) + "</b> sits in idle loaded services" +
      (idle.length ? " (" + idle.map((s) => esc(s.name)).join(", ") + ")" : "") + ";",
    "<b>" + bytes(kvUnused) + "</b> of KV pools is reserved but unused;",
    "<b>" + bytes(reserved) + "</b> allocator cache above estimates;",
    "<b>" + bytes(active) + "</b> in active requests;",
    "<b>" + bytes(dev.foreign_bytes) + "</b> used by other processes.",
  ];
  return parts.join(" ");
}

function meter(used, total, cls) {
  if (!total) return "";
  const pct = Math.min(100, (100 * used) / total);
  return '<span class="meter ' + (cls || "") + (pct >= 99.5 ? " full" : "") + '"><i style="width:' + pct.toFixed(1) + '%"></i></span>';
}

// The batch size the status reports for a service (``usage.batch_size``: the server's busy
// slots, else what its worker runs, else its requests in flight); null when none.
function batchSize(s) {
  return (s.usage && s.usage.batch_size) ?? null;
}

function renderServices(st) {
  const body = $("#services tbody");
  const rows = st.services.map((s) => {
    const c = color(s.name);
    const pinned = s.pinned ? '<span class="pin" title="pinned: never evicted">PIN</span>' : "";
    const kv = s.kv_pool_bytes > 0 || s.kv_ceiling_bytes > 0
      ? meter(s.kv_in_use_bytes, s.kv_pool_bytes, "kv") + bytes(s.kv_in_use_bytes) + " / " + bytes(s.kv_pool_bytes)
      : '<span class="muted">–</span>';
    const batch = batchSize(s);
    const measured = s.measured_bytes !== null && s.measured_bytes !== undefined
      ? '<div class="sub" title="measured">meas. ' + bytes(s.measured_bytes) + "</div>" : "";
    const model = s.model && s.model !== s.name ? '<span class="sub">' + esc(s.model) + "</span>" : "";
    const canLoad = s.state === "unloaded" || s.state === "crashed";
    // a pinned service is never unloaded by the API (409 service_pinned): unpin first
    const canUnload = (s.state === "loaded" || s.state === "loading") && !s.pinned;
    const unloadTitle = s.pinned ? ' title="pinned: unpin first"' : "";
    const ops = [
      '<button data-op="load" ' + (canLoad ? "" : "disabled") + ">load</button>",
      '<button data-op="unload" class="danger"' + unloadTitle + " " + (canUnload ? "" : "disabled") + ">unload</button>",
      s.pinned ? '<button data-op="unpin">unpin</button>' : '<button data-op="pin">pin</button>',
    ];
    return '<tr data-service="' + esc(s.name) + '" data-state="' + esc(s.state) + '">' +
      '<td><span class="dot" style="background:' + c + '"></span><span class="svc-name">' + esc(s.name) + "</span>" +
      (s.kind !== s.name ? '<span class="sub">' + esc(s.kind) + "</span>" : "") + model + "</td>" +
      '<td class="state"><span class="badge st-' + esc(s.state) + '">' + esc(s.state) + "</span>" + pinned + "</td>" +
      '<td class="cls-' + esc(s.class) + '">' + esc(s.class) + "</td>" +
      "<td>" + esc(s.residency) + "</td>" +
      '<td class="num mem">' + bytes(ledgerTotal(s)) + measured + "</td>" +
      '<td class="running">' + meter(s.inflight, s.concurrency) + s.inflight + " / " + s.concurrency + "</td>" +
      '<td class="num queue' + (s.waiting ? " hot" : "") + '">' + s.waiting + "</td>" +
      '<td class="kv">' + kv + "</td>" +
      '<td class="num col-batch">' + (batch === null ? '<span class="muted">–</span>' : esc(batch)) + "</td>" +
      '<td class="num switches"><span class="loads">' + s.loads + "</span> / " + s.evictions +
      ' / <span class="' + (s.thrash ? "hot" : "") + '">' + s.thrash + "</span></td>" +
      '<td class="num">' + s.cold_starts + "</td>" +
      '<td class="num' + (s.crashes ? " hot" : "") + '">' + s.crashes + "</td>" +
      '<td class="num served">' + s.served + "</td>" +
      '<td class="num slo' + (s.slo && s.slo.attainment !== null && s.slo.attainment < 0.9 ? " hot" : "") +
      '" title="' + (s.slo ? s.slo.met + " of " + s.slo.requests + " requests" : "") + '">' +
      percent(s.slo ? s.slo.attainment : null) + "</td>" +
      '<td><div class="actions">' + ops.join("") + "</div></td></tr>";
  });
  setHTML(body, rows.join(""));
  // batch size shows only when the daemon reports one for some service
  const anyBatch = st.services.some((s) => batchSize(s) !== null);
  $("#services").classList.toggle("no-batch", !anyBatch);
}

// ---- decisions ------------------------------------------------------------------------
function decisionKey(d) {
  return [d.t, d.action, d.service || "", d.request_id || "", d.reason || "", d.attempt ?? ""].join("|");
}

function addDecision(d) {
  const key = decisionKey(d);
  if (state.decisions.has(key)) return false;
  state.decisions.set(key, d);
  if (state.decisions.size > MAX_DECISIONS) {
    const sorted = [...state.decisions.entries()].sort((a, b) => a[1].t - b[1].t);
    for (const [k] of sorted.slice(0, state.decisions.size - MAX_DECISIONS)) state.decisions.delete(k);
  }
  return true;
}

function visible(d) {
  if (state.filter === "refusals") return REFUSALS.has(d.action);
  if (state.filter === "memory") return MEMORY_ACTIONS.has(d.action);
  return true;
}

function renderDecisions() {
  const list = [...state.decisions.values()].filter(visible).sort((a, b) => b.t - a.t).slice(0, 150);
  const rows = list.map((d) => {
    const wall = state.clockOffset === null ? null : d.t + state.clockOffset;
    const rid = d.request_id || "";
    const cls = (rid ? "clickable" : "") + (rid && rid === state.selected ? " sel" : "");
    const extra = [];
    if (d.retry_after_s) extra.push("retry after " + d.retry_after_s + "s");
    if (d.lease_bytes) extra.push("lease " + bytes(d.lease_bytes));
    if (d.kv_pool_bytes) extra.push("KV pool " + bytes(d.kv_pool_bytes));
    const detail = [d.detail || "", extra.join(", ")].filter(Boolean).join(" · ");
    return '<tr class="' + cls + '" data-rid="' + esc(rid) + '" data-action="' + esc(d.action) + '" data-reason="' + esc(d.reason || "") + '">' +
      '<td class="time">' + (wall === null ? d.t.toFixed(2) : clockTime(wall)) + "</td>" +
      '<td><span class="act act-' + esc(d.action) + '">' + esc(d.action) + "</span></td>" +
      "<td>" + esc(d.service || "") + "</td>" +
      '<td class="reason">' + esc(d.reason || "") + "</td>" +
      '<td class="rid">' + esc(rid) + "</td>" +
      '<td class="detail">' + esc(detail) + "</td></tr>";
  });
  setHTML($("#decisions tbody"), rows.length ? rows.join("")
    : '<tr><td colspan="6" class="muted">No decisions yet.</td></tr>');
}

async function explain(rid) {
  state.selected = rid;
  renderDecisions();
  const box = $("#explain");
  const ds = [...state.decisions.values()].filter((d) => d.request_id === rid).sort((a, b) => a.t - b.t);
  const last = ds[ds.length - 1];
  box.innerHTML = '<p class="muted">Loading the explanation of ' + esc(rid) + "…</p>";
  let lines = null;
  let error = null;
  try {
    const out = await api("/admin/explain/" + encodeURIComponent(rid));
    lines = out.lines || [];
  } catch (e) {
    error = e.status === 404 ? "The daemon keeps no record of this request any more." : e.message;
  }
  if (state.selected !== rid) return;
  let verdict = "";
  if (last) {
    const wait = last.action === "enqueue";
    verdict = '<div class="verdict' + (wait ? " wait" : "") + '"><span class="act act-' + esc(last.action) + '">' +
      esc(last.action) + "</span> <b>" + esc(last.reason || "") + "</b>" +
      (last.service ? " on " + esc(last.service) : "") +
      (last.detail ? '<div class="muted">' + esc(last.detail) + "</div>" : "") +
      (last.retry_after_s ? '<div class="muted">retry after ' + esc(last.retry_after_s) + " s</div>" : "") + "</div>";
  }
  const story = error ? '<p class="muted">' + esc(error) + "</p>"
    : "<ol>" + lines.map((l) => "<li>" + esc(l) + "</li>").join("") + "</ol>";
  box.innerHTML = '<h3 class="mono">' + esc(rid) + "</h3>" + verdict + story;
}

function connectEvents() {
  // fetch() rather than EventSource: EventSource cannot send the admin key.
  const ctrl = new AbortController();
  let retry = 1000;
  const open = async () => {
    try {
      const resp = await fetch("/admin/events", { headers: headers(), signal: ctrl.signal, cache: "no-store" });
      if (!resp.ok || !resp.body) throw new Error("HTTP " + resp.status);
      state.sse = "open";
      retry = 1000;
      setConn();
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const chunk = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          handleEvent(chunk);
        }
      }
    } catch (e) {
      if (ctrl.signal.aborted) return;
    }
    state.sse = "closed";
    setConn();
    setTimeout(open, retry);
    retry = Math.min(retry * 2, 15000);
  };
  open();
  window.addEventListener("pagehide", () => ctrl.abort());
}

function handleEvent(chunk) {
  let type = "message";
  const data = [];
  for (const line of chunk.split("\n")) {
    if (line.startsWith(":")) continue;
    if (line.startsWith("event:")) type = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  if (type !== "decision" || !data.length) return;
  try {
    if (addDecision(JSON.parse(data.join("\n")))) scheduleLogRender();
  } catch (e) { /* a malformed record is skipped */ }
}

function scheduleLogRender() {
  if (scheduleLogRender.pending) return;
  scheduleLogRender.pending = true;
  requestAnimationFrame(() => { scheduleLogRender.pending = false; renderDecisions(); });
}

// ---- history / timeline ---------------------------------------------------------------
async function pollHistory() {
  try {
    const q = state.historySince === null ? "" : "?since=" + state.historySince;
    const h = await api("/admin/history" + q);
    if (state.history === null || state.historySince === null) {
      state.history = h;
    } else {
      state.history.devices = h.devices;
      state.history.service_device = h.service_device;
      state.history.now = h.now;
      state.history.samples.push(...h.samples);
      const cutoff = h.now - h.window_s;
      while (state.history.samples.length && state.history.samples[0].t < cutoff) state.history.samples.shift();
    }
    const n = state.history.samples.length;
    if (n) state.historySince = state.history.samples[n - 1].t;
    renderTimeline();
  } catch (e) {
    if (e.status === 404) {
      setHTML($("#timeline"), '<p class="muted">This daemon serves no memory history (/admin/history).</p>');
      return;
    }
  }
}

function pickRange(h) {
  if (state.range) return state.range;
  const span = h.samples.length ? h.now - h.samples[0].t : 0;
  for (const r of [60, 300, 900, 3600]) if (span <= r) return r;
  return 3600;
}

function renderTimeline() {
  const h = state.history;
  const box = $("#timeline");
  if (!h || !h.samples.length) { setHTML(box, '<p class="muted">Waiting for samples…</p>'); return; }
  const range = pickRange(h);
  for (const b of document.querySelectorAll("#ranges button")) {
    b.classList.toggle("sel", Number(b.dataset.range) === range);
  }
  const t1 = h.now;
  const t0 = t1 - range;
  const samples = h.samples.filter((s) => s.t >= t0 - h.period_s);
  const parts = [];
  for (const [dev, info] of Object.entries(h.devices)) {
    const names = Object.keys(h.service_device).filter((n) => h.service_device[n] === dev);
    parts.push(chart(dev, info, names, samples, t0, t1, range));
  }
  setHTML(box, parts.join(""));
}

function chart(dev, info, names, samples, t0, t1, range) {
  const W = 1200, H = 190, L = 64, R = 10, T = 8, B = 22;
  const iw = W - L - R, ih = H - T - B;
  let top = info.budget_bytes || 1;
  for (const s of samples) {
    let sum = s.foreign[dev] || 0;
    for (const n of names) sum += s.services[n] || 0;
    top = Math.max(top, sum);
  }
  const x = (t) => L + ((t - t0) / (t1 - t0)) * iw;
  const y = (v) => T + ih - (v / top) * ih;
  const layers = [{ name: "foreign", color: "#7b8592", get: (s) => s.foreign[dev] || 0 }]
    .concat(names.map((n) => ({ name: n, color: color(n), get: (s) => s.services[n] || 0 })));
  const base = samples.map(() => 0);
  const paths = [];
  for (const layer of layers) {
    const lower = base.slice();
    const upper = samples.map((s, i) => (base[i] += layer.get(s)));
    if (!upper.some((v, i) => v > lower[i])) continue;
    let d = "";
    samples.forEach((s, i) => { d += (i ? "L" : "M") + x(s.t).toFixed(1) + "," + y(upper[i]).toFixed(1); });
    for (let i = samples.length - 1; i >= 0; i -= 1) d += "L" + x(samples[i].t).toFixed(1) + "," + y(lower[i]).toFixed(1);
    paths.push('<path d="' + d + 'Z" fill="' + layer.color + '" fill-opacity="0.78" stroke="' + layer.color +
      '" stroke-width="0.8"><title>' + esc(layer.name) + "</title></path>");
  }
  const grid = [];
  for (let i = 0; i <= 4; i += 1) {
    const v = (top * i) / 4;
    grid.push('<line class="axis" x1="' + L + '" x2="' + (W - R) + '" y1="' + y(v) + '" y2="' + y(v) + '"/>' +
      '<text x="' + (L - 6) + '" y="' + (y(v) + 4) + '" text-anchor="end">' + bytes(v) + "</text>");
  }
  const step = range / 6;
  for (let i = 0; i <= 6; i += 1) {
    const t = t0 + i * step;
    const label = i === 6 ? "now" : "−" + duration(range - i * step).replace(/ 0s$/, "");
    grid.push('<text x="' + x(t) + '" y="' + (H - 5) + '" text-anchor="' + (i === 0 ? "start" : i === 6 ? "end" : "middle") + '">' + label + "</text>");
  }
  state.charts[dev] = { t0, t1, L, iw, W, layers, samples };
  const budget = info.budget_bytes;
  const usable = budget - (info.headroom_bytes || 0);
  const lines = '<line class="budget" x1="' + L + '" x2="' + (W - R) + '" y1="' + y(budget) + '" y2="' + y(budget) + '"><title>budget ' + bytes(budget) + "</title></line>" +
    '<line class="usable" x1="' + L + '" x2="' + (W - R) + '" y1="' + y(usable) + '" y2="' + y(usable) + '"><title>budget − headroom ' + bytes(usable) + "</title></line>";
  return '<div class="tl-device" data-device="' + esc(dev) + '"><div class="tl-title">' + esc(dev) +
    ' · dashed: budget ' + bytes(budget) + ' · dotted: budget − headroom</div><svg viewBox="0 0 ' + W + " " + H +
    '" preserveAspectRatio="none" style="height:' + H + 'px">' + grid.join("") + paths.join("") + lines + "</svg></div>";
}

function hoverTimeline(ev) {
  const tip = $("#tl-tip");
  const svg = ev.target.closest && ev.target.closest(".tl-device svg");
  const meta = svg && state.charts[svg.closest(".tl-device").dataset.device];
  if (!meta || !meta.samples.length) { tip.hidden = true; return; }
  const rect = svg.getBoundingClientRect();
  const vx = ((ev.clientX - rect.left) / rect.width) * meta.W;
  const t = meta.t0 + ((vx - meta.L) / meta.iw) * (meta.t1 - meta.t0);
  let best = meta.samples[0];
  for (const s of meta.samples) if (Math.abs(s.t - t) < Math.abs(best.t - t)) best = s;
  const rows = meta.layers.map((l) => [l, l.get(best)]).filter(([, v]) => v > 0).reverse()
    .map(([l, v]) => '<div><i class="sw" style="background:' + l.color + '"></i>' + esc(l.name) +
      " <b>" + bytes(v) + "</b></div>");
  const total = meta.layers.reduce((a, l) => a + l.get(best), 0);
  tip.innerHTML = "<div class=\"muted\">" + new Date(best.t * 1000).toLocaleTimeString([], { hour12: false }) +
    " · total <b>" + bytes(total) + "</b></div>" + rows.join("");
  const box = $("#timeline").getBoundingClientRect();
  tip.hidden = false;
  const left = ev.clientX - box.left + 14;
  tip.style.left = Math.min(left, box.width - tip.offsetWidth - 4) + "px";
  tip.style.top = ev.clientY - box.top + 10 + "px";
}

// ---- jobs and windows -----------------------------------------------------------------
async function pollJobs() {
  try {
    const out = await api("/v1/jobs?limit=20");
    state.jobs = out.data || [];
    state.jobsError = null;
  } catch (e) {
    state.jobs = null;
    state.jobsError = e.status === 404 ? "The batch jobs API (/v1/jobs) is not enabled on this daemon."
      : e.status === 401 ? "The jobs API needs a key: " + e.message : "Cannot list jobs: " + e.message;
  }
  renderJobs();
}

function renderJobs() {
  const box = $("#jobs");
  if (state.jobsError) { setHTML(box, '<p class="muted">' + esc(state.jobsError) + "</p>"); return; }
  if (!state.jobs) return;
  if (!state.jobs.length) { setHTML(box, '<p class="muted">No batch jobs.</p>'); return; }
  const rows = state.jobs.map((j) => {
    const c = j.request_counts;
    const total = Math.max(1, c.total);
    const okPct = (100 * c.completed) / total;
    const badPct = (100 * (c.failed + c.cancelled)) / total;
    const live = ["queued", "running", "paused"].includes(j.status);
    return '<tr data-job="' + esc(j.id) + '" data-status="' + esc(j.status) + '">' +
      '<td class="mono">' + esc(j.id) + "</td><td>" + esc(j.model) + "</td>" +
      '<td class="js-' + esc(j.status) + ' status">' + esc(j.status) + "</td>" +
      '<td><span class="progress"><i style="width:' + okPct.toFixed(1) + '%"></i><i class="failed" style="width:' +
      badPct.toFixed(1) + '%"></i></span>' + c.completed + " / " + c.total +
      (c.in_progress ? ' <span class="muted">(' + c.in_progress + " running)</span>" : "") + "</td>" +
      '<td class="num">' + c.failed + "</td>" +
      "<td>" + (live ? '<button data-cancel="' + esc(j.id) + '" class="danger">cancel</button>' : "") + "</td></tr>";
  });
  setHTML(box, '<div class="table-wrap"><table class="grid"><thead><tr><th>job</th><th>model</th><th>status</th><th>progress</th>' +
    '<th class="num">failed</th><th></th></tr></thead><tbody>' + rows.join("") + "</tbody></table></div>");
}

function renderWindows(st) {
  const now = new Date();
  const sod = now.getHours() * 3600 + now.getMinutes() * 60 + now.getSeconds();
  const relevant = st.services.filter((s) => (s.windows && s.windows.length) || s.class === "batch");
  if (!relevant.length) { setHTML($("#windows"), '<p class="muted">No service has a maintenance window.</p>'); return; }
  const rows = relevant.map((s) => {
    const wins = s.windows || [];
    const spans = wins.map(([a, b]) => {
      const segs = a <= b ? [[a, b]] : [[a, 86400], [0, b]];
      return segs.map(([p, q]) => '<i style="left:' + ((100 * p) / 86400).toFixed(2) + "%;width:" +
        ((100 * (q - p)) / 86400).toFixed(2) + '%"></i>').join("");
    }).join("");
    const text = wins.length ? wins.map(([a, b]) => hhmm(a) + "–" + hhmm(b)).join(", ") : "any time";
    const inWin = s.in_window ? '<span class="in-win">open</span>' : '<span class="out-win">closed</span>';
    return '<tr data-window="' + esc(s.name) + '"><td><span class="dot" style="background:' + color(s.name) + '"></span>' +
      esc(s.name) + "</td><td>" + text + "</td><td>" + inWin + '</td><td class="day-cell"><span class="day" title="the day, 00:00 to 24:00; white: now">' +
      (wins.length ? spans : '<i style="left:0;width:100%"></i>') + '<b style="left:' + ((100 * sod) / 86400).toFixed(2) + '%"></b></span></td></tr>';
  });
  setHTML($("#windows"), '<div class="table-wrap"><table class="grid"><thead><tr><th>service</th><th>windows</th><th>now</th><th>day</th></tr></thead><tbody>' +
    rows.join("") + "</tbody></table></div>");
}

// ---- actions ----------------------------------------------------------------------------
async function serviceOp(name, op, button) {
  if (button) button.disabled = true;
  try {
    const out = await api("/admin/services/" + encodeURIComponent(name) + "/" + op, { method: "POST" });
    toast(op + " " + name + ": accepted (state " + out.state + (out.pinned ? ", pinned" : "") + ")");
  } catch (e) {
    toast(op + " " + name + " failed: " + e.message, true);
  }
  pollStatus();
}

async function cancelJob(id, button) {
  if (button) button.disabled = true;
  try {
    const out = await api("/v1/jobs/" + encodeURIComponent(id) + "/cancel", { method: "POST" });
    toast("job " + id + ": " + out.status);
  } catch (e) {
    toast("cancel " + id + " failed: " + e.message, true);
  }
  pollJobs();
}

function bind() {
  $("#services").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-op]");
    if (!b) return;
    const row = b.closest("tr[data-service]");
    serviceOp(row.dataset.service, b.dataset.op, b);
  });
  $("#jobs").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-cancel]");
    if (b) cancelJob(b.dataset.cancel, b);
  });
  $("#decisions").addEventListener("click", (ev) => {
    const row = ev.target.closest("tr[data-rid]");
    if (row && row.dataset.rid) explain(row.dataset.rid);
  });
  $("#timeline").addEventListener("mousemove", hoverTimeline);
  $("#timeline").addEventListener("mouseleave", () => { $("#tl-tip").hidden = true; });
  $("#ranges").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-range]");
    if (!b) return;
    const r = Number(b.dataset.range);
    state.range = state.range === r ? null : r;
    renderTimeline();
  });
  $("#filters").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-filter]");
    if (!b) return;
    state.filter = b.dataset.filter;
    for (const x of document.querySelectorAll("#filters button")) x.classList.toggle("sel", x === b);
    renderDecisions();
  });
  $("#key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = $("#key").value.trim();
    if (v) sessionStorage.setItem(KEY_STORE, v); else sessionStorage.removeItem(KEY_STORE);
    $("#key").value = "";
    $("#key").placeholder = v ? "admin key (set)" : "admin key";
    pollStatus(); pollHistory(); pollJobs();
  });
  document.querySelector('#filters button[data-filter="all"]').classList.add("sel");
  if (adminKey()) $("#key").placeholder = "admin key (set)";
  showKeyForm(false);
}

function start() {
  bind();
  pollStatus();
  pollHistory();
  pollJobs();
  connectEvents();
  setInterval(pollStatus, POLL_MS);
  setInterval(pollHistory, HISTORY_MS);
  setInterval(pollJobs, JOBS_MS);
  setInterval(setConn, 1000);
}

start();
