import assert from 'node:assert/strict';
import { test } from 'node:test';

import { formatSource } from '../../assets/js/format.js';

test('a frame source reads file:line, the file alone without a line, nothing without a file', () => {
  // Shaped as the store's `sources` and top entries' `source` are.
  assert.equal(formatSource({ file: '/src/hot.c', line: 5 }), '/src/hot.c:5');
  assert.equal(formatSource({ file: 'init.c' }), 'init.c');
  assert.equal(formatSource({ file: '', line: 3 }), '');
  assert.equal(formatSource(undefined), '');
  assert.equal(formatSource(null), '');
});
