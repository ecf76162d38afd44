// The host view in headless Chromium against a real kiln-store seeded with
// the real CPU profiles of three processes (tests/programs/workload, built
// and run by store/ui/tests/browser.rs), each sample labelled with its
// process like the agent labels a host's samples (`comm`, `pid`: kept per
// sample by the store, not series labels). Each upload also gets series
// labels of its own (`job`, `instance`), so that a process's own total can
// be queried apart. Environment:
//   KILN_URL         the store's base URL (UI at /)
//   KILN_PROFILES    `service=path` lines, one CPU profile per process
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
const artifacts = env('KILN_ARTIFACTS');
const profiles = env('KILN_PROFILES')
  .split('\n')
  .map((line) => line.split('='))
  .map(([service, path]) => ({ service, path }));
const require = createRequire(import.meta.url);
const { chromium } = require(env('KILN_PLAYWRIGHT'));
mkdirSync(artifacts, { recursive: true });

const TIMEOUT = 60000;
const ROW_HEIGHT = 20; // flamegraph.js
let step = 'start';
let currentPage = null;
const log = (message) => console.log(`[host-view] ${message}`);

// The whole page, and the flame panel alone (small enough for the README:
// docs/images/ holds copies of the panels).
async function screenshot(page, name) {
  const path = join(artifacts, `${name}.png`);
  await page.screenshot({ path });
  const panel = join(artifacts, `${name}-panel.png`);
  await page.locator('.flame-panel').screenshot({ path: panel });
  log(`screenshots ${path}, ${panel}`);
}

// Waits for the UI to finish its next query after `action`.
async function afterRun(page, action) {
  const before = Number((await page.getAttribute('body', 'data-runs')) || 0);
  await action();
  await page.waitForFunction((n) => Number(document.body.dataset.runs || 0) > n, before, { timeout: TIMEOUT });
  const error = page.locator('#error');
  if (await error.isVisible()) throw new Error(`the UI shows an error: ${await error.textContent()}`);
}

// The tooltip of the frame at value position `value` of flame graph row
// `depth` in `canvasSelector` (drawn unzoomed, root spanning the width).
async function tooltipAt(page, canvasSelector, depth, value, rootValue, { inverted = false, rows = 0 } = {}) {
  const box = await page.locator(canvasSelector).boundingBox();
  const row = inverted ? rows - 1 - depth : depth;
  await page.mouse.move(box.x + (value / rootValue) * box.width, box.y + row * ROW_HEIGHT + ROW_HEIGHT / 2);
  const tooltip = page.locator(`${canvasSelector} ~ .tooltip`);
  await tooltip.waitFor({ state: 'visible' });
  return {
    title: await tooltip.locator('.tooltip-title').textContent(),
    text: await tooltip.textContent(),
  };
}

