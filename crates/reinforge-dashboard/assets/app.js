// The run page: polls the JSON API every two seconds and draws what changed.
// Metrics are grouped like verl's names (the name without its last part: critic/score,
// actor, timing_s, val/<source>), one uPlot chart per group, runs overlaid with dashes.
"use strict";

const token = new URLSearchParams(location.search).get("token");
const headers = token ? { Authorization: "Bearer " + token } : {};
const PALETTE = ["#2b6cb0", "#c05621", "#2f855a", "#b83280", "#6b46c1", "#975a16", "#2c7a7b", "#c53030", "#4a5568", "#d69e2e"];
const DASHES = [[], [6, 3], [2, 2], [10, 3, 2, 3]];
const SKIP = new Set(["step", "timestamp"]);

const state = {
  runs: [],          // [{id, name, dir}]
  data: {},          // id -> {rows, next, samples, snext, status}
  charts: new Map(), // group -> {el, u, sig}
  lastPoll: 0,
};

function $(id) { return document.getElementById(id); }
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
}
function fmt(v) {
  if (v == null || Number.isNaN(v)) return "";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(3);
  return String(Math.round(v * 10000) / 10000);
}
async function get(path) {
  const r = await fetch(path, { headers, cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status + " " + (await r.text()));
  return r.json();
}

// verl's sections: the first part of the name (actor, response_length, timing_s, perf, val,
// env), except critic's, whose parts are different quantities (critic/score, critic/rewards,
// critic/advantages, critic/returns, critic/values).
const SPLIT = new Set(["critic"]);
function groupOf(key) {
  const parts = key.split("/");
  return SPLIT.has(parts[0]) && parts.length > 2 ? parts[0] + "/" + parts[1] : parts[0];
}

function smooth(ys, alpha) {
  if (!alpha) return ys;
  let last = null;
  return ys.map((y) => {
    if (y == null) return null;
    last = last == null ? y : alpha * last + (1 - alpha) * y;
    return last;
  });
}

// group -> {keys: Set, runs: Set}
function groups() {
  const out = new Map();
  for (const run of state.runs) {
    const d = state.data[run.id];
    if (!d) continue;
    for (const row of d.rows) {
      for (const [k, v] of Object.entries(row)) {
        if (SKIP.has(k) || typeof v !== "number") continue;
        const g = groupOf(k);
        if (!out.has(g)) out.set(g, { keys: new Set(), runs: new Set() });
        out.get(g).keys.add(k);
        out.get(g).runs.add(run.id);
      }
    }
  }
  return new Map([...out.entries()].sort((a, b) => a[0].localeCompare(b[0])));
}

function chartData(group, keys, runIds, xKind, alpha) {
  const xs = new Set();
  const series = [];
  for (const id of runIds) {
    for (const k of keys) series.push({ id, k, pts: new Map() });
  }
  for (const id of runIds) {
    for (const row of state.data[id].rows) {
      const x = xKind === "time" ? row.timestamp : row.step;
      if (x == null) continue;
      let any = false;
      for (const s of series) {
        if (s.id === id && typeof row[s.k] === "number") { s.pts.set(x, row[s.k]); any = true; }
      }
      if (any) xs.add(x);
    }
  }
  const xsorted = [...xs].sort((a, b) => a - b);
  const data = [xsorted];
  for (const s of series) data.push(smooth(xsorted.map((x) => (s.pts.has(x) ? s.pts.get(x) : null)), alpha));
  return { data, series, points: xsorted.length };
}

function drawCharts() {
  const xKind = $("xaxis").value;
  const alpha = parseFloat($("smooth").value);
  const filter = $("filter").value.trim().toLowerCase();
  const box = $("charts");
  const width = Math.max(360, Math.floor((box.clientWidth || 900) / Math.max(1, Math.floor((box.clientWidth || 900) / 440))) - 26);
  for (const [group, info] of groups()) {
    const keys = [...info.keys].sort();
    const runIds = [...info.runs].sort((a, b) => a - b);
    const { data, series, points } = chartData(group, keys, runIds, xKind, alpha);
    const sig = xKind + "|" + keys.join(",") + "|" + runIds.join(",");
    let c = state.charts.get(group);
    if (!c) {
      const holder = el("div", { class: "chart", "data-group": group }, el("h3", { text: group }));
      box.append(holder);
      c = { el: holder, u: null, sig: "" };
      state.charts.set(group, c);
    }
    c.el.setAttribute("data-points", String(points));
    c.el.setAttribute("data-series", String(series.length));
    c.el.classList.toggle("hidden", filter !== "" && !group.toLowerCase().includes(filter) && !keys.some((k) => k.toLowerCase().includes(filter)));
    if (c.sig !== sig) {
      if (c.u) c.u.destroy();
      const opts = {
        width, height: 220,
        scales: { x: { time: xKind === "time" } },
        legend: { live: true },
        series: [{ label: xKind }].concat(series.map((s) => ({
          label: (state.runs.length > 1 ? state.runs[s.id].name + ": " : "") + s.k.slice(group.length + 1 || 0) || s.k,
          stroke: PALETTE[keys.indexOf(s.k) % PALETTE.length],
          dash: DASHES[s.id % DASHES.length],
          width: 1.5,
          spanGaps: true,
          value: (u, v) => fmt(v),
        }))),
        axes: [{}, { size: 60, values: (u, vals) => vals.map(fmt) }],
      };
      c.u = new uPlot(opts, data, c.el);
      c.sig = sig;
    } else {
      c.u.setData(data);
    }
  }
}

function table(head, rows) {
  const t = el("table", {}, el("tr", {}, ...head.map((h) => el("th", { text: h }))));
  for (const r of rows) t.append(el("tr", {}, ...r.map((v) => el("td", { text: v == null ? "" : String(v) }))));
  return t;
}
function fill(id, node, emptyText) {
  const box = $(id);
  box.replaceChildren();
  if (node) { box.classList.remove("empty"); box.append(node); } else { box.classList.add("empty"); box.textContent = emptyText; }
}

function drawSide() {
  // Ranks and placement of every run that has them.
  const rankRows = [], placeRows = [], ckRows = [], valRows = [];
  let config = null, log = [];
  for (const run of state.runs) {
    const d = state.data[run.id];
    const st = d && d.status;
    if (!st) continue;
    const prefix = state.runs.length > 1 ? run.name + " " : "";
    if (st.ranks && st.ranks.ranks) {
      rankRows.push([prefix + "controller", st.ranks.host, st.ranks.phase, fmt(st.ranks.phase_s) + " s", "step " + st.ranks.step]);
      for (const r of st.ranks.ranks) rankRows.push([prefix + r.rank, r.node, r.activity, fmt(r.activity_s) + " s", "beat " + fmt(r.beat_age_s) + " s ago"]);
    }
    if (st.placement && st.placement.groups) {
      for (const g of st.placement.groups) for (const r of g.ranks) placeRows.push([prefix + g.group, (g.roles || []).join(", "), r.rank, r.node_ip, r.pid]);
    }
    for (const c of st.checkpoints || []) ckRows.push([prefix + c.name, c.complete ? "complete" : "incomplete", c.latest ? "latest" : "", c.time ? new Date(c.time * 1000).toLocaleTimeString() : ""]);
    const lastVal = [...d.rows].reverse().find((r) => Object.keys(r).some((k) => k.startsWith("val/")));
    if (lastVal) for (const [k, v] of Object.entries(lastVal)) if (k.startsWith("val/")) valRows.push([prefix + k, fmt(v), "step " + lastVal.step]);
    if (config == null && st.config) config = st.config;
    if (st.log && st.log.length) log = log.concat(state.runs.length > 1 ? st.log.map((l) => run.name + " | " + l) : st.log);
  }
  fill("ranks", rankRows.length ? table(["rank", "node", "doing", "for", ""], rankRows) : null, "no ranks.json (the run is not running)");
  fill("placement", placeRows.length ? table(["group", "roles", "rank", "node", "pid"], placeRows) : null, "one process (no placement.json)");
  fill("checkpoints", ckRows.length ? table(["checkpoint", "", "", "written"], ckRows) : null, "none yet");
  fill("validation", valRows.length ? table(["metric", "value", ""], valRows) : null, "no validation yet");
  $("config").textContent = config || "no config.toml";
  $("config").classList.toggle("empty", !config);
  const logBox = $("log");
  const atEnd = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 4;
  logBox.textContent = log.length ? log.join("\n") : "no log.txt";
  logBox.classList.toggle("empty", !log.length);
  if (atEnd) logBox.scrollTop = logBox.scrollHeight;
  // Runs in the header.
  $("runs").replaceChildren(...state.runs.map((run) => {
    const d = state.data[run.id] || { rows: [] };
    const last = [...d.rows].reverse().find((r) => typeof r["critic/score/mean"] === "number");
    const phase = d.status && d.status.ranks && d.status.ranks.phase;
    return el("span", { class: "run" },
      el("span", { class: "swatch", style: "border: 2px " + (run.id % DASHES.length ? "dashed" : "solid") + " #333" }),
      el("b", { text: run.name }),
      el("span", { class: "muted", text: (last ? "step " + last.step + ", reward " + fmt(last["critic/score/mean"]) : "no steps yet") + (phase ? ", " + phase : "") }));
  }));
}

function drawSamples() {
  const q = $("sample-search").value.trim().toLowerCase();
  const stepSel = $("sample-step");
  const all = [];
  for (const run of state.runs) for (const s of (state.data[run.id] || {}).samples || []) all.push(Object.assign({ run: run.name }, s));
  const steps = [...new Set(all.map((s) => s.step))].sort((a, b) => a - b);
  const chosen = stepSel.value;
  if (stepSel.options.length - 1 !== steps.length) {
    stepSel.replaceChildren(el("option", { value: "", text: "every step" }), ...steps.map((s) => el("option", { value: String(s), text: "step " + s })));
    stepSel.value = steps.includes(Number(chosen)) ? chosen : "";
  }
  const shown = all.filter((s) => (stepSel.value === "" || String(s.step) === stepSel.value) &&
    (q === "" || [s.prompt, s.response, JSON.stringify(s.ground_truth), s.data_source].join("\n").toLowerCase().includes(q)));
  $("sample-count").textContent = shown.length + " of " + all.length;
  const box = $("samples");
  if (!all.length) { box.classList.add("empty"); box.textContent = "no samples.jsonl (trainer.log_train_samples, trainer.log_val_generations)"; return; }
  box.classList.remove("empty");
  box.replaceChildren(...shown.slice(-200).reverse().map((s) => {
    const response = s.turns && s.turns.length
      ? el("pre", {}, ...s.turns.map((t) => el("span", { class: "turn-" + t.role, text: t.text })))
      : el("pre", { text: s.response });
    return el("div", { class: "sample", "data-step": String(s.step), "data-split": s.split },
      el("div", { class: "meta" }, (state.runs.length > 1 ? s.run + " · " : "") + "step " + s.step + " · " + s.split + " · " + s.data_source + " · ",
        el("span", { class: "reward", text: "reward " + fmt(s.reward) }), " · answer " + JSON.stringify(s.ground_truth)),
      el("details", {}, el("summary", { text: "prompt" }), el("pre", { text: s.prompt })),
      response);
  }));
}

function draw() {
  try {
    drawCharts();
    drawSide();
    drawSamples();
  } catch (e) {
    showError(e);
  }
}

function showError(e) {
  console.error(e);
  const box = $("error");
  box.hidden = false;
  box.textContent = String(e.message || e);
}

async function poll() {
  try {
    if (!state.runs.length) {
      state.runs = await get("/api/runs");
      for (const r of state.runs) state.data[r.id] = { rows: [], next: 0, file: "", samples: [], snext: 0, sfile: "", status: null };
    }
    await Promise.all(state.runs.map(async (run) => {
      const d = state.data[run.id];
      const [m, s, st] = await Promise.all([
        get("/api/runs/" + run.id + "/metrics?since=" + d.next + "&file=" + d.file),
        get("/api/runs/" + run.id + "/samples?since=" + d.snext + "&file=" + d.sfile),
        get("/api/runs/" + run.id + "/status"),
      ]);
      // reset: a resume replaced the file; reload it from the start at the next poll.
      if (m.reset) { d.rows = []; d.next = 0; } else { d.rows.push(...m.rows); d.next = m.next; }
      if (s.reset) { d.samples = []; d.snext = 0; } else { d.samples.push(...s.rows); d.snext = s.next; }
      d.file = m.file; d.sfile = s.file;
      d.status = st;
    }));
    state.lastPoll = Date.now();
    $("error").hidden = true;
    draw();
  } catch (e) {
    showError(e);
  }
}

for (const id of ["xaxis", "smooth", "filter"]) $(id).addEventListener("input", () => {
  $("smooth-v").textContent = $("smooth").value;
  if (id === "xaxis") for (const c of state.charts.values()) c.sig = "";
  draw();
});
for (const id of ["sample-search", "sample-step"]) $(id).addEventListener("input", drawSamples);
setInterval(() => { $("updated").textContent = state.lastPoll ? "updated " + Math.round((Date.now() - state.lastPoll) / 1000) + " s ago" : ""; }, 1000);
poll();
setInterval(poll, 2000);
