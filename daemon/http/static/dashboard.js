// agentd live dashboard: polls /scheduling/dashboard.json about once a second and renders it.
// Plain DOM, no dependencies. Every value shown comes from the latest poll.
"use strict";
(function () {
  const POLL_MS = 1000;
  const view = { page: 1, state: "all", sort: "program" };
  let polls = 0;
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }
  const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));
  const secs = (s) => (s === null || s === undefined ? "–" : s < 10 ? s.toFixed(2) + " s" : s.toFixed(0) + " s");
  const pct = (x, cap) => (cap ? Math.min(100, (100 * x) / cap) : 0);

  function renderTotals(d) {
    const c = d.programs.counts;
    const items = [
      ["live Programs", d.live_programs], ["active", c.active], ["acting", c.acting], ["paused", c.paused],
      ["queued", c.queued], ["in-flight requests", d.in_flight_requests], ["retained requests", d.retained_requests],
      ["forced admissions", d.forced_admissions], ["resume cache-miss ratio", d.resume_cache_miss_ratio.toFixed(3)],
    ];
    $("totals").replaceChildren(...items.map(([k, v]) => el("div", {}, el("b", {}, typeof v === "number" ? fmt(v) : v), k)));
  }

  function kvRow(label, cls, value, cap) {
    const bar = el("div", { class: "bar" }, el("span", { class: cls, style: `width:${pct(value || 0, cap)}%` }));
    return [el("span", {}, label), bar, el("span", { class: "v" }, value === null ? "not observed" : `${fmt(value)} / ${fmt(cap)}`)];
  }

  function renderRanks(ranks) {
    $("ranks").replaceChildren(...ranks.map((r) => {
      const fresh = r.observation_fresh;
      const age = r.observation_age_seconds === null ? "never observed" : `observed ${secs(r.observation_age_seconds)} ago`;
      return el("div", { class: "rank", "data-rank": r.target_id },
        el("h3", {}, el("span", {}, r.target_id), el("span", { class: fresh ? "fresh" : "stale" }, fresh ? "fresh" : "stale")),
        el("div", { class: "kv" },
          ...kvRow("ledger", "ledger", r.ledger_used_tokens, r.capacity_tokens),
          ...kvRow("observed", "observed", r.observed_used_tokens, r.capacity_tokens)),
        el("div", { class: "facts" },
          el("span", {}, "headroom ", el("b", {}, fmt(r.headroom_tokens))),
          el("span", {}, "queue ", el("b", {}, `${fmt(r.queued_programs)} (${fmt(r.queued_requests)} req)`)),
          el("span", {}, "in flight ", el("b", {}, fmt(r.in_flight_requests))),
          el("span", {}, "active ", el("b", {}, fmt(r.active_programs))),
          el("span", {}, "acting ", el("b", {}, fmt(r.acting_programs))),
          el("span", {}, "paused ", el("b", {}, fmt(r.paused_programs))),
          el("span", { title: "requests waiting in the engine at the last scrape" }, "engine queue ", el("b", {}, fmt(r.engine_waiting_requests)))),
        el("div", { class: "muted" }, `${age} · accounting: ${r.capacity_accounting_source}` +
          (r.waiting_gate_shut ? " · waiting gate shut: admissions held by the engine's queue" : "")));
    }));
  }

  function spark(label, values, show) {
    const nums = values.map((v) => (v === null ? null : Number(v)));
    const known = nums.filter((v) => v !== null);
    const max = Math.max(1e-9, ...known);
    const w = 200, h = 34, n = Math.max(2, nums.length);
    const pts = nums.map((v, i) => (v === null ? null : `${((i * w) / (n - 1)).toFixed(1)},${(h - 1 - (v / max) * (h - 3)).toFixed(1)}`)).filter(Boolean).join(" ");
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("preserveAspectRatio", "none");
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", pts);
    svg.append(line);
    const last = known.length ? show(known[known.length - 1]) : "–";
    return el("div", { class: "spark" }, el("span", { class: "last" }, last), el("div", { class: "label" }, label), svg);
  }

  function renderSparks(hist) {
    $("sparks").replaceChildren(
      spark(`admissions / tick (last ${hist.ticks})`, hist.admissions, fmt),
      spark("pauses / tick", hist.pauses, fmt),
      spark("mean router queue wait of admitted requests", hist.queue_wait_mean_seconds, secs),
      spark("resume cache-miss ratio", hist.resume_cache_miss_ratio, (v) => v.toFixed(3)),
      spark("cache-miss impact, mean over ranks", hist.cache_miss_impact_mean_seconds, secs));
  }

  function renderPrograms(p) {
    const order = ["all", "active", "reasoning", "acting", "paused", "queued"];
    $("filters").replaceChildren(...order.map((s) => {
      const b = el("button", { type: "button", class: s === p.state ? "sel" : "" }, `${s} ${fmt(p.counts[s])}`);
      b.addEventListener("click", () => { view.state = s; view.page = 1; poll(); });
      return b;
    }));
    $("prog-summary").textContent = `${fmt(p.matching)} matching · ${p.page_size} per page · sorted by ${p.sort}`;
    const rows = p.rows.map((r) => el("tr", { "data-program": r.program },
      el("td", {}, el("code", {}, r.program)), el("td", { class: "pstate" }, `${r.state} · ${r.status}`),
      el("td", {}, r.target_id || "–"), el("td", { class: "num" }, fmt(r.context_tokens)),
      el("td", { class: "num" }, fmt(r.in_flight_requests)), el("td", { class: "num" }, fmt(r.waiting_requests)),
      el("td", { class: "num" }, secs(r.ttl_remaining_seconds)),
      el("td", { class: "num" }, r.waiting_seconds === null ? "–" : `${secs(r.waiting_seconds)} ago`),
      el("td", {}, r.pause_reason || "")));
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "9", class: "muted" }, "no Programs in this state")));
    $("programs").tBodies[0].replaceChildren(...rows);
    view.page = p.page;
    $("pageinfo").textContent = `page ${p.page} of ${p.pages}`;
    $("prev").disabled = p.page <= 1;
    $("next").disabled = p.page >= p.pages;
  }

  function renderEvents(d) {
    $("events-total").textContent = `${fmt(d.events_total)} since start`;
    const items = d.events.map((e) => el("li", { class: `k-${e.kind}`, title: `reason: ${e.reason}` },
      el("span", {}, `${secs(e.age_seconds)} ago`), el("b", {}, e.kind),
      el("span", {}, el("code", {}, e.program), ` → ${e.target_id || "–"}`, el("br", {}), el("small", { class: "muted" }, e.reason))));
    if (!items.length) items.push(el("li", { class: "muted" }, "no scheduling events yet"));
    $("events").replaceChildren(...items);
  }

  function renderProxy(px) {
    const healthy = px.targets.filter((t) => t.healthy).length;
    $("proxy-summary").textContent = `${healthy}/${px.targets.length} healthy · native policy ${px.policy}${px.embedded ? " · embedded simulated backend" : ""}`;
    $("targets").tBodies[0].replaceChildren(...px.targets.map((t) => el("tr", { "data-target": t.target_id },
      el("td", {}, t.target_id), el("td", {}, t.base_url), el("td", {}, t.dp_rank === null ? "–" : t.dp_rank),
      el("td", { class: t.healthy ? "healthy" : "unhealthy" }, t.healthy ? "healthy" : `unhealthy: ${t.health_reason || ""}`),
      el("td", { class: "num" }, fmt(t.native_in_flight_requests)))));
  }

  function render(d, bytes) {
    polls += 1;
    const mode = $("mode");
    mode.textContent = d.enabled ? "Program scheduling on" : "Program scheduling off";
    mode.className = d.enabled ? "pill on" : "pill off";
    $("scheduling").hidden = !d.enabled;
    if (d.enabled) {
      renderTotals(d); renderRanks(d.ranks); renderSparks(d.history); renderPrograms(d.programs); renderEvents(d);
    }
    renderProxy(d.proxy);
    const status = $("status");
    status.dataset.polls = String(polls);
    status.textContent = `live · updated ${new Date().toLocaleTimeString()} · ${fmt(bytes)} bytes · poll #${polls}`;
  }

  let timer = null;
  async function poll() {
    clearTimeout(timer);
    const q = new URLSearchParams({ page: String(view.page), state: view.state, sort: view.sort });
    try {
      const res = await fetch(`/scheduling/dashboard.json?${q}`, { cache: "no-store" });
      const text = await res.text();
      if (!res.ok) throw new Error(`HTTP ${res.status}: ${text.slice(0, 200)}`);
      render(JSON.parse(text), text.length);
    } catch (err) {
      $("mode").className = "pill err";
      $("mode").textContent = "disconnected";
      $("status").textContent = `poll failed: ${err.message}`;
    }
    timer = setTimeout(poll, POLL_MS);
  }

  $("prev").addEventListener("click", () => { view.page = Math.max(1, view.page - 1); poll(); });
  $("next").addEventListener("click", () => { view.page += 1; poll(); });
  $("sort").addEventListener("change", (e) => { view.sort = e.target.value; view.page = 1; poll(); });
  poll();
})();
