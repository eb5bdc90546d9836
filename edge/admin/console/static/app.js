// notifyedge console. Every value from the server is put in the page as
// text (textContent, createTextNode): never as markup. The token lives in
// this tab's sessionStorage and goes in the Authorization header of each
// API call; no cookie carries it.
'use strict';

const tokenKey = 'notifyedge.token';
const roleKey = 'notifyedge.role';
const reasons = ['PAYLOAD_CONFLICT', 'AMOUNT_MISMATCH', 'MERCHANT_MISMATCH', 'UNKNOWN_ORDER', 'PAID_AFTER_CLOSE',
  'DUPLICATE_PAYMENT', 'REFUND_EXCEEDS', 'REFUND_OTHER_TRADE', 'REFUND_FAILED', 'REFUNDED_AT_CHANNEL',
  'NOT_IN_BILL', 'BILL_MISMATCH'];

// bidiControls are the characters that reorder the text around them
// (embeddings, overrides, isolates, marks): a callback's "\u202egnp.exe"
// would read "exe.png".
const bidiControls = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

// visible shows bidirectional controls as their code points, so text reads
// in the order it was sent.
function visible(s) {
  return String(s).replace(bidiControls, c => '⟦U+' + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, '0') + '⟧');
}

// el builds an element: attrs are set as attributes or listeners, children
// are nodes or strings (text nodes); nothing is ever parsed as markup, and
// no text reorders what follows it.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = visible(v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(visible(c)));
  }
  return e;
}

// minorDigits is a currency's ISO 4217 exponent (2 for CNY, 0 for JPY, 3
// for KWD), as the browser's Intl knows it.
function minorDigits(currency) {
  try {
    return new Intl.NumberFormat('en', { style: 'currency', currency }).resolvedOptions().maximumFractionDigits;
  } catch (e) {
    return 2;
  }
}

// money prints an amount in minor units as the currency writes it.
function money(minor, currency) {
  if (minor === null || minor === undefined) return '—';
  const d = minorDigits(currency || 'CNY');
  return (minor / Math.pow(10, d)).toFixed(d);
}

// safeDecode is decodeURIComponent that never throws (a hash typed by
// hand, "#/order/%", must not stop the page).
function safeDecode(s) {
  try { return decodeURIComponent(s); } catch (e) { return s; }
}

function main() { return document.getElementById('main'); }

function show(...nodes) { main().replaceChildren(...nodes); }

function token() { return sessionStorage.getItem(tokenKey) || ''; }
function role() { return sessionStorage.getItem(roleKey) || ''; }

// request calls the admin API with the token; it resolves to {status,
// body} (body parsed as JSON when it is JSON, else text).
async function request(method, path, body) {
  const init = { method, headers: { Authorization: 'Bearer ' + token() }, credentials: 'omit', cache: 'no-store' };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const text = await resp.text();
  let parsed = text;
  if ((resp.headers.get('Content-Type') || '').includes('json')) {
    try { parsed = JSON.parse(text); } catch (e) { /* shown as text */ }
  }
  return { status: resp.status, body: parsed };
}

// api is request for a signed-in page: a refused token signs out.
async function api(method, path, body) {
  const r = await request(method, path, body);
  if (r.status === 401 && token()) {
    signOut('The token was refused: sign in again.');
    throw new Error('unauthorized');
  }
  return r;
}

function message(body) {
  if (body && typeof body === 'object') return body.message || JSON.stringify(body);
  return String(body);
}

function when(t) {
  if (!t) return '';
  const d = new Date(t);
  return isNaN(d) ? String(t) : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

// pretty shows a stored callback body readably: JSON indented, a form
// one field a line; always as text.
function pretty(raw) {
  const s = String(raw || '');
  try { return JSON.stringify(JSON.parse(s), null, 2); } catch (e) { /* not JSON */ }
  if (/^[^=&\s]+=[^&]*(&[^=&\s]+=[^&]*)*$/.test(s.trim())) {
    try {
      return Array.from(new URLSearchParams(s.trim())).map(([k, v]) => k + ' = ' + v).join('\n');
    } catch (e) { /* shown raw */ }
  }
  return s;
}

function requestID() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, x => x.toString(16).padStart(2, '0')).join('');
}

// ---- sign-in -------------------------------------------------------------

