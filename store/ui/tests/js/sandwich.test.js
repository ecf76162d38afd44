// The sandwich view's pure part, on a grouped flame graph the real store
// answered (tests/fixtures/grouped.json): crypto.hash is called from
// main.checkout and main.audit in checkout-1 and from main.search in search-1.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { layoutFlameGraph } from '../../assets/js/flame_layout.js';
import { sandwichGraphs } from '../../assets/js/sandwich.js';

const MS10 = 10_000_000;
const grouped = JSON.parse(readFileSync(new URL('../fixtures/grouped.json', import.meta.url), 'utf8'));

const named = (graph, node) => graph.names[node.name];
const childTotals = (graph, node) =>
  Object.fromEntries(node.children.map((c) => [named(graph, c), c.total]));

test('callers of a function merge every place it appears, nearest caller first', () => {
  const { callers, total } = sandwichGraphs(grouped.flamegraph, 'crypto.hash');
  assert.equal(total, 600 * MS10, 'every sample of crypto.hash');
  assert.equal(named(callers, callers.root), 'crypto.hash');
  assert.deepEqual(childTotals(callers, callers.root), {
    'main.checkout': 300 * MS10,
    'main.search': 200 * MS10,
    'main.audit': 100 * MS10,
  });
  const checkout = callers.root.children.find((c) => named(callers, c) === 'main.checkout');
  const main = checkout.children[0];
  assert.equal(named(callers, main), 'main.main');
  assert.deepEqual(childTotals(callers, main), { 'pod=checkout-1': 300 * MS10 });
  assert.equal(main.children[0].self, 300 * MS10, 'the outermost frame holds the value');
  assert.equal(layoutFlameGraph(callers).rootValue, 600 * MS10);
});

test('callees merge the subtrees below every appearance', () => {
  const { callees } = sandwichGraphs(grouped.flamegraph, 'main.search');
  assert.equal(callees.root.total, 400 * MS10);
  assert.deepEqual(childTotals(callees, callees.root), { 'crypto.hash': 200 * MS10, 'sort.Ints': 200 * MS10 });
});

test('a recursive function counts once and an absent one gives empty trees', () => {
  const graph = {
    names: ['total', 'f', 'g'],
    root: {
      name: 0, total: 10, self: 0,
      children: [{ name: 1, total: 10, self: 2, children: [{ name: 1, total: 8, self: 3, children: [{ name: 2, total: 5, self: 5, children: [] }] }] }],
    },
  };
  const { callers, callees, total } = sandwichGraphs(graph, 'f');
  assert.equal(total, 10);
  assert.equal(callers.root.self, 10, 'f starts every stack it is in');
  assert.equal(callees.root.children[0].total, 8);
  assert.equal(sandwichGraphs(graph, 'nowhere').total, 0);
});

test('equal callers are listed by name, whatever order the answer lists names in', () => {
  // The same tree twice, its names table in two orders.
  const tree = (names) => {
    const id = (name) => names.indexOf(name);
    const leaf = { name: id('f'), total: 5, self: 5, children: [] };
    return {
      names,
      root: {
        name: id('total'), total: 10, self: 0,
        children: [
          { name: id('b.caller'), total: 5, self: 0, children: [{ ...leaf }] },
          { name: id('a.caller'), total: 5, self: 0, children: [{ ...leaf }] },
        ],
      },
    };
  };
  for (const names of [['total', 'f', 'a.caller', 'b.caller'], ['total', 'b.caller', 'f', 'a.caller']]) {
    const { callers } = sandwichGraphs(tree(names), 'f');
    assert.deepEqual(callers.root.children.map((c) => named(callers, c)), ['a.caller', 'b.caller']);
  }
});
