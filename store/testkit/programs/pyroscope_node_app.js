// Profiles itself with the real Pyroscope Node.js SDK (@pyroscope/nodejs,
// which `./kiln-dev test` installs) and uploads to the URL it is given, so a
// test can replay the SDK's own requests. Usage:
//   node pyroscope_node_app.js SERVER_URL APP_NAME SECONDS
// The SDK adds dotted tags of its own (otel.scope.name=...) to the static
// tags below, and sends the wall profile beside the heap profile; the work
// runs under dynamic labels (endpoint=/a, endpoint=/b), which the SDK writes
// as pprof sample labels.
'use strict';

const Pyroscope = require('@pyroscope/nodejs');

const [serverAddress, appName, secondsArg] = process.argv.slice(2);
if (!serverAddress || !appName || !secondsArg) {
  console.error('usage: pyroscope_node_app.js SERVER_URL APP_NAME SECONDS');
  process.exit(2);
}
const seconds = Number(secondsArg);

// Named so a flame graph shows which label each one ran under.
function kilnNodeA(until) {
  let x = 0;
  while (Date.now() < until) x += Math.sqrt(x + 1);
  return x;
}
function kilnNodeB(until) {
  let x = 0;
  while (Date.now() < until) x += Math.cbrt(x + 2);
  return x;
}

Pyroscope.init({
  serverAddress,
  appName,
  tags: { region: 'local', env: 'ci' },
  flushIntervalMs: 1000,
});
Pyroscope.start();

const end = Date.now() + seconds * 1000;
function slice() {
  if (Date.now() >= end) {
    Pyroscope.stop().then(
      () => process.exit(0),
      (err) => {
        console.error('stop failed:', err);
        process.exit(1);
      },
    );
    return;
  }
  // 20 ms of each function per slice; yielding between slices lets the
  // SDK's timers flush uploads while the work goes on.
  Pyroscope.wrapWithLabels({ endpoint: '/a' }, () => kilnNodeA(Date.now() + 20));
  Pyroscope.wrapWithLabels({ endpoint: '/b' }, () => kilnNodeB(Date.now() + 20));
  setImmediate(slice);
}
slice();
