// Kiln's UI: wires the selections, flame graph, timeline and table to the
// store's query API, and keeps the whole query in the page URL.

import { Api, storedToken } from './api.js';
import { compileSearch, diffTableRows, layoutDiffFlameGraph, layoutFlameGraph, nodeByPath } from './flame_layout.js';
import { FlameGraphView } from './flamegraph.js';
import { formatPercent, formatValue, profileTypeLabel } from './format.js';
import { chooseStep, decodeState, defaultGroupBy, encodeState, nothingToGroup, parseGroupBy } from './query_state.js';
import { sandwichGraphs } from './sandwich.js';
import { SelectionPanel } from './selection_panel.js';
import { foldedToSvg } from './svg_export.js';
import { TopTable } from './top_table.js';

// The server trims flame graphs to this many nodes; the canvas handles it.
const MAX_NODES = 16384;
const TOP_LIMIT = 1000;

const $ = (selector) => document.querySelector(selector);

// Asks for a read token in a dialog; resolves to '' when cancelled.
function askToken(message) {
  const dialog = $('#token-dialog');
  $('#token-message').textContent = message;
  $('#token-input').value = '';
  return new Promise((resolve) => {
    dialog.addEventListener(
      'close',
      () => resolve(dialog.returnValue === 'ok' ? $('#token-input').value.trim() : ''),
      { once: true },
    );
    dialog.showModal();
  });
}

const api = new Api({ askToken });
let state = decodeState(window.location.search);
let layout = null;
// The last single-mode flame graph answer, for the sandwich view.
let lastGraph = null;

const panelA = new SelectionPanel({
  root: $('#selection-a'),
  name: 'A',
  color: '#ea580c',
  api,
  onRun: () => run({ push: true }),
});
const panelB = new SelectionPanel({
  root: $('#selection-b'),
  name: 'B',
  color: '#2563eb',
  api,
  onRun: () => run({ push: true }),
});

const flame = new FlameGraphView({
  container: $('#flame-container'),
  canvas: $('#flame'),
  tooltip: $('#tooltip'),
  onZoom: (path) => {
    state.zoom = path;
    renderBreadcrumbs();
    updateUrl(false);
  },
});

const table = new TopTable({
  table: $('#top-table'),
  summary: $('#top-count'),
  onSelect: (name) => {
    $('#search').value = name;
    applySearch();
  },
  onSandwich: (name) => openSandwich(name),
});

const callersView = new FlameGraphView({
  container: $('#callers-container'),
  canvas: $('#callers'),
  tooltip: $('#callers-tooltip'),
  inverted: true,
  onPick: (name) => openSandwich(name),
});
const calleesView = new FlameGraphView({
  container: $('#callees-container'),
  canvas: $('#callees'),
  tooltip: $('#callees-tooltip'),
  onPick: (name) => openSandwich(name),
});
flame.onPick = (name) => openSandwich(name);

function openSandwich(name) {
  if (!name || state.mode === 'compare') return;
  state.sandwich = name;
  updateUrl(true);
  renderSandwich();
}

// Shows the sandwich of `state.sandwich` from the last flame graph, or the
// flame graph itself when none is picked.
function renderSandwich() {
  const on = Boolean(state.sandwich) && state.mode !== 'compare' && lastGraph !== null;
  $('#sandwich').hidden = !on;
  $('#flame-container').hidden = on;
  if (!on) return;
  const { callers, callees, total } = sandwichGraphs(lastGraph.flamegraph, state.sandwich);
  $('#sandwich-name').textContent = state.sandwich;
  $('#sandwich-summary').textContent = total
    ? `${formatValue(total, lastGraph.unit)} · ${formatPercent(total, lastGraph.total)} of total`
    : 'not in this selection';
  // The direct callers in words too, largest first.
  const direct = callers.root.children.map(
    (c) => `${callers.names[c.name]} (${formatPercent(c.total, total)})`,
  );
  $('#sandwich-callers').textContent = direct.length ? `Called from ${direct.join(', ')}` : 'No callers: it starts its stacks.';
  callersView.setData(layoutFlameGraph(callers), { unit: lastGraph.unit });
  calleesView.setData(layoutFlameGraph(callees), { unit: lastGraph.unit });
}

