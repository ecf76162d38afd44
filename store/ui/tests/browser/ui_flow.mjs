// Drives the Kiln UI in headless Chromium against a real kiln-store.
// Started by store/ui/tests/browser.rs, which starts the store and passes:
//   KILN_URL         the store's base URL (UI at /)
//   KILN_PROFILE_CHECKOUT, KILN_PROFILE_SEARCH
//                    the CPU profiles of the two pods (gzipped pprof)
//   KILN_EXPECT      optional JSON: what those profiles hold (see `expected`;
//                    `hotSource`, a pattern of the hot function's file:line)
//   KILN_ARTIFACTS   where screenshots go
//   KILN_CHROMIUM    the Chromium binary
//   KILN_PLAYWRIGHT  the playwright-core package directory
// Exits non-zero, naming the failed step, when anything is wrong.

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createRequire } from 'node:module';
import { join } from 'node:path';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const base = env('KILN_URL');
const profiles = { checkout: env('KILN_PROFILE_CHECKOUT'), search: env('KILN_PROFILE_SEARCH') };
// The functions the flow looks for. The defaults are what ../shared's
// sample.cpu (checkout) and large.cpu (search) hold; browser.rs passes the
// frames of the Go profiles it makes when it seeds those instead. A share
// of null is not checked.
const expected = {
  top: 'runtime.mapiternext', // checkout's largest flat function
  hot: 'main.busyLoop', // on all of checkout's stacks; first by name of those
  hotShare: '100(\\.0)?% of total',
  other: 'time.Now', // on search's stacks only
  zoom: 'runtime.mapassign_fast64', // below hot
  zoomShare: '7\\.39% of total',
  zoomPath: ['All', 'runtime.main', 'main.main', 'main.busyLoop', 'runtime.mapassign_fast64'],
  ...JSON.parse(process.env.KILN_EXPECT || '{}'),
};
// A pattern that matches `text` as it is.
const literally = (text) => new RegExp(text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
const artifacts = env('KILN_ARTIFACTS');
const require = createRequire(import.meta.url);
const { chromium } = require(env('KILN_PLAYWRIGHT'));
mkdirSync(artifacts, { recursive: true });

const TIMEOUT = 60000;
let step = 'start';
let currentPage = null;
const log = (message) => console.log(`[ui-test] ${message}`);

async function ingest(path, labels, fromSec, untilSec) {
  const name = `process_cpu{${labels}}`;
  const url = `${base}/ingest?format=pprof&name=${encodeURIComponent(name)}&from=${fromSec}&until=${untilSec}`;
  const response = await fetch(url, { method: 'POST', body: readFileSync(path) });
  assert.equal(response.status, 200, `ingest of ${path} answered ${response.status}: ${await response.text()}`);
}

async function screenshot(page, name) {
  const path = join(artifacts, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  log(`screenshot ${path}`);
}

// Waits for the UI to finish its next query after `action`.
async function afterRun(page, action) {
  const before = Number((await page.getAttribute('body', 'data-runs')) || 0);
  await action();
  await page.waitForFunction((n) => Number(document.body.dataset.runs || 0) > n, before, { timeout: TIMEOUT });
  const error = await page.locator('#error');
  if (await error.isVisible()) throw new Error(`the UI shows an error: ${await error.textContent()}`);
}

// Canvas position (CSS px) of the first pixel of the search highlight colour.
async function highlightedPoint(page) {
  return page.evaluate(() => {
    const canvas = document.querySelector('#flame');
    const ctx = canvas.getContext('2d');
    const { width, height } = canvas;
    const data = ctx.getImageData(0, 0, width, height).data;
    const dpr = width / canvas.clientWidth;
    // hsl(292 70% 62%) is about rgb(214, 91, 226).
    for (let y = 0; y < height; y += 2) {
      for (let x = 0; x < width; x += 2) {
        const i = (y * width + x) * 4;
        if (Math.abs(data[i] - 214) < 12 && Math.abs(data[i + 1] - 91) < 12 && Math.abs(data[i + 2] - 226) < 12) {
          return { x: x / dpr + 3, y: y / dpr + 4 };
        }
      }
    }
    return null;
  });
}

async function main() {
  step = 'seed the store';
  const now = Math.floor(Date.now() / 1000);
  await ingest(profiles.checkout, 'pod=checkout-1,namespace=shop', now - 600, now - 590);
  await ingest(profiles.checkout, 'pod=checkout-1,namespace=shop', now - 300, now - 290);
  await ingest(profiles.search, 'pod=search-1,namespace=shop', now - 240, now - 230);

  step = 'launch chromium';
  // A fresh profile directory per run, so no state leaks between runs.
  const userDataDir = mkdtempSync(join(tmpdir(), 'kiln-chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: env('KILN_CHROMIUM'),
    headless: true,
    viewport: { width: 1440, height: 1000 },
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  const problems = [];
  try {
    const page = await context.newPage();
    currentPage = page;
    page.setDefaultTimeout(TIMEOUT);
    page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
    page.on('console', (msg) => {
      // The deliberate bad selector below gets a 400, which Chromium logs.
      const expected = /status of 400 \(Bad Request\)/.test(msg.text());
      if (msg.type() === 'error' && !expected) problems.push(`console error: ${msg.text()}`);
    });

    step = 'load the UI';
    // Ungrouped: this flow checks single frames; host_view.mjs checks grouping.
    await afterRun(page, () => page.goto(`${base}/?from=now-15m&to=now&group_by=`));
    assert.match(await page.title(), /Kiln/);
    const types = await page.locator('#selection-a select.profile-type option').allTextContents();
    assert.ok(types.some((t) => t.includes('cpu')), `profile types offered: ${types}`);
    await screenshot(page, '01-loaded');

    step = 'select a pod with label autocomplete';
    const matchers = page.locator('#selection-a input.matchers');
    await matchers.click();
    await matchers.pressSequentially('po');
    const suggestions = page.locator('#selection-a ul.suggestions');
    await suggestions.locator('li', { hasText: 'pod' }).first().waitFor();
    await matchers.press('Enter');
    await suggestions.locator('li', { hasText: 'checkout-1' }).waitFor();
    const podValues = await suggestions.locator('li').allTextContents();
    assert.ok(podValues.includes('search-1'), `pod values offered: ${podValues}`);
    await screenshot(page, '02-autocomplete');
    await suggestions.locator('li', { hasText: 'checkout-1' }).click();
    assert.equal(await matchers.inputValue(), 'pod="checkout-1"');
    await afterRun(page, () => matchers.press('Enter'));
    assert.match(decodeURIComponent(page.url()), /query=process_cpu:cpu:nanoseconds[^&]*\{pod="checkout-1"\}/);

    step = 'a bad matcher shows the store error at its position';
    await matchers.fill('pod=checkout-1');
    const runsBefore = Number(await page.getAttribute('body', 'data-runs'));
    await matchers.press('Enter');
    await page.waitForFunction((n) => Number(document.body.dataset.runs) > n, runsBefore);
    const errorText = await page.locator('#error').textContent();
    assert.match(errorText, /selector position \d+/, `error shown: ${errorText}`);
    assert.ok(await page.locator('#selection-a .matcher-box.invalid').count(), 'the matcher box is marked');
    const caret = await matchers.evaluate((input) => input.selectionStart);
    assert.equal(caret, 4, 'the caret sits on the unquoted value');
    await screenshot(page, '02b-selector-error');
    await matchers.fill('pod="checkout-1"');
    await afterRun(page, () => matchers.press('Enter'));
    assert.equal(await page.locator('#selection-a .matcher-box.invalid').count(), 0, 'the mark clears');

    step = 'see the flame graph and top table with the expected function';
    const firstRow = page.locator('#top-table tbody tr').first();
    assert.match(await firstRow.textContent(), literally(expected.top));
    assert.ok(await page.locator('#top-table tbody tr', { hasText: expected.hot }).count(), `${expected.hot} in the table`);
    assert.doesNotMatch(await page.locator('#top-table').textContent(), literally(expected.other), 'search-1 frames stay out');
    const flameBox = await page.locator('#flame').boundingBox();
    assert.ok(flameBox.height >= 5 * 20, `flame graph canvas is ${flameBox.height}px tall`);
    // Hover the root frame: the tooltip shows total, self and percent.
    await page.mouse.move(flameBox.x + flameBox.width / 2, flameBox.y + 10);
    const tooltip = page.locator('#tooltip');
    await tooltip.waitFor({ state: 'visible' });
    const tip = await tooltip.textContent();
    assert.match(tip, /Total.*100/);
    assert.match(tip, /Self/);
    await screenshot(page, '03-flamegraph');

    step = 'sort the top table by cumulative value';
    await page.locator('#top-table th', { hasText: /^Cum\.( ▼| ▲)?$/ }).click();
    assert.match(await page.locator('#top-table th.sorted').textContent(), /Cum\. ▼/);
    assert.match(await page.locator('#top-table tbody tr').first().textContent(), literally(expected.hot));
    await page.locator('#top-table th', { hasText: /^Cum\. ▼$/ }).click();
    assert.match(await page.locator('#top-table th.sorted').textContent(), /Cum\. ▲/);
    await page.locator('#top-table th', { hasText: /^Flat( ▼| ▲)?$/ }).click();

    step = 'search highlights the expected function';
    await page.locator('#search').fill(expected.hot);
    await page.waitForFunction(() => / frames? /.test(document.querySelector('#search-summary').textContent));
    if (expected.hotShare) assert.match(await page.locator('#search-summary').textContent(), new RegExp(expected.hotShare));
    const point = await highlightedPoint(page);
    assert.ok(point, 'the search highlight is drawn on the canvas');
    assert.ok(await page.locator('#top-table tr.match', { hasText: expected.hot }).count(), 'the table marks the match');
    if (expected.hotSource) {
      // Where the profile names a file, the matched frame's tooltip and
      // its table row show it, `file:line`, from the answers' sources.
      await page.mouse.move(flameBox.x + point.x, flameBox.y + point.y);
      await page.waitForFunction(() => /Source/.test(document.querySelector('#tooltip').textContent));
      const hotTip = await tooltip.textContent();
      assert.match(hotTip, new RegExp(`Source\\S*${expected.hotSource}`), `the tooltip names the source: ${hotTip}`);
      const hotRow = page.locator('#top-table tbody tr', { hasText: expected.hot }).first();
      assert.match(await hotRow.locator('.source').textContent(), new RegExp(expected.hotSource));
      await page.mouse.move(flameBox.x + 5, flameBox.y + flameBox.height + 40);
      await tooltip.waitFor({ state: 'hidden' });
    }
    await screenshot(page, '04-search');

    step = 'click to zoom into a matched frame';
    await page.locator('#search').fill(expected.zoom);
    // The search is applied once the link carries it.
    await page.waitForFunction((term) => new URLSearchParams(location.search).get('search') === term, expected.zoom);
    if (expected.zoomShare) assert.match(await page.locator('#search-summary').textContent(), new RegExp(expected.zoomShare));
    const target = await highlightedPoint(page);
    assert.ok(target, `${expected.zoom} is highlighted`);
    await page.mouse.click(flameBox.x + target.x, flameBox.y + target.y);
    await page.waitForFunction((zoom) => new URLSearchParams(location.search).get('zoom')?.endsWith(zoom), expected.zoom);
    assert.deepEqual(await page.locator('#breadcrumbs button').allTextContents(), expected.zoomPath);
    await page.mouse.move(flameBox.x + 5, flameBox.y + flameBox.height + 40);
    await screenshot(page, '05-zoomed');

    step = 'a shared URL restores the query, zoom and search';
    const shared = page.url();
    const copy = await context.newPage();
    copy.on('pageerror', (err) => problems.push(`page error (shared link): ${err.message}`));
    await afterRun(copy, () => copy.goto(shared));
    assert.equal(await copy.locator('#selection-a input.matchers').inputValue(), 'pod="checkout-1"');
    assert.equal(await copy.locator('#search').inputValue(), expected.zoom);
    assert.ok(await copy.locator('#breadcrumbs button', { hasText: expected.zoom }).count(), 'zoom restored');
    await copy.close();

    step = 'reset zoom and clear the search';
    await page.locator('#reset-zoom').click();
    await page.locator('#search').fill('');
    await page.waitForFunction(() => !new URLSearchParams(location.search).get('zoom'));

    step = 'brush the timeline to narrow the range';
    const timeline = await page.locator('#selection-a canvas.timeline').boundingBox();
    await afterRun(page, async () => {
      await page.mouse.move(timeline.x + 70, timeline.y + 40);
      await page.mouse.down();
      await page.mouse.move(timeline.x + timeline.width * 0.6, timeline.y + 40, { steps: 8 });
      await page.mouse.up();
    });
    const params = new URL(page.url()).searchParams;
    assert.match(params.get('from'), /^\d{13}$/, `from after brushing: ${params.get('from')}`);
    assert.match(params.get('to'), /^\d{13}$/);
    assert.ok(await page.locator('#top-table tbody tr', { hasText: expected.hot }).count(), 'the narrowed range still has the profile');
    await screenshot(page, '06-brushed');

    step = 'set an absolute range';
    await page.locator('#selection-a .range-label').click();
    const absolute = page.locator('#selection-a .absolute-range');
    await absolute.waitFor();
    const fromValue = await absolute.locator('input').first().inputValue();
    // A datetime-local value is normalized: its seconds are left out when
    // they are 0 (a brushed start on a whole minute reads 'T00:23').
    assert.match(fromValue, /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?$/);
    const widerFrom = new Date(Date.now() - 20 * 60000);
    const pad = (n) => String(n).padStart(2, '0');
    const local = `${widerFrom.getFullYear()}-${pad(widerFrom.getMonth() + 1)}-${pad(widerFrom.getDate())}T${pad(
      widerFrom.getHours(),
    )}:${pad(widerFrom.getMinutes())}:00`;
    await absolute.locator('input').first().fill(local);
    await afterRun(page, () => absolute.locator('button', { hasText: 'Apply' }).click());
    assert.equal(new URL(page.url()).searchParams.get('from'), String(new Date(local).getTime()));
    assert.ok(await page.locator('#top-table tbody tr', { hasText: expected.hot }).count(), 'the absolute range has the profile');

    step = 'download the merged pprof';
    const href = await page.locator('#download-a').getAttribute('href');
    const pprof = await page.request.get(new URL(href, page.url()).toString());
    assert.equal(pprof.status(), 200);
    const body = await pprof.body();
    assert.ok(body.length > 100 && body[0] === 0x1f && body[1] === 0x8b, 'the download is gzipped pprof');

    step = 'compare two pods';
    await afterRun(page, () => page.locator('#selection-a .preset', { hasText: '15m' }).click());
    await afterRun(page, () => page.locator('#mode-compare').click());
    assert.ok(await page.locator('#selection-b').isVisible(), 'selection B is shown');
    const matchersB = page.locator('#selection-b input.matchers');
    assert.equal(await matchersB.inputValue(), 'pod="checkout-1"', 'B starts from A');
    await matchersB.fill('pod="search-1"');
    await afterRun(page, () => matchersB.press('Enter'));
    assert.ok(await page.locator('#diff-legend').isVisible(), 'the diff legend is shown');
    assert.match(await page.locator('#flame-summary').textContent(), /A .* → B /);
    assert.equal(await page.locator('#top-title').textContent(), 'Functions: A → B');
    assert.ok(await page.locator('#top-table td.gain').count(), 'some functions gain in B');
    assert.ok(await page.locator('#top-table td.loss').count(), 'some functions lose in B');
    const compareUrl = new URL(page.url()).searchParams;
    assert.equal(compareUrl.get('mode'), 'compare');
    assert.equal(compareUrl.get('query_b'), 'process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta{pod="search-1"}');
    await page.mouse.move(flameBox.x + flameBox.width / 3, flameBox.y + 30);
    await screenshot(page, '07-compare');

    step = 'measure layout and drawing of a large flame graph';
    // Numbers for docs/benchmarks.md; printed, never asserted.
    const measured = await page.evaluate(async () => {
      const { layoutFlameGraph, matchNodes } = await import('./js/flame_layout.js');
      const { FlameGraphView } = await import('./js/flamegraph.js');
      const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
      const params = new URLSearchParams({
        query: 'process_cpu:cpu{pod="search-1"}',
        from: 'now-15m',
        to: 'now',
        max_nodes: '1048576',
      });
      const t0 = performance.now();
      const body = await (await fetch(`api/v1/flamegraph?${params}`)).json();
      const t1 = performance.now();
      const layout = layoutFlameGraph(body.flamegraph);
      const t2 = performance.now();
      const search = matchNodes(layout, 'setFunctions');
      const t3 = performance.now();
      const container = document.createElement('div');
      container.style.width = '1400px';
      const canvas = document.createElement('canvas');
      container.append(canvas);
      document.body.append(container);
      const view = new FlameGraphView({ container, canvas, tooltip: document.createElement('div') });
      view.layout = layout;
      view.unit = body.unit;
      const full = [];
      for (let i = 0; i < 15; i += 1) {
        const s = performance.now();
        view.draw();
        full.push(performance.now() - s);
      }
      view.zoomNode = layout.rows[3][0];
      const zoomed = [];
      for (let i = 0; i < 15; i += 1) {
        const s = performance.now();
        view.draw();
        zoomed.push(performance.now() - s);
      }
      container.remove();
      return {
        nodes: layout.count,
        maxDepth: layout.maxDepth,
        fetchAndParseMs: Math.round(t1 - t0),
        layoutMs: +(t2 - t1).toFixed(1),
        searchMs: +(t3 - t2).toFixed(1),
        searchMatches: search.matchedNodes,
        drawFullMs: +median(full).toFixed(1),
        drawZoomedMs: +median(zoomed).toFixed(1),
      };
    });
    log(`measured: ${JSON.stringify(measured)}`);

    step = 'check the page stayed free of errors';
    assert.deepEqual(problems, []);
  } catch (err) {
    if (currentPage) await currentPage.screenshot({ path: join(artifacts, 'failure.png'), fullPage: true }).catch(() => {});
    if (problems.length) console.error(`[ui-test] page problems:\n  ${problems.join('\n  ')}`);
    throw err;
  } finally {
    await context.close();
    rmSync(userDataDir, { recursive: true, force: true });
  }
}

main().then(
  () => log('all UI steps passed'),
  (err) => {
    console.error(`[ui-test] FAILED at step "${step}": ${err.stack || err}`);
    process.exit(1);
  },
);
