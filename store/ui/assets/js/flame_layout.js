// Flame graph layout as flat typed arrays, computed once per result.
//
// Every node gets a start and a width in "value" units (the root spans
// [0, rootValue)), a depth and a parent. Nodes of each depth are kept in
// `rows[depth]` in left-to-right order, so drawing a zoomed view and hit
// testing a pointer are binary searches within one row instead of walks
// over the whole tree. Tens of thousands of nodes lay out in a few ms.

function countNodes(root) {
  let count = 0;
  const stack = [root];
  while (stack.length) {
    const node = stack.pop();
    count += 1;
    const children = node.children || [];
    for (let i = 0; i < children.length; i += 1) stack.push(children[i]);
  }
  return count;
}

function allocate(count, diff) {
  const layout = {
    diff,
    count,
    names: [],
    name: new Uint32Array(count),
    start: new Float64Array(count),
    width: new Float64Array(count),
    depth: new Uint16Array(count),
    parent: new Int32Array(count),
    total: new Float64Array(count),
    self: new Float64Array(count),
    rows: [],
    maxDepth: 0,
    rootValue: 0,
  };
  if (diff) {
    layout.baseTotal = new Float64Array(count);
    layout.baseSelf = new Float64Array(count);
    layout.compareTotal = new Float64Array(count);
    layout.compareSelf = new Float64Array(count);
    layout.change = new Float64Array(count);
  }
  return layout;
}

// Lays out nodes in depth-first, left-to-right order. `widthOf(node)` gives
// a node's width; `record(index, node)` stores per-node values.
function place(layout, root, widthOf, record) {
  const rowLists = [];
  const stack = [{ node: root, parent: -1, depth: 0, start: 0 }];
  let next = 0;
  while (stack.length) {
    const { node, parent, depth, start } = stack.pop();
    const index = next;
    next += 1;
    const width = Math.max(0, widthOf(node));
    layout.name[index] = node.name >>> 0;
    layout.start[index] = start;
    layout.width[index] = width;
    layout.depth[index] = Math.min(depth, 65535);
    layout.parent[index] = parent;
    record(index, node);
    if (depth > layout.maxDepth) layout.maxDepth = depth;
    (rowLists[depth] ||= []).push(index);
    const children = node.children || [];
    // Children follow each other from the parent's start; push right to
    // left so the leftmost child is popped (and numbered) first.
    const starts = new Array(children.length);
    let x = start;
    for (let i = 0; i < children.length; i += 1) {
      starts[i] = x;
      x += Math.max(0, widthOf(children[i]));
    }
    for (let i = children.length - 1; i >= 0; i -= 1) {
      stack.push({ node: children[i], parent: index, depth: depth + 1, start: starts[i] });
    }
  }
  layout.rows = rowLists.map((list) => Int32Array.from(list));
  layout.rootValue = layout.width[0] || 0;
}

// Lays out a kiln-engine `FlameGraph` ({names, root, node_count}).
export function layoutFlameGraph(graph) {
  const count = countNodes(graph.root);
  const layout = allocate(count, false);
  layout.names = graph.names || [];
  place(
    layout,
    graph.root,
    (node) => Number(node.total) || 0,
    (i, node) => {
      layout.total[i] = Number(node.total) || 0;
      layout.self[i] = Number(node.self) || 0;
    },
  );
  return layout;
}

// Lays out a kiln-engine `DiffFlameGraph`. Each side is normalised by its
// own root total so selections of different length compare fairly; a
// node's width is the sum of its two shares (the root is 2 wide), and
// `change` is in [-1, 1]: +1 only in the compared selection (a gain), -1
// only in the base (a loss).
export function layoutDiffFlameGraph(graph) {
  const count = countNodes(graph.root);
  const layout = allocate(count, true);
  layout.names = graph.names || [];
  const baseRoot = Number(graph.root.base_total) || 0;
  const compareRoot = Number(graph.root.compare_total) || 0;
  const baseScale = baseRoot > 0 ? 1 / baseRoot : 0;
  const compareScale = compareRoot > 0 ? 1 / compareRoot : 0;
  layout.baseRoot = baseRoot;
  layout.compareRoot = compareRoot;
  place(
    layout,
    graph.root,
    (node) => (Number(node.base_total) || 0) * baseScale + (Number(node.compare_total) || 0) * compareScale,
    (i, node) => {
      const b = Number(node.base_total) || 0;
      const c = Number(node.compare_total) || 0;
      layout.baseTotal[i] = b;
      layout.baseSelf[i] = Number(node.base_self) || 0;
      layout.compareTotal[i] = c;
      layout.compareSelf[i] = Number(node.compare_self) || 0;
      layout.total[i] = b + c;
      layout.self[i] = layout.baseSelf[i] + layout.compareSelf[i];
      const bs = b * baseScale;
      const cs = c * compareScale;
      const larger = Math.max(bs, cs);
      layout.change[i] = larger > 0 ? (cs - bs) / larger : 0;
    },
  );
  return layout;
}