function signOut(why) {
  sessionStorage.removeItem(tokenKey);
  sessionStorage.removeItem(roleKey);
  location.hash = '#/signin';
  renderSignIn(why);
}

function renderSignIn(why) {
  document.getElementById('nav').hidden = true;
  const input = el('input', { type: 'password', id: 'token', autocomplete: 'off', placeholder: 'admin or orders token', required: true });
  const err = el('p', { class: 'error', id: 'signin-error' }, why || '');
  const form = el('form', { id: 'signin', onsubmit: async ev => {
    ev.preventDefault();
    sessionStorage.setItem(tokenKey, input.value.trim());
    const r = await probeRole();
    if (!r) {
      sessionStorage.removeItem(tokenKey);
      err.textContent = 'This token opens nothing here.';
      return;
    }
    sessionStorage.setItem(roleKey, r);
    location.hash = r === 'admin' ? '#/reviews' : '#/order';
    route();
  } }, input, el('button', { type: 'submit', id: 'signin-button' }, 'Sign in'));
  show(el('div', { class: 'signin panel' }, el('h2', {}, 'Sign in'),
    el('p', { class: 'muted' }, 'The admin token opens everything; the orders token opens the orders only. ' +
      'It is kept in this tab only, until you sign out or close it.'), form, err));
  input.focus();
}

// probeRole finds what the token opens: the review queue (admin) or the
// orders only; '' for nothing.
async function probeRole() {
  if ((await request('GET', '/review?limit=1')).status === 200) return 'admin';
  const s = (await request('GET', '/orders/-')).status;
  return s === 404 || s === 200 ? 'orders' : '';
}

// ---- review queue --------------------------------------------------------

function hashParams() {
  const q = location.hash.indexOf('?');
  return new URLSearchParams(q < 0 ? '' : location.hash.slice(q + 1));
}

async function renderReviews() {
  const p = hashParams();
  const state = p.get('state') || 'open';
  const reason = p.get('reason') || '';
  const after = p.get('after') || '';
  const go = (st, rs, af) => {
    const q = new URLSearchParams({ state: st });
    if (rs) q.set('reason', rs);
    if (af) q.set('after', af);
    location.hash = '#/reviews?' + q.toString();
  };
  const stateSel = el('select', { id: 'filter-state', onchange: () => go(stateSel.value, reasonSel.value, '') },
    ...['open', 'resolved', 'all'].map(s => el('option', { value: s, selected: s === state }, s)));
  const reasonSel = el('select', { id: 'filter-reason', onchange: () => go(stateSel.value, reasonSel.value, '') },
    el('option', { value: '' }, 'every reason'),
    ...reasons.map(r => el('option', { value: r, selected: r === reason }, r)));
  const status = el('span', { class: 'muted', id: 'reviews-status' }, 'loading…');
  const body = el('tbody', { id: 'reviews-body' });
  const detail = el('div', { id: 'review-detail' });
  const pager = el('div', { class: 'bar' });
  show(el('h2', {}, 'Review queue'),
    el('div', { class: 'bar' }, el('label', {}, 'State ', stateSel), el('label', {}, 'Reason ', reasonSel), status),
    el('table', { id: 'reviews' }, el('thead', {}, el('tr', {}, ...['id', 'created', 'reason', 'order', 'key', 'state'].map(h => el('th', {}, h)))), body),
    pager, detail);

  const q = new URLSearchParams({ state, limit: '50' });
  if (reason) q.set('reason', reason);
  if (after) q.set('after_id', after);
  const started = performance.now();
  const r = await api('GET', '/review?' + q.toString());
  if (r.status !== 200) {
    status.textContent = 'Could not read the queue: ' + message(r.body);
    status.className = 'error';
    return;
  }
  const rows = r.body.items.map(item => {
    const tr = el('tr', { class: 'row', 'data-id': item.id, onclick: () => {
      for (const o of body.children) o.classList.remove('selected');
      tr.classList.add('selected');
      renderReviewDetail(item, detail);
    } },
    el('td', { class: 'mono' }, item.id), el('td', {}, when(item.created_at)), el('td', {}, item.reason),
    el('td', { class: 'mono' }, el('a', { href: '#/order/' + encodeURIComponent(item.order_no), onclick: ev => ev.stopPropagation() }, item.order_no)),
    el('td', { class: 'mono' }, item.biz_key),
    el('td', {}, el('span', { class: 'badge ' + (item.resolved_at ? 'resolved' : 'open') }, item.resolved_at ? 'resolved' : 'open')));
    return tr;
  });
  body.replaceChildren(...rows);
  const ms = performance.now() - started;
  document.body.dataset.reviewsMs = ms.toFixed(1);
  status.textContent = rows.length ? `${rows.length} rows` + (after ? ` before id ${after}` : '') : 'No rows.';
  status.className = 'muted';
  if (after) pager.append(el('a', { href: '#', id: 'page-first', onclick: ev => { ev.preventDefault(); go(state, reason, ''); } }, '« newest'));
  if (r.body.next_after_id) {
    pager.append(el('a', { href: '#', id: 'page-next', onclick: ev => { ev.preventDefault(); go(state, reason, String(r.body.next_after_id)); } }, 'older »'));
  }
}

