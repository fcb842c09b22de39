// quotaledger page: the quota tree from /v1/tree and the live decision feed from
// /v1/stream (DESIGN §11). Plain DOM, no build step, no external resources.
"use strict";

const FEED_LIMIT = 200;
const NOISY = new Set(["ClocksObserved"]);

function human(resource, amount) {
  if (amount === null || amount === undefined) return "∞";
  if (resource === "cpu") return trim(amount / 1000);
  if (resource === "memory" || resource.endsWith("storage")) {
    const units = [["Ti", 2 ** 40], ["Gi", 2 ** 30], ["Mi", 2 ** 20], ["Ki", 2 ** 10]];
    for (const [unit, size] of units) {
      if (amount >= size) return trim(amount / size) + unit;
    }
    return String(amount);
  }
  return trim(amount);
}

function trim(value) {
  return String(Math.round(value * 100) / 100);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "style" || key === "title") node.setAttribute(key, value);
    else node.dataset[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function resourcesOf(quota) {
  const keys = new Set();
  for (const field of ["min", "max", "runtime", "used", "request"]) {
    for (const key of Object.keys(quota[field] || {})) keys.add(key);
  }
  return [...keys].sort();
}

// system and default are outside the runtime tree (DESIGN §5): no runtime of their own.
const OUTSIDE_RUNTIME = new Set(["system", "default"]);

// How a quota relates to one resource: "managed" (it has a runtime there), "outside"
// (system, default), or "unlimited": the quota sets neither min nor max for it and, with
// a max set, its request is masked to max's keys (DESIGN §5), so its pods' use of the
// resource counts in `used` but no runtime is computed: not overuse (DECISIONS 268).
function relation(quota, resource, min, runtime, request, max) {
  if (OUTSIDE_RUNTIME.has(quota.name)) return "outside";
  if (min === 0 && max === null && runtime === 0 && request === 0) return "unlimited";
  return "managed";
}

function bar(quota, resource) {
  const get = (field) => (quota[field] || {})[resource] || 0;
  const min = get("min"), runtime = get("runtime"), used = get("used"), request = get("request");
  const max = quota.max === null ? null : (resource in quota.max ? quota.max[resource] : null);
  const kind = relation(quota, resource, min, runtime, request, max);
  const scale = Math.max(min, runtime, used, request, max || 0, 1);
  const pct = (value) => `${Math.min(100, (100 * value) / scale).toFixed(2)}%`;
  // Without a runtime there is nothing to draw used against: the words say it.
  const track = kind !== "managed" ? el("div", { class: "track" }) : el("div", { class: "track" },
    el("div", { class: "runtime", style: `width:${pct(runtime)}` }),
    el("div", { class: "used", style: `width:${pct(used)}` }),
    min > 0 ? el("div", { class: "min", style: `left:${pct(min)}` }) : null,
    max !== null ? el("div", { class: "max", style: `left:calc(${pct(max)} - 3px)` }) : null);
  let numbers, title;
  if (kind === "managed") {
    numbers = `min ${human(resource, min)} · runtime ${human(resource, runtime)}` +
      ` · used ${human(resource, used)} · max ${human(resource, max)}`;
    title = numbers;
  } else if (kind === "outside") {
    numbers = `used ${human(resource, used)} · outside the runtime tree`;
    title = `${quota.name} is outside the runtime tree (DESIGN §5): its used is taken off the` +
      " cluster total; it has no runtime";
  } else {
    numbers = `used ${human(resource, used)} · not limited here`;
    title = `${quota.name} sets no min and no max for ${resource}: its pods' ${resource} counts` +
      " in used, but no runtime is computed for it (not overuse)";
  }
  return el("div", { class: `bar ${kind}`, resource, relation: kind },
    el("span", { class: "resource" }, resource), track,
    el("span", { class: "numbers", title }, numbers));
}

function quotaNode(quota) {
  const resources = resourcesOf(quota);
  const bars = el("div", { class: "bars" });
  if (resources.length === 0) bars.append(el("span", { class: "empty" }, "nothing configured or used"));
  for (const resource of resources) bars.append(bar(quota, resource));
  const name = el("div", { class: "name", title: quota.name }, quota.name, " ",
    el("span", { class: "pods" }, quota.is_parent ? "" : `${quota.pods} pods`),
    quota.running ? el("div", { class: "busy" }, `preempting: ${quota.running}`) : null);
  const node = el("div", { class: "quota", quota: quota.name }, el("div", { class: "row" }, name, bars));
  if (quota.children.length) {
    const children = el("div", { class: "children" });
    for (const child of quota.children) children.append(quotaNode(child));
    node.append(children);
  }
  return node;
}

async function loadTree() {
  const response = await fetch("/v1/tree");
  if (!response.ok) throw new Error(`GET /v1/tree: ${response.status}`);
  const tree = await response.json();
  const target = document.getElementById("tree");
  const nodes = tree.root.children.map(quotaNode);
  if (tree.orphans.length) {
    nodes.push(el("h2", {}, "Orphans (parent missing)"));
    for (const orphan of tree.orphans) nodes.push(quotaNode(orphan));
  }
  target.replaceChildren(...nodes);
  const total = Object.entries(tree.cluster.total).map(([r, v]) => `${human(r, v)} ${r}`).join(", ");
  document.getElementById("cluster").textContent = `cluster total: ${total || "nothing yet"}`;
  document.getElementById("offset").textContent = `offset ${tree.offset} · ${tree.time}`;
  document.body.dataset.offset = String(tree.offset);
}

function describe(record) {
  const e = record.event || {};
  switch (record.kind) {
    case "PreemptionStarted":
      return `${e.cause} on ${e.queue}` + (e.pod_uid ? ` for pod ${e.pod_uid}` : "");
    case "EvictionRequested":
      return `evict pod ${e.pod_uid} from ${e.queue}`;
    case "EvictionSucceeded":
    case "EvictionFailed":
      return `${e.eviction_id}${e.error ? ": " + e.error : ""}`;
    case "PreemptionFinished":
      return `${e.queue}: ${e.outcome}${e.reason ? " (" + e.reason + ")" : ""}`;
    case "LeaderElected":
      return `epoch ${e.epoch} by ${e.instance}`;
    case "FactRejected":
      return e.reason || "";
    default:
      return "";
  }
}

function addDecision(record) {
  if (NOISY.has(record.kind)) return;
  const feed = document.getElementById("feed");
  const item = el("li", { class: record.kind, offset: String(record.offset), kind: record.kind },
    el("span", { class: "kind" }, record.kind), " ", describe(record), " ",
    el("span", { class: "at" }, `#${record.offset} ${record.at}`));
  feed.prepend(item);
  while (feed.children.length > FEED_LIMIT) feed.lastChild.remove();
}

async function loadDecisions() {
  let since = 0;
  let last = [];
  for (let page = 0; page < 50; page++) {
    const response = await fetch(`/v1/decisions?since=${since}&limit=1000`);
    if (!response.ok) return;
    const body = await response.json();
    last = last.concat(body.decisions).slice(-FEED_LIMIT);
    if (body.decisions.length < 1000) break;
    since = body.next;
  }
  for (const record of last) addDecision({ ...record, event: record });
  return since;
}

let treeTimer = null;
function refreshTreeSoon() {
  if (treeTimer !== null) return;
  treeTimer = setTimeout(() => {
    treeTimer = null;
    loadTree().catch(showError);
  }, 500);
}

function showError(error) {
  const status = document.getElementById("status");
  status.textContent = String(error);
  status.className = "status";
}

function connect(seen) {
  const status = document.getElementById("status");
  const source = new EventSource("/v1/stream");
  source.onopen = () => { status.textContent = "live"; status.className = "status live"; };
  source.onerror = () => { status.textContent = "reconnecting…"; status.className = "status"; };
  source.addEventListener("record", (message) => {
    const record = JSON.parse(message.data);
    if (record.offset > seen.offset && record.kind !== "LedgerOpened" && isDecision(record.kind)) {
      addDecision(record);
    }
    seen.offset = Math.max(seen.offset, record.offset);
    refreshTreeSoon();
  });
}

const FACTS = new Set(["NodeUpserted", "NodeRemoved", "PodUpserted", "PodRemoved", "QuotaUpserted",
  "QuotaRemoved", "NamespaceWeighted", "SettingsChanged"]);
function isDecision(kind) { return kind !== null && !FACTS.has(kind); }

async function start() {
  await loadTree();
  const seen = { offset: -1 };
  await loadDecisions();
  const items = document.querySelectorAll("#feed li");
  if (items.length) seen.offset = Number(items[0].dataset.offset);
  connect(seen);
  setInterval(() => loadTree().catch(showError), 10000);
}

start().catch(showError);