// The node at `depth` covering value position `x`, or -1.
export function nodeAt(layout, depth, x) {
  const row = layout.rows[depth];
  if (!row || row.length === 0) return -1;
  let lo = 0;
  let hi = row.length - 1;
  let found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (layout.start[row[mid]] <= x) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  if (found < 0) return -1;
  const node = row[found];
  return x < layout.start[node] + layout.width[node] ? node : -1;
}

// Index in `rows[depth]` of the first node ending after `x`.
export function firstInRowAfter(layout, depth, x) {
  const row = layout.rows[depth];
  let lo = 0;
  let hi = row.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    const node = row[mid];
    if (layout.start[node] + layout.width[node] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

export function isAncestorOrSelf(layout, ancestor, node) {
  for (let n = node; n >= 0; n = layout.parent[n]) if (n === ancestor) return true;
  return false;
}

// Frame names from the root's first child down to `node`.
export function pathOf(layout, node) {
  const names = [];
  for (let n = node; n > 0; n = layout.parent[n]) names.push(layout.names[layout.name[n]]);
  return names.reverse();
}

// The node reached by following `names` from the root (as far as they
// match), so a shared zoom survives new data with slightly different trees.
export function nodeByPath(layout, names) {
  let node = 0;
  for (const wanted of names) {
    const depth = layout.depth[node] + 1;
    const row = layout.rows[depth];
    if (!row) break;
    const from = firstInRowAfter(layout, depth, layout.start[node]);
    const end = layout.start[node] + layout.width[node];
    let next = -1;
    for (let i = from; i < row.length && layout.start[row[i]] < end; i += 1) {
      const child = row[i];
      if (layout.parent[child] === node && layout.names[layout.name[child]] === wanted) {
        next = child;
        break;
      }
    }
    if (next < 0) break;
    node = next;
  }
  return node;
}

// Compiles a search: `/re/` is a case-insensitive regular expression,
// anything else a case-insensitive substring. Returns null for no search.
export function compileSearch(term) {
  const text = String(term || '').trim();
  if (!text) return null;
  const re = /^\/(.+)\/$/.exec(text);
  if (re) {
    try {
      const regex = new RegExp(re[1], 'i');
      return (name) => regex.test(name);
    } catch {
      return () => false;
    }
  }
  const lower = text.toLowerCase();
  return (name) => name.toLowerCase().includes(lower);
}

// Marks nodes whose name matches. Returns the flags and the matched share
// of the root: each matched value counted once even when matches nest.
export function matchNodes(layout, term) {
  const test = compileSearch(term);
  const matched = new Uint8Array(layout.count);
  if (!test) return { matched, matchedValue: 0, matchedNodes: 0 };
  const nameHit = layout.names.map((n) => test(n));
  let matchedValue = 0;
  let matchedNodes = 0;
  const coveredBelow = new Uint8Array(layout.count);
  for (let i = 0; i < layout.count; i += 1) {
    // Nodes are numbered in pre-order, so parents come before children.
    const p = layout.parent[i];
    const insideMatch = p >= 0 && (matched[p] || coveredBelow[p]);
    coveredBelow[i] = insideMatch ? 1 : 0;
    if (nameHit[layout.name[i]]) {
      matched[i] = 1;
      matchedNodes += 1;
      if (!insideMatch) matchedValue += layout.width[i];
    }
  }
  return { matched, matchedValue, matchedNodes };
}

// Per-function totals derived from a laid-out diff (self values summed by
// name) for the compare-mode table.
export function diffTableRows(layout) {
  const rows = new Map();
  for (let i = 1; i < layout.count; i += 1) {
    const name = layout.names[layout.name[i]];
    let row = rows.get(name);
    if (!row) {
      row = { name, base: 0, compare: 0 };
      rows.set(name, row);
    }
    row.base += layout.baseSelf[i];
    row.compare += layout.compareSelf[i];
  }
  const b = layout.baseRoot || 0;
  const c = layout.compareRoot || 0;
  return [...rows.values()]
    .filter((r) => r.base !== 0 || r.compare !== 0)
    .map((r) => ({
      ...r,
      baseShare: b ? r.base / b : 0,
      compareShare: c ? r.compare / c : 0,
      delta: (c ? r.compare / c : 0) - (b ? r.base / b : 0),
    }));
}
