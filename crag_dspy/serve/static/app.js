// The page over the crag-dspy API: POST /ask/stream with the conversation so far, the answer written as
// it streams, then the trace. Data is only ever set as text.
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const fmt = (x, digits = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
const pct = (x) => `${Math.max(0, Math.min(1, x)) * 100}%`;

function safeLink(url, text) {
  return /^https?:\/\//i.test(url || "") ? el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, text) : text;
}

function zones(lower, upper) {
  return [
    el("span", { class: "z-incorrect", style: { width: pct(lower) } }),
    el("span", { class: "z-ambiguous", style: { width: pct(upper - lower) } }),
    el("span", { class: "z-correct", style: { width: pct(1 - upper) } }),
  ];
}

function thresholdLines(lower, upper) {
  return [
    el("span", { class: "threshold", style: { left: `calc(${pct(lower)} - 1px)` }, title: `lower ${fmt(lower)}` }),
    el("span", { class: "threshold", style: { left: `calc(${pct(upper)} - 1px)` }, title: `upper ${fmt(upper)}` }),
  ];
}

// --- the API key ---------------------------------------------------------------------------------
// A service with keys configured answers 401 without one: the page asks for it and keeps it for this
// tab only (sessionStorage, gone when the tab closes), sending it as X-API-Key.
const KEY_ITEM = "crag-api-key";
const keyHeaders = () => (sessionStorage.getItem(KEY_ITEM) ? { "X-API-Key": sessionStorage.getItem(KEY_ITEM) } : {});

function askForKey() {
  sessionStorage.removeItem(KEY_ITEM);
  $("key-form").hidden = false;
  $("api-key").focus();
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_ITEM, $("api-key").value.trim());
  $("api-key").value = "";
  $("key-form").hidden = true;
  loadProgram();
});

