// The whole query as plain data, and its encoding in the page URL so that a
// link reproduces exactly what the sender saw.

export const PRESETS = [
  { label: '5m', from: 'now-5m' },
  { label: '15m', from: 'now-15m' },
  { label: '1h', from: 'now-1h' },
  { label: '6h', from: 'now-6h' },
  { label: '24h', from: 'now-24h' },
  { label: '7d', from: 'now-7d' },
];

export const DEFAULT_FROM = 'now-1h';
export const DEFAULT_TO = 'now';

// Kiln's one duration grammar (docs/durations.md, kiln_contract::duration in
// Rust): each unit's spellings and length in nanoseconds, largest first, since
// a sum lists its units from the largest to the smallest.
const SECOND_NS = 1000000000n;
const DAY_NS = 86400n * SECOND_NS;
const DURATION_UNITS = [
  [['y', 'year', 'years'], 365n * DAY_NS],
  [['w', 'week', 'weeks'], 7n * DAY_NS],
  [['d', 'day', 'days'], DAY_NS],
  [['h', 'hour', 'hours'], 3600n * SECOND_NS],
  [['m', 'min', 'mins', 'minute', 'minutes'], 60n * SECOND_NS],
  [['s', 'sec', 'secs', 'second', 'seconds'], SECOND_NS],
  [['ms'], 1000000n],
  [['us', '\u00b5s', '\u03bcs'], 1000n],
  [['ns'], 1n],
];
const DURATION_TERM = /^(\d+)(?:\.(\d+))?\s*(\p{Alphabetic}*)\s*/u;

// A duration whose every number carries its unit, as relative times are
// written (`1h30m`, `1.5h`, `500ms`): milliseconds, cut like the store cuts
// them, or NaN when the store would refuse the text.
export function parseDurationMs(text) {
  let rest = String(text ?? '').trim();
  if (rest === '') return NaN;
  let totalNs = 0n;
  let previous = -1;
  while (rest !== '') {
    const term = DURATION_TERM.exec(rest);
    if (!term || term[3] === '') return NaN;
    const index = DURATION_UNITS.findIndex(([spellings]) => spellings.includes(term[3]));
    if (index <= previous) return NaN; // unknown (-1), or not smaller than the last unit
    previous = index;
    const unitNs = DURATION_UNITS[index][1];
    // Digits past the 18th are below a nanosecond for every unit.
    const fraction = (term[2] ?? '').slice(0, 18);
    totalNs += BigInt(term[1]) * unitNs;
    if (fraction !== '') totalNs += (BigInt(fraction) * unitNs) / 10n ** BigInt(fraction.length);
    rest = rest.slice(term[0].length);
  }
  // The store's durations hold at most 2^64 - 1 seconds.
  if (totalNs / SECOND_NS >= 2n ** 64n) return NaN;
  return Number(totalNs / 1000000n);
}

// Splits `type{matchers}` into its profile type and the text between the braces.
export function splitSelector(query) {
  const text = String(query || '').trim();
  const open = text.indexOf('{');
  if (open < 0) return { profileType: text, matchers: '' };
  const close = text.lastIndexOf('}');
  const body = close > open ? text.slice(open + 1, close) : text.slice(open + 1);
  return { profileType: text.slice(0, open).trim(), matchers: body.trim() };
}

export function joinSelector(profileType, matchers) {
  return `${profileType || ''}{${(matchers || '').trim()}}`;
}

// Reads a time as the store does: `now`, `now-<duration>` / `now+<duration>`
// / `-<duration>` (`now-1h30m`), unix seconds or milliseconds (told apart by
// magnitude), or an ISO 8601 / RFC 3339 date. Returns unix milliseconds, or
// NaN when the text is not a time.
export function parseTime(text, nowMs) {
  const t = String(text ?? '').trim();
  if (t === '' || t === 'now') return t === 'now' ? nowMs : NaN;
  const rel = /^(?:now)?([-+])(.*)$/s.exec(t);
  if (rel) {
    const delta = parseDurationMs(rel[2]);
    return rel[1] === '-' ? nowMs - delta : nowMs + delta;
  }
  if (/^\d+$/.test(t)) {
    const n = Number(t);
    if (n < 1e11) return n * 1000; // seconds
    if (n < 1e14) return n; // milliseconds
    if (n < 1e17) return Math.floor(n / 1e3); // microseconds
    return Math.floor(n / 1e6); // nanoseconds
  }
  const ms = Date.parse(t);
  return Number.isFinite(ms) ? ms : NaN;
}

// Resolves a selection's `from`/`to` to absolute unix milliseconds.
export function resolveRange(selection, nowMs) {
  const startMs = parseTime(selection.from, nowMs);
  const endMs = parseTime(selection.to, nowMs);
  if (!Number.isFinite(startMs)) throw new Error(`"${selection.from}" is not a time`);
  if (!Number.isFinite(endMs)) throw new Error(`"${selection.to}" is not a time`);
  if (startMs >= endMs) throw new Error('the start of the time range must be before its end');
  return { startMs: Math.floor(startMs), endMs: Math.ceil(endMs) };
}

const NICE_STEPS_MS = [
  1000, 5000, 10000, 15000, 30000, 60000, 120000, 300000, 600000, 900000, 1800000, 3600000,
  7200000, 10800000, 21600000, 43200000, 86400000,
];

