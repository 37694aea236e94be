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
      el("td", { class: "ptenant" }, r.tenant), el("td", { class: "num" }, fmt(r.priority)),
      el("td", {}, r.target_id || "–"), el("td", { class: "num" }, fmt(r.context_tokens)),
      el("td", { class: "num" }, fmt(r.in_flight_requests)), el("td", { class: "num" }, fmt(r.waiting_requests)),
      el("td", { class: "num" }, secs(r.ttl_remaining_seconds)),
      el("td", { class: "num" }, r.waiting_seconds === null ? "–" : `${secs(r.waiting_seconds)} ago`),
      el("td", {}, r.pause_reason || "")));
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "11", class: "muted" }, "no Programs in this state")));
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

  // ---- panels beyond Program scheduling (docs/operations.md §9) ----
  const share = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`);
  const num = (x, digits) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));

  function table(cls, head, rows, emptyText) {
    const thead = el("thead", {}, el("tr", {}, ...head.map(([label, numeric, title]) =>
      el("th", Object.assign(numeric ? { class: "num" } : {}, title ? { title } : {}), label))));
    const body = rows.length ? rows : [el("tr", {}, el("td", { colspan: String(head.length), class: "muted" }, emptyText))];
    return el("table", { class: cls }, thead, el("tbody", {}, ...body));
  }
  const td = (v, numeric, attrs) => el("td", Object.assign(numeric ? { class: "num" } : {}, attrs || {}), v);
  const facts = (items) => el("div", { class: "pfacts" }, ...items.map(([k, v, title]) =>
    el("span", title ? { title } : {}, `${k} `, el("b", {}, v))));
  const more = (n, what) => (n > 0 ? [el("div", { class: "muted more" }, `+ ${fmt(n)} more ${what} (in /scheduling/diagnostics)`)] : []);

  function panel(id, summary, ...children) {
    const p = $(id);
    p.querySelector("small").textContent = summary;
    p.querySelector(".pbody").replaceChildren(...children);
  }
  const empty = (text) => el("div", { class: "muted empty" }, text);

  function renderBatch(b, enabled) {
    if (!enabled) return panel("p-batch", "", empty("needs Program scheduling (enable_program_scheduling)"));
    if (!b || !b.enabled) return panel("p-batch", "off", empty("batch jobs are off ([batch_jobs] enabled = false)"));
    const totals = facts([
      ["queued", fmt(b.queued)], ["running", fmt(b.running)], ["oldest wait", secs(b.oldest_wait_seconds)],
      ["starvation escapes", fmt(b.starvation_escapes)], ["preemptions", fmt(b.preemptions)],
      ["decode rate", b.decode_tokens_per_second === null ? "–" : `${fmt(Math.round(b.decode_tokens_per_second))} tok/s`],
      ["reserve", `${fmt(b.reserve_blocks)} blocks`, "sum over ranks of min(running + reserve_margin_blocks, reserve_max_blocks)"],
      ["growth reserve", `${fmt(b.growth_reserve_tokens)} tok`], ["budget", `${fmt(b.budget_tokens)} tok`]]);
    if (!b.jobs_total) return panel("p-batch", "no jobs yet", totals, empty("no batch job seen yet"));
    const rows = b.jobs.map((j) => el("tr", { "data-job": j.job },
      td(el("code", {}, j.job)), td(fmt(j.queued), true), td(fmt(j.running), true),
      td(`${fmt(j.admitted)} / ${fmt(j.completed)}`, true), td(fmt(j.failed), true),
      td(`${fmt(j.predicted_decode_tokens)} / ${j.observed_decode_tokens_mean === null ? "–" : fmt(Math.round(j.observed_decode_tokens_mean))}`, true),
      td(secs(j.mean_queue_wait_seconds), true), td(fmt(j.charged_blocks), true)));
    panel("p-batch", `${fmt(b.jobs_total)} jobs · block ${b.block_size_tokens} tokens${b.programs_waiting ? " · Programs waiting: batch held to its share" : ""}`,
      totals,
      table("ptable", [["job"], ["queued", 1], ["running", 1], ["admitted / completed", 1], ["failed", 1, "failed + abandoned"],
        ["decode pred. / obs.", 1, "predicted decode tokens vs observed mean of natural stops"], ["mean wait", 1],
        ["charged blocks", 1, "KV blocks its running requests are charged on the ledgers"]], rows, ""),
      ...more(b.jobs_more, "jobs"));
  }

  function shareBar(service, weight) {
    const bar = el("div", { class: "sbar", title: `service ${share(service)} · weight share ${share(weight)}` },
      el("span", { class: "svc", style: `width:${Math.min(100, 100 * (service || 0))}%` }));
    if (weight !== null && weight !== undefined) bar.append(el("i", { style: `left:${Math.min(100, 100 * weight)}%` }));
    return bar;
  }

  function renderTenants(ct) {
    if (!ct) return panel("p-tenants", "", empty("no class or tenant figures"));
    const classes = ct.classes.map((c) => el("tr", { "data-class": c.request_class },
      td(c.request_class), td(fmt(c.waiting), true), td(fmt(c.running), true), td(secs(c.oldest_wait_seconds), true),
      td(fmt(c.admitted), true), td(fmt(c.rejected), true), td(secs(c.wait_mean_seconds), true), td(share(c.service_share), true)));
    const tenants = ct.tenants.map((t) => el("tr", { "data-tenant": t.tenant },
      td(el("code", {}, t.tenant)), td(t.weight === null ? "–" : `${num(t.weight, 2)} (${share(t.weight_share)})`, true),
      td(el("span", {}, share(t.service_share), shareBar(t.service_share, t.weight_share)), true),
      td(fmt(t.waiting), true), td(t.running === null ? "–" : fmt(t.running), true), td(fmt(t.dispatched), true),
      td(t.counter === null ? "–" : fmt(Math.round(t.counter)), true), td(t.kv_token_seconds === null ? "–" : fmt(Math.round(t.kv_token_seconds)), true),
      td(t.held_kv_tokens === null ? "–" : fmt(t.held_kv_tokens), true), td(t.lifts === null ? "–" : fmt(t.lifts), true)));
    panel("p-tenants", `${fmt(ct.tenants_total)} tenants${ct.fairness ? ` · fairness ${ct.fairness}` : ""}`,
      table("ptable", [["class"], ["waiting", 1], ["running", 1], ["oldest wait", 1], ["admitted", 1], ["rejected", 1],
        ["mean wait", 1, "arrival to dispatch decision, at the proxy"], ["service share", 1, "share of prompt + completion tokens served"]], classes, "no class figures"),
      table("ptable", [["tenant"], ["weight (share)", 1], ["service share vs weight", 1, "charged input + output tokens over all tenants; the tick marks the weight share"],
        ["waiting", 1], ["running", 1], ["dispatched", 1], ["VTC counter", 1, "virtual token counter, KV rent included"],
        ["KV token·s", 1, "KV rent charged"], ["held KV", 1, "tokens held now by its idle Programs"], ["lifts", 1, "counter lifts on return"]],
      tenants, "no tenant has sent a request yet"),
      ...more(ct.tenants_more, "tenants"));
  }

  function renderTools(tl, enabled) {
    if (!enabled || !tl) return panel("p-tools", "", empty("needs Program scheduling (enable_program_scheduling)"));
    const state = tl.enabled ? `per-tool TTL on · decides after ${tl.min_samples} gaps` : "per-tool TTL off: the fitted TTL decides";
    if (!tl.tools_total) return panel("p-tools", state, empty("no tool-call turn seen yet"));
    const decision = (t) => (t.decision === "hold" ? `hold ${secs(t.last_ttl_seconds)}` : t.decision === "release" ? "release at once" : "fitted TTL");
    const rows = tl.tools.map((t) => el("tr", { "data-tool": t.tool },
      td(el("code", {}, t.tool)), td(t.model_pool), td(`${fmt(t.samples)} / ${fmt(t.observed)}`, true),
      td(`${secs(t.gap_p50_seconds)} · ${secs(t.gap_p90_seconds)} · ${secs(t.gap_p99_seconds)}`, true),
      td(decision(t), false, { class: `d-${t.decision}` }),
      td(`${fmt(t.held)} / ${fmt(t.released)} / ${fmt(t.fallbacks)}`, true),
      td(`${fmt(t.returned_held)} / ${fmt(t.returned_released)}`, true),
      td(`${fmt(t.fit_would_hold)} / ${fmt(t.fit_would_release)}`, true), td(share(t.resume_miss_ratio), true)));
    panel("p-tools", `${fmt(tl.tools_total)} tools · ${state}`,
      table("ptable", [["tool"], ["pool"], ["gaps kept / seen", 1], ["gap p50 · p90 · p99", 1], ["decision now", 0, "what its next completion gets"],
        ["held / released / fit", 1, "decisions that held the KV, released it at once, fell back to the fitted TTL"],
        ["came back in / after TTL", 1], ["fit would hold / release", 1, "came back when the fitted TTL would have decided otherwise"],
        ["miss ratio", 1, "previous context lost over the resumes after this tool"]], rows, ""),
      ...more(tl.tools_more, "tools"));
  }

  const TIME_PARTS = [["queue", "router queue"], ["prefill", "prefill (cached + new)"]];
  const TIME_TAIL = [["decode", "decode"], ["between_turns", "between turns"]];
  function stack(parts, total, cls) {
    return el("div", { class: `stack ${cls || ""}` }, ...parts.filter(([, , v]) => v > 0).map(([key, label, v]) =>
      el("span", { class: `t-${key}`, style: `width:${(100 * v) / total}%`, title: `${label}: ${v.toFixed(3)} s (${share(v / total)})` })));
  }
  function renderTime(ts, enabled) {
    if (!enabled || !ts) return panel("p-time", "", empty("needs Program scheduling (enable_program_scheduling)"));
    if (!ts.programs_seen) return panel("p-time", "", empty("no Program seen yet"));
    const s = ts.seconds;
    const causes = Object.entries(ts.recompute_seconds_by_cause).filter(([, v]) => v > 0);
    const recomputeParts = causes.length ? causes.map(([c, v]) => [`rc-${c}`, `recompute: ${c}`, v]) : [["recompute", "recompute", s.recompute]];
    const parts = [...TIME_PARTS.map(([k, l]) => [k, l, s[k]]), ...recomputeParts, ...TIME_TAIL.map(([k, l]) => [k, l, s[k]])];
    const total = parts.reduce((a, [, , v]) => a + v, 0) || 1;
    const legend = el("div", { class: "legend" }, ...parts.map(([k, l, v]) =>
      el("span", { "data-part": k }, el("i", { class: `t-${k}` }), `${l} `, el("b", {}, `${secs(v)} · ${share(v / total)}`))));
    const tok = ts.prompt_tokens;
    const tokTotal = (tok.cached || 0) + (tok.new || 0) + (tok.recomputed || 0);
    const tokens = facts([["prompt tokens: cached", `${fmt(tok.cached)} (${share(tokTotal ? tok.cached / tokTotal : null)})`],
      ["new", fmt(tok.new)], ["recomputed", `${fmt(tok.recomputed)} (${share(tokTotal ? tok.recomputed / tokTotal : null)})`]]);
    const rows = ts.top_programs.map((p) => {
      const pp = [["queue", "queue", p.queue_seconds], ["prefill", "prefill", p.prefill_seconds], ["recompute", "recompute", p.recompute_seconds],
        ["decode", "decode", p.decode_seconds], ["between_turns", "between turns", p.between_turns_seconds]];
      const tot = pp.reduce((a, [, , v]) => a + v, 0) || 1;
      return el("tr", { "data-time-program": p.program }, td(el("code", {}, p.program)), td(secs(p.wall_seconds), true),
        td(stack(pp, tot, "mini")), td(fmt(p.completions), true), td(p.open_phase), td(p.pending_loss_cause || "–"));
    });
    panel("p-time", `${fmt(ts.programs_seen)} Programs · ${fmt(ts.completions)} completions since start`,
      stack(parts, total), legend, tokens,
      rows.length ? table("ptable", [["longest live Programs"], ["wall", 1], ["split"], ["turns", 1], ["now"], ["next loss cause", 0, "what its next request would pay for"]], rows, "") : empty("no live Program"));
  }

  function renderEta(q, enabled, queued) {
    if (!enabled || !q) return panel("p-eta", "", empty("needs Program scheduling (enable_program_scheduling)"));
    const summary = `${fmt(queued)} Programs waiting now`;
    if (!q.samples && !q.told_waiting && !q.bound_rejections) return panel("p-eta", summary, empty("no Program request has waited for admission yet"));
    panel("p-eta", summary, facts([
      ["accuracy samples", `${fmt(q.samples)} (${fmt(q.recent_samples)} recent)`],
      ["median relative error", share(q.median_relative_error), "|first ETA told − actual wait| / actual wait"],
      ["p90 relative error", share(q.p90_relative_error)],
      ["waiting requests told", fmt(q.told_waiting)],
      ["bound rejections", fmt(q.bound_rejections), "429s: the ETA exceeded x-agentd-max-queue-seconds"]]));
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
    renderBatch(d.batch, d.enabled); renderTenants(d.classes_tenants); renderTools(d.tools, d.enabled);
    renderTime(d.time_split, d.enabled); renderEta(d.queue_eta, d.enabled, d.enabled ? d.programs.counts.queued : 0);
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
