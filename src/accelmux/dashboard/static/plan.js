// accelmux plan page: plain JavaScript, no build step, nothing fetched from outside.
// POSTs the asked change to /admin/plan (the daemon replays its own history) or reads
// a plan file written by `accelmux plan --json FILE`, and draws the same table as the
// command line and the memory each column's services held over time.
"use strict";

const KEY_STORE = "accelmux.adminKey";
const CLASSES = ["realtime", "interactive", "batch", "background"];
const COLORS = ["#8a96a3", "#4f8cff", "#f2a93b", "#3fc98a", "#e5534b", "#a371f7", "#2fb9c9"];
const $ = (sel) => document.querySelector(sel);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

function gib(n) { return n === null || n === undefined ? "–" : (n / 2 ** 30).toFixed(2) + " GiB"; }
function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1) + " %"; }
function secs(x) {
  if (x === null || x === undefined) return "–";
  return x < 1 ? Math.round(x * 1000) + " ms" : x.toFixed(2) + " s";
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function status(text, isError) {
  const el = $("#plan-status");
  el.textContent = text;
  el.className = isError ? "err" : "muted";
}

function list(text, sep) {
  return String(text || "").split(sep).map((s) => s.trim()).filter(Boolean);
}

function body(form) {
  const f = new FormData(form);
  const out = {};
  for (const key of ["device_gib", "budget_gib", "policy", "last"]) {
    if (f.get(key)) out[key] = String(f.get(key)).trim();
  }
  for (const key of ["add_device_gib", "compute_scale"]) {
    if (f.get(key)) out[key] = Number(f.get(key));
  }
  if (f.get("add_service")) out.add_service = list(f.get("add_service"), ";");
  if (f.get("remove_service")) out.remove_service = list(f.get("remove_service"), ",");
  if (f.get("set")) out.set = list(f.get("set"), ";");
  return out;
}

async function runPlan(ev) {
  ev.preventDefault();
  const button = $("#plan-run");
  button.disabled = true;
  status("replaying the history…");
  try {
    const resp = await fetch("/admin/plan", {
      method: "POST", headers: headers(), body: JSON.stringify(body(ev.target)), cache: "no-store",
    });
    const data = await resp.json().catch(() => null);
    if (!resp.ok) {
      if (resp.status === 401 || resp.status === 403) $("#key-form").hidden = false;
      throw new Error(data && data.error ? data.error.message : resp.status + " " + resp.statusText);
    }
    render(data);
    status("done");
  } catch (e) {
    status(e.message, true);
  } finally {
    button.disabled = false;
  }
}

function bar(bars, cls, key, unit) {
  const v = ((bars.classes || {})[cls] || {})[key];
  return v === null || v === undefined ? "" : ` <span class="err-bar">±${Math.round(v)}${unit}</span>`;
}

function rows(plan) {
  const cols = plan.columns;
  const bars = plan.error_bars || {};
  const out = [];
  const sim = (c) => c.kind !== "recorded";
  for (const cls of CLASSES) {
    if (!cols.some((c) => c.classes[cls])) continue;
    out.push([`${cls} attainment`, cols.map((c) => {
      const f = c.classes[cls] || {};
      return esc(pct(f.attainment)) + (sim(c) ? bar(bars, cls, "attainment_pts", " pts") : "");
    })]);
    out.push([`${cls} p50 / p95`, cols.map((c) => {
      const f = c.classes[cls] || {};
      const p95 = f.p95_s === null || f.p95_s === undefined ? "too few" : secs(f.p95_s);
      return esc(`${secs(f.p50_s)} / ${p95}`) + (sim(c) && f.p95_s != null ? bar(bars, cls, "p95_pct", " %") : "");
    })]);
    out.push([`${cls} requests`, cols.map((c) => {
      const f = c.classes[cls] || {};
      return esc(f.requests ?? 0) + (f.waiting_at_end ? ` <small>(+${esc(f.waiting_at_end)} waiting)</small>` : "");
    })]);
  }
  const devices = [...new Set(cols.flatMap((c) => Object.keys(c.memory)))];
  const peakBar = bars.memory_peak_pct;
  for (const dev of devices) {
    out.push([`${dev} memory peak`, cols.map((c) => {
      const m = c.memory[dev] || {};
      const b = peakBar != null && sim(c) && m.peak != null ? ` <span class="err-bar">±${Math.round(peakBar)} %</span>` : "";
      return esc(gib(m.peak)) + b;
    })]);
    out.push([`${dev} budget left at peak`, cols.map((c) => {
      const m = c.memory[dev] || {};
      return esc(`${gib(m.budget_left_at_peak)} of ${gib(m.budget)}`);
    })]);
  }
  for (const [key, label] of [["cold_starts", "cold starts"], ["evictions", "evictions"], ["loads", "loads"]]) {
    out.push([label, cols.map((c) => esc(c.decisions[key] ?? 0))]);
  }
  out.push(["OOM risk", cols.map((c) => `<span class="risk-${esc(c.oom_risk)}">${esc(c.oom_risk)}</span>`)]);
  out.push(["first to suffer", cols.map((c) => {
    const f = c.first_to_suffer;
    if (!f) return "–";
    if (!f.service) return "none";
    const missed = Object.values(f.newly_missed).reduce((a, b) => a + b, 0);
    return esc(`${f.service} at ${(f.at_s / 60).toFixed(1)} min (${missed} miss)`);
  })]);
  return out;
}

function render(plan) {
  $("#plan-source").textContent =
    `${plan.source}: ${plan.requests} requests over ${(plan.span_s / 60).toFixed(1)} min`;
  const head = "<thead><tr><th></th>" + plan.columns.map((c, i) =>
    `<th style="color:${COLORS[i % COLORS.length]}">${esc(c.label)}${c.kind === "recorded" ? "" : ` <small>${esc(c.policy)}</small>`}</th>`
  ).join("") + "</tr></thead>";
  const bodyRows = rows(plan).map(([label, cells]) =>
    `<tr><th>${esc(label)}</th>${cells.map((v) => `<td class="num">${v}</td>`).join("")}</tr>`).join("");
  $("#plan-table").innerHTML = head + "<tbody>" + bodyRows + "</tbody>";
  const notes = [];
  notes.push(plan.error_bars && plan.error_bars.source
    ? `± is the simulator's error measured against the real stack (${plan.error_bars.source}).`
    : "No measured error bars are shipped with this version.");
  for (const c of plan.columns) for (const n of c.notes || []) notes.push(`${c.label}: ${n}`);
  for (const w of plan.warnings || []) notes.push(w);
  $("#plan-notes").innerHTML = notes.map((n) => `<li>${esc(n)}</li>`).join("");
  drawMemory(plan);
}

function drawMemory(plan) {
  const box = $("#plan-memory");
  const devices = [...new Set(plan.columns.flatMap((c) => Object.keys(c.timeline || {})))];
  box.innerHTML = devices.map((dev) => chart(plan, dev)).join("") || '<p class="muted">no memory samples</p>';
}

function chart(plan, dev) {
  const W = 900, H = 220, L = 60, B = 24;
  const series = plan.columns.map((c) => (c.timeline || {})[dev] || []);
  const tMax = Math.max(1, ...series.flat().map((p) => p[0]));
  const tMin = Math.min(tMax, ...series.flat().map((p) => p[0]));
  const budgets = plan.columns.map((c) => (c.memory[dev] || {}).budget || 0);
  const yMax = Math.max(1, ...series.flat().map((p) => p[1]), ...budgets) * 1.05;
  const x = (t) => L + (W - L - 8) * (t - tMin) / Math.max(1, tMax - tMin);
  const y = (v) => H - B - (H - B - 8) * v / yMax;
  let svg = `<svg class="plan-chart" viewBox="0 0 ${W} ${H}" role="img" aria-label="memory over time on ${esc(dev)}">`;
  for (let i = 0; i <= 4; i++) {
    const v = yMax * i / 4;
    svg += `<line x1="${L}" x2="${W - 8}" y1="${y(v)}" y2="${y(v)}" class="grid-line"/>` +
      `<text x="${L - 6}" y="${y(v) + 4}" class="axis" text-anchor="end">${esc(gib(v))}</text>`;
  }
  svg += `<text x="${L}" y="${H - 6}" class="axis">${esc((tMin / 60).toFixed(0))} min</text>` +
    `<text x="${W - 8}" y="${H - 6}" class="axis" text-anchor="end">${esc((tMax / 60).toFixed(0))} min</text>`;
  plan.columns.forEach((c, i) => {
    const color = COLORS[i % COLORS.length];
    if (budgets[i]) {
      svg += `<line x1="${L}" x2="${W - 8}" y1="${y(budgets[i])}" y2="${y(budgets[i])}" stroke="${color}" stroke-dasharray="4 4" opacity=".6"/>`;
    }
    const pts = series[i].map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    if (pts) svg += `<polyline class="mem-line" data-column="${esc(c.label)}" points="${pts}" fill="none" stroke="${color}" stroke-width="1.5"/>`;
  });
  return `<h3 class="chart-title">${esc(dev)}</h3>` + svg + "</svg>";
}

function readFile(ev) {
  const file = ev.target.files[0];
  if (!file) return;
  file.text().then((text) => {
    const plan = JSON.parse(text);
    if (!plan || !Array.isArray(plan.columns)) throw new Error("not a plan file (accelmux plan --json FILE)");
    render(plan);
    status(`read ${file.name}`);
  }).catch((e) => status(e.message, true));
}

document.addEventListener("DOMContentLoaded", () => {
  $("#plan-form").addEventListener("submit", runPlan);
  $("#plan-file").addEventListener("change", readFile);
  $("#key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = $("#key").value.trim();
    if (v) sessionStorage.setItem(KEY_STORE, v); else sessionStorage.removeItem(KEY_STORE);
    $("#key-form").hidden = true;
  });
});
