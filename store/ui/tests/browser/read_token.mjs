// Read tokens in headless Chromium against a real kiln-store started with
// `--read-tokens-file` (store/ui/tests/browser.rs). The UI must ask once, retry
// with what the user typed, ask again only when the store refuses it, keep
// the token for the tab only, send it as a bearer header and never put it
// in the page URL. Environment:
//   KILN_URL, KILN_ARTIFACTS, KILN_CHROMIUM, KILN_PLAYWRIGHT as for host_view.mjs
//   KILN_READ_TOKEN  the token the store accepts

import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
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
const token = env('KILN_READ_TOKEN');
const require = createRequire(import.meta.url);
const { chromium } = require(env('KILN_PLAYWRIGHT'));
mkdirSync(artifacts, { recursive: true });

const TIMEOUT = 60000;
let step = 'start';
const log = (message) => console.log(`[read-token] ${message}`);

async function main() {
  step = 'seed the store (writes stay open)';
  const now = Math.floor(Date.now() / 1000);
  const name = encodeURIComponent('process_cpu{comm=app}');
  const ingest = await fetch(`${base}/ingest?format=folded&name=${name}&from=${now - 60}&until=${now - 50}`, {
    method: 'POST',
    body: 'main;work 30\nmain;idle 10\n',
  });
  assert.equal(ingest.status, 200, await ingest.text());
  assert.equal((await fetch(`${base}/api/v1/profile-types`)).status, 401, 'reads need the token');

  step = 'launch chromium';
  const userDataDir = mkdtempSync(join(tmpdir(), 'kiln-chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: env('KILN_CHROMIUM'),
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-sync'],
  });
  try {
    const page = await context.newPage();
    page.setDefaultTimeout(TIMEOUT);
    const apiRequests = [];
    page.on('request', (request) => {
      if (request.url().includes('/api/v1/')) apiRequests.push({ url: request.url(), auth: request.headers().authorization });
    });
    let prompts = 0;
    const dialog = page.locator('#token-dialog');
    const answer = async (text) => {
      await dialog.waitFor({ state: 'visible' });
      prompts += 1;
      const message = await page.locator('#token-message').textContent();
      await page.locator('#token-input').fill(text);
      await page.locator('#token-dialog button[value="ok"]').click();
      // Closed, or already open again for the next prompt (which empties
      // the field): a refused token may reopen it within one poll.
      await page.waitForFunction(() => {
        const box = document.querySelector('#token-dialog');
        return !box.open || document.querySelector('#token-input').value === '';
      });
      return message;
    };

    step = 'the first 401 asks for a token, a refused one asks again';
    await page.goto(`${base}/?from=now-15m&to=now`);
    assert.match(await answer('not-the-token'), /requires a read token/);
    assert.match(await answer(token), /refused the read token/);
    await page.waitForFunction(() => Number(document.body.dataset.runs || 0) > 0);
    assert.ok(await page.locator('#error').isHidden(), `no error: ${await page.locator('#error').textContent()}`);
    assert.match(await page.locator('#flame-summary').textContent(), /total 400 ms/);
    assert.equal(prompts, 2, 'one prompt per refusal, however many requests were refused');

    step = 'the token is sent as a bearer header and kept out of the URL';
    const authorized = apiRequests.filter((r) => r.auth === `Bearer ${token}`);
    assert.ok(authorized.length >= 3, 'queries carry the token');
    assert.ok(apiRequests.every((r) => !r.url.includes(token)), 'no request URL holds the token');
    assert.ok(!page.url().includes(token), 'the page URL does not hold the token');
    assert.equal(await page.evaluate(() => window.sessionStorage.getItem('kiln.readToken')), token);
    assert.equal(await page.evaluate(() => window.localStorage.length), 0, 'nothing kept beyond the tab');

    step = 'a reload of the tab does not ask again';
    const before = prompts;
    await page.reload();
    await page.waitForFunction(() => Number(document.body.dataset.runs || 0) > 0);
    assert.match(await page.locator('#flame-summary').textContent(), /total 400 ms/);
    assert.equal(prompts, before);
    assert.ok(await dialog.isHidden());
    await page.screenshot({ path: join(artifacts, 'read-token.png') });

    step = 'the pprof download goes through fetch with the token';
    const [download] = await Promise.all([page.waitForEvent('download'), page.locator('#download-a').click()]);
    assert.equal(download.suggestedFilename(), 'profile.pb.gz');
    assert.ok(!download.url().includes(token));
  } finally {
    await context.close();
    rmSync(userDataDir, { recursive: true, force: true });
  }
}

main().then(
  () => log('all UI steps passed'),
  (err) => {
    console.error(`[read-token] FAILED at step "${step}": ${err.stack || err}`);
    process.exit(1);
  },
);
