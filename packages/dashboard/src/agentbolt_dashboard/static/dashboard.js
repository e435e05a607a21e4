// agentbolt dashboard: live runs table, run curves, run comparison and the Serving page (uPlot). No build step.
"use strict";

const POLL_MS = 2000;
const SERVING_POLL_MS = 5000;
const COLORS = ["#3056d3", "#d9480f", "#2b8a3e", "#9c36b5", "#c92a2a", "#0b7285", "#e67700", "#5c940d"];

async function getJSON(url) {
  const res = await fetch(url, { headers: { accept: "application/json" }, credentials: "same-origin" });
  if (!res.ok) throw new Error(`${url}: ${res.status}`);
  return res.json();
}

function fmt(x) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  return Math.abs(x) >= 1e4 || (Math.abs(x) < 1e-3 && x !== 0) ? x.toExponential(3) : Number(x.toPrecision(4)).toString();
}

/** Metrics rows of one run, fetched incrementally (after_seq). */
class RunSeries {
  constructor(runId) { this.runId = runId; this.rows = []; this.lastSeq = null; }
  async poll() {
    const q = this.lastSeq === null ? "" : `?after_seq=${this.lastSeq}`;
    const fresh = await getJSON(`/api/runs/${encodeURIComponent(this.runId)}/metrics${q}`);
    for (const row of fresh) { this.rows.push(row); this.lastSeq = row.seq; }
    return fresh;
  }
  /** ``metric`` by step (or by recording time, Unix seconds, with ``byTime``). */
  points(metric, byTime = false) {
    const byX = new Map();
    for (const row of this.rows) if (metric in row.values) byX.set(byTime ? row.time : row.step, row.values[metric]);
    return byX;
  }
}

const POLICY = "{policy}";

/** Policies by role of a run (from its recorded config), [] for one shared policy. */
function policiesOf(runId) { return (window.AGENTBOLT_POLICIES || {})[runId] || []; }

/** ``train/{policy}/loss`` for ``train/writer/loss`` when ``writer`` is one of ``policies``. */
function policyFamily(metric, policies) {
  const parts = metric.split("/");
  const i = parts.findIndex((p) => policies.includes(p));
  if (i < 0) return null;
  parts[i] = POLICY;
  return parts.join("/");
}

/** The curves of ``metric`` for each run: one, or one per policy for a per-policy family. */
function lines(metric, series, labels) {
  const out = [];
  series.forEach((s, i) => {
    if (!metric.includes(POLICY)) { out.push({ s, key: metric, label: labels[i] }); return; }
    for (const name of policiesOf(s.runId)) {
      out.push({ s, key: metric.replace(POLICY, name), label: series.length > 1 ? `${labels[i]} · ${name}` : name });
    }
  });
  return out;
}

/** One uPlot chart of ``metric`` over steps (or over time with ``{ time: true }``), one series per
 * run (and per policy for ``{policy}`` families). */
class Chart {
  constructor(el, options = {}) { this.el = el; this.plot = null; this.key = ""; this.time = !!options.time; }
  draw(metric, series, runLabels) {
    const drawn = lines(metric, series, runLabels);
    const labels = drawn.map((l) => l.label);
    const maps = drawn.map((l) => l.s.points(l.key, this.time));
    const steps = [...new Set(maps.flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
    const data = [steps, ...maps.map((m) => steps.map((x) => (m.has(x) ? m.get(x) : null)))];
    const key = metric + "|" + labels.join(",");
    this.el.dataset.points = String(steps.length);
    if (this.plot && this.key === key) { this.plot.setData(data); this.narrow(steps); return; }
    if (this.plot) this.plot.destroy();
    this.key = key;
    const width = Math.max(320, this.el.clientWidth || 800);
    this.plot = new uPlot({
      width, height: 300,
      scales: { x: { time: this.time } },
      axes: [
        this.time ? { label: "time" } : { label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] },
        { label: metric, size: 70 },
      ],
      series: [{ label: this.time ? "time" : "step" }, ...drawn.map((l, i) => ({
        label: labels[i], stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true,
        points: { show: true, size: 6 }, value: (u, v) => fmt(v),
      }))],
    }, data, this.el);
    this.narrow(steps);
  }
  /** One point in time (a server that just started): a minute around it, not years. */
  narrow(xs) {
    if (this.time && xs.length === 1) this.plot.setScale("x", { min: xs[0] - 60, max: xs[0] + 60 });
  }
}

function runsPage() {
  const table = document.getElementById("runs-table");
  if (!table) return;
  const select = document.getElementById("compare-metric");
  const chart = new Chart(document.getElementById("compare-chart"));
  const hint = document.getElementById("compare-hint");
  const series = new Map();
  const labelOf = (id) => {
    const a = table.querySelector(`tr[data-run="${CSS.escape(id)}"] td:nth-child(2) a`);
    return a ? a.textContent : id;
  };
  const picked = () => [...table.querySelectorAll("input.pick:checked")].map((x) => x.value);

  async function refreshChart() {
    const ids = picked();
    hint.textContent = ids.length >= 2 ? `${ids.length} runs` : "Select two or more runs above.";
    if (ids.length < 1) { if (chart.plot) { chart.plot.destroy(); chart.plot = null; } return; }
    for (const id of ids) if (!series.has(id)) series.set(id, new RunSeries(id));
    await Promise.all(ids.map((id) => series.get(id).poll()));
    chart.draw(select.value, ids.map((id) => series.get(id)), ids.map(labelOf));
  }

  async function refreshTable() {
    const runs = await getJSON("/api/runs");
    for (const run of runs) {
      const tr = table.querySelector(`tr[data-run="${CSS.escape(run.run_id)}"]`);
      if (!tr) continue;
      const badge = tr.querySelector('[data-field="status"]');
      badge.textContent = run.status; badge.className = `badge ${run.status}`;
      tr.querySelector('[data-field="steps"]').textContent = run.steps;
    }
  }

  table.addEventListener("change", refreshChart);
  document.getElementById("select-all").addEventListener("change", (e) => {
    for (const box of table.querySelectorAll("input.pick")) box.checked = e.target.checked;
    refreshChart();
  });
  select.addEventListener("change", () => { chart.key = ""; refreshChart(); });
  setInterval(() => { refreshTable().catch(console.error); if (picked().length) refreshChart().catch(console.error); }, POLL_MS);
}

/** Small charts' axes: whole steps on x, compact numbers on y. */
const STEP_AXES = [
  { label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], values: (u, vals) => vals.map((v) => String(v)) },
  { size: 64, values: (u, vals) => vals.map((v) => (v !== 0 && Math.abs(v) < 1e-3 ? v.toExponential(1) : fmt(v))) },
];

