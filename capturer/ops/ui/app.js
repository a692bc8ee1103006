// The capturer's status page: polls GET /status every second and draws it.
// Everything from the server is put in the page as text (textContent), never as
// HTML: table names and error messages come from the sources.
(function () {
  "use strict";
  var POLL_MS = 1000, KEEP = 300, SPARK = 120;  // samples kept for the chart / for a sparkline
  var LOGICAL = 262144;  // 2^18: a commit_ts (TSO) is ms << 18 | logical
  var $ = function (id) { return document.getElementById(id); };

  var hist = null;   // {t: [unix s], series: {"sender file": [rows/s]}}
  var prev = null;   // the previous /status answer
  var startedAt = null, failures = 0, chart = null, chartKeys = "", lastData = null;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function fmtBytes(n) {
    if (!n) return "0";
    var units = [["GB", 1073741824], ["MB", 1048576], ["KB", 1024]];
    for (var i = 0; i < units.length; i++) if (n >= units[i][1]) return (n / units[i][1]).toFixed(1) + " " + units[i][0];
    return n + " B";
  }

  function fmtInt(n) { return n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en-US"); }
  function fmtRate(n) { return n === null || n === undefined ? "–" : (n >= 100 ? fmtInt(n) : n.toFixed(1)); }
  function fmtSecs(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function tsMs(ts) { return ts ? Math.floor(ts / LOGICAL) : 0; }
  function fmtTs(ts) {
    if (!ts) return "–";
    var d = new Date(tsMs(ts));
    return d.toISOString().replace("T", " ").replace("Z", " UTC");
  }
  function ago(ts, now) { return ts ? fmtSecs(Math.max(0, now - tsMs(ts) / 1000)) + " ago" : ""; }

  // --- history (rates from counters; reset when the capturer restarts) -------
  function resetHistory() { hist = {t: [], series: {}}; prev = null; }
  function rate(cur, old, dt) {
    if (old === undefined || old === null || dt <= 0 || cur < old) return null;
    return (cur - old) / dt;
  }
  function record(d) {
    var dt = prev ? d.now - prev.now : 0, rates = {};
    Object.keys(d.regions).forEach(function (n) {
      var o = prev && prev.regions[n];
      rates["region " + n] = o ? rate(d.regions[n].rows, o.rows, dt) : null;
    });
    Object.keys(d.senders).forEach(function (n) {
      var o = prev && prev.senders[n];
      rates["sender " + n] = o ? rate(d.senders[n].rows, o.rows, dt) : null;
    });
    hist.t.push(d.now);
    Object.keys(rates).forEach(function (k) {
      if (!hist.series[k]) hist.series[k] = hist.t.slice(0, -1).map(function () { return null; });
      hist.series[k].push(rates[k]);
    });
    if (hist.t.length > KEEP) {
      hist.t.shift();
      Object.keys(hist.series).forEach(function (k) { hist.series[k].shift(); });
    }
    prev = d;
    return rates;
  }

  function sparkline(values) {
    var ns = "http://www.w3.org/2000/svg", svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 120 24");
    svg.setAttribute("preserveAspectRatio", "none");
    var v = values.slice(-SPARK), max = 0;
    v.forEach(function (x) { if (x !== null && x > max) max = x; });
    var pts = [];
    v.forEach(function (x, i) {
      var px = v.length > 1 ? (i * 120) / (v.length - 1) : 0;
      pts.push(px.toFixed(1) + "," + (22 - (max > 0 && x !== null ? (x / max) * 20 : 0)).toFixed(1));
    });
    var pl = document.createElementNS(ns, "polyline");
    pl.setAttribute("points", pts.join(" "));
    svg.appendChild(pl);
    var title = document.createElementNS(ns, "title");
    title.textContent = "max " + fmtRate(max) + " rows/s";
    svg.appendChild(title);
    return svg;
  }

  // --- tables: one row per name, cells updated in place ----------------------
  function rowFor(tbody, name, ncols) {
    var rows = tbody.querySelectorAll("tr");
    for (var i = 0; i < rows.length; i++) if (rows[i].dataset.name === name) return rows[i];
    var tr = el("tr");
    tr.dataset.name = name;
    for (var c = 0; c < ncols; c++) tr.appendChild(el("td"));
    tbody.appendChild(tr);
    return tr;
  }
  function prune(tbody, names) {
    Array.prototype.slice.call(tbody.querySelectorAll("tr")).forEach(function (tr) {
      if (names.indexOf(tr.dataset.name) < 0) tbody.removeChild(tr);
    });
  }
  function cell(tr, i, cls, text) {
    var td = tr.children[i];
    td.className = cls || "";
    td.textContent = text === undefined || text === null ? "" : String(text);
    return td;
  }
  function badge(tr, i, cls, state) {
    var td = cell(tr, i, cls, "");
    td.appendChild(el("span", "badge state-" + state, state));
  }

  function renderRegions(d, rates) {
    var tbody = $("regions").tBodies[0], names = Object.keys(d.regions).sort();
    var waiting = (d.merger && d.merger.waiting_for) || [];
    names.forEach(function (n) {
      var r = d.regions[n], tr = rowFor(tbody, n, 11);
      tr.className = (r.state === "reconnecting" || r.state === "failed") ? "failing" : "";
      cell(tr, 0, "c-name", n);
      cell(tr, 1, "c-kind muted", r.kind || "");
      badge(tr, 2, "c-state", r.state);
      var pos = cell(tr, 3, "c-position pos", r.position_text || "–");
      // heartbeats: an idle or filtered-only source's position moves with them (operators check they fire)
      if (r.heartbeats) pos.appendChild(el("div", "muted", "heartbeat " + fmtSecs(r.heartbeat_age_seconds) + " ago, " +
        fmtInt(r.heartbeats) + " in all"));
      if (r.slot_wal_held_bytes !== undefined && r.slot_wal_held_bytes !== null)
        pos.appendChild(el("div", "muted", "slot holds " + fmtBytes(r.slot_wal_held_bytes) + " of WAL"));
      cell(tr, 4, "c-lag num", fmtSecs(r.lag_seconds));
      if (waiting.indexOf(n) >= 0) tr.children[4].appendChild(el("div", "muted", "merge waits for it"));
      cell(tr, 5, "c-rate num", fmtRate(rates["region " + n]));
      cell(tr, 6, "c-spark", "").appendChild(sparkline(hist.series["region " + n] || []));
      cell(tr, 7, "c-rows num", fmtInt(r.rows));
      cell(tr, 8, "c-reconnects num", fmtInt(r.reconnects));
      cell(tr, 9, "c-queue num", fmtInt(r.queue_rows));
      cell(tr, 10, "c-error err", r.last_error || "");
    });
    prune(tbody, names);
  }

  function renderSenders(d, rates) {
    var tbody = $("senders").tBodies[0], names = Object.keys(d.senders);
    var control = d.control && d.control.enabled;
    names.forEach(function (n) {
      var s = d.senders[n], tr = rowFor(tbody, n, 11);
      // where it stands in the stream: live, catching up (reading the backlog), paused, failing, detached;
      // "pausing": asked to pause, still finishing the batch in hand (the target may still be written)
      var state = s.stream_state || s.state;
      if (s.paused && s.state !== "paused") state = "pausing";
      tr.className = s.paused ? "paused" : ((s.stream_state === "failing" || s.stream_state === "detached" ||
        s.state === "retrying" || s.state === "failed") ? "failing" : "");
      cell(tr, 0, "c-name", n);
      badge(tr, 1, "c-state", state);
      if (s.paused && s.paused_since) tr.children[1].appendChild(el("div", "muted", "since " + new Date(s.paused_since * 1000).toLocaleTimeString()));
      // process=true: the sender's own process, and how often it was started again after it died
      if (s.process) tr.children[1].appendChild(el("div", "muted", "process " + (s.process.pid || "starting") +
        (s.process.restarts ? ", restarted " + s.process.restarts + "\u00d7" : "")));
      cell(tr, 2, "c-rate num", fmtRate(rates["sender " + n]));
      cell(tr, 3, "c-spark", "").appendChild(sparkline(hist.series["sender " + n] || []));
      cell(tr, 4, "c-rows num", fmtInt(s.rows));
      var acked = cell(tr, 5, "c-acked", fmtTs(s.acked_ts));
      acked.appendChild(el("div", "muted", ago(s.acked_ts, d.now)));
      // how far behind the stream's head: rows, and the backlog on disk kept for it
      var behind = s.lag_rows !== undefined ? s.lag_rows : s.queue_rows;
      var q = cell(tr, 6, "c-queue num", fmtInt(behind));
      if (s.backlog_bytes) q.appendChild(el("div", "muted", fmtBytes(s.backlog_bytes) + " on disk"));
      if (s.queue_capacity_rows) {
        var bar = el("div", "bar"), fill = el("div");
        fill.style.width = Math.min(100, (100 * behind) / s.queue_capacity_rows).toFixed(0) + "%";
        bar.title = fmtInt(behind) + " rows behind; " + fmtInt(s.queue_capacity_rows) + " rows are kept in memory, " +
          "the rest waits for it in the backlog on disk";
        bar.appendChild(fill);
        q.appendChild(bar);
      }
      cell(tr, 7, "c-retries num", fmtInt(s.retries));
      cell(tr, 8, "c-errors num", fmtInt(s.errors));
      cell(tr, 9, "c-error err", s.last_error || "");
      // the button is made once and updated in place: a click is never lost to a redraw
      var td = tr.children[10], b = td.querySelector("button");
      if (!b) {
        td.className = "c-action";
        b = el("button", "pause-resume");
        b.type = "button";
        b.dataset.sender = n;
        td.appendChild(b);
      }
      var verb = s.detached ? "attach" : (s.paused ? "resume" : "pause");
      var label = verb.charAt(0).toUpperCase() + verb.slice(1);
      if (b.textContent !== label) b.textContent = label;
      b.dataset.verb = verb;
      b.disabled = !control || d.stopping;
      b.title = !control ? "control endpoints are off: set controlToken in [global] of the config"
        : verb === "attach" ? "go on from the stream's head (then copy its tables again with a snapshot)"
        : verb === "resume" ? "go on sending (it reads what it missed from the backlog)"
        : "stop sending after the batch in hand; the other senders go on";
    });
    prune(tbody, names);
  }

  function renderSnapshots(d) {
    var tbody = $("snapshots").tBodies[0], keys = [];
    Object.keys(d.regions).sort().forEach(function (rn) {
      var tables = ((d.regions[rn].snapshot || {}).tables) || {};
      Object.keys(tables).sort().forEach(function (tn) {
        var t = tables[tn], key = rn + " " + tn, tr = rowFor(tbody, key, 7);
        keys.push(key);
        cell(tr, 0, "", rn);
        cell(tr, 1, "", tn);
        badge(tr, 2, "", t.state);
        cell(tr, 3, "num", fmtInt(t.rows));
        cell(tr, 4, "num", fmtInt(t.estimated_rows));
        var pct = t.state === "done" ? 100 : (t.estimated_rows ? Math.min(100, (100 * t.rows) / t.estimated_rows) : 0);
        var bar = el("div", "bar"), fill = el("div");
        fill.style.width = pct.toFixed(0) + "%";
        bar.appendChild(fill);
        cell(tr, 5, "", "").appendChild(bar);
        cell(tr, 6, "num", fmtRate(t.rows_per_s));
      });
    });
    prune(tbody, keys);
    $("snapshots").hidden = keys.length === 0;
  }

  function renderVerify(d) {
    var v = d.verify || {}, last = v.last || null, tbody = $("verify-results").tBodies[0], keys = [];
    var p = v.progress || {};
    $("verify-state").textContent = v.state === "running"
      ? "running: " + fmtInt(p.tables_done) + " of " + fmtInt(p.tables_total) + " tables" + (p.current ? " · " + p.current : "")
      : last ? "last run " + new Date(last.finished * 1000).toLocaleTimeString() + ": " +
               ({0: "all equal", 1: "DIFFERENT", 2: "could not read everything", 3: "not settled"}[last.exit_code] || "") +
               ((last.errors || []).length ? " · " + last.errors.join("; ") : "")
      : "not run yet";
    ((last && last.tables) || []).forEach(function (t) {
      var key = t.sender + " " + t.table, tr = rowFor(tbody, key, 8);
      keys.push(key);
      cell(tr, 0, "", t.sender);
      cell(tr, 1, "", t.table);
      badge(tr, 2, "", t.status);
      cell(tr, 3, "num", fmtInt(t.rows));
      cell(tr, 4, "num", fmtInt(t.missing));
      cell(tr, 5, "num", fmtInt(t.extra));
      cell(tr, 6, "num", fmtInt(t.different));
      cell(tr, 7, "", [t.note].concat(t.examples || []).filter(function (x) { return x; }).join(" · "));
    });
    prune(tbody, keys);
    $("verify-results").hidden = keys.length === 0;
  }

  function renderChart() {
    if (typeof uPlot === "undefined") return;
    var keys = Object.keys(hist.series).sort(function (a, b) {
      return (a.indexOf("sender") === 0 ? 0 : 1) - (b.indexOf("sender") === 0 ? 0 : 1) || (a < b ? -1 : 1);
    });
    var data = [hist.t].concat(keys.map(function (k) { return hist.series[k]; }));
    var palette = ["#0969da", "#1a7f37", "#cf222e", "#8250df", "#bf8700", "#1b7c83", "#e16f24", "#6e7781"];
    var box = $("chart"), width = Math.max(300, box.clientWidth - 16);
    if (!chart || chartKeys !== keys.join("|")) {
      if (chart) chart.destroy();
      box.textContent = "";
      chartKeys = keys.join("|");
      chart = new uPlot({
        width: width, height: 220,
        scales: {x: {time: true}},
        axes: [{}, {label: "rows/s", size: 60}],
        series: [{}].concat(keys.map(function (k, i) {
          return {label: k, stroke: palette[i % palette.length], width: k.indexOf("sender") === 0 ? 2 : 1,
                  dash: k.indexOf("region") === 0 ? [4, 3] : undefined, spanGaps: false,
                  value: function (u, v) { return v === null ? "–" : fmtRate(v); }};
        }))
      }, data, box);
    } else {
      if (Math.abs(chart.width - width) > 20) chart.setSize({width: width, height: 220});
      chart.setData(data);
    }
  }

  function render(d) {
    if (startedAt !== null && d.started_at !== startedAt) {
      showBanner("The capturer restarted at " + new Date(d.started_at * 1000).toLocaleTimeString() +
                 ": rates start again from its counters.", false, 30000);
      resetHistory();
      if (chart) { chart.destroy(); chart = null; chartKeys = ""; }
    }
    startedAt = d.started_at;
    var ha = d.ha || {};
    var haEl = $("ha");
    haEl.hidden = ha.role !== "active" && ha.role !== "standby";
    if (!haEl.hidden) {
      var last = ha.last_takeover;
      haEl.textContent = ha.role + " · epoch " + ha.epoch + (ha.role === "standby"
        ? " · active: " + ((ha.holder || {}).id || "none") : "");
      haEl.className = "badge " + (ha.role === "active" ? "ok" : "wait");
      haEl.title = "group " + ha.name + " · this capturer: " + ha.id + " · last takeover: " +
        (last ? new Date(last.at * 1000).toLocaleString() + " (" + (last.from || "none") + " → " + last.to + ")" : "none") +
        (ha.step_downs ? " · step-downs: " + ha.step_downs + " (last: " + ((ha.last_step_down || {}).why || "") + ")" : "") +
        ((ha.etcd || {}).error ? " · etcd: " + ha.etcd.error : "");
    }
    if (ha.role === "standby") {  // a standby runs no pipeline: nothing else to show
      $("uptime").textContent = "up " + fmtSecs(d.uptime_seconds) + " · standby";
      $("config").textContent = "config " + (d.config || "");
      showBanner("Standby of group " + ha.name + ": the active capturer is " + ((ha.holder || {}).id || "none") +
                 (ha.holder && ha.holder.port ? " (status port " + ha.holder.port + ")" : "") +
                 "; this one takes over when its lease lapses.", false, 0);
      return;
    }
    var rates = record(d);
    lastData = d;

    var cp = d.checkpoint || {};
    $("cp-time").textContent = fmtTs(cp.commit_ts);
    $("cp-age").textContent = "written " + fmtSecs(cp.age_seconds) + " ago · " + (cp.path || "");
    $("lag").textContent = d.lag_ms_behind_sources === null || d.lag_ms_behind_sources === undefined
      ? "–" : fmtSecs(d.lag_ms_behind_sources / 1000);
    var m = d.merger || {};
    $("watermark").textContent = m.watermark ? fmtTs(m.watermark) : "not every region has reported yet";
    var held = (m.waiting_for || []).map(function (r) { return "region " + r; })
      .concat((m.full_senders || []).map(function (s) { return "sender " + s + " (backlog full)"; }));
    $("held").textContent = held.length ? held.join(", ") : "nothing";
    $("dispatched").textContent = fmtInt(m.dispatched_rows) + " rows in " + fmtInt(m.dispatched_txns) + " transactions handed out";
    var f = d.filter || {};
    $("filter").textContent = f.path ? (f.table_rules + " table rule(s), " + f.row_rules + " row rule(s)") : "no filter file";
    $("filter-loaded").textContent = f.path ? (f.path + " · loaded " + new Date(f.loaded_at * 1000).toLocaleTimeString()) : "";
    $("config").textContent = "config " + (d.config || "");
    $("uptime").textContent = "up " + fmtSecs(d.uptime_seconds) + (d.stopping ? " · stopping" : "");

    renderRegions(d, rates);
    renderSenders(d, rates);
    renderSnapshots(d);
    renderVerify(d);
    renderChart();

    var control = d.control && d.control.enabled;
    ["reload-filter", "stop", "snapshot", "verify"].forEach(function (id) {
      $(id).disabled = !control || d.stopping;
      $(id).title = control ? "" : "control endpoints are off: set controlToken in [global] of the config";
    });
    $("token").disabled = !control;
  }

  function showBanner(text, bad, ms) {
    var b = $("banner");
    b.textContent = text;
    b.className = "banner" + (bad ? " bad" : "");
    b.hidden = false;
    if (ms) setTimeout(function () { if (b.textContent === text) b.hidden = true; }, ms);
  }
  function showMessage(text, bad) {
    var m = $("message");
    m.textContent = text;
    m.className = "message" + (bad ? " bad" : "");
    m.hidden = false;
    clearTimeout(showMessage.timer);
    showMessage.timer = setTimeout(function () { m.hidden = true; }, 15000);
  }

  function setConn(cls, text) {
    var c = $("conn");
    c.className = "badge " + cls;
    c.textContent = text;
  }

  function fetchJson(path, opts) {
    var ctl = new AbortController(), t = setTimeout(function () { ctl.abort(); }, 4000);
    opts = opts || {};
    opts.signal = ctl.signal;
    opts.cache = "no-store";
    return fetch(path, opts).then(function (r) {
      clearTimeout(t);
      return r.json().catch(function () { return {}; }).then(function (body) { return {status: r.status, body: body}; });
    }, function (e) { clearTimeout(t); throw e; });
  }

  function poll() {
    fetchJson("/status").then(function (r) {
      if (r.status !== 200) throw new Error("HTTP " + r.status);
      failures = 0;
      document.body.classList.remove("stale");
      setConn("ok", "live");
      $("banner").classList.contains("bad") && ($("banner").hidden = true);
      try {
        render(r.body);
      } catch (e) {  // a bug of this page, not an unreachable capturer
        showBanner("The page could not show this answer: " + e + " (raw JSON at /status)", true);
        if (window.console) console.error(e);
      }
      return fetchJson("/health");
    }).then(function (h) {
      var ok = h.body && h.body.ok;
      $("health").className = "badge " + (ok ? "ok" : "bad");
      $("health").textContent = ok ? (h.body.reason === "ok" ? "healthy" : h.body.reason) : ("unhealthy: " + (h.body.reason || h.status));
    }).catch(function (e) {
      failures += 1;
      document.body.classList.add("stale");
      setConn("bad", "unreachable, retrying");
      showBanner("No answer from the capturer (" + (e && e.message ? e.message : e) + ") since " +
                 failures + " attempt(s); the values below are the last ones seen.", true);
    }).then(function () {
      setTimeout(poll, failures ? Math.min(5000, POLL_MS * (1 + failures)) : POLL_MS);
    });
  }

  // --- control ---------------------------------------------------------------
  function post(path, what, body) {
    var token = $("token").value;
    if (!token) { showMessage(what + ": enter the control token first", true); return; }
    fetchJson(path, {method: "POST", headers: {"Authorization": "Bearer " + token, "Content-Type": "application/json"},
                     body: JSON.stringify(body || {})})
      .then(function (r) {
        if (r.status >= 200 && r.status < 300) {
          var b = r.body || {}, more = "";
          if (b.filter) more = " (" + b.table_rules + " table rule(s), " + b.row_rules + " row rule(s))";
          if (b.regions) more = " (" + Object.keys(b.regions).map(function (k) { return k + ": " + b.regions[k].tables.join(", "); }).join("; ") +
                                (b.missing && b.missing.length ? "; not found: " + b.missing.join(", ") : "") + ")";
          showMessage(what + ": done" + more, false);
        } else {
          showMessage(what + " refused (HTTP " + r.status + "): " + ((r.body && r.body.error) || ""), true);
        }
      }, function (e) { showMessage(what + " failed: " + e, true); });
  }

  try { $("token").value = sessionStorage.getItem("capturerToken") || ""; } catch (e) { /* storage off */ }
  $("token").addEventListener("input", function () {
    try { sessionStorage.setItem("capturerToken", $("token").value); } catch (e) { /* storage off */ }
  });
  $("senders").addEventListener("click", function (ev) {
    var b = ev.target.closest("button.pause-resume");
    if (!b) return;
    post("/senders/" + encodeURIComponent(b.dataset.sender) + "/" + b.dataset.verb, b.dataset.verb + " " + b.dataset.sender);
  });
  $("reload-filter").addEventListener("click", function () { post("/filter/reload", "reload filter"); });
  $("snapshot-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var tables = $("snapshot-tables").value.split(/[\s,]+/).filter(function (t) { return t; });
    if (!tables.length) { showMessage("snapshot: name at least one db.table", true); return; }
    post("/snapshot", "snapshot " + tables.join(", "), {tables: tables});
  });
  $("verify-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var tables = $("verify-tables").value.split(/[\s,]+/).filter(function (t) { return t; });
    post("/verify", "verify", tables.length ? {tables: tables} : {});
  });
  $("stop").addEventListener("click", function () {
    if (window.confirm("Stop the capturer? Senders drain what is queued and a final checkpoint is written.")) post("/stop", "stop");
  });
  window.addEventListener("resize", function () { if (chart && lastData) renderChart(); });

  resetHistory();
  poll();
})();
