// The tpufleet fleet page. Plain JS, no build step, no third-party code.
// Every string from the API (job names, commands, reasons, log lines) is hostile input: it is only
// ever put on the page as textContent (or a title property), never parsed as HTML. Names, tenants
// and reasons go in <bdi> (isolated: a right-to-left override cannot reorder the text around them),
// and the log view draws each host's header as its own element, which no line a job prints can be.
"use strict";

(function () {
  const KEY = "tpufleet.token";
  const POLL_MS = 1000;
  const LOG_KEEP = 50000; // characters of log kept on the page per host (the newest)
  const DASH = "\u2014";
  let timer = null;
  let fleet = null;
  let selected = null; // job id shown in the detail panel
  let logs = null; // {job, attempt, offsets: {host: n}, text}
  let costs = null; // GET /api/v1/cost: {tenants: {name: row}, jobs: {id: row}}, null until it answers
  let costAt = 0;
  let slicesDrawn = null; // the slices as last drawn (JSON), to skip an unchanged redraw
  let session = 0; // bumped at every sign-in and sign-out: answers to an older session are dropped
  const COST_MS = 10000; // the cost report reads every attempt: refreshed less often than the fleet

  const $ = (id) => document.getElementById(id);

  // -- building the DOM: text only -------------------------------------------------------------
  function el(tag, opts, children) {
    const node = document.createElement(tag);
    const o = opts || {};
    if (o.cls) node.className = o.cls;
    if (o.text !== undefined && o.text !== null) node.textContent = String(o.text);
    if (o.title) node.title = String(o.title);
    if (o.data) for (const [k, v] of Object.entries(o.data)) node.dataset[k] = String(v);
    if (o.onclick) node.addEventListener("click", o.onclick);
    for (const c of children || []) if (c) node.appendChild(c);
    return node;
  }
  const td = (text, cls) => el("td", { text: text === null || text === undefined ? DASH : text, cls });
  const bdi = (text, cls) => el("bdi", { text, cls }); // isolated from the text around it

  // -- the token: asked for, kept in this tab's sessionStorage, sent as a Bearer header ---------
  function token() {
    return sessionStorage.getItem(KEY);
  }

  async function api(path) {
    const resp = await fetch(path, {
      headers: { Authorization: "Bearer " + token(), Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
    if (resp.status === 401) {
      signOut("that token was not accepted; paste a valid one");
      throw new Error("unauthorized");
    }
    const body = await resp.json().catch(() => ({}));
    if (!resp.ok) throw new Error(body.error || "HTTP " + resp.status);
    return body;
  }

  function signOut(message) {
    session += 1;
    sessionStorage.removeItem(KEY);
    if (timer) clearTimeout(timer);
    timer = null;
    fleet = null;
    slicesDrawn = null;
    costs = null;
    costAt = 0;
    closeJob();
    $("fleet").hidden = true;
    $("signout").hidden = true;
    $("viewer").textContent = "";
    $("updated").textContent = "";
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("token").value = "";
    $("token").focus();
  }

  function signIn(event) {
    event.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    sessionStorage.setItem(KEY, value);
    $("token").value = "";
    start();
  }

  function start() {
    session += 1;
    $("login").hidden = true;
    $("fleet").hidden = false;
    $("signout").hidden = false;
    tick();
  }

  async function tick() {
    const mine = session;
    timer = null;
    try {
      const view = await api("/api/v1/fleet");
      await refreshCost(mine);
      if (mine !== session) return; // signed out (or in again) meanwhile: not this session's to draw
      fleet = view;
      render(fleet);
      if (selected) await refreshJob();
      if (mine !== session) return;
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      $("updated").classList.remove("error");
    } catch (err) {
      if (mine !== session || !token()) return;
      $("updated").textContent = "not updated: " + err.message;
      $("updated").classList.add("error");
    }
    if (mine === session && token()) timer = setTimeout(tick, POLL_MS);
  }

  async function refreshCost(mine) {
    if (Date.now() - costAt < COST_MS) return;
    costAt = Date.now();
    let got = null; // no cost report on this server (yet): shown as a dash, never as zero
    try {
      const report = await api("/api/v1/cost");
      got = { tenants: {}, jobs: {} };
      for (const t of report.tenants || []) got.tenants[t.tenant] = t;
      for (const j of report.jobs || []) got.jobs[j.job_id] = j;
    } catch (err) {
      if (!token()) throw err;
    }
    if (mine === session) costs = got;
  }

  // -- formatting -------------------------------------------------------------------------------
  function hue(name) {
    // FNV-1a over the name, spread round the colour wheel by the golden angle
    let h = 0x811c9dc5;
    for (const ch of String(name)) h = Math.imul(h ^ ch.codePointAt(0), 0x01000193) >>> 0;
    return Math.round((h % 1000) * 137.508) % 360;
  }
  function ago(seconds) {
    if (seconds === null || seconds === undefined) return DASH;
    const s = Math.max(0, Math.round(seconds));
    if (s < 90) return s + " s";
    if (s < 5400) return Math.round(s / 60) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function since(t) {
    return t === null || t === undefined || !fleet ? DASH : ago(fleet.at - t);
  }
  function pct(x) {
    return typeof x === "number" ? (100 * x).toFixed(1) + " %" : DASH;
  }
  function dollars(x) {
    if (typeof x !== "number") return DASH;
    return "$" + x.toFixed(x >= 100 ? 0 : x >= 1 ? 2 : 4);
  }
  function shape(j) {
    return (j.num_slices > 1 ? j.num_slices + " \u00d7 " : "") + j.accelerator_type;
  }

  // -- the slices: hosts and chips ----------------------------------------------------------------
  function chipNode(slice, host, index) {
    const duty = host.duty_cycle_percent ? host.duty_cycle_percent[index] : null;
    const chip = el("span", { cls: "chip", data: { state: slice.state } });
    if (slice.tenant) {
      chip.classList.add("tenant");
      chip.style.setProperty("--hue", String(hue(slice.tenant)));
    } else if (slice.held_by_other) {
      chip.classList.add("other");
    }
    if (!host.alive) chip.classList.add("dead");
    if (typeof duty === "number") {
      chip.style.setProperty("--duty", String(Math.max(0, Math.min(100, duty)) / 100));
      chip.classList.add("measured");
    }
    chip.title =
      slice.name + " host " + host.worker_id + " chip " + index + "\n" + slice.state +
      (slice.tenant ? " by " + slice.tenant + " (job " + slice.holder + ")" : "") +
      (slice.held_by_other ? " by another tenant" : "") +
      "\nduty cycle " + (typeof duty === "number" ? duty.toFixed(0) + " %" : DASH);
    return chip;
  }

  function sliceNode(slice, onlyHosts) {
    const hosts = el("div", { cls: "hosts" });
    for (const host of slice.hosts) {
      const chips = el("div", { cls: "chips" });
      const n = host.chips || 0;
      for (let i = 0; i < n; i++) chips.appendChild(chipNode(slice, host, i));
      hosts.appendChild(
        el("div", { cls: "host" + (host.alive ? "" : " dead"), title: host.address || "" }, [
          chips,
          el("div", { cls: "hostname", text: "w" + host.worker_id + (host.alive ? "" : " down") }),
        ])
      );
    }
    const who = slice.tenant
      ? slice.tenant + " \u00b7 " + (slice.holder || "")
      : slice.held_by_other
        ? "another tenant"
        : "";
    const node = el(
      "div",
      {
        cls: "slice",
        data: { slice: slice.name, state: slice.state, holder: slice.holder || "" },
        onclick: slice.holder && !onlyHosts ? () => openJob(slice.holder) : null,
      },
      [
        el("div", { cls: "slice-head" }, [
          el("span", { cls: "slice-name", text: slice.name }),
          el("span", { cls: "badge", data: { state: slice.state }, text: slice.state }),
        ]),
        el("div", { cls: "slice-sub muted", text: slice.accelerator_type + " " + slice.topology + (who ? " \u00b7 " + who : "") }),
        hosts,
        slice.problems && slice.problems.length ? el("div", { cls: "error", text: slice.problems.join("; ") }) : null,
      ]
    );
    if (slice.holder && !onlyHosts) node.classList.add("clickable");
    return node;
  }

  // A held chip is drawn in its tenant's colour (the swatch in the tenants table), so the legend's
  // "held" item shows the colours of the tenants on view (the first few), never one fixed colour.
  const LEGEND_HUES = 4;
  let legendFor = null;
  function renderLegend(tenants) {
    const names = (tenants || []).slice(0, LEGEND_HUES);
    if (legendFor === names.join("\n")) return;
    legendFor = names.join("\n");
    const item = (chips, label) => el("span", { cls: "legend-item" }, [...chips, el("span", { text: label })]);
    const chip = (state, cls) => el("span", { cls: "chip" + (cls ? " " + cls : ""), data: { state } });
    const held = (names.length ? names : [""]).map((name) => {
      const c = chip("HELD", "tenant");
      c.style.setProperty("--hue", String(hue(name)));
      return c;
    });
    $("legend").replaceChildren(
      item([chip("FREE")], "free"),
      item(held, "held: the tenant's colour (as in the tenants table)"),
      item([chip("BROKEN")], "broken"),
      item([chip("DRAINING")], "draining"),
      item([chip("HELD", "other")], "another tenant's")
    );
  }

  // -- tables ---------------------------------------------------------------------------------------
  function jobLink(j) {
    const cell = el("td", { cls: "job-name" }, [
      el("span", { cls: "job-id", text: j.id }),
      document.createTextNode(" "),
      bdi(j.name, "name"),
    ]);
    cell.addEventListener("click", () => openJob(j.id));
    return cell;
  }
  function tenantCell(name) {
    const cell = el("td", { cls: "nowrap" }, [el("span", { cls: "swatch" }), bdi(name, "name")]);
    cell.firstChild.style.setProperty("--hue", String(hue(name)));
    return cell;
  }
  function rows(tableId, items, build) {
    const body = $(tableId).tBodies[0];
    body.replaceChildren(...items.map(build));
    if (!items.length) {
      const cols = $(tableId).tHead.rows[0].cells.length;
      const cell = el("td", { cls: "muted", text: "none" });
      cell.colSpan = cols;
      body.appendChild(el("tr", {}, [cell]));
    }
  }

  function usage(t) {
    const gens = new Set([...Object.keys(t.quota || {}), ...Object.keys(t.held || {})]);
    if (!gens.size) return el("td", { text: DASH });
    const cell = el("td");
    for (const g of [...gens].sort()) {
      const held = (t.held || {})[g] || 0;
      const quota = (t.quota || {})[g] || 0;
      const bar = el("span", { cls: "bar" }, [el("span", { cls: "fill" })]);
      bar.firstChild.style.setProperty("--frac", String(quota ? Math.min(1, held / quota) : held ? 1 : 0));
      if (held > quota) bar.classList.add("over");
      cell.appendChild(el("div", { cls: "usage" }, [el("span", { cls: "gen", text: g }), bar, el("span", { text: held + " / " + quota })]));
    }
    return cell;
  }
  function borrowed(t) {
    const parts = Object.entries(t.borrowing || {}).map(([g, n]) => g + " +" + n);
    return parts.length ? parts.join(", ") : "no";
  }
  function cost(t) {
    // from GET /api/v1/cost; an unknown price or no report is a dash, never a made-up number
    const c = costs && costs.tenants[t.name];
    if (!c || typeof c.dollars !== "number") return DASH;
    const lost = typeof c.badput_dollars === "number" && c.badput_dollars > 0 ? " (" + dollars(c.badput_dollars) + " badput)" : "";
    return dollars(c.dollars) + lost;
  }
  function goodput(j) {
    // the job view's goodput, else the cost report's; a job that reports no steps has none
    if (j.goodput && typeof j.goodput.ratio === "number") return pct(j.goodput.ratio);
    const c = costs && costs.jobs[j.id];
    return c && typeof c.goodput === "number" ? pct(c.goodput) : DASH;
  }

  function render(f) {
    $("viewer").textContent = f.viewer.admin ? "admin: the whole fleet" : "tenant " + f.viewer.tenant;
    const drawn = JSON.stringify(f.slices);
    if (drawn !== slicesDrawn) {
      // redrawn only when a slice changed: thousands of chips stay put (and their tooltips open)
      $("slices").replaceChildren(...f.slices.map((s) => sliceNode(s, false)));
      slicesDrawn = drawn;
    }
    renderLegend(f.tenants.map((t) => t.name));
    rows("tenants", f.tenants, (t) =>
      el("tr", { data: { tenant: t.name } }, [tenantCell(t.name), usage(t), td(borrowed(t)), td(t.running), td(t.queued), td(cost(t))])
    );
    $("queued").textContent = f.queued > f.queue.length ? "(first " + f.queue.length + " of " + f.queued + ")" : "(" + f.queued + ")";
    rows("queue", f.queue, (j) =>
      el("tr", { data: { job: j.id } }, [
        el("td", { text: j.position, title: "place among the queued jobs of its slice type" }),
        jobLink(j),
        tenantCell(j.tenant),
        td(shape(j)),
        td(j.priority),
        td(since(j.submitted_at), "nowrap"),
        el("td", { cls: "reason", title: j.reason || "" }, [
          el("span", { cls: "code", text: j.reason_code || "waiting for the next cycle" }),
          j.reason ? document.createTextNode(" ") : null,
          j.reason ? bdi(j.reason, "muted") : null,
        ]),
      ])
    );
    rows("active", f.active, (j) =>
      el("tr", { data: { job: j.id, state: j.state } }, [
        jobLink(j),
        tenantCell(j.tenant),
        el("td", {}, [el("span", { cls: "badge", data: { state: j.state }, text: j.state })]),
        td(j.slices.join(", ")),
        td(j.attempt + (j.borrowing ? " (borrowing)" : "") + (j.preempting ? " (preempting)" : "")),
        td(since(j.started_at || j.admitted_at), "nowrap"),
        td(goodput(j)),
      ])
    );
    rows("recent", f.recent, (j) =>
      el("tr", { data: { job: j.id, state: j.state } }, [
        jobLink(j),
        tenantCell(j.tenant),
        el("td", {}, [el("span", { cls: "badge", data: { state: j.state }, text: j.state })]),
        td(j.attempt),
        td(since(j.finished_at) + " ago", "nowrap"),
        el("td", {}, [bdi(j.reason || (j.exit_code !== null ? "exit " + j.exit_code : ""))]),
      ])
    );
  }

  // -- one job: hosts, attempts, goodput, live logs ----------------------------------------------------
  function openJob(id) {
    selected = id;
    logs = null;
    $("job").hidden = false;
    $("job-title").textContent = id;
    $("job-logs").textContent = "";
    refreshJob().catch((err) => ($("job-logs-note").textContent = err.message));
    $("job").scrollIntoView({ behavior: "smooth", block: "start" });
  }

  function closeJob() {
    selected = null;
    logs = null;
    $("job").hidden = true;
  }

  function fact(dl, name, value) {
    dl.appendChild(el("dt", { text: name }));
    dl.appendChild(el("dd", {}, [bdi(value === null || value === undefined || value === "" ? DASH : value)]));
  }

  async function refreshJob() {
    const id = selected;
    const job = await api("/api/v1/jobs/" + encodeURIComponent(id));
    if (selected !== id) return;
    $("job-title").replaceChildren(document.createTextNode(job.id + " \u00b7 "), bdi(job.name, "name"));
    const facts = $("job-facts");
    facts.replaceChildren();
    fact(facts, "state", job.state);
    fact(facts, "tenant", job.tenant);
    fact(facts, "shape", shape(job));
    fact(facts, "command", job.command.join(" "));
    fact(facts, "priority", job.priority);
    fact(facts, "attempt", job.attempt + " of " + (job.max_retries + 1));
    fact(facts, "reason", job.reason_code ? job.reason_code + ": " + (job.reason || "") : job.reason);
    fact(facts, "submitted", since(job.submitted_at) + " ago");
    const jc = costs && costs.jobs[job.id];
    fact(facts, "chip-hours", jc && typeof jc.chip_hours === "number" ? jc.chip_hours.toFixed(3) : null);
    fact(facts, "cost", jc && typeof jc.dollars === "number" ? dollars(jc.dollars) : null);
    const last = job.attempts.length ? job.attempts[job.attempts.length - 1] : null;
    const held = new Set(job.slices.length ? job.slices : last ? last.slices : []);
    const slices = (fleet ? fleet.slices : []).filter((s) => held.has(s.name));
    $("job-hosts").replaceChildren(...slices.map((s) => sliceNode(s, true)));
    if (!slices.length) $("job-hosts").replaceChildren(el("span", { cls: "muted", text: "holds no slices now" }));
    rows("job-attempts", job.attempts, (a) =>
      el("tr", { data: { attempt: a.attempt } }, [
        td(a.attempt),
        el("td", {}, [el("span", { cls: "badge", data: { state: a.state }, text: a.state })]),
        td(a.slices.join(", ")),
        td(a.started_at ? ago((a.ended_at || fleet.at) - a.started_at) : null),
        el("td", {}, [bdi(a.message === null || a.message === undefined ? DASH : a.message)]),
      ])
    );
    const gp = $("job-goodput");
    gp.replaceChildren();
    const g = job.goodput || {};
    fact(gp, "goodput", pct(g.ratio));
    for (const [k, v] of Object.entries(g)) {
      if (k !== "ratio" && (typeof v === "number" || typeof v === "string")) {
        fact(gp, k.replaceAll("_", " "), typeof v === "number" ? +v.toFixed(3) : v);
      }
    }
    await refreshLogs(job);
  }

  async function refreshLogs(job) {
    if (!job.attempts.length) {
      $("job-logs-note").textContent = "(no attempt has run yet)";
      return;
    }
    // read afresh when another job is shown or the job moved to another attempt; else only what is new
    if (!logs || logs.job !== job.id || logs.seen !== job.attempt) {
      const first = await api("/api/v1/jobs/" + encodeURIComponent(job.id) + "/logs");
      logs = { job: job.id, seen: job.attempt, attempt: first.attempt, offsets: {}, parts: {}, labels: {}, complete: false };
      for (const h of first.hosts) take(h);
    } else if (!logs.complete) {
      for (const host of Object.keys(logs.offsets)) {
        const q = "?attempt=" + logs.attempt + "&host=" + host + "&offset=" + logs.offsets[host];
        const next = await api("/api/v1/jobs/" + encodeURIComponent(job.id) + "/logs" + q);
        for (const h of next.hosts) take(h);
      }
    }
    logs.complete = Object.values(logs.labels).every((l) => l.complete);
    // each host: a header element (the job's output cannot make one), then its output as one text node
    const parts = Object.keys(logs.parts)
      .sort((a, b) => a - b)
      .flatMap((h) => [
        el("div", { cls: "log-host", data: { host: h }, text: logs.labels[h].name }),
        el("div", { cls: "log-text", text: logs.parts[h] }),
      ]);
    const pre = $("job-logs");
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.replaceChildren(...parts);
    if (atEnd) pre.scrollTop = pre.scrollHeight;
    $("job-logs-note").textContent = "attempt " + logs.attempt + (logs.complete ? " (complete)" : " (live)");
  }

  function take(h) {
    const key = String(h.host);
    logs.parts[key] = ((logs.parts[key] || "") + h.data).slice(-LOG_KEEP);
    logs.offsets[key] = h.next_offset;
    logs.labels[key] = { name: h.slice + " worker " + h.worker_id, complete: h.complete };
  }

  document.addEventListener("DOMContentLoaded", () => {
    renderLegend();
    $("login-form").addEventListener("submit", signIn);
    $("signout").addEventListener("click", () => signOut(""));
    $("job-close").addEventListener("click", closeJob);
    if (token()) start();
    else signOut("");
  });
})();
