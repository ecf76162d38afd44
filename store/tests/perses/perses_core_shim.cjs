// Stands in for `@perses-dev/core`, of which the Pyroscope plugin's client
// uses only `fetch`. It calls the global fetch and throws on an HTTP error,
// so an error answer fails the test instead of being parsed as data.
'use strict';

async function fetch(...args) {
  const response = await globalThis.fetch(...args);
  if (!response.ok) {
    const text = await response.text();
    throw new Error(`HTTP ${response.status} from ${args[0]}: ${text}`);
  }
  return response;
}

module.exports = { fetch };
