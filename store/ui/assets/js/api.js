// The store's query API (`/api/v1/`, see docs/api.md). Every request is a
// GET with the selector in `query` and times as unix milliseconds.

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

export class Api {
  constructor() {
    this.controllers = new Map();
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
    let response;
    try {
      response = await fetch(apiUrl(path, params), { signal, headers: { Accept: 'application/json' } });
    } catch (err) {
      if (err.name === 'AbortError') throw err;
      throw new ApiError(`The store is unreachable: ${err.message}`, 0);
    }
    const text = await response.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = null;
    }
    if (!response.ok) {
      const message = (body && (body.error || body.message)) || text || response.statusText;
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

  // {profile_type, unit, total, flamegraph: {names, root, node_count}}
  flamegraph(query, range, maxNodes, channel) {
    return this.get('flamegraph', { query, ...rangeParams(range), max_nodes: String(maxNodes) }, channel);
  }

  // {profile_type, unit, total, top: [{name, flat, cumulative}]}
  top(query, range, limit, channel) {
    return this.get('top', { query, ...rangeParams(range), limit: String(limit) }, channel);
  }

  // {profile_type, unit, timeline: {start_ms, step_ms, values}}
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

  pprofUrl(query, range) {
    return apiUrl('pprof', { query, ...rangeParams(range) });
  }
}