function groupByLabels() {
  return state.mode === 'compare' ? [] : state.groupBy || [];
}

function showError(err) {
  if (err && err.name === 'AbortError') return;
  const box = $('#error');
  const message = err instanceof Error ? err.message : String(err);
  box.textContent = message;
  box.hidden = false;
  // A bad group_by names the label: mark the group-by box.
  $('#group-by-box').classList.toggle('invalid', /invalid `group_by`/.test(message));
  // The store names the position of a selector mistake; point at it in
  // the matcher box the user typed into.
  const at = /invalid `(query|left_query|right_query)`: selector position (\d+)/.exec(message);
  if (at) {
    const panel = at[1] === 'right_query' ? panelB : panelA;
    panel.markSelectorError(Number(at[2]));
  }
}

function hideError() {
  $('#error').hidden = true;
  $('#group-by-box').classList.remove('invalid');
  panelA.markSelectorError(null);
  panelB.markSelectorError(null);
}

function updateUrl(push) {
  const search = encodeState(state);
  if (search === window.location.search) return;
  if (push) window.history.pushState(null, '', search);
  else window.history.replaceState(null, '', search);
}

function collectState() {
  state.a = panelA.selection();
  state.b = panelB.selection();
  state.search = $('#search').value.trim();
}

function setMode(mode) {
  state.mode = mode;
  const compare = mode === 'compare';
  document.body.classList.toggle('compare', compare);
  $('#selection-b').hidden = !compare;
  $('#diff-legend').hidden = !compare;
  $('#download-b').hidden = !compare;
  $('#download-a').textContent = compare ? 'Download A (pprof)' : 'Download pprof';
  $('#top-title').textContent = compare ? 'Functions: A → B' : 'Top functions';
  $('#group-by-box').hidden = compare;
  $('#mode-single').setAttribute('aria-selected', String(!compare));
  $('#mode-compare').setAttribute('aria-selected', String(compare));
}

function applyStateToControls() {
  panelA.setSelection(state.a);
  panelB.setSelection(state.b);
  $('#search').value = state.search;
  $('#group-by').value = (state.groupBy || []).join(',');
  setMode(state.mode);
}

function renderBreadcrumbs() {
  const crumbs = $('#breadcrumbs');
  const path = state.zoom;
  const parts = [];
  const root = document.createElement('button');
  root.type = 'button';
  root.textContent = 'All';
  root.addEventListener('click', () => flame.zoomTo(0));
  parts.push(root);
  path.forEach((name, i) => {
    const sep = document.createElement('span');
    sep.className = 'sep';
    sep.textContent = '›';
    const button = document.createElement('button');
    button.type = 'button';
    button.textContent = name;
    button.title = name;
    button.addEventListener('click', () => {
      if (layout) flame.zoomTo(nodeByPath(layout, path.slice(0, i + 1)));
    });
    parts.push(sep, button);
  });
  crumbs.replaceChildren(...parts);
  $('#reset-zoom').disabled = path.length === 0;
}

function applySearch() {
  const term = $('#search').value.trim();
  state.search = term;
  const result = flame.setSearch(term);
  const summary = $('#search-summary');
  if (!term || !layout) {
    summary.textContent = '';
  } else if (!result.matchedNodes) {
    summary.textContent = 'No matching frames';
  } else {
    summary.textContent = `${result.matchedNodes} ${result.matchedNodes === 1 ? 'frame' : 'frames'} · ${formatPercent(result.matchedValue, layout.rootValue)} of total`;
  }
  table.setHighlight(compileSearch(term));
  updateUrl(false);
}

async function refreshProfileTypes(panels, nowMs) {
  await Promise.all(
    panels.map(async (panel) => {
      panel.setProfileTypes(await api.profileTypes(panel.range(nowMs), `profile-types-${panel.name}`));
    }),
  );
}

let generation = 0;

