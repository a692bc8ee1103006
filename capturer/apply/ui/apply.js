"use strict";
// The applier's status page: /status as tables (text only: nothing from the status is parsed as HTML).
function cell(row, text, head) {
  const c = document.createElement(head ? "th" : "td");
  c.textContent = text === null || text === undefined ? "" : String(text);
  row.appendChild(c);
  return c;
}
function table(id, heads, rows) {
  const t = document.getElementById(id);
  t.replaceChildren();
  const h = t.insertRow();
  heads.forEach((x) => cell(h, x, true));
  rows.forEach((r) => { const tr = t.insertRow(); r.forEach((x) => cell(tr, x)); });
}
async function refresh() {
  try {
    const s = await (await fetch("/status", { cache: "no-store" })).json();
    document.getElementById("name").textContent = s.name;
    const st = document.getElementById("state");
    st.textContent = s.state + (s.failure ? ": " + s.failure : "");
    st.className = s.state === "failed" ? "bad" : "ok";
    const a = s.applied;
    document.getElementById("summary").textContent =
      `${a.txns} transactions, ${a.rows} rows, ${a.ddls} DDL applied; lag ${a.lag_seconds} s; ` +
      `${s.in_flight} in flight; ${s.regroup.rows_buffered} rows held; group ${s.group}; tables ${s.tables.join(", ")}`;
    table("senders", ["sender", "state", "rows", "txns", "errors", "last error", "waiting for"],
      Object.entries(s.senders).map(([n, x]) => [n, x.state, x.rows, x.txns, x.errors, x.last_error,
        x.waiting_for ? x.waiting_for + " (" + x.waiting_seconds + " s)" : ""]));
    table("partitions", ["topic", "partition", "next offset", "committed", "lag (messages)", "lag (s)", "paused"],
      Object.values(s.partitions).map((p) => [p.topic, p.partition, p.next_offset, p.committed, p.lag_messages,
        p.lag_seconds, p.paused ? "yes" : ""]));
    table("waiting", ["transaction", "waiting (s)", "missing"],
      s.waiting.map((w) => [w.txn, w.waiting_s, JSON.stringify(w.missing)]));
    const e = s.errors;
    table("errors", ["bad messages", "dead letters", "last bad message", "commit errors", "Kafka"],
      [[e.bad_messages, e.dead_letters, e.last_bad, e.commit_errors + (e.last_commit_error ? ": " + e.last_commit_error : ""), e.kafka]]);
  } catch (err) {
    document.getElementById("state").textContent = "status not reachable: " + err;
  }
}
refresh();
setInterval(refresh, 2000);
