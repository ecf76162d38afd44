import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import {
  chooseStep,
  completeMatchers,
  decodeState,
  defaultGroupBy,
  encodeState,
  nothingToGroup,
  joinSelector,
  parseDurationMs,
  parseGroupBy,
  parseTime,
  resolveRange,
  splitSelector,
} from '../../assets/js/query_state.js';
import { applyCompletion, completionContext, rankSuggestions } from '../../assets/js/matcher_input.js';
import { formatPercent, formatValue } from '../../assets/js/format.js';

test('the whole query survives a trip through the URL', () => {
  const state = {
    mode: 'compare',
    a: { query: 'process_cpu{pod="a", ns=~"shop.*"}', from: 'now-6h', to: 'now' },
    b: { query: 'process_cpu{pod="b"}', from: '1763776800000', to: '1763780400000' },
    zoom: ['main.main', 'net/http.(*conn).serve'],
    search: '/^runtime\\./',
    groupBy: null,
    sandwich: '',
  };
  assert.deepEqual(decodeState(encodeState(state)), state);
  const grouped = { ...state, mode: 'single', b: state.a, groupBy: ['namespace', 'pod'], sandwich: 'main.work' };
  assert.deepEqual(decodeState(encodeState(grouped)), grouped);
  const ungrouped = { ...grouped, groupBy: [] };
  assert.match(encodeState(ungrouped), /group_by=&/, 'an explicit "no grouping" stays in the link');
  assert.deepEqual(decodeState(encodeState(ungrouped)).groupBy, []);
});

test('views start grouped by pod on Kubernetes and by process on a host', () => {
  assert.deepEqual(defaultGroupBy(['__name__', 'namespace', 'pod', 'comm']), ['namespace', 'pod']);
  assert.deepEqual(defaultGroupBy(['pod']), ['pod']);
  assert.deepEqual(defaultGroupBy(['node', 'language']), ['comm'], 'a host: comm is on its samples');
  assert.deepEqual(defaultGroupBy([]), ['comm']);
  const graph = (...names) => ({ names: ['total', ...names], root: { children: names.map((_, i) => ({ name: i + 1 })) } });
  assert.ok(nothingToGroup(graph('comm=(none)'), ['comm']));
  assert.ok(!nothingToGroup(graph('comm=nginx'), ['comm']));
  assert.ok(!nothingToGroup(graph('comm=(none)', 'comm=nginx'), ['comm']));
  assert.deepEqual(parseGroupBy(' namespace, pod,,pod '), ['namespace', 'pod']);
});

test('value autocomplete keeps the complete matchers but the edited one', () => {
  assert.equal(completeMatchers('namespace="shop", pod=~"check.*", comm="x', 'pod'), 'namespace="shop"');
  assert.equal(completeMatchers('a="1",b!="2"', 'c'), 'a="1", b!="2"');
  assert.equal(completeMatchers('', 'pod'), '');
});

test('an empty URL gives the last hour in single mode', () => {
  const state = decodeState('');
  assert.equal(state.mode, 'single');
  assert.equal(state.a.from, 'now-1h');
  assert.equal(state.a.to, 'now');
  assert.deepEqual(state.zoom, []);
});

test('selectors split into profile type and matchers and join back', () => {
  assert.deepEqual(splitSelector('memory:alloc_space{pod="x{y}"}'), { profileType: 'memory:alloc_space', matchers: 'pod="x{y}"' });
  assert.deepEqual(splitSelector('process_cpu'), { profileType: 'process_cpu', matchers: '' });
  assert.equal(joinSelector('process_cpu', ' pod="a" '), 'process_cpu{pod="a"}');
});

test('times parse like the store parses them', () => {
  const now = 1763780400000;
  assert.equal(parseTime('now', now), now);
  assert.equal(parseTime('now-15m', now), now - 900000);
  assert.equal(parseTime('now-7d', now), now - 7 * 86400000);
  assert.equal(parseTime('1763780400', now), now);
  assert.equal(parseTime('1763780400000', now), now);
  assert.equal(parseTime('1763780400000000000', now), now);
  assert.equal(parseTime('2025-11-22T03:00:00Z', now), Date.parse('2025-11-22T03:00:00Z'));
  assert.ok(Number.isNaN(parseTime('yesterday', now)));
  assert.throws(() => resolveRange({ from: 'now', to: 'now-1h' }, now), /before its end/);
  assert.equal(parseTime('now-1h30m', now), now - 5400000);
  assert.equal(parseTime('now+2 hours', now), now + 7200000);
  assert.equal(parseTime('-1d', now), now - 86400000);
  assert.ok(Number.isNaN(parseTime('now-90', now)));
  assert.ok(Number.isNaN(parseTime('now - 1h', now)));
});

// The store's own parser (kiln_contract::duration) is tested against the same file.
test('durations parse as the store parses them', () => {
  const cases = JSON.parse(readFileSync(new URL('../../../contract/testdata/duration_cases.json', import.meta.url), 'utf8'));
  assert.ok(cases.length > 40);
  for (const { text, ms, bare } of cases) {
    // Relative times need every unit, so a bare number is refused here.
    const expected = ms === null || bare ? NaN : ms;
    assert.equal(parseDurationMs(text), expected, JSON.stringify(text));
  }
});

test('timeline steps are round and never finer than ten seconds', () => {
  assert.equal(chooseStep(5 * 60000), 10000);
  assert.equal(chooseStep(3600000), 30000);
  assert.equal(chooseStep(7 * 86400000), 3600000 * 2);
});

test('autocomplete knows whether a name or a value is being typed', () => {
  assert.deepEqual(completionContext('', 0), { kind: 'name', prefix: '', start: 0, end: 0 });
  assert.deepEqual(completionContext('po', 2), { kind: 'name', prefix: 'po', start: 0, end: 2 });
  const value = completionContext('pod="chec', 9);
  assert.equal(value.kind, 'value');
  assert.equal(value.label, 'pod');
  assert.equal(value.prefix, 'chec');
  const second = completionContext('pod="a", namespace=~"sh', 23);
  assert.equal(second.label, 'namespace');
  assert.equal(second.prefix, 'sh');
  assert.equal(completionContext('pod="a" x', 9), null);
  assert.equal(completionContext('pod="a\\"b", n', 14).kind, 'name');
});

test('accepting a suggestion writes valid matcher syntax', () => {
  const name = applyCompletion('po', completionContext('po', 2), 'pod');
  assert.deepEqual(name, { text: 'pod=""', cursor: 5 });
  const value = applyCompletion(name.text, completionContext(name.text, 5), 'checkout-"1"');
  assert.deepEqual(value, { text: 'pod="checkout-\\"1\\""', cursor: 20 });
  const bare = applyCompletion('pod=', completionContext('pod=', 4), 'a');
  assert.equal(bare.text, 'pod="a"');
});

test('suggestions rank prefix matches before substring matches', () => {
  assert.deepEqual(rankSuggestions(['namespace', 'pod', 'app_pod', 'node'], 'pod'), ['pod', 'app_pod']);
});

test('values are shown in their unit', () => {
  assert.equal(formatValue(1500000000, 'nanoseconds'), '1.5 s');
  assert.equal(formatValue(999960000, 'nanoseconds'), '1 s');
  assert.equal(formatValue(2 * 1024 * 1024, 'bytes'), '2 MiB');
  assert.equal(formatValue(12345, 'count'), '12.3k');
  assert.equal(formatPercent(1, 3), '33.3%');
  assert.equal(formatPercent(1, 0), '–');
});