// --- program -------------------------------------------------------------------------------------
async function loadProgram() {
  const box = $("program");
  try {
    // A server of several domains (serve --program a.json --program b.json) lets the page choose one.
    const chosen = $("domain").value;
    const url = chosen ? `/program?domain=${encodeURIComponent(chosen)}` : "/program";
    const response = await fetch(url, { headers: keyHeaders() });
    if (response.status === 401) {
      box.textContent = "This service needs an API key.";
      askForKey();
      return;
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const p = await response.json();
    const domains = p.domains || [p.domain];
    if (domains.length > 1 && $("domain").options.length === 0) {
      $("domain").replaceChildren(...domains.map((name) => el("option", { value: name }, name)));
      $("domain-row").hidden = false;
    }
    if (domains.length > 1) $("domain").value = p.domain;
    // The program's max_history_turns (CRAGConfig): the API refuses more earlier turns than that.
    const most = (p.config || {}).max_history_turns;
    maxTurns = Number.isInteger(most) ? most : DEFAULT_MAX_TURNS;
    drawConversation();
    const scores = p.scores || {};
    const test = scores.test ? Object.entries(scores.test).map(([k, v]) => `${k} ${fmt(100 * v, 1)}%`).join(", ") : null;
    const parts = [
      el("span", {}, "domain ", el("b", {}, p.domain)),
      el("span", { class: p.compiled ? "tag" : "tag uncompiled", title: p.note }, p.compiled ? "compiled program" : "uncompiled default program"),
      el("span", {}, "thresholds ", el("b", {}, `lower ${fmt(p.lower)}`), " / ", el("b", {}, `upper ${fmt(p.upper)}`)),
      p.thresholds_by_type && Object.keys(p.thresholds_by_type).length
        ? el("span", {}, "per type ", el("b", {}, Object.entries(p.thresholds_by_type).map(([k, [lo, up]]) => `${k} ${fmt(lo)}/${fmt(up)}`).join(", ")))
        : null,
      (p.config || {}).internal_retries ? el("span", {}, "internal retries ", el("b", {}, `at most ${p.config.internal_retries}`)) : null,
      el("span", {}, "LM ", el("b", {}, p.lm || "–")),
      el("span", {}, "web ", el("b", {}, p.web_backend)),
      scores.val_accuracy != null ? el("span", {}, "val accuracy ", el("b", {}, `${fmt(100 * scores.val_accuracy, 1)}%`)) : null,
      test ? el("span", {}, "test ", el("b", {}, test)) : null,
      p.compiled ? null : el("span", {}, p.note),
    ];
    box.replaceChildren(...parts.filter(Boolean));
  } catch (error) {
    box.textContent = `Could not load /program (${error.message}).`;
  }
}

// --- the conversation --------------------------------------------------------------------------------
// Each answered question is a turn; the next question goes with the last turns as `history`, so the
// server rewrites a follow-up ("and the night ferry?") into a standalone question. The turns live in
// this page only: "New conversation" (or another domain) starts afresh.
const DEFAULT_MAX_TURNS = 8;
let maxTurns = DEFAULT_MAX_TURNS;
let turns = []; // [{question, answer}], oldest first: answered questions only

const historyToSend = () => (maxTurns > 0 ? turns.slice(-maxTurns) : []);

function turnItem(question, answer, pending) {
  return el("li", { class: pending ? "turn pending" : "turn", "aria-busy": pending ? "true" : undefined },
    el("p", { class: "turn-q" }, question),
    el("p", { class: "turn-a" }, answer));
}

function drawConversation(pending) {
  const shown = turns.length > 0 || pending;
  $("conversation").hidden = !shown;
  $("question-label").textContent = turns.length ? "Your follow-up question" : "Your question";
  if (!shown) return;
  const items = turns.map((t) => turnItem(t.question, t.answer, false));
  if (pending) items.push(pending);
  $("turns").replaceChildren(...items);
  const sent = historyToSend().length;
  $("history-hint").textContent = !turns.length
    ? ""
    : maxTurns === 0
      ? "This program takes no history: each question is asked on its own."
      : `The next question is asked as a follow-up of the last ${sent} turn${sent === 1 ? "" : "s"}` +
        (turns.length > sent ? ` (the program takes at most ${maxTurns}).` : ".");
}

function newConversation() {
  turns = [];
  drawConversation();
}

$("new-conversation").addEventListener("click", () => {
  newConversation();
  $("status").textContent = "New conversation: the next question is asked on its own.";
  $("question").focus();
});

// --- one answer -------------------------------------------------------------------------------------
function explain(trace) {
  const rounds = trace.internal_rounds || [];
  // With per-type thresholds the pair that routed this question is its type's.
  const pair = trace.question_type ? `Thresholds for "${trace.question_type}" questions. ` : "";
  if (!rounds.length) return pair + explainAction(trace);
  const times = rounds.length === 1 ? "once" : `${rounds.length} times`;
  return `${pair}First ${trace.first_action}: searched the knowledge base again ${times} with rewritten queries. ${explainAction(trace)}`;
}

function explainAction(trace) {
  const known = trace.documents.map((d) => d.score).filter((s) => s !== null);
  const best = known.length ? Math.max(...known) : null;
  const lo = fmt(trace.lower), up = fmt(trace.upper);
  const webUsed = trace.external_strips.some((s) => s.kept);
  switch (trace.action) {
    case "CORRECT":
      return `Best document scored ${fmt(best)} ≥ upper ${up}: answered from refined internal knowledge.`;
    case "INCORRECT":
      if (!trace.documents.length) return "Nothing was retrieved: searched the web instead.";
      return `Every document scored below lower ${lo} (best ${fmt(best)}): internal knowledge discarded, ` +
        (webUsed ? "answered from the web." : "searched the web.");
    case "AMBIGUOUS":
      if (best === null && trace.documents.length) {
        return "No document could be graded (the grader failed on all of them), so neither threshold applies: " +
          "combined internal knowledge with a web search.";
      }
      return `Best document scored ${fmt(best)}, between lower ${lo} and upper ${up}` +
        (known.length < trace.documents.length ? " (some grades failed)" : "") +
        ": combined internal knowledge with a web search.";
    default:
      return "";
  }
}

function drawDocuments(trace) {
  const { lower, upper } = trace;
  $("legend-zones").replaceChildren(...zones(lower, upper));
  const labels = [[0, "0", "edge-left"], [lower, `lower ${fmt(lower)}`], [upper, `upper ${fmt(upper)}`], [1, "1", "edge-right"]];
  $("legend-labels").replaceChildren(
    ...labels
      .filter(([x], i) => !(i === 3 && upper > 0.93) && !(i === 0 && lower < 0.07))
      .map(([x, text, cls]) => el("span", { class: cls, style: { left: pct(x) } }, text)),
  );
  const list = $("documents");
  const foundIn = new Map((trace.internal_rounds || []).flatMap((r) => r.passage_ids.map((id) => [id, r.round])));
  if (!trace.documents.length) {
    list.replaceChildren(el("li", { class: "empty" }, "No documents were retrieved."));
    return;
  }
  list.replaceChildren(
    ...trace.documents.map((d) => {
      const failed = d.score === null;
      const band = failed ? "" : d.score >= upper ? "correct" : d.score < lower ? "incorrect" : "ambiguous";
      const zone = { "": "grade failed", correct: "at or above upper", incorrect: "below lower", ambiguous: "between the thresholds" }[band];
      return el("li", { class: "doc" },
        el("span", { class: "rank" }, `#${d.rank}`),
        el("span", { class: "title", title: d.title }, d.title || d.doc_id, " ", el("small", {}, `[${d.doc_id}]`),
          foundIn.has(d.id) ? el("small", { class: "round-tag" }, ` retry round ${foundIn.get(d.id)}`) : null),
        el("div", {
            class: "track", role: "meter", "aria-valuemin": 0, "aria-valuemax": 1,
            "aria-valuenow": failed ? undefined : d.score,
            "aria-label": `${d.title || d.doc_id}: score ${failed ? "unknown (grader failed)" : fmt(d.score)}, ${zone}`,
          },
          el("div", { class: "zones" }, zones(lower, upper)),
          el("div", { class: failed ? "fill failed" : `fill ${band}`, style: failed ? {} : { width: pct(d.score) } }),
          thresholdLines(lower, upper),
        ),
        el("span", { class: "score", title: failed ? d.error : `${d.score_source}, similarity ${fmt(d.similarity)}` }, failed ? "failed" : fmt(d.score),
          failed ? "" : el("small", { class: "source" }, ` ${SOURCES[d.score_source] || d.score_source}`)),
      );
    }),
  );
}

function drawRounds(trace) {
  const rounds = trace.internal_rounds || [];
  const box = $("rounds");
  box.hidden = !rounds.length;
  if (!rounds.length) return;
  $("rounds-heading").textContent =
    `Internal retries before the web (${rounds.length} of at most ${trace.internal_retries} rounds; first action ${trace.first_action})`;
  $("rounds-list").replaceChildren(...rounds.map((r) => {
    const scores = r.scores.map((s) => (s === null ? "failed" : fmt(s))).join(", ");
    const found = r.passage_ids.length ? `graded ${r.passage_ids.length} new (${scores})` : "nothing new to grade";
    return el("li", {},
      "Query ", el("span", { class: "web-query" }, r.query || "–"), `: ${found}`,
      r.repeated ? `, ${r.repeated} found again` : "", " → ",
      el("span", { class: `badge small ${r.action}` }, r.action),
      r.error ? el("span", { class: "round-error" }, ` ended: ${r.error}`) : null,
    );
  }));
}

// Where a document's grade came from, as the page shows it next to the score.
const SOURCES = { logprobs: "LLM", label: "LLM", evaluator: "evaluator", fused: "fused" };

// Where in a document a strip or citation is from: a PDF's page, else the section's heading path.
const whereIn = (x) => (x.page !== null && x.page !== undefined ? `p. ${x.page}` : x.section || null);

function stripItem(s, id) {
  const where = s.source === "web"
    ? safeLink(s.url, s.title || s.url)
    : `${s.title} [${s.doc_id}]${whereIn(s) ? `, ${whereIn(s)}` : ""}`;
  // A citation links here (an in-page anchor); tabindex -1 lets following it move the focus too.
  return el("li", { class: s.kept ? "strip" : "strip dropped", id, tabindex: id ? -1 : undefined },
    el("header", {},
      el("span", { class: "src" }, s.source),
      el("span", {}, where),
      el("span", { class: "sc", title: s.score_source }, s.score === null ? "failed" : `score ${fmt(s.score)}`),
    ),
    // A dropped strip's text comes only in the full trace (?debug=1).
    s.text === null ? null : el("p", {}, s.text),
  );
}

const keptStrips = (trace) => [...trace.internal_strips, ...trace.external_strips].filter((s) => s.kept);
const keptId = (i) => `kept-strip-${i + 1}`;

function drawStrips(trace) {
  const all = [...trace.internal_strips, ...trace.external_strips];
  const kept = keptStrips(trace), dropped = all.filter((s) => !s.kept);
  $("kept-heading").textContent = `Kept (${kept.length}): the answer's only context`;
  $("dropped-heading").textContent = `Dropped (${dropped.length})`;
  $("kept").replaceChildren(...(kept.length ? kept.map((s, i) => stripItem(s, keptId(i))) : [el("li", { class: "empty" }, "No strip survived refinement.")]));
  $("dropped").replaceChildren(...(dropped.length ? dropped.map((s) => stripItem(s)) : [el("li", { class: "empty" }, "Nothing dropped.")]));
}

function drawWeb(trace) {
  const section = $("web");
  section.hidden = trace.web_query === null;
  if (section.hidden) return;
  const results = trace.web_results.map((r) =>
    // Contents come only in the full trace (?debug=1); clients see titles and links.
    el("li", {}, safeLink(r.url, r.title || r.url), r.content ? el("p", {}, r.content.length > 220 ? `${r.content.slice(0, 220)}…` : r.content) : null));
  $("web-body").replaceChildren(
    el("p", {}, "Rewritten query ", el("span", { class: "web-query" }, trace.web_query), ` sent to ${trace.web_backend}: ${results.length} result(s).`),
    results.length ? el("ol", { class: "results" }, results) : el("p", { class: "empty" }, "No results."),
  );
}

function drawTimings(trace, seconds) {
  const stages = Object.entries(trace.timings);
  const longest = Math.max(0.001, ...stages.map(([, s]) => s));
  const usage = trace.lm_usage || {};
  const total = { calls: 0, prompt_tokens: 0, completion_tokens: 0 };
  const rows = stages.map(([stage, secs]) => {
    const u = usage[stage] || { calls: 0, prompt_tokens: 0, completion_tokens: 0 };
    for (const key of Object.keys(total)) total[key] += u[key] || 0;
    return el("tr", {},
      el("td", {}, stage.replace("_", " ")),
      el("td", { class: "num" }, fmt(secs, 3)),
      el("td", {}, el("div", { class: "tbar", style: { width: pct(secs / longest) } })),
      el("td", { class: "num" }, u.calls),
      el("td", { class: "num" }, `${u.prompt_tokens} / ${u.completion_tokens}`),
    );
  });
  rows.push(el("tr", {},
    el("th", { scope: "row" }, "request total"),
    el("td", { class: "num" }, fmt(seconds, 3)),
    el("td", {}),
    el("td", { class: "num" }, total.calls),
    el("td", { class: "num" }, `${total.prompt_tokens} / ${total.completion_tokens}`),
  ));
  $("timings").replaceChildren(...rows);
}

// The answer's key content checked against its context (crag_dspy/grounding.py): a flag is a warning
// about the answer, so it comes first.
function groundingNotice(g) {
  if (!g || !g.flagged) return null;
  const items = [];
  if (g.ungrounded.length) items.push(el("li", {}, `Not in the context or the question: ${g.ungrounded.join(", ")}`));
  if (g.instruction_supported.length) {
    items.push(el("li", {}, `Only in text that instructs the model (${g.instructing_sources.join(", ")}): ${g.instruction_supported.join(", ")}`));
  }
  if ((g.disputed || []).length) {
    items.push(el("li", {}, `Other sources state another value (${g.disputing_sources.join(", ")}): ${g.disputed.join(", ")}`));
  }
  return el("div", { class: "notice error", id: "grounding-warning", role: "alert" },
    el("h3", {}, "The answer may not be grounded (possible injection)"), el("ul", {}, items));
}

// The label people read, from the server (Citation.label, crag_dspy/citations.py), as `crag-dspy ask` prints it.
const citationLabel = (c) => c.label || c.doc_id;

// Quotes are sentences as the server cut them, with whitespace runs made one space.
const squash = (text) => (text || "").split(/\s+/).filter(Boolean).join(" ");

// A web citation links to its page (http/https only); a document's to the kept strip it quotes on this
// page, since the server does not serve the documents themselves; else it is plain text.
function citationSource(c, kept) {
  const label = citationLabel(c);
  if (c.source === "web" && /^https?:\/\//i.test(c.url || "")) return safeLink(c.url, label);
  const i = kept.findIndex((s) => s.source === c.source && s.doc_id === c.doc_id && (s.page ?? null) === (c.page ?? null) &&
    (s.section ?? null) === (c.section ?? null) && squash(s.text).includes(squash(c.quote)));
  return i < 0 ? label : el("a", { href: `#${keptId(i)}`, title: "the kept strip this quotes" }, label);
}

// Under the answer and its grounding warning: what the answer rests on, numbered as the CLI prints it.
function sourcesList(trace) {
  const citations = trace.citations || [];
  if (!citations.length) return null;
  const kept = keptStrips(trace);
  return el("div", { class: "sources", id: "sources-list" },
    el("h3", { id: "sources-heading" }, citations.length === 1 ? "Source" : `Sources (${citations.length})`),
    el("ol", { "aria-labelledby": "sources-heading" }, citations.map((c, i) =>
      el("li", {}, el("span", { class: "cite-num" }, `[${i + 1}]`), " ", citationSource(c, kept), el("q", {}, c.quote)))));
}

// A withheld answer (the server's on_flag is "withhold", crag_dspy/flag_policy.py): the sources on the
// other side, after the answer's own (the Sources list), numbered on from them as the CLI does.
function otherSideList(body, trace) {
  if (!body || body.status !== "withheld") return null;
  const first = (trace.citations || []).length + 1;
  return el("div", { class: "notice error", id: "withheld-notice", role: "alert" },
    el("h3", {}, "Not answered: the sources disagree or instruct the model"),
    el("p", {}, "Read both sides: the answer's sources are listed under Sources, the others here."),
    el("ol", { start: String(first) }, (body.other_side || []).map((c) =>
      el("li", {}, citationSource(c, keptStrips(trace)), el("q", {}, c.quote)))));
}

function drawProblems(trace, body) {
  // The grounding warning and the sources have their own places above the fallbacks and errors.
  $("grounding").replaceChildren(...[groundingNotice(trace.grounding), otherSideList(body, trace)].filter(Boolean));
  $("sources").replaceChildren(...[sourcesList(trace)].filter(Boolean));
  const box = $("problems");
  const blocks = [];
  if (trace.fallbacks.length) {
    blocks.push(el("div", { class: "notice" }, el("h3", {}, "Fallbacks"), el("ul", {}, trace.fallbacks.map((f) => el("li", {}, f)))));
  }
  if (trace.errors.length) {
    blocks.push(el("div", { class: "notice error" }, el("h3", {}, `Errors (${trace.errors.length})`), el("ul", {}, trace.errors.map((e) => el("li", {}, e)))));
  }
  box.replaceChildren(...blocks);
}

function drawTrace(trace, body) {
  const { answer, action, seconds } = body;
  $("answer").textContent = answer ?? "(no answer)";
  const badge = $("action");
  badge.textContent = action || "no action";
  badge.className = `badge ${action || ""}`;
  $("why").textContent = explain(trace);
  drawProblems(trace, body);
  $("meta").textContent = [seconds !== undefined ? `${fmt(seconds, 2)} s` : null, `LM ${trace.lm_model || "–"}`, `retriever ${trace.retriever}`]
    .filter(Boolean).join(" · ");
  drawDocuments(trace);
  drawRounds(trace);
  drawStrips(trace);
  drawWeb(trace);
  drawTimings(trace, seconds ?? Object.values(trace.timings).reduce((a, b) => a + b, 0));
  $("raw").textContent = JSON.stringify(trace, null, 2);
  $("result").hidden = false;
}

// Reads POST /ask/stream's server-sent events: each `stage` goes to onStage and each `token` (a piece of
// the answer's draft) to onToken as it arrives; resolves with the last event (`answer` or `error`).
async function readStream(response, onStage, onToken) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "", last = { event: "error", data: { status: 502, detail: "the stream ended without an answer" } };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return last;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = (block.match(/^event: (.*)$/m) || [])[1];
      const data = (block.match(/^data: (.*)$/m) || [])[1];
      if (!event || data === undefined) continue;
      const parsed = JSON.parse(data);
      if (event === "stage") onStage(parsed);
      else if (event === "token") onToken(parsed.text);
      else last = { event, data: parsed };
    }
  }
}

