// Unit tests of the pure UI modules, run by `node --test` from
// store/ui/tests/assets.rs against JSON the real store answered
// (tests/fixtures/, kept by tests/api_fixtures.rs).

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import {
  diffTableRows,
  layoutDiffFlameGraph,
  layoutFlameGraph,
  matchNodes,
  nodeAt,
  nodeByPath,
  pathOf,
} from '../../assets/js/flame_layout.js';

// The fixtures' folded samples are 10 ms each, in nanoseconds.
const MS10 = 10_000_000;
const fixture = (name) => JSON.parse(readFileSync(new URL(`../fixtures/${name}`, import.meta.url), 'utf8'));

test('layout places children side by side from their parent start', () => {
  const layout = layoutFlameGraph(fixture('flamegraph.json').flamegraph);
  assert.equal(layout.count, 6);
  assert.equal(layout.rootValue, 1000 * MS10);
  assert.equal(layout.maxDepth, 3);
  const names = (row) => [...layout.rows[row]].map((n) => layout.names[layout.name[n]]);
  assert.deepEqual(names(1), ['main.main', '(other)']);
  assert.deepEqual(names(2), ['main.work', 'main.idle']);
  const idle = layout.rows[2][1];
  assert.equal(layout.start[idle], 600 * MS10);
  assert.equal(layout.width[idle], 200 * MS10);
  assert.equal(layout.self[idle], 200 * MS10);
});

test('hit testing finds the frame under a value position and nothing in gaps', () => {
  const layout = layoutFlameGraph(fixture('flamegraph.json').flamegraph);
  const at = (depth, x) => {
    const n = nodeAt(layout, depth, x * MS10);
    return n < 0 ? null : layout.names[layout.name[n]];
  };
  assert.equal(at(1, 0), 'main.main');
  assert.equal(at(1, 899.5), 'main.main');
  assert.equal(at(1, 900), '(other)');
  assert.equal(at(3, 10), 'runtime.mallocgc');
  assert.equal(at(3, 300), null, 'self time of main.work leaves a gap below it');
  assert.equal(at(7, 10), null);
});

test('zoom paths round trip and stop at the deepest matching frame', () => {
  const layout = layoutFlameGraph(fixture('flamegraph.json').flamegraph);
  const malloc = nodeByPath(layout, ['main.main', 'main.work', 'runtime.mallocgc']);
  assert.deepEqual(pathOf(layout, malloc), ['main.main', 'main.work', 'runtime.mallocgc']);
  const partial = nodeByPath(layout, ['main.main', 'gone', 'runtime.mallocgc']);
  assert.deepEqual(pathOf(layout, partial), ['main.main']);
  assert.equal(nodeByPath(layout, []), 0);
});

test('search counts nested matches once in the matched share', () => {
  const layout = layoutFlameGraph(fixture('flamegraph.json').flamegraph);
  const bySubstring = matchNodes(layout, 'MAIN.');
  assert.equal(bySubstring.matchedNodes, 3);
  assert.equal(bySubstring.matchedValue, 900 * MS10);
  const byRegex = matchNodes(layout, '/^runtime\\./');
  assert.equal(byRegex.matchedNodes, 1);
  assert.equal(byRegex.matchedValue, 200 * MS10);
  assert.equal(matchNodes(layout, '/[unclosed/').matchedNodes, 0);
  assert.equal(matchNodes(layout, '').matchedNodes, 0);
});

test('diff layout normalises each side and marks gains and losses', () => {
  const layout = layoutDiffFlameGraph(fixture('diff.json').diff);
  assert.equal(layout.rootValue, 2);
  const byName = (name) => [...layout.rows[2]].find((n) => layout.names[layout.name[n]] === name);
  assert.equal(layout.change[byName('main.work')], 0, 'half of A and half of B: unchanged');
  assert.equal(layout.change[byName('main.idle')], -1, 'only in A: a loss');
  assert.equal(layout.change[byName('main.newpath')], 1, 'only in B: a gain');
  const rows = Object.fromEntries(diffTableRows(layout).map((r) => [r.name, r]));
  assert.equal(rows['main.newpath'].delta, 0.5);
  assert.equal(rows['main.idle'].delta, -0.5);
  assert.equal(rows['main.work'].delta, 0);
});

test('a deep and wide tree of 50,000 nodes lays out without recursion limits', () => {
  let names = ['total'];
  const leaf = () => ({ name: 1, total: 1, self: 1, children: [] });
  const root = { name: 0, total: 0, self: 0, children: [] };
  // A 5,000-deep chain plus 45,000 siblings.
  let node = root;
  for (let i = 0; i < 5000; i += 1) {
    const child = { name: 1, total: 0, self: 0, children: [] };
    node.children.push(child);
    node = child;
  }
  for (let i = 0; i < 44999; i += 1) root.children.push(leaf());
  names = ['total', 'f'];
  const layout = layoutFlameGraph({ names, root, node_count: 50000 });
  assert.equal(layout.count, 50000);
  assert.equal(layout.maxDepth, 5000);
  assert.equal(layout.rows[1].length, 45000);
});
