// swarmrl's live dashboard: polls the orchestrator's /v1/dashboard/ API and draws the
// run, the swarm, the verdicts and the rollouts. No library, no network beyond the
// orchestrator. Every value from the API is written as text (textContent), never as
// HTML: rollout texts come from untrusted workers.
"use strict";

const POLL_MS = 2000;
const state = {
  token: sessionStorage.getItem("swarmrl-token") || "",
  metrics: [], lastStep: -1, run: null, swarm: null, verdicts: null,
  files: null, step: null, openKey: null, rollout: null, xaxis: "step",
};

// ---- small DOM helpers ----
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}
const $ = (id) => document.getElementById(id);
const short = (key) => (key || "").slice(0, 12);
function fmt(v, digits = 3) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return v.toFixed(digits);
}
function ago(t, now) {
  if (t === null || t === undefined) return "–";
  return dur(Math.max(0, now - t)) + " ago";
}
function dur(s) {
  if (s === null || s === undefined) return "–";
  if (s < 10) return s.toFixed(1) + " s";
  if (s < 90) return s.toFixed(0) + " s";
  if (s < 5400) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function table(id, columns, rows, rowClass) {
  const t = $(id);
  const head = el("tr", {}, ...columns.map((c) => el("th", {}, c[0])));
  t.tHead.replaceChildren(head);
  const body = rows.map((r) => {
    const tr = el("tr", { class: rowClass ? rowClass(r) : "" });
    for (const c of columns) {
      const v = c[1](r);
      const td = el("td", { class: (typeof v === "number" ? "num " : "") + (c[2] || "") });
      td.append(v instanceof Node ? v : fmt(v));
      tr.append(td);
    }
    return tr;
  });
  t.tBodies[0].replaceChildren(...body);
  return body;
}

// ---- the API ----
async function get(path, withToken) {
  const headers = withToken && state.token ? { Authorization: "Bearer " + state.token } : {};
  const r = await fetch(path, { headers, cache: "no-store" });
  if (!r.ok) {
    let detail = r.statusText;
    try { detail = (await r.json()).detail; } catch (e) { /* not JSON */ }
    const err = new Error(typeof detail === "string" ? detail : JSON.stringify(detail));
    err.status = r.status;
    throw err;
  }
  return r.json();
}
async function post(path, body) {
  const r = await fetch(path, {
    method: "POST",
    headers: { Authorization: "Bearer " + state.token, "Content-Type": "application/json" },
    body: JSON.stringify(body || {}),
  });
  if (!r.ok) alert(path + ": " + r.status + " " + (await r.text()));
  return r.ok;
}

// ---- SVG line charts ----
const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function ticks(lo, hi, n, whole) {
  if (!(hi > lo)) return [lo];
  const raw = Math.max((hi - lo) / n, whole ? 1 : 0), mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((x) => x >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9 * step; v += step) out.push(+v.toPrecision(12));
  return out;
}
// series: [{name, color, points: [[x, y, title]], dots: bool}]; opts: {yMin, yMax, xLabel, marks}
function chart(container, series, opts) {
  const W = opts.width || 560, H = opts.height || 200, L = 46, R = 10, T = 18, B = 30;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  const pts = series.flatMap((ser) => ser.points);
  const marks = opts.marks || [];
  if (!pts.length && !marks.length) {
    svg.append(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#6b7280" }, "no data yet"));
    container.replaceChildren(svg);
    return;
  }
  const xs = pts.map((p) => p[0]).concat(marks.map((m) => m.x));
  const ys = pts.map((p) => p[1]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  let y0 = opts.yMin !== undefined ? opts.yMin : Math.min(...ys);
  let y1 = opts.yMax !== undefined ? opts.yMax : Math.max(...ys);
  if (ys.length) { y0 = Math.min(y0, ...ys); y1 = Math.max(y1, ...ys); }
  if (!(y1 > y0)) { y1 = y0 + 1; }
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  for (const t of ticks(y0, y1, 4)) {
    svg.append(s("line", { x1: L, x2: W - R, y1: Y(t), y2: Y(t), stroke: "#eceef1" }));
    svg.append(s("text", { x: L - 4, y: Y(t) + 4, "text-anchor": "end", "font-size": 10, fill: "#6b7280" }, fmt(t, 2)));
  }
  for (const t of ticks(x0, x1, 6, !opts.xTime)) {
    svg.append(s("text", { x: X(t), y: H - B + 14, "text-anchor": "middle", "font-size": 10, fill: "#6b7280" },
      opts.xTime ? dur(t) : fmt(t, 0)));
  }
  svg.append(s("text", { x: W - R, y: H - 3, "text-anchor": "end", "font-size": 10, fill: "#6b7280" }, opts.xLabel || ""));
  svg.append(s("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#9ca3af" }));
  for (const m of marks) {  // events on the timeline: a vertical line with its label
    svg.append(s("line", { x1: X(m.x), x2: X(m.x), y1: T, y2: H - B, stroke: m.color, "stroke-dasharray": "3 3" }));
    const right = X(m.x) > W - R - 160;  // near the right edge: the label goes left of its line
    const label = s("text", { x: X(m.x) + (right ? -3 : 3), y: T + 10 + (m.row || 0) * 11, "font-size": 10,
      fill: m.color, "text-anchor": right ? "end" : "start" }, m.label);
    label.append(s("title", {}, m.title || m.label));
    svg.append(label);
  }
  let lx = L + 4;
  for (const ser of series) {
    const p = ser.points.filter((q) => Number.isFinite(q[1]));
    if (p.length > 1 && !ser.dotsOnly) {
      svg.append(s("polyline", {
        points: p.map((q) => `${X(q[0]).toFixed(1)},${Y(q[1]).toFixed(1)}`).join(" "),
        fill: "none", stroke: ser.color, "stroke-width": 1.6,
      }));
    }
    if (ser.dots || ser.dotsOnly || p.length === 1) {
      for (const q of p) {
        const c = s("circle", { cx: X(q[0]), cy: Y(q[1]), r: ser.r || 3, fill: ser.color });
        c.append(s("title", {}, q[2] || `${ser.name}: ${fmt(q[1])}`));
        svg.append(c);
      }
    }
    svg.append(s("rect", { x: lx, y: 4, width: 9, height: 9, fill: ser.color }));
    const name = s("text", { x: lx + 12, y: 12, "font-size": 10, fill: "#374151" }, ser.name);
    svg.append(name);
    lx += 18 + 6 * ser.name.length;
  }
  container.replaceChildren(svg);
}

// ---- the run ----
function xOf(row) {
  return state.xaxis === "time" ? row.elapsed_s : row.step;
}
function drawRun() {
  const run = state.run, rows = state.metrics;
  if (!run) return;
  $("run-name").textContent = run.name;
  $("run-model").textContent = `${run.model} · ${run.task} · run ${run.run_id}`;
  const st = run.state;
  const last = rows[rows.length - 1];
  const status = st.done ? "done" : st.paused ? "paused" : "running";
  $("run-state").textContent = `step ${st.step ?? "–"}/${run.steps} · policy ${st.policy ?? "–"} · ${status}` +
    (run.eta_s !== null && !st.done ? ` · ETA ${dur(run.eta_s)}` : "");
  const evals = Object.fromEntries(run.evaluations.map((e) => [e.name, e]));
  const first = rows[0];
  const samplesPerS = last ? rows.reduce((a, r) => a + r.samples, 0) / Math.max(last.elapsed_s, 1e-9) : null;
  const tiles = [
    ["step", `${st.step ?? "–"} / ${run.steps}`],
    ["reward (last / first)", last ? `${fmt(last.reward)} / ${fmt(first.reward)}` : "–"],
    ["held-out accuracy", evals.start_model ? `${fmt(evals.start_model.accuracy)} → ${evals.final_model ? fmt(evals.final_model.accuracy) : "…"}` : "–"],
    ["level", last ? last.level : "–"],
    ["signal fraction", last ? fmt(last.signal_fraction, 2) : "–"],
    ["staleness", last ? fmt(last.staleness, 2) : "–"],
    ["samples / s", fmt(samplesPerS, 2)],
    ["ETA", st.done ? "done" : dur(run.eta_s)],
  ];
  $("tiles").replaceChildren(...tiles.map(([k, v]) => el("div", { class: "tile" }, el("div", { class: "v" }, v), el("div", { class: "k" }, k))));
  const xLabel = state.xaxis === "time" ? "run time" : "step";
  const xTime = state.xaxis === "time";
  const line = (name, color, f) => ({ name, color, points: rows.filter((r) => f(r) !== null && f(r) !== undefined).map((r) => [xOf(r), f(r), `step ${r.step}: ${name} ${fmt(f(r))}`]) });
  const heldout = run.evaluations.filter((e) => typeof e.accuracy === "number").map((e) => {
    const at = rows.find((r) => r.step >= e.step);
    const x = state.xaxis === "time" ? (e.step === 0 || !at ? 0 : at.elapsed_s) : e.step;
    return [x, e.accuracy, `${e.name} at step ${e.step}: held-out accuracy ${fmt(e.accuracy)}`];
  });
  chart($("chart-reward"), [line("reward", "#2f5fb3", (r) => r.reward), line("task reward", "#8fb0e8", (r) => r.task_reward),
    { name: "held-out accuracy", color: "#c2410c", points: heldout, dotsOnly: true, r: 5 }], { yMin: 0, yMax: 1, xLabel, xTime });
  chart($("chart-level"), [line("level", "#6d28d9", (r) => r.level)], { yMin: 0, xLabel, xTime });
  chart($("chart-signal"), [line("signal fraction", "#0f766e", (r) => r.signal_fraction)], { yMin: 0, yMax: 1, xLabel, xTime });
  chart($("chart-staleness"), [line("staleness", "#b45309", (r) => r.staleness)], { yMin: 0, xLabel, xTime });
  let total = 0;
  const tput = rows.map((r) => { total += r.samples; return [xOf(r), total / Math.max(r.elapsed_s, 1e-9), `step ${r.step}`]; });
  chart($("chart-throughput"), [{ name: "samples/s", color: "#374151", points: tput }], { yMin: 0, xLabel, xTime });
  chart($("chart-files"), [line("accepted", "#1a8a4a", (r) => r.accepted_files), line("rejected", "#c62828", (r) => r.rejected_files),
    line("stale", "#9ca3af", (r) => r.stale_files)], { yMin: 0, xLabel, xTime });
}

// ---- the swarm ----
function drawSwarm() {
  const sw = state.swarm;
  if (!sw) return;
  const now = sw.now;
  const lines = [];
  if (sw.devices.trainer) lines.push(`trainer on ${sw.devices.trainer}`);
  for (const [k, v] of Object.entries(sw.devices.validators || {})) lines.push(`validator ${short(k)} on ${v}`);
  $("devices").textContent = lines.join(" · ");
  const w = sw.wasted;
  $("wasted").textContent = w && w.files ? `work wasted through no fault of its worker: ${fmt(100 * w.wasted_fraction, 1)}% ` +
    `of ${w.files} files (${w.stale} stale, ${w.refused_blamelessly} refused without blame)` : "";
  const admin = (n) => {
    if (!state.token || n.role === "relay") return "";
    const banned = n.state === "banned";
    return el("button", { class: "small", type: "button", onclick: async () => {
      if (await post(`/v1/admin/nodes/${n.key}/${banned ? "unban" : "ban"}`)) refresh();
    } }, banned ? "unban" : "ban");
  };
  const cols = [
    ["node", (n) => el("span", { title: n.key }, short(n.key))], ["role", (n) => n.role],
    ["state", (n) => el("span", { class: ["registered", "healthy"].includes(n.state) ? "ok" : n.state === "ejected" || n.state === "banned" ? "bad" : "warn" }, n.state)],
    ["device", (n) => n.device || "–"],
    ["hardware", (n) => n.cpus ? `${n.cpus} cpu, ${fmt(n.memory_gb, 0)} GB${n.gpus && n.gpus.length ? ", " + n.gpus.join(", ") : ""}` : "–"],
    ["tokens/s (claimed)", (n) => n.tokens_per_s ?? null], ["s per unit (measured)", (n) => n.s_per_unit],
    ["accepted", (n) => n.accepted], ["pending", (n) => n.pending], ["rejected", (n) => n.rejected],
    ["no fault", (n) => n.blameless ?? null], ["stale", (n) => n.stale ?? null],
    ["stake", (n) => n.stake], ["slashed", (n) => n.slashed],
    ["heartbeat", (n) => ago(n.last_seen, now)],
    ["policy", (n) => n.version ?? null], ["behind", (n) => n.behind], ["weights lag", (n) => n.lag_s === null ? "–" : dur(n.lag_s)],
    ["mismatch KL (unchecked)", (n) => n.kl_unchecked], ["suspect", (n) => n.suspect ? "yes" : ""],
    ["reason", (n) => n.reason || "", "long"], ["", admin],
  ];
  table("nodes", cols, sw.nodes, (n) => (n.state === "ejected" || n.state === "banned" ? "bad" : ""));
  table("relays", [["url", (r) => r.url], ["advertised", (r) => (r.advertised ? "yes" : "no")],
    ["holds versions", (r) => (r.holds ? (r.holds.length ? r.holds.join(", ") : "none yet") : r.error ? `unreachable (${r.error})` : "asking…")],
    ["asked", (r) => ago(r.asked, now)], ["verified version", (r) => r.version], ["listed", (r) => (r.listed === null ? "not checked" : r.listed ? "yes" : "no")],
    ["failures", (r) => r.failures], ["checked", (r) => ago(r.checked, now)], ["detail", (r) => r.detail]], sw.relays);
}

// ---- verification ----
function drawVerdicts() {
  const v = state.verdicts;
  if (!v) return;
  const now = v.now;
  const t0 = Math.min(...v.verdicts.map((x) => x.time || now), ...v.events.map((e) => e.time), now);
  const accepted = v.verdicts.filter((x) => x.accepted).map((x) => [x.time - t0, 1, `${short(x.node)} step ${x.step}: accepted`]);
  const rejected = v.verdicts.filter((x) => !x.accepted).map((x) => [x.time - t0, 0, `${short(x.node)} step ${x.step}: rejected at ${x.check}: ${x.reason}`]);
  const shown = v.events.filter((e) => ["ejected", "banned", "slash", "suspect"].includes(e.kind));
  const marks = shown.map((e, i) => ({ x: e.time - t0, color: e.kind === "suspect" ? "#b26a00" : "#c62828",
    label: `${e.kind} ${short(e.node)}`, title: `${e.kind} ${e.node}: ${e.detail}`, row: i % 4 }));
  chart($("timeline"), [{ name: "accepted", color: "#1a8a4a", points: accepted, dotsOnly: true },
    { name: "rejected", color: "#c62828", points: rejected, dotsOnly: true, r: 5 }],
  { yMin: -0.5, yMax: 1.5, xLabel: "time since the first verdict shown", xTime: true, marks, width: 1400, height: 150 });
  const verdicts = v.verdicts.slice().reverse();
  table("verdicts", [["when", (x) => ago(x.time, now)], ["node", (x) => el("span", { title: x.node }, short(x.node))],
    ["step", (x) => x.step], ["policy", (x) => x.policy],
    ["verdict", (x) => el("span", { class: x.accepted ? "ok" : "bad" }, x.accepted ? "accepted" : "rejected")],
    ["failed check", (x) => x.check], ["reason", (x) => x.reason, "long"], ["checked in", (x) => (x.seconds ? x.seconds.toFixed(2) + " s" : "–")]],
  verdicts, (x) => (x.accepted ? "" : "bad"));
  table("events", [["when", (e) => ago(e.time, now)], ["node", (e) => el("span", { title: e.node }, short(e.node))],
    ["event", (e) => e.kind], ["amount", (e) => e.amount], ["detail", (e) => e.detail, "long"]],
  v.events.slice().reverse(), (e) => (["ejected", "banned", "slash"].includes(e.kind) ? "bad" : ""));
}

// ---- rollouts ----
function verdictOf(f) {
  if (f.state === "rejected") return "rejected";
  return f.checked ? "accepted" : "unchecked";
}
function fillSelect(id, values, keep, label) {
  const sel = $(id), current = sel.value;
  const opts = values.map((v) => el("option", { value: String(v) }, label ? label(v) : String(v)));
  if (keep) opts.unshift(el("option", { value: "" }, "all"));
  sel.replaceChildren(...opts);
  if ([...sel.options].some((o) => o.value === current)) sel.value = current;
}
function drawFiles() {
  const f = state.files;
  if (!f) return;
  fillSelect("step", f.steps, false);
  $("step").value = String(f.step);
  const nodes = [...new Set(f.files.map((x) => x.node))];
  fillSelect("f-node", nodes, true, short);
  const levels = [...new Set(Object.values(state.run ? state.run.levels : {}))].sort((a, b) => a - b);
  fillSelect("f-level", levels, true);
  const node = $("f-node").value, verdict = $("f-verdict").value, level = $("f-level").value;
  const shown = f.files.filter((x) => (!node || x.node === node) && (!verdict || verdictOf(x) === verdict) &&
    (!level || String(x.level) === level));
  const rows = table("files", [["file", (x) => x.key.split("/").pop()], ["node", (x) => el("span", { title: x.node }, short(x.node))],
    ["step", (x) => x.step], ["policy", (x) => x.policy], ["staleness", (x) => x.staleness], ["level", (x) => x.level],
    ["groups", (x) => x.groups], ["state", (x) => x.state],
    ["verdict", (x) => el("span", { class: verdictOf(x) === "rejected" ? "bad" : verdictOf(x) === "accepted" ? "ok" : "dim" }, verdictOf(x))],
    ["failed check", (x) => x.check], ["reason", (x) => x.reason, "long"]], shown,
  (x) => (x.key === state.openKey ? "sel" : verdictOf(x) === "rejected" ? "bad" : ""));
  rows.forEach((tr, i) => {
    tr.dataset.key = shown[i].key;
    tr.addEventListener("click", () => openRollout(shown[i].key));
  });
}
async function openRollout(key) {
  state.openKey = key;
  drawFiles();
  const box = $("rollout");
  try {
    state.rollout = await get("/v1/dashboard/files/" + key, true);
  } catch (e) {
    state.rollout = null;
    box.replaceChildren(el("div", { class: "note" }, e.status === 401
      ? "Rollout texts are for the operator: type the operator token above (runs/<name>/keys/operator.token)."
      : `Cannot read this file: ${e.message}`));
    return;
  }
  drawRollout();
}
function drawRollout() {
  const r = state.rollout, box = $("rollout");
  if (!r) return;
  box.dataset.key = r.key;
  const head = el("h3", {}, `file ${r.key.split("/").pop()} · node ${short(r.node)} · step ${r.step} · policy ${r.policy} (staleness ${r.staleness}) · ${r.state}` +
    (r.check ? ` · failed ${r.check}: ${r.reason}` : ""));
  if (r.gone) { box.replaceChildren(head, el("div", { class: "note" }, r.gone)); return; }
  const want = $("f-reward").value;
  const keep = (x) => !want || (want === "pos" ? x.reward > 0 : x.reward <= 0);
  const groups = new Map();
  for (const x of r.samples) {
    if (!groups.has(x.group)) groups.set(x.group, []);
    groups.get(x.group).push(x);
  }
  const checked = new Set(r.checked_samples || []);
  const cards = [];
  for (const [g, xs] of groups) {
    const best = Math.max(...xs.map((x) => x.reward));
    const shown = xs.filter(keep);
    if (!shown.length) continue;
    const mean = xs.reduce((a, x) => a + x.reward, 0) / xs.length;
    cards.push(el("div", { class: "group" },
      el("div", {}, el("b", {}, `group ${g}`), ` · problem ${xs[0].problem_id} · ${xs[0].task_type} · mean reward ${fmt(mean)} · ${xs.length} samples`),
      el("div", { class: "prompt" }, xs[0].prompt),
      el("div", { class: "samples" }, ...shown.map((x) => el("div", { class: "sample" + (x.reward === best && best > 0 ? " win" : "") },
        el("div", {}, el("b", {}, `#${x.index}`), ` reward ${fmt(x.reward)} (task ${fmt(x.task_reward)}, length ${fmt(x.length_penalty)}) · ${x.completion_tokens} tokens` +
          (checked.has(x.index) ? " · checked" : "")),
        el("pre", {}, x.completion))))));
  }
  box.replaceChildren(head, el("div", { class: "groups" }, ...(cards.length ? cards : [el("div", { class: "note" }, "no sample matches the reward filter")])));
}

// ---- polling ----
async function refresh() {
  try {
    const [run, swarm, verdicts] = await Promise.all([
      get(`/v1/dashboard/run?after=${state.lastStep}`), get("/v1/dashboard/swarm"), get("/v1/dashboard/verdicts")]);
    if (run.metrics.length) {
      const byStep = new Map(state.metrics.map((r) => [r.step, r]));
      for (const r of run.metrics) byStep.set(r.step, r);
      state.metrics = [...byStep.values()].sort((a, b) => a.step - b.step);
      state.lastStep = state.metrics[state.metrics.length - 1].step;
    }
    state.run = run; state.swarm = swarm; state.verdicts = verdicts;
    const follow = $("follow").checked;
    const files = await get("/v1/dashboard/files" + (follow || state.step === null ? "" : `?step=${state.step}`));
    state.files = files; state.step = files.step;
    drawRun(); drawSwarm(); drawVerdicts(); drawFiles();
    if (state.openKey && state.rollout && state.rollout.gone === undefined && state.rollout.state !== (files.files.find((x) => x.key === state.openKey) || {}).state) {
      openRollout(state.openKey);  // its verdict came in
    }
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("updated").textContent = "cannot reach the orchestrator: " + e.message;
  }
}
async function checkToken() {
  if (!state.token) { $("token-state").textContent = "public view"; return; }
  try {
    await get("/v1/admin/nodes", true);
    $("token-state").textContent = "operator view";
  } catch (e) {
    $("token-state").textContent = "token refused";
    state.token = ""; sessionStorage.removeItem("swarmrl-token");
  }
}
function start() {
  $("token-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    state.token = $("token").value.trim();
    $("token").value = "";
    if (state.token) sessionStorage.setItem("swarmrl-token", state.token);
    await checkToken();
    refresh();
    if (state.openKey) openRollout(state.openKey);
  });
  for (const r of document.querySelectorAll("input[name=xaxis]")) {
    r.addEventListener("change", () => { state.xaxis = r.value; drawRun(); });
  }
  $("step").addEventListener("change", () => { $("follow").checked = false; state.step = +$("step").value; refresh(); });
  const move = (d) => () => {
    const steps = state.files ? state.files.steps : [];
    const i = steps.indexOf(state.step) + d;
    if (i >= 0 && i < steps.length) { $("follow").checked = false; state.step = steps[i]; refresh(); }
  };
  $("step-prev").addEventListener("click", move(-1));
  $("step-next").addEventListener("click", move(1));
  for (const id of ["f-node", "f-verdict", "f-level"]) $(id).addEventListener("change", drawFiles);
  $("f-reward").addEventListener("change", drawRollout);
  checkToken();
  refresh();
  setInterval(refresh, POLL_MS);
}
document.addEventListener("DOMContentLoaded", start);
