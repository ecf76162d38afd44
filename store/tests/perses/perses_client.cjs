// Loads the Perses Pyroscope plugin's query client from npm
// (`@perses-dev/pyroscope-plugin`, lib/cjs/model/pyroscope-client.js) with
// `@perses-dev/core` resolved to a small shim, calls it the way the plugin's
// hooks and profile query do, and prints what it got back as JSON.
// Usage: node perses_client.cjs <plugin package dir> <store url> <profile type>
'use strict';

const Module = require('module');
const path = require('path');

const [pluginDir, storeUrl, profileType] = process.argv.slice(2);
const shim = path.join(__dirname, 'perses_core_shim.cjs');
const resolve = Module._resolveFilename;
Module._resolveFilename = function (request, ...rest) {
  if (request === '@perses-dev/core') {
    return shim;
  }
  return resolve.call(this, request, ...rest);
};

const client = require(path.join(pluginDir, 'lib/cjs/model/pyroscope-client.js'));

async function main() {
  const json = { 'content-type': 'application/json' };
  const options = { datasourceUrl: storeUrl, headers: json };
  const profileTypes = await client.searchProfileTypes({}, options, {});
  const labelNames = await client.searchLabelNames({}, options, {});
  const labelValues = await client.searchLabelValues({}, options, { name: 'env' });
  const services = await client.searchServices({}, options);
  // As get-profile-data.js builds it: type{service_name="..."} and now-1h.
  const profiles = await client.searchProfiles(
    { query: `${profileType}{service_name="checkout"}`, from: 'now-1h', maxNodes: 1024 },
    { datasourceUrl: storeUrl },
  );
  process.stdout.write(JSON.stringify({ profileTypes, labelNames, labelValues, services, profiles }));
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