async function ask(question) {
  const button = $("submit"), status = $("status"), failure = $("failure");
  button.disabled = true;
  failure.hidden = true;
  const started = performance.now();
  let stageLine = "each retrieved document is graded by the LM";
  const tick = () => { status.textContent = `Asking… ${((performance.now() - started) / 1000).toFixed(0)} s (${stageLine})`; };
  tick();
  const timer = setInterval(tick, 1000);
  // The question shows as the conversation's next turn, its answer written as the LM writes it.
  const pending = turnItem(question, "", true);
  const draft = pending.querySelector(".turn-a");
  const history = historyToSend();
  drawConversation(pending);
  try {
    // The stream tells each stage as it happens; a refusal (401, 422, 429, a full queue) is plain JSON.
    const request = { question, ...(history.length ? { history } : {}) };
    if (!$("domain-row").hidden) request.domain = $("domain").value;
    const response = await fetch("/ask/stream", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream", ...keyHeaders() },
      body: JSON.stringify(request),
    });
    let body, httpStatus = response.status;
    if (response.ok && (response.headers.get("Content-Type") || "").startsWith("text/event-stream")) {
      const ended = await readStream(response, (stage) => {
        stageLine = stage.message;
        tick();
      }, (text) => {
        stageLine = "writing the answer";
        draft.textContent += text; // the draft: the final answer replaces it
      });
      body = ended.data;
      if (ended.event === "answer") {
        turns.push({ question, answer: body.answer });
        drawConversation();
        $("question").value = ""; // ready for the follow-up
        drawTrace(body.trace, body);
        status.textContent = `Answered in ${fmt(body.seconds, body.seconds < 10 ? 2 : 1)} s: ${body.action}${body.degraded ? " (degraded: see fallbacks and errors)" : ""}.`;
        return;
      }
      httpStatus = body.status;
    } else {
      body = await response.json().catch(() => ({ detail: `HTTP ${response.status} with a non-JSON body` }));
    }
    drawConversation(); // the question got no answer: it is no turn of the conversation
    if (httpStatus === 401) askForKey();
    const who = body.dependency ? ` (failed dependency: ${body.dependency})` : "";
    failure.replaceChildren(el("h3", {}, `HTTP ${httpStatus}${who}`), el("p", {}, body.detail || "request failed"));
    failure.hidden = false;
    if (body.trace) drawTrace(body.trace, { answer: body.trace.answer, action: body.trace.action });
    else $("result").hidden = true;
    status.textContent = "The request failed.";
  } catch (error) {
    drawConversation();
    failure.replaceChildren(el("h3", {}, "The service did not answer"), el("p", {}, String(error)));
    failure.hidden = false;
    status.textContent = "The request failed.";
  } finally {
    clearInterval(timer);
    button.disabled = false;
  }
}

$("ask").addEventListener("submit", (event) => {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question) {
    $("status").textContent = "Type a question first.";
    $("question").focus();
    return;
  }
  ask(question);
});
$("question").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("ask").requestSubmit();
  }
});
$("domain").addEventListener("change", () => {
  newConversation(); // another domain's program would read the turns as its own conversation
  loadProgram();
});
loadProgram();
