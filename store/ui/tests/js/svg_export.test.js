// The UI's SVG export, from folded stacks as /api/v1/folded answers.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { foldedToSvg, foldedTree } from '../../assets/js/svg_export.js';

const FOLDED = 'comm=api;main;work 30\ncomm=api;main;idle 10\ncomm=db;query 60\n';

test('the exported tree keeps every stack and its totals', () => {
  const { root, depth, total } = foldedTree(FOLDED);
  assert.equal(total, 100);
  assert.equal(depth, 3);
  assert.equal(root.children.get('comm=api').total, 40);
  assert.equal(root.children.get('comm=api').children.get('main').children.get('work').total, 30);
});

test('a zoomed export keeps only the stacks under the zoomed frame', () => {
  const { total, root } = foldedTree(FOLDED, ['comm=api', 'main']);
  assert.equal(total, 40);
  assert.deepEqual([...root.children.keys()], ['comm=api']);
});

test('the SVG names each frame with its value and escapes markup', () => {
  const svg = foldedToSvg(`${FOLDED}<script>&x 5\n`, { title: 'cpu{pod="a"}', unit: 'nanoseconds' });
  assert.match(svg, /^<svg /);
  assert.match(svg, /<title>comm=db \(60 ns, 57\.1%\)<\/title>/);
  assert.match(svg, /<title>all \(105 ns, 100(\.0)?%\)<\/title>/);
  assert.doesNotMatch(svg, /<script>/);
  assert.match(svg, /cpu\{pod=&#34;a&#34;\}/);
});