async function main() {
  step = 'seed the store with three processes';
  const now = Math.floor(Date.now() / 1000);
  for (const [i, { service, path }] of profiles.entries()) {
    const name = `process_cpu{job=${service},instance=10.0.0.${i + 1},node=host-1}`;
    const url = `${base}/ingest?format=pprof&name=${encodeURIComponent(name)}&from=${now - 120}&until=${now - 110}`;
    const response = await fetch(url, { method: 'POST', body: readFileSync(path) });
    assert.equal(response.status, 200, `ingest of ${service}: ${await response.text()}`);
  }

  step = 'launch chromium';
  const userDataDir = mkdtempSync(join(tmpdir(), 'kiln-chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: env('KILN_CHROMIUM'),
    headless: true,
    viewport: { width: 1440, height: 900 },
    acceptDownloads: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-sync'],
  });
  const problems = [];
  const watch = (page) => {
    page.setDefaultTimeout(TIMEOUT);
    page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
    page.on('console', (msg) => {
      // The deliberate bad group-by below gets a 400, which Chromium logs.
      const expected = /status of 400 \(Bad Request\)/.test(msg.text());
      if (msg.type() === 'error' && !expected) problems.push(`console error: ${msg.text()}`);
    });
    return page;
  };
  try {
    const page = watch(await context.newPage());
    currentPage = page;

    step = 'open the host view as `kiln up` does, grouped by comm';
    const graphAnswer = page.waitForResponse((r) => r.url().includes('/api/v1/flamegraph?'));
    await afterRun(page, () => page.goto(`${base}/`));
    const answer = await graphAnswer;
    const graph = await answer.json();
    assert.deepEqual(graph.group_by, ['comm']);
    assert.equal(new URL(page.url()).searchParams.get('group_by'), 'comm', 'the link says how it is grouped');
    assert.equal(await page.locator('#group-by').inputValue(), 'comm');
    const names = graph.flamegraph.names;
    const roots = graph.flamegraph.root.children;
    assert.deepEqual(
      roots.map((r) => names[r.name]).sort(),
      profiles.map((p) => `comm=${p.service}`).sort(),
      'one root frame per process',
    );

    step = "each root's total equals that process's own query";
    const asked = new URL(answer.url()).searchParams;
    const formatted = await page.evaluate(async (values) => {
      const { formatValue } = await import('./js/format.js');
      return values.map(([v, unit]) => formatValue(v, unit));
    }, roots.map((r) => [r.total, graph.unit]));
    let start = 0;
    for (const [i, root] of roots.entries()) {
      const comm = names[root.name].slice('comm='.length);
      const params = new URLSearchParams({
        query: `${graph.profile_type}{job="${comm}"}`,
        from: asked.get('from'),
        to: asked.get('to'),
      });
      const own = await (await fetch(`${base}/api/v1/flamegraph?${params}`)).json();
      assert.ok(own.total > 0, `${comm} has samples`);
      assert.equal(root.total, own.total, `the comm=${comm} root carries ${comm}'s own total`);
      const tip = await tooltipAt(page, '#flame', 1, start + root.total / 2, graph.total);
      assert.equal(tip.title, `comm=${comm}`, 'the UI draws the root frame where its value puts it');
      assert.ok(tip.text.includes(formatted[i]), `the tooltip shows ${formatted[i]}: ${tip.text}`);
      start += root.total;
    }
    await page.mouse.move(0, 0);
    await screenshot(page, 'host-grouped-by-comm');
    const groupedUrl = page.url();

    step = 'the top table lists functions, not groups';
    assert.equal(await page.locator('#top-table tbody tr[title^="comm="]').count(), 0);
    await page.locator('#top-table tbody tr[title="main.hashItems"]').waitFor();

    step = 'open the sandwich view of a function with two distinct callers';
    await page.locator('#top-table tbody tr[title="main.hashItems"] button.sandwich-open').click();
    await page.locator('#sandwich').waitFor({ state: 'visible' });
    assert.equal(new URL(page.url()).searchParams.get('sandwich'), 'main.hashItems');
    assert.equal(await page.locator('#sandwich-name').textContent(), 'main.hashItems');
    assert.ok(await page.locator('#flame-container').isHidden(), 'the sandwich replaces the flame graph');
    const callersText = await page.locator('#sandwich-callers').textContent();
    for (const caller of ['main.auditLog', 'main.handleCheckout', 'main.handleSearch']) {
      assert.ok(callersText.includes(caller), `${caller} is shown as a caller: ${callersText}`);
    }
    // The callers graph is drawn root (the function) at the bottom.
    const callersRows = Math.round((await page.locator('#callers').boundingBox()).height / ROW_HEIGHT);
    const bottom = await tooltipAt(page, '#callers', 0, 1, 2, { inverted: true, rows: callersRows });
    assert.equal(bottom.title, 'main.hashItems', 'the function sits under its callers');
    const callees = await tooltipAt(page, '#callees', 0, 1, 2);
    assert.equal(callees.title, 'main.hashItems', 'and above its callees');
    await page.mouse.move(0, 0);
    await screenshot(page, 'sandwich-main-hashItems');
    const sandwichUrl = page.url();

    step = 'reload the link of each view and get the same view';
    const reopen = async (url) => {
      const copy = watch(await context.newPage());
      await afterRun(copy, () => copy.goto(url));
      return copy;
    };
    const grouped = await reopen(groupedUrl);
    assert.equal(await grouped.locator('#group-by').inputValue(), 'comm');
    assert.ok(await grouped.locator('#flame-container').isVisible());
    assert.equal((await tooltipAt(grouped, '#flame', 1, roots[0].total / 2, graph.total)).title, names[roots[0].name]);
    await grouped.close();
    const sandwich = await reopen(sandwichUrl);
    await sandwich.locator('#sandwich').waitFor({ state: 'visible' });
    assert.equal(await sandwich.locator('#sandwich-name').textContent(), 'main.hashItems');
    assert.equal(await sandwich.locator('#sandwich-callers').textContent(), callersText);
    await sandwich.close();

    step = 'back to the flame graph, zoom into one process, and reload that';
    await page.locator('#sandwich-close').click();
    assert.ok(await page.locator('#flame-container').isVisible());
    assert.equal(new URL(page.url()).searchParams.get('sandwich'), null);
    const firstRoot = names[roots[0].name];
    const box = await page.locator('#flame').boundingBox();
    await page.mouse.click(box.x + ((roots[0].total / 2) / graph.total) * box.width, box.y + ROW_HEIGHT * 1.5);
    await page.waitForFunction((name) => new URLSearchParams(location.search).get('zoom') === name, firstRoot);
    const zoomed = await reopen(page.url());
    assert.ok(await zoomed.locator('#breadcrumbs button', { hasText: firstRoot }).count(), 'zoom restored');
    await zoomed.close();
    await page.locator('#reset-zoom').click();

    step = 'download what is on screen as SVG and as pprof';
    const [svgDownload] = await Promise.all([page.waitForEvent('download'), page.locator('#download-svg').click()]);
    const svg = readFileSync(await svgDownload.path(), 'utf8');
    for (const root of roots) {
      assert.ok(svg.includes(`<title>${names[root.name]} (`), `the SVG has the ${names[root.name]} group`);
    }
    const pprofHref = await page.locator('#download-a').getAttribute('href');
    assert.match(pprofHref, /group_by=comm/, 'the pprof is grouped as shown');
    const pprof = await page.request.get(new URL(pprofHref, page.url()).toString());
    const body = await pprof.body();
    assert.ok(pprof.status() === 200 && body[0] === 0x1f && body[1] === 0x8b, 'the pprof download is gzipped pprof');

    step = 'a bad group-by points at the mistake';
    await page.locator('#group-by').fill('comm{');
    const before = Number((await page.getAttribute('body', 'data-runs')) || 0);
    await page.locator('#group-by').press('Enter');
    await page.waitForFunction((n) => Number(document.body.dataset.runs || 0) > n, before);
    assert.match(await page.locator('#error').textContent(), /invalid `group_by`: "comm\{" is not a label name/);
    assert.ok(await page.locator('#group-by-box.invalid').count(), 'the group-by box is marked');

    step = 'ungroup, and the link keeps it ungrouped';
    await page.locator('#group-by').fill('');
    await afterRun(page, () => page.locator('#group-by').press('Enter'));
    assert.equal(new URL(page.url()).searchParams.get('group_by'), '');
    const ungrouped = await reopen(page.url());
    assert.equal(await ungrouped.locator('#group-by').inputValue(), '');
    const top = (await ungrouped.locator('#breadcrumbs').textContent()).trim();
    assert.equal(top, 'All');
    await ungrouped.close();

    step = 'value autocomplete offers only values under the matchers typed';
    const matchers = page.locator('#selection-a input.matchers');
    await matchers.fill('');
    await matchers.click();
    await matchers.pressSequentially('job="search", insta');
    const suggestions = page.locator('#selection-a ul.suggestions');
    await suggestions.locator('li', { hasText: 'instance' }).first().waitFor();
    await matchers.press('Enter');
    await suggestions.locator('li', { hasText: '10.0.0.' }).first().waitFor();
    const instances = await suggestions.locator('li').allTextContents();
    assert.deepEqual(instances.map((t) => t.trim()), ['10.0.0.2'], 'only the search job\'s instance');
    await matchers.press('Escape');

    step = 'an empty range says what to do';
    const empty = await reopen(`${base}/?from=now-3h&to=now-2h&group_by=comm`);
    await empty.locator('#empty-state').waitFor({ state: 'visible' });
    assert.match(await empty.locator('#empty-state').textContent(), /Widen the time range.*profiles\.kiln\.dev\/enabled=true/s);
    await empty.close();

    step = 'check the pages stayed free of errors';
    assert.deepEqual(problems, []);
  } catch (err) {
    if (currentPage) await currentPage.screenshot({ path: join(artifacts, 'host-view-failure.png') }).catch(() => {});
    if (problems.length) console.error(`[host-view] page problems:\n  ${problems.join('\n  ')}`);
    throw err;
  } finally {
    await context.close();
    rmSync(userDataDir, { recursive: true, force: true });
  }
}

main().then(
  () => log('all UI steps passed'),
  (err) => {
    console.error(`[host-view] FAILED at step "${step}": ${err.stack || err}`);
    process.exit(1);
  },
);