async function run({ push }) {
  const mine = (generation += 1);
  hideError();
  const compare = state.mode === 'compare';
  const panels = compare ? [panelA, panelB] : [panelA];
  panels.forEach((p) => p.setBusy(true));
  document.body.classList.add('loading');
  try {
    const now = Date.now();
    await refreshProfileTypes(panels, now);
    if (mine !== generation) return;
    collectState();
    updateUrl(push);
    const rangeA = panelA.range(now);
    $('#empty-state').hidden = true;
    if (!panelA.profileType()) {
      layout = null;
      lastGraph = null;
      flame.setData(null);
      table.clear();
      panelA.timeline.setData(null, rangeA, '');
      $('#flame-summary').textContent = 'No profiles in this time range.';
      showEmptyState();
      return;
    }
    let defaultedGroupBy = false;
    if (!compare) {
      // Names of the selection's labels: the group-by suggestions, and the
      // default grouping of a view opened without one in its link.
      const names = await api.labelNames(state.a.query, rangeA);
      if (mine !== generation) return;
      $('#group-by-labels').replaceChildren(
        ...names.filter((n) => !n.startsWith('__')).map((n) => Object.assign(document.createElement('option'), { value: n })),
      );
      if (state.groupBy === null) {
        state.groupBy = defaultGroupBy(names);
        defaultedGroupBy = true;
        $('#group-by').value = state.groupBy.join(',');
        updateUrl(false);
      }
    }
    $('#download-a').href = api.pprofUrl(state.a.query, rangeA, groupByLabels());
    const timelineA = api.timeline(state.a.query, rangeA, chooseStep(rangeA.endMs - rangeA.startMs), 'timeline-a');
    if (compare) {
      const rangeB = panelB.range(now);
      $('#download-b').href = api.pprofUrl(state.b.query, rangeB, []);
      const timelineB = api.timeline(state.b.query, rangeB, chooseStep(rangeB.endMs - rangeB.startMs), 'timeline-b');
      const diff = api.diff({ query: state.a.query, range: rangeA }, { query: state.b.query, range: rangeB }, MAX_NODES, 'flame');
      const [tlA, tlB, result] = await Promise.all([timelineA, timelineB, diff]);
      if (mine !== generation) return;
      lastGraph = null;
      renderSandwich();
      layout = layoutDiffFlameGraph(result.diff);
      flame.setData(layout, { unit: result.unit, zoomPath: state.zoom });
      table.setDiff(diffTableRows(layout));
      panelA.timeline.setData(tlA.timeline, rangeA, tlA.unit, tlA.aggregation);
      panelB.timeline.setData(tlB.timeline, rangeB, tlB.unit, tlB.aggregation);
      $('#flame-summary').textContent = `${profileTypeLabel(result.profile_type)} · A ${formatValue(
        result.left_total,
        result.unit,
      )} → B ${formatValue(result.right_total, result.unit)} · ${result.diff.node_count} nodes`;
    } else {
      const groupBy = groupByLabels();
      const graph = api.flamegraph(state.a.query, rangeA, MAX_NODES, groupBy, 'flame');
      const top = api.top(state.a.query, rangeA, TOP_LIMIT, groupBy, 'top');
      const [tlA, fg, tp] = await Promise.all([timelineA, graph, top]);
      if (mine !== generation) return;
      if (defaultedGroupBy && nothingToGroup(fg.flamegraph, groupBy)) {
        // The default grouping found no process names: show it ungrouped.
        state.groupBy = [];
        $('#group-by').value = '';
        updateUrl(false);
        // A new run supersedes this one before this one's `finally` runs.
        run({ push: false });
        return;
      }
      lastGraph = fg;
      layout = layoutFlameGraph(fg.flamegraph);
      flame.setData(layout, { unit: fg.unit, zoomPath: state.zoom, sources: fg.sources });
      // Group frames (`comm=nginx`) are rows of a grouped top table; the
      // table lists functions, so they stay out.
      const groupPrefixes = groupBy.map((label) => `${label}=`);
      const functions = tp.top.filter((e) => !groupPrefixes.some((p) => e.name.startsWith(p)));
      table.setTop(functions, tp.total, tp.unit);
      renderSandwich();
      if (!fg.total) showEmptyState();
      panelA.timeline.setData(tlA.timeline, rangeA, tlA.unit, tlA.aggregation);
      $('#flame-summary').textContent = `${profileTypeLabel(fg.profile_type)} · total ${formatValue(
        fg.total,
        fg.unit,
      )} · ${fg.flamegraph.node_count} nodes`;
    }
    state.zoom = flame.zoomPath();
    renderBreadcrumbs();
    applySearch();
  } catch (err) {
    if (mine === generation) showError(err);
  } finally {
    if (mine === generation) {
      panels.forEach((p) => p.setBusy(false));
      document.body.classList.remove('loading');
      // Finished queries, counted so scripts (and the browser test) can wait for one.
      document.body.dataset.runs = String(Number(document.body.dataset.runs || 0) + 1);
    }
  }
}