function renderReviewDetail(item, box) {
  const result = el('p', { id: 'review-result' });
  const parts = [el('h3', {}, `Review ${item.id}: ${item.reason}`),
    el('table', {}, el('tbody', {},
      ...[['order', item.order_no], ['key', item.biz_key], ['digest', item.payload_hash], ['created', when(item.created_at)],
        ['resolved', item.resolved_at ? `${when(item.resolved_at)} by ${item.resolved_by}: ${item.resolution}` : 'open']]
        .map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', { class: 'mono' }, v))))),
    el('h3', {}, 'The delivery as received'),
    el('pre', { id: 'raw-body' }, pretty(item.raw_body))];
  if (!item.resolved_at) {
    const note = el('input', { id: 'resolution', placeholder: 'what was done (e.g. refunded the second payment)', size: 50, required: true });
    const by = el('input', { id: 'resolved-by', placeholder: 'your name', value: localStorage.getItem('notifyedge.by') || '', required: true });
    const resolve = el('form', { id: 'resolve-form', onsubmit: async ev => {
      ev.preventDefault();
      localStorage.setItem('notifyedge.by', by.value);
      const r = await api('POST', `/review/${item.id}/resolve`, { resolution: note.value, by: by.value });
      result.textContent = r.status === 200 ? 'Resolved.' : `Not resolved (${r.status}): ${message(r.body)}`;
      result.className = r.status === 200 ? 'ok' : 'error';
      if (r.status === 200) renderReviews();
    } }, note, by, el('button', { type: 'submit', id: 'resolve-button' }, 'Resolve'));
    const redrive = el('button', { type: 'button', id: 'redrive-button', onclick: async () => {
      if (!by.value) { result.textContent = 'Your name first.'; result.className = 'error'; return; }
      const r = await api('POST', `/review/${item.id}/redrive`, { by: by.value });
      if (r.status === 200) {
        result.textContent = `Re-driven: ${r.body.outcome}, order ${r.body.status} (answered ${r.body.http} ${r.body.code}).`;
        result.className = 'ok';
      } else {
        result.textContent = `Not re-driven (${r.status}): ${message(r.body)}`;
        result.className = 'error';
      }
    } }, 'Re-drive');
    parts.push(el('h3', {}, 'Resolve'), resolve,
      el('div', { class: 'bar' }, redrive, el('span', { class: 'muted' }, 'decides the stored delivery again (e.g. once the order is registered)')));
  }
  parts.push(result);
  box.replaceChildren(el('div', { class: 'panel' }, ...parts));
}

// ---- orders --------------------------------------------------------------

async function renderOrder(no) {
  const input = el('input', { id: 'order-no', placeholder: 'order number', value: no || '', size: 40 });
  const form = el('form', { id: 'order-form', onsubmit: ev => {
    ev.preventDefault();
    location.hash = '#/order/' + encodeURIComponent(input.value.trim());
  } }, input, el('button', { type: 'submit' }, 'Open'));
  const box = el('div', { id: 'order' });
  show(el('h2', {}, 'Orders'), form, box);
  if (!no) return;
  const r = await api('GET', '/orders/' + encodeURIComponent(no) + '?limit=1000');
  if (r.status === 404) { box.append(el('p', { class: 'error' }, 'No such order.')); return; }
  if (r.status !== 200) { box.append(el('p', { class: 'error' }, `Could not read it (${r.status}): ${message(r.body)}`)); return; }
  const o = r.body;
  const result = el('p', { id: 'order-result' });
  const act = (label, ev) => el('button', { type: 'button', id: 'order-' + ev.toLowerCase(), onclick: async () => {
    const a = await api('POST', '/orders/' + encodeURIComponent(no) + '/events', { event: ev, request_id: requestID() });
    result.textContent = a.status === 200 ? `${ev}: ${a.body.outcome}, now ${a.body.status}.` : `${ev} refused (${a.status}): ${message(a.body)}`;
    result.className = a.status === 200 ? 'ok' : 'error';
    // Show the moved order a moment later, unless the operator went on.
    const here = location.hash;
    if (a.status === 200) setTimeout(() => { if (location.hash === here) renderOrder(no); }, 600);
  } }, label);
  const ask = el('button', { type: 'button', id: 'order-reconcile', onclick: async () => {
    const a = await api('POST', '/orders/' + encodeURIComponent(no) + '/reconcile');
    result.textContent = a.status === 200 ? `The channel ${a.body.channel} says ${a.body.state}: ${a.body.outcome}${a.body.status ? ', now ' + a.body.status : ''}.`
      : `Not asked (${a.status}): ${message(a.body)}`;
    result.className = a.status === 200 ? 'ok' : 'error';
  } }, 'Ask the channel');
  const table = (title, cols, rows, cells) => [el('h3', {}, `${title} (${rows.length})`),
    rows.length ? el('table', { id: 'order-' + title.toLowerCase() }, el('thead', {}, el('tr', {}, ...cols.map(c => el('th', {}, c)))),
      el('tbody', {}, ...rows.map(x => el('tr', {}, ...cells(x).map(c => el('td', { class: 'mono' }, c)))))) : el('p', { class: 'muted' }, 'none')];
  box.append(el('div', { class: 'panel' },
    el('h3', {}, 'Order ', el('span', { class: 'mono', id: 'order-title' }, o.order_no), ' ', el('span', { class: 'badge', id: 'order-status' }, o.status)),
    el('p', { id: 'order-amount' }, `${money(o.amount, o.currency)} ${o.currency}` + (o.refunded_amount ? `, refunded ${money(o.refunded_amount, o.currency)}` : '') +
      (o.paid_by ? `, paid by trade ${o.paid_by}` : '') + (o.channel ? `, channel ${o.channel}` : '') + `; updated ${when(o.updated_at)}`),
    // Only the moves the order's state allows: SHIP a PAID order, CLOSE
    // (and ask the channel about) one still PENDING_PAY.
    el('div', { class: 'bar' }, o.status === 'PAID' ? act('Ship', 'SHIP') : null,
      o.status === 'PENDING_PAY' ? act('Close', 'CLOSE') : null, o.status === 'PENDING_PAY' ? ask : null),
    result,
    ...table('Claims', ['created', 'key', 'outcome', 'status'], o.claims, c => [when(c.created_at), c.biz_key, c.outcome, c.status]),
    ...table('Events', ['id', 'created', 'topic', 'published', 'payload'], o.events,
      e => [e.id, when(e.created_at), e.topic, e.published_at ? when(e.published_at) : 'not yet', JSON.stringify(e.payload)]),
    ...table('Refunds', ['created', 'trade', 'refund id', 'amount'], o.refunds, x => [when(x.created_at), x.trade, x.refund_id, money(x.amount, o.currency)]),
    ...table('Reviews', ['id', 'created', 'reason', 'key', 'resolved'], o.reviews,
      x => [x.id, when(x.created_at), x.reason, x.biz_key, x.resolved_at ? when(x.resolved_at) : 'open']),
    o.truncated ? el('p', { class: 'muted' }, 'Lists hold the newest 1000 rows.') : null));
}

// ---- bills ----------------------------------------------------------------

// yuan prints a statement's amount: both channels' statements are in CNY.
function yuan(fen) { return money(fen, 'CNY'); }

function isoDay(d) { return d.toISOString().slice(0, 10); }

// renderBills lists the runs of the last 30 days (or a channel's), with a
// form that runs a day now.
async function renderBills() {
  const p = hashParams();
  const channel = p.get('channel') || '';
  const to = p.get('to') || isoDay(new Date());
  const from = p.get('from') || isoDay(new Date(Date.now() - 30 * 86400000));
  const status = el('span', { class: 'muted', id: 'bills-status' }, 'loading…');
  const body = el('tbody', { id: 'bills-body' });
  const result = el('p', { id: 'bills-result' });
  const runCh = el('input', { id: 'run-channel', placeholder: 'channel', value: channel, size: 10, required: true });
  // Yesterday in the channels' day (Asia/Shanghai, UTC+8 all year).
  const runDay = el('input', { id: 'run-date', type: 'date', value: isoDay(new Date(Date.now() + 8 * 3600000 - 86400000)), required: true });
  const run = el('form', { id: 'run-form', onsubmit: async ev => {
    ev.preventDefault();
    result.textContent = 'fetching…';
    result.className = 'muted';
    const r = await api('POST', `/bills/${encodeURIComponent(runCh.value.trim())}/${encodeURIComponent(runDay.value)}`);
    result.textContent = r.status === 200 ? `${r.body.channel} ${r.body.date}: ${r.body.state}` + (r.body.message ? ` (${r.body.message})` : '')
      : `Not run (${r.status}): ${message(r.body)}`;
    result.className = r.status === 200 && r.body.state === 'ok' ? 'ok' : 'error';
    if (r.status === 200) location.hash = `#/bills/${encodeURIComponent(r.body.channel)}/${r.body.date}`;
  } }, runCh, runDay, el('button', { type: 'submit', id: 'run-button' }, 'Fetch and compare now'));
  const cols = ['day', 'channel', 'state', 'bill: payments', 'paid', 'refunds', 'refunded', 'fees', 'ledger: payments', 'paid', 'refunds', 'refunded',
    'matched', 'channel only', 'ledger only', 'amount mismatch', 'pending'];
  show(el('h2', {}, 'Daily bills'),
    el('p', { class: 'muted' }, 'Each channel\'s statement of a day against the ledger, by trade. Items that did not match, and what was done, are on each run.'),
    run, result,
    el('div', { class: 'bar' }, status),
    el('table', { id: 'bills' }, el('thead', {}, el('tr', {}, ...cols.map(h => el('th', {}, h)))), body));
  const q = new URLSearchParams({ from, to });
  if (channel) q.set('channel', channel);
  const r = await api('GET', '/bills?' + q.toString());
  if (r.status !== 200) {
    status.textContent = 'Could not read the runs: ' + message(r.body);
    status.className = 'error';
    return;
  }
  body.replaceChildren(...r.body.runs.map(x => {
    const c = x.categories || {};
    const href = `#/bills/${encodeURIComponent(x.channel)}/${x.date}`;
    return el('tr', { class: 'row', onclick: () => { location.hash = href; } },
      el('td', { class: 'mono' }, el('a', { href }, x.date)), el('td', {}, x.channel), el('td', {}, el('span', { class: 'badge ' + x.state }, x.state)),
      el('td', {}, x.bill.payments), el('td', {}, yuan(x.bill.paid)), el('td', {}, x.bill.refunds), el('td', {}, yuan(x.bill.refunded)), el('td', {}, yuan(x.bill.fees || 0)),
      el('td', {}, x.ledger.payments), el('td', {}, yuan(x.ledger.paid)), el('td', {}, x.ledger.refunds), el('td', {}, yuan(x.ledger.refunded)),
      el('td', {}, c.matched || 0), el('td', { class: c.channel_only ? 'error' : '' }, c.channel_only || 0),
      el('td', { class: c.ledger_only ? 'error' : '' }, c.ledger_only || 0), el('td', { class: c.amount_mismatch ? 'error' : '' }, c.amount_mismatch || 0),
      el('td', {}, c.pending || 0));
  }));
  status.textContent = r.body.runs.length ? `${r.body.runs.length} runs from ${from} to ${to}` : `No runs from ${from} to ${to}.`;
  status.className = 'muted';
}

// renderBillRun shows one run: both sides' totals and every item, each
// linked to its order.
async function renderBillRun(channel, date) {
  const box = el('div', { id: 'bill-run' }, 'loading…');
  show(el('h2', {}, 'Daily bill ', el('span', { class: 'mono' }, `${channel} ${date}`)),
    el('p', {}, el('a', { href: '#/bills?channel=' + encodeURIComponent(channel) }, '« all runs of ' + channel)), box);
  const r = await api('GET', `/bills/${encodeURIComponent(channel)}/${encodeURIComponent(date)}`);
  if (r.status !== 200) { box.replaceChildren(el('p', { class: 'error' }, `No run (${r.status}): ${message(r.body)}`)); return; }
  const x = r.body;
  const c = x.categories || {};
  const side = (name, s) => el('tr', {}, el('th', {}, name), el('td', {}, s.payments), el('td', {}, yuan(s.paid)), el('td', {}, s.refunds),
    el('td', {}, yuan(s.refunded)), el('td', {}, name === 'statement' ? yuan(s.fees || 0) : ''));
  const items = x.items.map(it => el('tr', { class: 'item ' + it.category },
    el('td', {}, it.category), el('td', {}, it.kind),
    el('td', { class: 'mono' }, it.order_no ? el('a', { href: '#/order/' + encodeURIComponent(it.order_no) }, it.order_no) : ''),
    el('td', { class: 'mono' }, it.trade), el('td', { class: 'mono' }, it.refund_id || ''),
    el('td', {}, yuan(it.bill_amount)), el('td', {}, yuan(it.ledger_amount)), el('td', {}, it.recorded_on || ''),
    el('td', {}, it.action + (it.detail ? ': ' + it.detail : ''))));
  box.replaceChildren(el('div', { class: 'panel' },
    el('p', {}, el('span', { class: 'badge ' + x.state, id: 'bill-state' }, x.state), ' fetched ', when(x.fetched_at), x.message ? ' — ' + x.message : ''),
    el('table', { id: 'bill-sides' }, el('thead', {}, el('tr', {}, ...['', 'payments', 'paid', 'refunds', 'refunded', 'fees'].map(h => el('th', {}, h)))),
      el('tbody', {}, side('statement', x.bill), side('ledger', x.ledger))),
    el('p', {}, `matched ${c.matched || 0} · channel only ${c.channel_only || 0} · ledger only ${c.ledger_only || 0} · amount mismatch ${c.amount_mismatch || 0} · pending ${c.pending || 0}`),
    el('h3', {}, `Items (${x.items.length})`),
    x.items.length ? el('table', { id: 'bill-items' }, el('thead', {}, el('tr', {}, ...['category', 'kind', 'order', 'trade', 'refund id', 'statement', 'ledger', 'recorded on', 'action']
      .map(h => el('th', {}, h)))), el('tbody', {}, ...items)) : el('p', { class: 'muted' }, 'Every row matched.')));
}

// ---- status --------------------------------------------------------------

// samples keeps this tab's scrapes of /metrics, for the outcome counts of
// the last minutes.
const samples = [];

function parseMetrics(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? ([^ ]+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[3] || '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

async function renderStatus() {
  const ready = el('div', { id: 'readiness' }, 'loading…');
  const outcomes = el('div', { id: 'outcomes' });
  const certs = el('div', { id: 'certs' });
  const reloadResult = el('span', { id: 'reload-result' });
  const reload = el('button', { type: 'button', id: 'reload-button', onclick: async () => {
    const r = await api('POST', '/reload');
    reloadResult.textContent = r.status === 200 ? 'Reloaded.' : `Reload failed (${r.status}): ${message(r.body)}; the old credentials stay.`;
    reloadResult.className = r.status === 200 ? 'ok' : 'error';
  } }, 'Reload credentials');
  show(el('h2', {}, 'Status'), el('h3', {}, 'Readiness'), ready, el('h3', {}, 'Callbacks by outcome'), outcomes,
    el('h3', {}, 'Channels and their credentials'), certs, el('div', { class: 'bar' }, role() === 'admin' ? reload : null, reloadResult));

  const rz = await fetch('/readyz', { cache: 'no-store' });
  const rb = await rz.json().catch(() => ({}));
  ready.replaceChildren(el('table', {}, el('tbody', {}, ...Object.entries(rb).map(([k, v]) =>
    el('tr', {}, el('th', {}, k), el('td', {}, el('span', { class: 'badge ' + String(v) }, String(v))))))));

  const text = await (await fetch('/metrics', { cache: 'no-store' })).text();
  const metrics = parseMetrics(text);
  const now = Date.now();
  const counts = {};
  for (const m of metrics) {
    if (m.name !== 'notifyedge_requests_total') continue;
    const k = m.labels.channel + '\u0000' + m.labels.outcome;
    counts[k] = m.value;
  }
  samples.push({ at: now, counts });
  while (samples.length > 1 && now - samples[0].at > 15 * 60 * 1000) samples.shift();
  const base = samples[0];
  const mins = samples.length > 1 ? ((now - base.at) / 60000).toFixed(1) : '';
  const rows = Object.entries(counts).filter(([, v]) => v > 0).sort().map(([k, v]) => {
    const [channel, outcome] = k.split('\u0000');
    return el('tr', {}, el('td', {}, channel), el('td', {}, outcome), el('td', {}, String(v)),
      el('td', {}, samples.length > 1 ? String(v - (base.counts[k] || 0)) : '—'));
  });
  outcomes.replaceChildren(rows.length ? el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'channel'), el('th', {}, 'outcome'),
    el('th', {}, 'since start'), el('th', {}, mins ? `last ${mins} min` : 'recent (from the next refresh)'))), el('tbody', {}, ...rows)) : el('p', { class: 'muted' }, 'No callbacks yet.'),
  el('p', { class: 'muted' }, 'The last-minutes column counts from when this page first read the figures; it refreshes every 15 s.'));

  // Each channel this node serves (the series edged makes for it at
  // start), with its certificates' expiry where it verifies with
  // certificates.
  const channels = [...new Set(metrics.filter(m => m.name === 'notifyedge_requests_total' && m.labels.channel !== 'unknown')
    .map(m => m.labels.channel))].sort();
  const certRows = [];
  for (const ch of channels) {
    const cs = metrics.filter(m => m.name === 'notifyedge_channel_cert_not_after_seconds' && m.labels.channel === ch);
    if (!cs.length) {
      certRows.push(el('tr', {}, el('td', {}, ch), el('td', { class: 'muted' }, 'secret or public key: no expiry'), el('td', {}), el('td', {})));
    }
    for (const m of cs) {
      const days = (m.value * 1000 - now) / 86400000;
      certRows.push(el('tr', {}, el('td', {}, ch), el('td', { class: 'mono' }, 'certificate ' + m.labels.serial),
        el('td', {}, when(new Date(m.value * 1000))), el('td', { class: days < 14 ? 'error' : '' }, `${Math.floor(days)} days`)));
    }
  }
  certs.replaceChildren(certRows.length ? el('table', { id: 'channels' }, el('thead', {}, el('tr', {}, ...['channel', 'credential', 'expires', 'left'].map(h => el('th', {}, h)))),
    el('tbody', {}, ...certRows)) : el('p', { class: 'muted' }, 'No channel configured.'));
}