/** TensorBoard's smoothing: an exponential moving average, debiased at the start. */
function smooth(values, weight) {
  if (!weight) return values;
  let last = 0, n = 0;
  return values.map((v) => {
    if (v === null || v === undefined) return null;
    last = last * weight + (1 - weight) * v; n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}

/** The run page's view, kept in its URL: the charts shown and the smoothing. */
function viewFromURL(defaults) {
  const q = new URLSearchParams(location.search);
  const charts = q.has("charts") ? q.get("charts").split(",").filter(Boolean) : defaults;
  const weight = Math.min(0.95, Math.max(0, Number(q.get("smooth")) || 0));
  return { charts, smooth: weight };
}

function saveView(view) {
  const q = new URLSearchParams(location.search);
  q.set("charts", view.charts.join(","));
  q.set("smooth", String(view.smooth));
  history.replaceState(null, "", `${location.pathname}?${q.toString().replace(/%2F/g, "/").replace(/%2C/g, ",").replace(/%3A/g, ":")}`);
}

/** A small chart of one metric: raw points faint, the smoothed line over them. */
function metricPlot(el, title, drawn, smoothing) {
  const maps = drawn.map((l) => l.s.points(l.key));
  const steps = [...new Set(maps.flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
  const raw = maps.map((m) => steps.map((x) => (m.has(x) ? m.get(x) : null)));
  const series = [{ label: "step" }];
  const data = [steps];
  drawn.forEach((l, i) => {
    const color = COLORS[i % COLORS.length];
    if (smoothing) {
      series.push({ label: `${l.label} (raw)`, stroke: color + "55", width: 1, spanGaps: true, points: { show: false }, value: (u, v) => fmt(v) });
      data.push(raw[i]);
    }
    series.push({ label: smoothing ? `${l.label} (smoothed ${smoothing})` : l.label, stroke: color, width: 2, spanGaps: true,
      points: { show: steps.length < 40, size: 5 }, value: (u, v) => fmt(v) });
    data.push(smooth(raw[i], smoothing));
  });
  el.dataset.points = String(steps.length);
  return new uPlot({
    width: Math.max(260, el.clientWidth || 400), height: 200, legend: { show: drawn.length > 1 || !!smoothing },
    scales: { x: { time: false } },
    axes: STEP_AXES,
    series,
  }, data, el);
}

/** A held-out chart: each evaluation's mean, a band of ± 1 standard error, and n. */
function heldoutPlot(el, fig) {
  const lo = fig.mean.map((m, i) => m - fig.se[i]);
  const hi = fig.mean.map((m, i) => m + fig.se[i]);
  el.dataset.points = String(fig.steps.length);
  return new uPlot({
    width: Math.max(260, el.clientWidth || 400), height: 200, legend: { show: true },
    scales: { x: { time: false } },
    axes: STEP_AXES,
    series: [
      { label: "step" },
      { label: fig.label, stroke: COLORS[2], width: 2, points: { show: true, size: 7 }, value: (u, v, s, i) => (v === null ? "–" : `${fmt(v)} (n=${fig.n[i]})`) },
      { label: "− 1 se", stroke: COLORS[2] + "44", width: 1, points: { show: false }, value: (u, v) => fmt(v) },
      { label: "+ 1 se", stroke: COLORS[2] + "44", width: 1, points: { show: false }, value: (u, v) => fmt(v) },
    ],
    bands: [{ series: [3, 2], fill: COLORS[2] + "22" }],
  }, [fig.steps, fig.mean, lo, hi], el);
}

function runPage() {
  const runId = window.AGENTBOLT_RUN;
  const config = window.AGENTBOLT_CHARTS;
  const series = new RunSeries(runId);
  const grid = document.getElementById("chart-grid");
  const slider = document.getElementById("smooth");
  const sliderValue = document.getElementById("smooth-value");
  const picks = [...document.querySelectorAll("input.chart-pick")];
  const labels = new Map(config.groups.flat());
  const body = document.querySelector("#steps-table tbody");
  const view = viewFromURL(config.defaults);
  const plots = new Map();
  slider.value = String(view.smooth); sliderValue.textContent = String(view.smooth);
  for (const box of picks) box.checked = view.charts.includes(box.value);

  function render() {
    for (const plot of plots.values()) plot.destroy();
    plots.clear();
    grid.textContent = "";
    for (const key of view.charts) {
      const panel = document.createElement("div");
      panel.className = "panel";
      panel.dataset.chart = key;
      const title = document.createElement("h3");
      title.textContent = labels.get(key) || key;
      const note = document.createElement("span");
      note.className = "muted small";
      const heldout = config.heldout[key];
      if (heldout) note.textContent = ` mean ± 1 se, n=${heldout.n[heldout.n.length - 1]} per evaluation`;
      else if (key.includes(POLICY)) note.textContent = " one line per policy";
      title.append(note);
      const el = document.createElement("div");
      el.className = "plot";
      panel.append(title, el);
      grid.append(panel);
      if (heldout) { plots.set(key, heldoutPlot(el, heldout)); continue; }
      const drawn = lines(key, [series], [window.AGENTBOLT_RUN_LABEL || runId]);
      plots.set(key, metricPlot(el, labels.get(key) || key, drawn, view.smooth));
    }
    grid.dataset.charts = view.charts.join(",");
  }

  function addRows(rows) {
    for (const row of rows) {
      const tr = document.createElement("tr");
      tr.dataset.step = row.step;
      const shown = Object.entries(row.values).slice(0, 6).map(([k, v]) => `${k}=${fmt(v)}`).join("  ");
      tr.innerHTML = `<td class="num"></td><td></td><td class="id"></td>`;
      tr.children[0].textContent = row.step;
      tr.children[1].textContent = new Date(row.time * 1000).toLocaleTimeString();
      tr.children[2].textContent = shown + (Object.keys(row.values).length > 6 ? "  …" : "");
      tr.title = JSON.stringify(row.values, null, 1);
      body.prepend(tr);
    }
  }

  async function tick(force = false) {
    const fresh = await series.poll();
    if (fresh.length) {
      addRows(fresh);
      document.getElementById("run-steps").textContent = Math.max(...series.rows.map((r) => r.step));
    }
    if (fresh.length || force) render();
  }

  for (const box of picks) box.addEventListener("change", () => {
    view.charts = picks.filter((b) => b.checked).map((b) => b.value);
    saveView(view); render();
  });
  slider.addEventListener("input", () => {
    view.smooth = Number(slider.value); sliderValue.textContent = slider.value;
    saveView(view); render();
  });
  tick(true).catch(console.error);
  setInterval(() => tick().catch(console.error), POLL_MS);
}

/** The Serving page: the metrics chart over time, and the server-rendered parts marked
 * ``data-live`` (sessions, tiles, decisions, feedback, judge) replaced from a fresh render. */
function servingPage() {
  const runId = window.AGENTBOLT_RUN;
  const series = new RunSeries(runId);
  const chart = new Chart(document.getElementById("serve-chart"), { time: true });
  const select = document.getElementById("serve-metric");

  async function drawChart() {
    await series.poll();
    chart.draw(select.value, [series], [window.AGENTBOLT_RUN_LABEL || runId]);
  }

  async function refresh() {
    const res = await fetch(location.href, { headers: { accept: "text/html" }, credentials: "same-origin" });
    if (!res.ok) return;
    const fresh = new DOMParser().parseFromString(await res.text(), "text/html");
    for (const el of document.querySelectorAll("[data-live][id]")) {
      const next = fresh.getElementById(el.id);
      if (next) el.replaceWith(document.importNode(next, true));
    }
    document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
  }

  select.addEventListener("change", () => { chart.key = ""; drawChart().catch(console.error); });
  drawChart().catch(console.error);
  setInterval(() => { refresh().catch(console.error); drawChart().catch(console.error); }, SERVING_POLL_MS);
}

/** The trajectory page: token ids on demand beside each token's text. */
function trajectoryPage() {
  for (const box of document.querySelectorAll("input.show-ids")) {
    box.addEventListener("change", () => box.closest(".call").querySelector(".tokens").classList.toggle("ids", box.checked));
  }
}

document.addEventListener("DOMContentLoaded", () => {
  trajectoryPage();
  if (window.AGENTBOLT_PAGE === "runs") runsPage();
  if (window.AGENTBOLT_PAGE === "run") runPage();
  if (window.AGENTBOLT_PAGE === "serving") servingPage();
});
