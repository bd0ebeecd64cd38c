// The dashboard's script: polls the serving node's JSON (api/overview for
// the cluster's state, api/metrics for the charts) every 2 s and redraws.
// Plain JavaScript with no dependencies; charts are SVG drawn here. Every
// string from the server goes through textContent (never innerHTML), so a
// node or file system name cannot inject markup.
"use strict";

const POLL_MS = 2000;
const OVERVIEW_TIMEOUT_MS = 8000; // a gathering waits for dead nodes a few seconds
const METRICS_TIMEOUT_MS = 4000;
const ROWS_MAX = 50; // rows shown per table; the rest are counted

let lastOverviewAt = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function byId(id) { return document.getElementById(id); }

function fmtBytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function fmtNum(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en");
  // Sub-millisecond latencies keep two significant digits, not "0.0".
  if (v !== 0 && Math.abs(v) < 0.1 && digits === undefined) return String(+v.toPrecision(2));
  return v.toFixed(digits === undefined ? 1 : digits);
}

function fmtTime(s) {
  if (!s) return "";
  const d = new Date(s);
  return Number.isNaN(d.getTime()) ? s : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function stateBadge(state) { return el("span", { class: "state " + state }, state); }

function setNote(id, section, extra) {
  const n = byId(id);
  n.textContent = section && section.error ? "error: " + section.error : (extra || "");
  n.className = section && section.error ? "err" : "";
}

function fillBody(table, rows, total, cols) {
  const body = byId(table).tBodies[0];
  body.replaceChildren(...rows);
  if (total > rows.length) {
    body.append(el("tr", {}, el("td", { colspan: cols, class: "muted" }, `… and ${total - rows.length} more`)));
  }
  if (total === 0) body.append(el("tr", {}, el("td", { colspan: cols, class: "muted" }, "none")));
}

// diskSpace shows how full a node's disks are: the free space its last
// heartbeat reported against their size (what it can still take, whoever
// filled it), or the bytes it registered as used when it reported none.
function diskSpace(n) {
  const cap = n.capacity_bytes || 0;
  const used = n.free_bytes ? Math.max(0, cap - n.free_bytes) : n.used_bytes || 0;
  const pct = cap > 0 ? Math.min(100, (100 * used) / cap) : 0;
  return el("span", { title: `${fmtBytes(used)} used` }, el("span", { class: "bar" }, el("span", { style: `width:${pct.toFixed(1)}%` })),
    `${fmtBytes(n.free_bytes || cap - used)} free of ${fmtBytes(cap)}`);
}

// health classifies the overview: "down" when the directory has no leader
// (nothing can change), "degraded" when anything else is listed, else
// "healthy".
function health(ov) {
  const degraded = ov.degraded || [];
  if (!ov.directory || !ov.directory.leader || degraded.some((p) => p.kind === "no_directory_leader")) return "down";
  return degraded.length ? "degraded" : "healthy";
}

function renderHealth(ov) {
  const status = health(ov);
  const banner = byId("health");
  banner.dataset.status = status;
  byId("health-badge").textContent = status;
  const degraded = ov.degraded || [];
  byId("health-text").textContent =
    status === "healthy" ? "all nodes alive, every extent and tract fully replicated"
      : status === "down" ? "the directory has no leader: the cluster cannot change its state"
        : `${degraded.length} problem${degraded.length === 1 ? "" : "s"}`;
  byId("degraded").replaceChildren(...degraded.slice(0, 20).map((p) =>
    el("li", { "data-kind": p.kind }, el("b", {}, p.subject), ": ", p.message)));
}

function renderUnreachable(err) {
  const banner = byId("health");
  banner.dataset.status = "unreachable";
  byId("health-badge").textContent = "node unreachable";
  byId("health-text").textContent = `this node did not answer (${err})` +
    (lastOverviewAt ? `; showing its last answer, from ${lastOverviewAt.toLocaleTimeString()}` : "");
  byId("degraded").replaceChildren();
}

function renderSummary(ov) {
  const d = ov.directory || {};
  const nodes = ov.nodes || [];
  const alive = nodes.filter((n) => n.state === "alive").length;
  const cap = ov.capacity || {};
  byId("summary").replaceChildren(
    "directory leader ", el("b", { id: "leader" }, d.leader ? `node ${d.leader}` : "none"),
    d.term ? ` (term ${d.term})` : "", d.stale ? " · stale view" : "",
    " · nodes ", el("b", {}, `${alive}/${nodes.length}`), " alive",
    " · space ", el("b", {}, `${fmtBytes(cap.free_bytes)} free of ${fmtBytes(cap.capacity_bytes)}`));
  byId("updated").textContent = `updated ${new Date().toLocaleTimeString()} · gathered in ${ov.took_ms} ms`;
}

function renderNodes(ov) {
  const nodes = ov.nodes || [];
  const rows = nodes.map((n) => el("tr", { "data-node-id": n.id, "data-state": n.state },
    el("td", {}, String(n.id)),
    el("td", {}, stateBadge(n.state)),
    el("td", {}, (n.roles || []).join(", ")),
    el("td", {}, n.directory || ""),
    el("td", {}, n.domain || ""),
    el("td", {}, n.http_address ? el("a", { href: `http://${n.http_address}/ui/` }, n.address) : n.address),
    el("td", {}, (n.disks || []).map((d) => d.path).join(", ")),
    el("td", {}, diskSpace(n)),
    el("td", { class: "num" }, fmtNum(n.load))));
  fillBody("nodes", rows, nodes.length, 9);
  setNote("nodes-note", ov.directory, `${nodes.length} nodes`);
}

function renderRecovery(ov) {
  const r = ov.recovery || {};
  const rows = r.rows || 0;
  const synced = rows - (r.rows_catching_up || 0);
  byId("recovery").replaceChildren(el("div", { class: "kv" },
    el("span", { class: "k" }, "state"), el("span", {}, r.in_progress ? "re-replicating" : "idle"),
    el("span", { class: "k" }, "TLT rows in sync"), usageRows(synced, rows),
    el("span", { class: "k" }, "recovered"), el("span", {}, fmtBytes(r.recovered_bytes)),
    el("span", { class: "k" }, "under-replicated extents"), el("span", {}, String(r.extents_under_replicated || 0))));
}

function usageRows(done, total) {
  const pct = total > 0 ? (100 * done) / total : 100;
  return el("span", {}, el("span", { class: "bar" }, el("span", { style: `width:${pct.toFixed(1)}%` })), `${done} / ${total}`);
}

function renderTLT(ov) {
  const t = ov.tlt || {};
  const rows = t.rows || [];
  const servers = t.servers || [];
  const behind = rows.filter((r) => (r.pending || []).length || (r.behind || []).length);
  const children = [el("div", { class: "kv" },
    el("span", { class: "k" }, "version"), el("span", {}, String(t.version || 0)),
    el("span", { class: "k" }, "rows"), el("span", {}, `${rows.length} × ${t.replication || 0} replicas, tract ${fmtBytes(t.tract_size)}`),
    el("span", { class: "k" }, "pending entries"), el("span", {}, String(behind.length ? behind.reduce((a, r) => a + (r.pending || []).length, 0) : 0)))];
  const sTable = el("table", {}, el("thead", {}, el("tr", {}, ["server", "state", "slots", "primary", "pending", "tracts", "bytes"].map((h) => el("th", {}, h)))),
    el("tbody", {}, servers.map((s) => el("tr", { "data-state": s.state },
      el("td", {}, s.server), el("td", {}, stateBadge(s.state || "")),
      el("td", { class: "num" }, String(s.slots)), el("td", { class: "num" }, String(s.primary)),
      el("td", { class: "num" }, String(s.pending)), el("td", { class: "num" }, String(s.tracts)),
      el("td", { class: "num" }, fmtBytes(s.bytes))))));
  children.push(sTable);
  if (behind.length) {
    // One line per row would push the rest of the page away: a short list.
    const shown = behind.slice(0, 8).map((r) =>
      `row ${r.row} (${[...(r.pending || []).map((p) => "pending " + p), ...(r.behind || [])].join("; ")})`);
    children.push(el("p", { class: "muted" }, `${behind.length} rows catching up: ${shown.join(", ")}` +
      (behind.length > shown.length ? `, … and ${behind.length - shown.length} more` : "")));
  }
  byId("tlt").replaceChildren(...children);
  setNote("tlt-note", t, t.version ? `version ${t.version}` : "");
}

function renderExtents(ov) {
  const s = ov.extents || {};
  const list = s.extents || [];
  const state = new Map((ov.nodes || []).map((n) => [n.id, n.state]));
  const rows = list.slice(0, ROWS_MAX).map((x) => {
    const reps = x.replicas || [];
    const live = reps.filter((id) => state.get(id) === "alive").length;
    const short = live < (x.replication || reps.length);
    return el("tr", { "data-state": short ? "degraded" : "alive" },
      el("td", {}, String(x.id)),
      el("td", {}, reps.map((id, i) => [i ? ", " : "", el("span", { class: state.get(id) === "alive" ? "" : "down" }, String(id))]),
        short ? ` (${live} of ${x.replication} live)` : ""),
      el("td", {}, x.leader ? String(x.leader) : "none"),
      el("td", { class: "num" }, String(x.epoch)));
  });
  fillBody("extents", rows, list.length, 4);
  setNote("extents-note", s, `${list.length}`);
}

function renderTables(ov) {
  const s = ov.tables || {};
  const list = s.tables || [];
  byId("balance").replaceChildren(
    el("span", { class: "k" }, "metadata servers"), el("span", {}, (s.servers || []).join(", ") || "none"),
    el("span", { class: "k" }, "inode balance (CV)"), el("span", {}, `tables ${fmtNum(s.inodes_cv_tables, 2)} · servers ${fmtNum(s.inodes_cv_servers, 2)}`),
    el("span", { class: "k" }, "load balance (CV)"), el("span", {}, `tables ${fmtNum(s.load_cv_tables, 2)} · servers ${fmtNum(s.load_cv_servers, 2)}`));
  const rows = list.slice(0, ROWS_MAX).map((t) => el("tr", { "data-state": t.owner ? "alive" : "dead" },
    el("td", {}, String(t.table)), el("td", {}, String(t.file_system)),
    el("td", {}, `${t.lo} – ${t.hi}`),
    el("td", {}, t.owner ? `node ${t.owner}` : "none"),
    el("td", { class: "num" }, fmtNum(t.inodes, 0)), el("td", { class: "num" }, fmtNum(t.ops_per_second))));
  fillBody("tables", rows, list.length, 6);
  setNote("tables-note", s, `${list.length}`);
}

function renderFileSystems(ov) {
  const s = ov.file_systems || {};
  const list = s.file_systems || [];
  const rows = list.slice(0, ROWS_MAX).map((f) => el("tr", {},
    el("td", {}, String(f.number)), el("td", {}, f.name), el("td", {}, fmtTime(f.created)),
    el("td", {}, (f.snapshots || []).length ? (f.snapshots || []).map((p) => p.name).join(", ") : "none")));
  fillBody("filesystems", rows, list.length, 4);
  setNote("fs-note", s, `${list.length}`);
}

// chart draws series (arrays of [t, v|null]) over the last windowMs as an
// SVG line chart; a null breaks the line (no calls, or no sample). With
// log set the y axis is logarithmic, one grid line a decade: latency
// quantiles lie orders of magnitude apart, and a linear axis would flatten
// all but the highest.
function chart(id, series, windowMs, now, log) {
  const W = 600, H = 160, L = 44, R = 8, T = 8, B = 18;
  let max = 0, min = Infinity;
  for (const s of series) for (const [, v] of s.points) {
    if (v !== null && v > max) max = v;
    if (v !== null && v > 0 && v < min) min = v;
  }
  const x = (t) => L + ((t - (now - windowMs)) / windowMs) * (W - L - R);
  let y, ticks;
  if (log) {
    const lo = Math.floor(Math.log10(Number.isFinite(min) ? min : 0.01));
    const hi = Math.max(lo + 1, Math.ceil(Math.log10(max > 0 ? max : 1)));
    y = (v) => H - B - ((Math.log10(Math.max(v, Math.pow(10, lo))) - lo) / (hi - lo)) * (H - T - B);
    ticks = [];
    const every = Math.ceil((hi - lo) / 4); // at most 5 lines
    for (let e = lo; e <= hi; e += every) ticks.push(Math.pow(10, e));
  } else {
    max = niceMax(max);
    y = (v) => H - B - (v / max) * (H - T - B);
    ticks = [0, max / 2, max];
  }
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
  for (const v of ticks) {
    root.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    const label = svg("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" });
    label.textContent = v < 1 && v > 0 ? String(+v.toPrecision(1)) : fmtNum(v, v < 10 ? 1 : 0);
    root.append(label);
  }
  for (const m of [windowMs, windowMs / 2, 0]) {
    const label = svg("text", { x: x(now - m), y: H - 4, "text-anchor": m === windowMs ? "start" : m === 0 ? "end" : "middle" });
    label.textContent = m === 0 ? "now" : `-${Math.round(m / 60000)} min`;
    root.append(label);
  }
  for (const s of series) {
    let seg = [];
    const flush = () => {
      if (seg.length > 1) root.append(svg("polyline", { points: seg.join(" "), fill: "none", stroke: s.color, "stroke-width": 1.5 }));
      else if (seg.length === 1) { const [cx, cy] = seg[0].split(","); root.append(svg("circle", { cx, cy, r: 1.5, fill: s.color })); }
      seg = [];
    };
    for (const [t, v] of s.points) {
      if (v === null || t < now - windowMs) { flush(); continue; }
      seg.push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
    }
    flush();
  }
  const legend = el("div", { class: "legend" }, series.map((s) => [el("i", { style: `background:${s.color}` }), s.name,
    " ", el("b", {}, fmtNum(lastValue(s.points)))]));
  byId(id).replaceChildren(root, legend);
}