// ---- routing -------------------------------------------------------------

let statusTimer = 0;

function route() {
  clearInterval(statusTimer);
  if (!token()) { renderSignIn(); return; }
  const admin = role() === 'admin';
  document.getElementById('nav').hidden = false;
  document.getElementById('nav-reviews').hidden = !admin;
  document.getElementById('nav-status').hidden = !admin;
  document.getElementById('nav-bills').hidden = !admin;
  document.getElementById('role').textContent = admin ? 'admin' : 'orders only';
  const h = location.hash || '#/';
  for (const a of document.querySelectorAll('header nav a')) a.classList.toggle('active', h.startsWith(a.getAttribute('href')));
  const run = p => p.catch(e => { if (e.message !== 'unauthorized') show(el('p', { class: 'error' }, 'Error: ' + e.message)); });
  if (h.startsWith('#/order')) {
    const no = h.startsWith('#/order/') ? safeDecode(h.slice('#/order/'.length)) : '';
    run(renderOrder(no));
  } else if (admin && h.startsWith('#/bills/')) {
    const [ch, day] = h.slice('#/bills/'.length).split('/');
    run(renderBillRun(safeDecode(ch || ''), safeDecode(day || '')));
  } else if (admin && h.startsWith('#/bills')) {
    run(renderBills());
  } else if (admin && h.startsWith('#/status')) {
    run(renderStatus());
    statusTimer = setInterval(() => run(renderStatus()), 15000);
  } else if (admin) {
    if (!h.startsWith('#/reviews')) { location.hash = '#/reviews'; return; }
    run(renderReviews());
  } else {
    location.hash = '#/order';
  }
}

document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('signout').addEventListener('click', () => signOut(''));
  window.addEventListener('hashchange', route);
  route();
});
