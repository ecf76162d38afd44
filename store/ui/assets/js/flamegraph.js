// The interactive icicle flame graph on a <canvas>.
//
// Layout happens once per result (flame_layout.js); drawing walks only the
// visible part of each row and skips frames narrower than half a pixel, so
// redraws stay cheap for tens of thousands of nodes. Hit testing converts
// the pointer to (row, value position) and binary-searches that row.

import { firstInRowAfter, isAncestorOrSelf, matchNodes, nodeAt, pathOf, nodeByPath } from './flame_layout.js';
import { formatPercent, formatSource, formatValue } from './format.js';

const ROW_HEIGHT = 20;
const FONT = '12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace';
const MIN_DRAW_PX = 0.5;
const MIN_TEXT_PX = 28;

function hashString(text) {
  let h = 2166136261;
  for (let i = 0; i < text.length; i += 1) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return h >>> 0;
}

// Frames of one package or module share a hue family, so the shape of a
// program shows at a glance; the exact shade comes from the full name.
function packageOf(name) {
  const cut = name.search(/[ (<]/);
  const head = cut > 0 ? name.slice(0, cut) : name;
  const sep = Math.max(head.lastIndexOf('::'), head.lastIndexOf('.'), head.lastIndexOf('/'));
  return sep > 0 ? head.slice(0, sep) : head;
}

const colorCache = new Map();
export function frameColor(name) {
  let color = colorCache.get(name);
  if (color) return color;
  const pkg = hashString(packageOf(name));
  const own = hashString(name);
  const hue = 8 + (pkg % 44); // red through orange to yellow
  const sat = 70 + (own % 20);
  const light = 58 + ((own >>> 8) % 14);
  color = `hsl(${hue} ${sat}% ${light}%)`;
  if (colorCache.size > 50000) colorCache.clear();
  colorCache.set(name, color);
  return color;
}

// Red for a gain, blue for a loss, grey for no change; `change` in [-1, 1].
export function diffColor(change) {
  const strength = Math.min(1, Math.abs(change));
  if (strength < 0.02) return 'hsl(220 8% 84%)';
  const light = 86 - strength * 36;
  return change > 0 ? `hsl(2 80% ${light}%)` : `hsl(214 78% ${light}%)`;
}

export class FlameGraphView {
  // `inverted` draws the root at the bottom (the callers half of a
  // sandwich); `onPick(name)` is called on a right click on a frame.
  constructor({ container, canvas, tooltip, onZoom, onPick, inverted = false }) {
    this.container = container;
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.onZoom = onZoom || (() => {});
    this.onPick = onPick || null;
    this.inverted = inverted;
    this.rowsShown = 0;
    this.ctx = canvas.getContext('2d');
    this.layout = null;
    this.unit = '';
    this.zoomNode = 0;
    this.hoverNode = -1;
    this.search = { matched: null, matchedValue: 0, matchedNodes: 0 };
    this.searchTerm = '';
    this.cssWidth = 0;
    this.pending = false;
    this.charWidth = 7;
    canvas.addEventListener('mousemove', (e) => this.onMove(e));
    canvas.addEventListener('mouseleave', () => this.setHover(-1, null));
    canvas.addEventListener('click', (e) => this.onClick(e));
    canvas.addEventListener('contextmenu', (e) => {
      const node = this.hit(e);
      if (!this.onPick || node <= 0) return;
      e.preventDefault();
      this.onPick(this.layout.names[this.layout.name[node]] ?? '');
    });
    new ResizeObserver(() => this.scheduleDraw()).observe(container);
  }

  // Shows a new result. `zoomPath` restores a zoom by frame names.
  // `sources`: the flame graph answer's `sources`, frame name to
  // `{file, line}`, shown in the tooltip.
  setData(layout, { unit, zoomPath = [], sources = {} } = {}) {
    this.layout = layout;
    this.unit = unit || '';
    this.sources = sources || {};
    this.hoverNode = -1;
    this.zoomNode = layout && layout.count ? nodeByPath(layout, zoomPath) : 0;
    this.applySearch(this.searchTerm);
    this.scheduleDraw();
  }

  clear() {
    this.layout = null;
    this.scheduleDraw();
  }

  setSearch(term) {
    this.searchTerm = term;
    this.applySearch(term);
    this.scheduleDraw();
    return this.search;
  }

  applySearch(term) {
    this.search = this.layout ? matchNodes(this.layout, term) : { matched: null, matchedValue: 0, matchedNodes: 0 };
    if (!term) this.search.matched = null;
  }

  zoomTo(node) {
    if (!this.layout) return;
    this.zoomNode = node < 0 ? 0 : node;
    this.scheduleDraw();
    this.onZoom(pathOf(this.layout, this.zoomNode));
  }

  zoomPath() {
    return this.layout ? pathOf(this.layout, this.zoomNode) : [];
  }

  scheduleDraw() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.draw();
    });
  }

  // Visible value window [viewStart, viewStart + viewWidth).
  view() {
    const l = this.layout;
    return { viewStart: l.start[this.zoomNode], viewWidth: l.width[this.zoomNode] || 1 };
  }

  draw() {
    const l = this.layout;
    const dpr = window.devicePixelRatio || 1;
    const width = Math.max(100, this.container.clientWidth);
    const rows = l && l.count ? this.visibleDepth(width) + 1 : 0;
    const height = Math.max(ROW_HEIGHT * 3, rows * ROW_HEIGHT);
    // Inverted graphs sit on the canvas's bottom edge.
    this.rowsShown = height / ROW_HEIGHT;
    if (this.canvas.width !== Math.round(width * dpr) || this.canvas.height !== Math.round(height * dpr)) {
      this.canvas.width = Math.round(width * dpr);
      this.canvas.height = Math.round(height * dpr);
      this.canvas.style.width = `${width}px`;
      this.canvas.style.height = `${height}px`;
    }
    this.cssWidth = width;
    const ctx = this.ctx;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = FONT;
    ctx.textBaseline = 'middle';
    this.charWidth = ctx.measureText('m').width || 7;
    if (!l || !l.count || l.rootValue <= 0) {
      ctx.fillStyle = '#6b7280';
      ctx.fillText(l ? 'No samples in this selection.' : '', 8, ROW_HEIGHT);
      return;
    }
    const { viewStart, viewWidth } = this.view();
    const viewEnd = viewStart + viewWidth;
    const scale = width / viewWidth;
    const zoomDepth = l.depth[this.zoomNode];
    // Ancestors of the zoomed frame span the full width, drawn faded.
    for (let n = l.parent[this.zoomNode]; n >= 0; n = l.parent[n]) {
      this.drawFrame(n, 0, width, this.rowY(l.depth[n]), true);
    }
    for (let depth = zoomDepth; depth <= l.maxDepth; depth += 1) {
      const row = l.rows[depth];
      if (depth >= this.rowsShown) break;
      const y = this.rowY(depth);
      for (let i = firstInRowAfter(l, depth, viewStart); i < row.length; i += 1) {
        const node = row[i];
        const start = l.start[node];
        if (start >= viewEnd) break;
        const w = l.width[node] * scale;
        if (w < MIN_DRAW_PX) continue;
        // Rows partition the value axis, so every frame inside the zoomed
        // frame's span is one of its descendants: no ancestry check needed.
        const x = (start - viewStart) * scale;
        this.drawFrame(node, x, w, y, false);
      }
    }
  }

  // Top of the row of frames at `depth`.
  rowY(depth) {
    return (this.inverted ? this.rowsShown - 1 - depth : depth) * ROW_HEIGHT;
  }

  // The deepest row with a frame wide enough to draw in the current view,
  // so the canvas is not padded with rows of invisible slivers.
  visibleDepth(width) {
    const l = this.layout;
    const { viewStart, viewWidth } = this.view();
    const viewEnd = viewStart + viewWidth;
    const minValue = (MIN_DRAW_PX * viewWidth) / width;
    let deepest = l.depth[this.zoomNode];
    for (let depth = deepest + 1; depth <= l.maxDepth; depth += 1) {
      const row = l.rows[depth];
      let found = false;
      for (let i = firstInRowAfter(l, depth, viewStart); i < row.length && l.start[row[i]] < viewEnd; i += 1) {
        if (l.width[row[i]] >= minValue) {
          found = true;
          break;
        }
      }
      if (!found) break;
      deepest = depth;
    }
    return deepest;
  }

  drawFrame(node, x, w, y, faded) {
    const l = this.layout;
    const ctx = this.ctx;
    const name = l.names[l.name[node]] ?? '?';
    const left = Math.max(0, x);
    const right = Math.min(this.cssWidth, x + w);
    const visible = right - left;
    if (visible <= 0) return;
    const matched = this.search.matched;
    let fill;
    if (matched && !matched[node]) fill = 'hsl(220 10% 88%)';
    else if (matched) fill = 'hsl(292 70% 62%)';
    else if (l.diff) fill = diffColor(l.change[node]);
    else fill = frameColor(name);
    ctx.globalAlpha = faded ? 0.55 : 1;
    ctx.fillStyle = fill;
    ctx.fillRect(left, y, visible > 2 ? visible - 1 : visible, ROW_HEIGHT - 1);
    if (node === this.hoverNode) {
      ctx.strokeStyle = '#111827';
      ctx.lineWidth = 1.5;
      ctx.strokeRect(left + 0.75, y + 0.75, Math.max(0, visible - 2.5), ROW_HEIGHT - 2.5);
    }
    if (visible >= MIN_TEXT_PX) {
      const fit = Math.floor((visible - 8) / this.charWidth);
      if (fit >= 2) {
        const text = name.length > fit ? `${name.slice(0, fit - 1)}…` : name;
        ctx.fillStyle = matched && !matched[node] ? '#6b7280' : '#111827';
        ctx.fillText(text, left + 4, y + ROW_HEIGHT / 2);
      }
    }
    ctx.globalAlpha = 1;
  }

  // The node under a pointer event, or -1.
  hit(event) {
    const l = this.layout;
    if (!l || !l.count) return -1;
    const rect = this.canvas.getBoundingClientRect();
    const px = event.clientX - rect.left;
    const row = Math.floor((event.clientY - rect.top) / ROW_HEIGHT);
    const depth = this.inverted ? this.rowsShown - 1 - row : row;
    if (depth < 0 || depth > l.maxDepth) return -1;
    const zoomDepth = l.depth[this.zoomNode];
    if (depth < zoomDepth) {
      let n = this.zoomNode;
      while (n >= 0 && l.depth[n] > depth) n = l.parent[n];
      return n;
    }
    const { viewStart, viewWidth } = this.view();
    const x = viewStart + (px / this.cssWidth) * viewWidth;
    const node = nodeAt(l, depth, x);
    if (node < 0 || !isAncestorOrSelf(l, this.zoomNode, node)) return -1;
    return node;
  }

  onMove(event) {
    this.setHover(this.hit(event), event);
  }

  onClick(event) {
    const node = this.hit(event);
    if (node >= 0) this.zoomTo(node === this.zoomNode ? this.layout.parent[node] : node);
  }

  setHover(node, event) {
    if (node !== this.hoverNode) {
      this.hoverNode = node;
      this.scheduleDraw();
    }
    if (node < 0 || !event) {
      this.tooltip.hidden = true;
      return;
    }
    this.tooltip.replaceChildren(...this.tooltipContent(node));
    this.tooltip.hidden = false;
    const box = this.container.getBoundingClientRect();
    const tip = this.tooltip.getBoundingClientRect();
    let left = event.clientX - box.left + 14;
    if (left + tip.width > box.width) left = Math.max(0, event.clientX - box.left - tip.width - 14);
    const top = event.clientY - box.top + 16;
    this.tooltip.style.left = `${left}px`;
    this.tooltip.style.top = `${top}px`;
  }

  tooltipContent(node) {
    const l = this.layout;
    const title = document.createElement('div');
    title.className = 'tooltip-title';
    const name = l.names[l.name[node]] ?? '?';
    title.textContent = name;
    const table = document.createElement('table');
    const row = (label, value) => {
      const tr = table.insertRow();
      tr.insertCell().textContent = label;
      tr.insertCell().textContent = value;
    };
    const source = formatSource(this.sources && Object.hasOwn(this.sources, name) ? this.sources[name] : null);
    if (source) row('Source', source);
    const u = this.unit;
    if (l.diff) {
      row('Base total', `${formatValue(l.baseTotal[node], u)} (${formatPercent(l.baseTotal[node], l.baseRoot)})`);
      row('Base self', `${formatValue(l.baseSelf[node], u)} (${formatPercent(l.baseSelf[node], l.baseRoot)})`);
      row('Compared total', `${formatValue(l.compareTotal[node], u)} (${formatPercent(l.compareTotal[node], l.compareRoot)})`);
      row('Compared self', `${formatValue(l.compareSelf[node], u)} (${formatPercent(l.compareSelf[node], l.compareRoot)})`);
      const b = l.baseRoot ? l.baseTotal[node] / l.baseRoot : 0;
      const c = l.compareRoot ? l.compareTotal[node] / l.compareRoot : 0;
      const points = (100 * (c - b)).toFixed(2);
      row('Change', `${c >= b ? '+' : ''}${points} percentage points of total`);
    } else {
      const root = l.total[0];
      row('Total', `${formatValue(l.total[node], u)} (${formatPercent(l.total[node], root)})`);
      row('Self', `${formatValue(l.self[node], u)} (${formatPercent(l.self[node], root)})`);
    }
    const hint = document.createElement('div');
    hint.className = 'tooltip-hint';
    hint.textContent = node === 0 ? 'Click a frame to zoom in' : node === this.zoomNode ? 'Click to zoom out' : 'Click to zoom in';
    if (this.onPick && node > 0) hint.textContent += ' · right-click for its callers and callees';
    return [title, table, hint];
  }
}
