// Formatting of values, units, percentages and times for display.

const DURATION_STEPS = [
  [1e9 * 3600, 'h'],
  [1e9 * 60, 'min'],
  [1e9, 's'],
  [1e6, 'ms'],
  [1e3, 'µs'],
  [1, 'ns'],
];
const BYTE_STEPS = [
  [1024 ** 4, 'TiB'],
  [1024 ** 3, 'GiB'],
  [1024 ** 2, 'MiB'],
  [1024, 'KiB'],
  [1, 'B'],
];
const COUNT_STEPS = [
  [1e12, 'T'],
  [1e9, 'G'],
  [1e6, 'M'],
  [1e3, 'k'],
  [1, ''],
];

// A frame's source as the store gives it (`{file, line}`, the line absent
// when unknown): `file:line`, or the file alone; '' when there is none.
export function formatSource(source) {
  if (!source || !source.file) return '';
  return source.line ? `${source.file}:${source.line}` : String(source.file);
}

// A profile type id is `name:sample_type:sample_unit:period_type:period_unit[:delta]`.
export function parseProfileType(id) {
  const parts = String(id || '').split(':');
  return {
    id: String(id || ''),
    name: parts[0] || '',
    sampleType: parts[1] || '',
    sampleUnit: parts[2] || '',
    periodType: parts[3] || '',
    periodUnit: parts[4] || '',
    delta: parts[5] === 'delta',
  };
}

// A short human label for a profile type, e.g. "process_cpu · cpu (nanoseconds)".
export function profileTypeLabel(id) {
  const t = parseProfileType(id);
  if (!t.sampleType) return t.name;
  return `${t.name} · ${t.sampleType}${t.sampleUnit ? ` (${t.sampleUnit})` : ''}`;
}

function scaled(value, steps, suffixSpace) {
  const abs = Math.abs(value);
  for (const [size, suffix] of steps) {
    // 999.96 ms shows as 1 s, not 1000 ms.
    if (abs >= size * 0.9995) {
      const v = value / size;
      const digits = Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : 2;
      const text = v.toFixed(digits).replace(/\.0+$|(\.\d*?)0+$/, '$1');
      return suffix ? `${text}${suffixSpace ? ' ' : ''}${suffix}` : text;
    }
  }
  return '0';
}

// Formats `value` in `unit` (a pprof sample unit: nanoseconds, bytes, count, ...).
export function formatValue(value, unit) {
  if (!Number.isFinite(value)) return String(value);
  if (value === 0) return '0';
  switch (unit) {
    case 'nanoseconds':
      return scaled(value, DURATION_STEPS, true);
    case 'microseconds':
      return scaled(value * 1e3, DURATION_STEPS, true);
    case 'milliseconds':
      return scaled(value * 1e6, DURATION_STEPS, true);
    case 'seconds':
      return scaled(value * 1e9, DURATION_STEPS, true);
    case 'bytes':
      return scaled(value, BYTE_STEPS, true);
    default:
      return scaled(value, COUNT_STEPS, false);
  }
}

export function formatPercent(part, whole) {
  if (!whole) return '–';
  const p = (100 * part) / whole;
  if (p !== 0 && Math.abs(p) < 0.01) return p > 0 ? '<0.01%' : '>-0.01%';
  return `${p.toFixed(Math.abs(p) >= 10 ? 1 : 2)}%`;
}

function pad(n) {
  return String(n).padStart(2, '0');
}

// Local date and time, to the second: "2026-11-22 01:57:11".
export function formatDateTime(ms) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(
    d.getMinutes(),
  )}:${pad(d.getSeconds())}`;
}

// The value a `datetime-local` input takes for `ms`.
export function toDateTimeLocal(ms) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(
    d.getMinutes(),
  )}:${pad(d.getSeconds())}`;
}

// Short axis label for a time, choosing precision from the visible span.
export function formatAxisTime(ms, spanMs) {
  const d = new Date(ms);
  const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  if (spanMs <= 10 * 60 * 1000) return `${hm}:${pad(d.getSeconds())}`;
  if (spanMs <= 36 * 3600 * 1000) return hm;
  return `${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${hm}`;
}

// Human duration for a span of milliseconds: "15m", "6h", "7d", "1h 30m".
export function formatSpan(ms) {
  const units = [
    [86400000, 'd'],
    [3600000, 'h'],
    [60000, 'm'],
    [1000, 's'],
  ];
  const out = [];
  let rest = Math.max(0, Math.round(ms));
  for (const [size, suffix] of units) {
    if (rest >= size) {
      out.push(`${Math.floor(rest / size)}${suffix}`);
      rest %= size;
    }
    if (out.length === 2) break;
  }
  return out.join(' ') || `${rest}ms`;
}
