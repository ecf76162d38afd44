// The e2e suite's Node workload (check 8): a hot function called by a named caller, forever,
// run by a plain `node /app/hot_loop.js` with no --perf-basic-prof. The loop allocates
// nothing, so V8's helper threads stay idle and the main thread owns the samples.
function kilnE2eHotJs(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

function kilnE2eCallerJs() {
  let sum = 0;
  for (let round = 0; round < 20; round++) {
    sum += kilnE2eHotJs(2000000);
  }
  return sum;
}

let sink = 0;
while (true) {
  sink += kilnE2eCallerJs();
}