// What to do when a selection has no samples.
function showEmptyState() {
  const box = $('#empty-state');
  box.replaceChildren();
  const line = (html) => {
    const p = document.createElement('p');
    p.innerHTML = html;
    box.append(p);
  };
  line('<strong>No samples in this selection.</strong>');
  line('Widen the time range (try <em>24h</em> or <em>7d</em> above), or remove a matcher.');
  line(
    'Nothing profiled yet? On one machine run <code>kiln up</code>. On Kubernetes, select pods with a ' +
      '<code>ProfilingTarget</code> or annotate a pod with <code>profiles.kiln.dev/enabled=true</code>; agents ship every few seconds.',
  );
  box.hidden = false;
}

// Downloads what is on screen as SVG: the untrimmed merge of the selection
// (grouped as shown), restricted to the zoomed frame.
async function downloadSvg() {
  try {
    const now = Date.now();
    const range = panelA.range(now);
    const folded = await api.folded(state.a.query, range, groupByLabels());
    const svg = foldedToSvg(folded, {
      title: `${state.a.query}  ${state.a.from} .. ${state.a.to}`,
      unit: lastGraph ? lastGraph.unit : '',
      zoomPath: state.zoom,
    });
    const url = URL.createObjectURL(new Blob([svg], { type: 'image/svg+xml' }));
    const link = document.createElement('a');
    link.href = url;
    link.download = 'flamegraph.svg';
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (err) {
    showError(err);
  }
}

let searchTimer = 0;
$('#search').addEventListener('input', () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(applySearch, 120);
});
$('#reset-zoom').addEventListener('click', () => flame.zoomTo(0));
$('#group-by').addEventListener('change', () => {
  state.groupBy = parseGroupBy($('#group-by').value);
  state.zoom = [];
  run({ push: true });
});
$('#sandwich-close').addEventListener('click', () => {
  state.sandwich = '';
  updateUrl(true);
  renderSandwich();
});
$('#download-svg').addEventListener('click', downloadSvg);
// With a read token the pprof goes through fetch, which can send it.
for (const id of ['#download-a', '#download-b']) {
  $(id).addEventListener('click', (event) => {
    if (!storedToken()) return;
    event.preventDefault();
    const url = new URL($(id).href, window.location.href);
    api.download('pprof', Object.fromEntries(url.searchParams), id === '#download-a' ? 'profile.pb.gz' : 'profile-b.pb.gz').catch(showError);
  });
}
$('#mode-single').addEventListener('click', () => {
  if (state.mode === 'single') return;
  setMode('single');
  run({ push: true });
});
$('#mode-compare').addEventListener('click', () => {
  if (state.mode === 'compare') return;
  collectState();
  // Start B from A, so changing one matcher is enough to compare.
  if (!state.b.query || state.b.query === '{}') panelB.setSelection(state.a);
  setMode('compare');
  run({ push: true });
});
$('#copy-link').addEventListener('click', async () => {
  const button = $('#copy-link');
  try {
    await navigator.clipboard.writeText(window.location.href);
    button.textContent = 'Copied';
  } catch {
    window.prompt('Copy this link', window.location.href);
  }
  setTimeout(() => {
    button.textContent = 'Copy link';
  }, 1500);
});
window.addEventListener('popstate', () => {
  state = decodeState(window.location.search);
  applyStateToControls();
  run({ push: false });
});
document.addEventListener('keydown', (event) => {
  const typing = /^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement?.tagName || '');
  if (event.key === '/' && !typing) {
    event.preventDefault();
    $('#search').focus();
  }
});

applyStateToControls();
renderBreadcrumbs();
run({ push: false });