function lastValue(points) {
  for (let i = points.length - 1; i >= 0; i--) if (points[i][1] !== null) return points[i][1];
  return null;
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function renderCharts(h) {
  const now = Date.now();
  const pts = h.points || [];
  chart("chart-ops", [
    { name: "ops/s", color: "#1a73e8", points: pts.map((p) => [p.t, p.ops]) },
    { name: "not OK/s", color: "#c5221f", points: pts.map((p) => [p.t, p.errors]) },
  ], h.window_ms, now);
  const colors = ["#1e8e3e", "#f9ab00", "#c5221f"];
  chart("chart-lat", (h.quantiles || []).map((q, i) => ({
    name: `p${Math.round(q * 100)}`, color: colors[i % colors.length],
    points: pts.map((p) => [p.t, (p.latency_ms || [])[i] ?? null]),
  })), h.window_ms, now, true);
  const note = byId("charts-note");
  note.textContent = h.error ? h.error : pts.length ? `${pts[pts.length - 1].nodes} nodes, every ${h.step_ms / 1000} s`
    : "sampling started; the first points come in a few seconds";
  note.className = h.error ? "err" : "";
}

async function fetchJSON(path, timeoutMs) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), timeoutMs);
  try {
    const r = await fetch(path, { signal: ctl.signal, cache: "no-store" });
    const body = await r.json().catch(() => ({}));
    // The overview answers 503 with a partial overview when the directory
    // could not be read: that is news to show, not a failed fetch.
    if (!r.ok && !body.directory) throw new Error(body.error || `HTTP ${r.status}`);
    return body;
  } catch (e) {
    // fetch rejects with a TypeError when no connection could be made.
    throw new Error(e.name === "AbortError" ? `no answer within ${timeoutMs / 1000} s`
      : e instanceof TypeError ? "connection failed" : e.message);
  } finally {
    clearTimeout(timer);
  }
}

async function pollOverview() {
  try {
    const ov = await fetchJSON("api/overview", OVERVIEW_TIMEOUT_MS);
    lastOverviewAt = new Date();
    for (const f of [renderHealth, renderSummary, renderNodes, renderRecovery, renderTLT, renderExtents, renderTables, renderFileSystems]) {
      try { f(ov); } catch (e) { console.error(f.name, e); }
    }
  } catch (e) {
    renderUnreachable(e.message);
  }
}

async function pollMetrics() {
  try {
    renderCharts(await fetchJSON("api/metrics", METRICS_TIMEOUT_MS));
  } catch (e) {
    const note = byId("charts-note");
    note.textContent = "metrics: " + e.message;
    note.className = "err";
  }
}

// loop polls, then waits POLL_MS: polls never pile up behind a slow node.
async function loop(poll) {
  for (;;) {
    await poll();
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

loop(pollOverview);
loop(pollMetrics);
