// The store's query API (`/api/v1/`, see docs/api.md). Every request is a
// GET with the selector in `query` and times as unix milliseconds.
//
// A store that requires read tokens answers 401; the UI then asks for one
// once (`askToken`), keeps it in sessionStorage only (gone with the tab,
// never in the URL or a link) and sends it as a bearer token.

const TOKEN_KEY = 'kiln.readToken';

export function storedToken() {
  try {
    return window.sessionStorage.getItem(TOKEN_KEY) || '';
  } catch {
    return '';
  }
}

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

function rangeParams(range, prefix = '') {
  return { [`${prefix}from`]: String(range.startMs), [`${prefix}to`]: String(range.endMs) };
}

export function apiUrl(path, params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== '') search.set(key, value);
  }
  const text = search.toString();
  return `api/v1/${path}${text ? `?${text}` : ''}`;
}

function groupParam(groupBy) {
  return groupBy && groupBy.length ? groupBy.join(',') : undefined;
}

export class Api {
  // `askToken(message)` resolves to a token, or '' when the user declines.
  constructor({ askToken } = {}) {
    this.controllers = new Map();
    this.askToken = askToken || null;
    this.tokenPrompt = null;
  }

  headers(accept) {
    const headers = { Accept: accept };
    const token = storedToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    return headers;
  }

  // One prompt for every request that got a 401 at the same time.
  async newToken(message) {
    if (!this.askToken) return '';
    if (!this.tokenPrompt) {
      this.tokenPrompt = this.askToken(message).finally(() => {
        this.tokenPrompt = null;
      });
    }
    const token = (await this.tokenPrompt) || '';
    if (token) window.sessionStorage.setItem(TOKEN_KEY, token);
    return token;
  }

  // Fetches `path`; on a 401 asks for a read token and retries, until the
  // store accepts one or the user cancels.
  async fetchWithToken(path, params, signal, accept) {
    for (;;) {
      const sent = storedToken();
      let response;
      try {
        response = await fetch(apiUrl(path, params), { signal, headers: this.headers(accept) });
      } catch (err) {
        if (err.name === 'AbortError') throw err;
        throw new ApiError(`The store is unreachable: ${err.message}`, 0);
      }
      if (response.status !== 401) return response;
      // Another request got a new token meanwhile: try that one first.
      if (storedToken() !== sent) continue;
      const token = await this.newToken(
        sent ? 'The store refused the read token. Enter another one:' : 'This store requires a read token:',
      );
      if (!token) return response;
    }
  }

  // Downloads `path` as a file named `filename` (through fetch, so the read
  // token goes in a header rather than the link).
  async download(path, params, filename) {
    const response = await this.fetchWithToken(path, params, undefined, '*/*');
    if (!response.ok) throw new ApiError(await errorMessage(response), response.status);
    const url = URL.createObjectURL(await response.blob());
    const link = document.createElement('a');
    link.href = url;
    link.download = filename;
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  // The untrimmed merge as folded stacks (`a;b;c value` lines).
  async folded(query, range, groupBy) {
    const response = await this.fetchWithToken(
      'folded',
      { query, ...rangeParams(range), group_by: groupParam(groupBy) },
      undefined,
      'text/plain',
    );
    if (!response.ok) throw new ApiError(await errorMessage(response), response.status);
    return response.text();
  }

  // Fetches JSON. A newer request on the same `channel` aborts the older
  // one, so fast clicking never shows stale results.
  async get(path, params, channel) {
    let signal;
    if (channel) {
      this.controllers.get(channel)?.abort();
      const controller = new AbortController();
      this.controllers.set(channel, controller);
      signal = controller.signal;
    }
    const response = await this.fetchWithToken(path, params, signal, 'application/json');
    const text = await response.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = null;
    }
    if (!response.ok) {
      let message = (body && (body.error || body.message)) || text || response.statusText;
      if (response.status === 401) message = `${message}. This store requires a read token; reload the page to enter one.`;
      throw new ApiError(message, response.status);
    }
    if (body === null) throw new ApiError(`The store sent a response that is not JSON (${path})`, response.status);
    return body;
  }

  async profileTypes(range, channel) {
    const body = await this.get('profile-types', rangeParams(range), channel);
    return (body.profile_types || []).map((t) => (typeof t === 'string' ? t : t.id));
  }

  async labelNames(query, range) {
    const body = await this.get('labels', { query, ...rangeParams(range) });
    return body.names || [];
  }

  async labelValues(name, query, range) {
    const body = await this.get(`labels/${encodeURIComponent(name)}/values`, { query, ...rangeParams(range) });
    return body.values || [];
  }

  // {profile_type, unit, total, group_by, flamegraph: {names, root, node_count}}
  flamegraph(query, range, maxNodes, groupBy, channel) {
    return this.get(
      'flamegraph',
      { query, ...rangeParams(range), max_nodes: String(maxNodes), group_by: groupParam(groupBy) },
      channel,
    );
  }

  // {profile_type, unit, total, group_by, top: [{name, flat, cumulative}]}
  top(query, range, limit, groupBy, channel) {
    return this.get('top', { query, ...rangeParams(range), limit: String(limit), group_by: groupParam(groupBy) }, channel);
  }

  // {profile_type, unit, aggregation, timeline: {start_ms, step_ms, values, profiles}}
  timeline(query, range, stepMs, channel) {
    return this.get('timeline', { query, ...rangeParams(range), step: `${stepMs}ms` }, channel);
  }

  // {profile_type, unit, left_total, right_total, diff: {names, root, node_count}}
  diff(base, compare, maxNodes, channel) {
    return this.get(
      'diff',
      {
        left_query: base.query,
        ...rangeParams(base.range, 'left_'),
        right_query: compare.query,
        ...rangeParams(compare.range, 'right_'),
        max_nodes: String(maxNodes),
      },
      channel,
    );
  }

  pprofParams(query, range, groupBy) {
    return { query, ...rangeParams(range), group_by: groupParam(groupBy) };
  }

  pprofUrl(query, range, groupBy) {
    return apiUrl('pprof', this.pprofParams(query, range, groupBy));
  }
}

async function errorMessage(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    return body.error || body.message || text;
  } catch {
    return text || response.statusText;
  }
}
