// knowledge-query UI: renders `results` messages (DESIGN §8 envelope, schemaVersion 2).
// Everything is inserted with textContent: text from a peer never becomes markup.
"use strict";

(function () {
  const out = document.getElementById("out");
  const errorBox = document.getElementById("error");
  const tpl = document.getElementById("answer-tpl");

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function showError(msg) {
    errorBox.textContent = msg;
    errorBox.hidden = !msg;
  }

  // One JSON object per line (`kith join --json`), or one JSON array/object.
  function parseMessages(text) {
    const trimmed = text.trim();
    if (!trimmed) return [];
    if (trimmed.startsWith("[")) return JSON.parse(trimmed);
    return trimmed.split(/\r?\n/).filter((l) => l.trim()).map((l) => JSON.parse(l));
  }

  function renderMessage(msg) {
    if (!msg || msg.action !== "results" || typeof msg.envelope !== "object") return null;
    const env = msg.envelope || {};
    const node = tpl.content.firstElementChild.cloneNode(true);
    node.querySelector(".qid").textContent = "[" + msg.query_id + "]";
    const status = node.querySelector(".status");
    status.textContent = msg.status;
    status.classList.add(String(msg.status).replace(/[^a-z-]/g, ""));
    const results = Array.isArray(env.results) ? env.results : [];
    node.querySelector(".count").textContent = results.length + " result(s)";

    const cites = (env.citationPack && Array.isArray(env.citationPack.citations)) ? env.citationPack.citations : [];
    const citeIndex = new Map();
    cites.forEach((c, i) => citeIndex.set(c.citationId, i + 1));
    const anchor = (cid) => "cite-" + msg.query_id + "-" + citeIndex.get(cid);

    const sentences = (env.answerSynthesis && Array.isArray(env.answerSynthesis.sentences)) ? env.answerSynthesis.sentences : [];
    const sList = node.querySelector(".sentences");
    sentences.forEach((s) => {
      const li = el("li", null, s.text);
      if (citeIndex.has(s.citationId)) {
        const sup = el("sup");
        const a = el("a", null, "[" + citeIndex.get(s.citationId) + "]");
        a.href = "#" + anchor(s.citationId);
        sup.appendChild(a);
        li.appendChild(sup);
      }
      sList.appendChild(li);
    });
    if (!sentences.length) node.querySelector(".synthesis").hidden = true;

    const hits = node.querySelector(".hits");
    results.forEach((r) => {
      const li = el("li");
      li.appendChild(el("div", "source", r.source));
      li.appendChild(el("div", "score", "score " + Number(r.score || 0).toFixed(3) + (r.date ? " · " + r.date : "")));
      li.appendChild(el("div", "preview", r.textPreview));
      hits.appendChild(li);
    });
    if (!results.length) hits.appendChild(el("li", "preview", env.reason || "no results"));

    const cList = node.querySelector(".cites");
    cites.forEach((c) => {
      const li = el("li");
      li.id = anchor(c.citationId);
      li.appendChild(el("div", "source", c.source));
      const loc = c.location && typeof c.location === "object"
        ? Object.entries(c.location).map(([k, v]) => k + " " + (Array.isArray(v) ? v.join(" › ") : v)).join(", ") : "";
      if (loc) li.appendChild(el("div", "loc", loc));
      li.appendChild(el("div", "excerpt", c.excerpt));
      cList.appendChild(li);
    });
    if (!cites.length) node.querySelector(".citations").hidden = true;
    return node;
  }

  function render(messages) {
    out.textContent = "";
    let shown = 0;
    messages.forEach((m) => {
      const node = renderMessage(m);
      if (node) { out.appendChild(node); shown += 1; }
    });
    showError(shown ? "" : "no results messages found");
  }

  function renderText(text) {
    try { render(parseMessages(text)); } catch (e) { showError("not JSON Lines: " + e.message); }
  }

  document.getElementById("file").addEventListener("change", (ev) => {
    const f = ev.target.files && ev.target.files[0];
    if (!f) return;
    const reader = new FileReader();
    reader.onload = () => renderText(String(reader.result));
    reader.readAsText(f);
  });
  document.getElementById("render").addEventListener("click", () => renderText(document.getElementById("paste").value));

  // `kith join --accept-host-ui` writes results.js (window.KITH_RESULTS) beside this page.
  if (Array.isArray(window.KITH_RESULTS)) render(window.KITH_RESULTS);
  window.kithRender = render; // for tests and embedding
})();