// A round timeline step giving at most about `points` points over the span,
// never finer than 10 s (agents ship every few seconds).
export function chooseStep(spanMs, points = 150) {
  const wanted = Math.max(10000, spanMs / points);
  for (const step of NICE_STEPS_MS) if (step >= wanted) return step;
  return Math.ceil(wanted / 86400000) * 86400000;
}

function emptySelection() {
  return { query: '', from: DEFAULT_FROM, to: DEFAULT_TO };
}

// `groupBy`: label names each flame graph root is grouped by, outermost
// first; `null` until chosen (the URL lacks `group_by`), then
// `defaultGroupBy` picks one. `sandwich`: the function whose callers and
// callees are shown, or ''.
export function defaultState() {
  return { mode: 'single', a: emptySelection(), b: emptySelection(), zoom: [], search: '', groupBy: null, sandwich: '' };
}

// The grouping a view starts with, from the series label names of its
// selection: a Kubernetes selection (one with a `pod` or `namespace` label)
// groups by namespace then pod; anything else is taken for a host's
// processes (`kiln up`) and grouped by process name, `comm`, which the agent
// puts on every sample (a sample label, so not among `labelNames`). The app
// drops that default when no sample has a `comm` (one `comm=(none)` root).
export function defaultGroupBy(labelNames) {
  const names = new Set(labelNames || []);
  if (names.has('pod') || names.has('namespace')) return ['namespace', 'pod'].filter((n) => names.has(n));
  return ['comm'];
}

// True when a flame graph grouped by `comm` alone has nothing to group:
// its only root is `comm=(none)`.
export function nothingToGroup(graph, groupBy) {
  const roots = graph?.root?.children || [];
  return groupBy.length === 1 && roots.length === 1 && graph.names[roots[0].name] === `${groupBy[0]}=(none)`;
}

// `group_by` text (`namespace, pod`) as a list of label names.
export function parseGroupBy(text) {
  return String(text ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s, i, all) => s !== '' && all.indexOf(s) === i);
}

const COMPLETE_MATCHER = /([A-Za-z_][\w.\-/]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"/g;

// The complete matchers of `text` (what the user typed between the braces),
// leaving out those on `exceptLabel`, joined as a selector body. Value
// autocomplete asks the store for values under these, so it only offers
// values that still match what is already typed.
export function completeMatchers(text, exceptLabel) {
  const kept = [];
  for (const m of String(text ?? '').matchAll(COMPLETE_MATCHER)) {
    if (m[1] !== exceptLabel) kept.push(`${m[1]}${m[2]}"${m[3]}"`);
  }
  return kept.join(', ');
}

// URL parameters: query/from/to for selection A, query_b/from_b/to_b for
// B (compare mode only), mode, zoom (frame names from the root, one per
// line), search, group_by (comma separated; present but empty means "not
// grouped") and sandwich (a function name).
export function encodeState(state) {
  const p = new URLSearchParams();
  if (state.mode === 'compare') p.set('mode', 'compare');
  p.set('query', state.a.query);
  p.set('from', state.a.from);
  p.set('to', state.a.to);
  if (state.mode === 'compare') {
    p.set('query_b', state.b.query);
    p.set('from_b', state.b.from);
    p.set('to_b', state.b.to);
  }
  if (state.groupBy !== null && state.mode !== 'compare') p.set('group_by', state.groupBy.join(','));
  if (state.zoom.length) p.set('zoom', state.zoom.join('\n'));
  if (state.search) p.set('search', state.search);
  if (state.sandwich && state.mode !== 'compare') p.set('sandwich', state.sandwich);
  return `?${p.toString()}`;
}

export function decodeState(search) {
  const p = new URLSearchParams(search);
  const state = defaultState();
  state.mode = p.get('mode') === 'compare' ? 'compare' : 'single';
  state.a = {
    query: p.get('query') ?? '',
    from: p.get('from') || DEFAULT_FROM,
    to: p.get('to') || DEFAULT_TO,
  };
  state.b = {
    query: p.get('query_b') ?? state.a.query,
    from: p.get('from_b') || state.a.from,
    to: p.get('to_b') || state.a.to,
  };
  const zoom = p.get('zoom');
  state.zoom = zoom ? zoom.split('\n').filter((s) => s !== '') : [];
  state.search = p.get('search') ?? '';
  state.groupBy = p.has('group_by') ? parseGroupBy(p.get('group_by')) : null;
  state.sandwich = p.get('sandwich') ?? '';
  return state;
}

// A short description of a selection's range for buttons: "Last 1h" or
// an absolute span.
export function describeRange(selection, format) {
  const preset = PRESETS.find((p) => p.from === selection.from);
  if (preset && selection.to === 'now') return `Last ${preset.label}`;
  const rel = /^now-(\S+)$/.exec(selection.from);
  if (rel && selection.to === 'now') return `Last ${rel[1]}`;
  const now = Date.now();
  const from = parseTime(selection.from, now);
  const to = parseTime(selection.to, now);
  if (!Number.isFinite(from) || !Number.isFinite(to)) return `${selection.from} → ${selection.to}`;
  return `${format(from)} → ${format(to)}`;
}
