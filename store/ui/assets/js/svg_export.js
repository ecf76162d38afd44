// A standalone SVG flame graph from folded stacks (`a;b;c value` lines, as
// `/api/v1/folded` answers: the untrimmed merge, never the trimmed tree).
// Pure: text in, text out. Zoomed views export the zoomed frame's stacks.

import { formatPercent, formatValue } from './format.js';

const WIDTH = 1200;
const ROW = 17;
const TOP = 34;
const CHAR = 6.4;

function escapeXml(text) {
  return String(text).replace(/[<>&"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

// The frame tree of `folded`, keeping only stacks under `zoomPath` (frame
// names from the root). Returns {root, depth, total}.
export function foldedTree(folded, zoomPath = []) {
  const root = { name: 'all', total: 0, children: new Map() };
  let depth = 0;
  for (const line of String(folded).split('\n')) {
    const space = line.lastIndexOf(' ');
    if (space <= 0) continue;
    const value = Number(line.slice(space + 1));
    if (!Number.isFinite(value) || value === 0) continue;
    const frames = line.slice(0, space).split(';');
    if (zoomPath.some((name, i) => frames[i] !== name)) continue;
    root.total += value;
    let node = root;
    frames.forEach((name) => {
      let child = node.children.get(name);
      if (!child) {
        child = { name, total: 0, children: new Map() };
        node.children.set(name, child);
      }
      child.total += value;
      node = child;
    });
    depth = Math.max(depth, frames.length);
  }
  return { root, depth, total: root.total };
}

function hue(name) {
  let h = 0;
  for (let i = 0; i < name.length; i += 1) h = (h * 31 + name.charCodeAt(i)) >>> 0;
  return 10 + (h % 40);
}

// The SVG document for `folded`, titled `title`, values in `unit`.
export function foldedToSvg(folded, { title = '', unit = '', zoomPath = [] } = {}) {
  const { root, depth, total } = foldedTree(folded, zoomPath);
  const height = TOP + (depth + 1) * ROW + 8;
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}" font-family="monospace" font-size="11">`,
    `<rect width="100%" height="100%" fill="#ffffff"/>`,
    `<text x="${WIDTH / 2}" y="20" text-anchor="middle" font-size="15">${escapeXml(title)}</text>`,
  ];
  const scale = total > 0 ? (WIDTH - 20) / total : 0;
  // Iterative, so stacks thousands of frames deep export too.
  const pending = [{ node: root, x: 10, level: 0 }];
  while (pending.length) {
    const { node, x, level } = pending.pop();
    const w = node.total * scale;
    if (w < 0.3) continue;
    const y = TOP + level * ROW;
    const label = `${node.name} (${formatValue(node.total, unit)}, ${formatPercent(node.total, total)})`;
    parts.push(
      `<g><title>${escapeXml(label)}</title><rect x="${x.toFixed(2)}" y="${y}" width="${Math.max(0.3, w - 0.5).toFixed(2)}" height="${ROW - 1}" fill="hsl(${hue(node.name)} 85% 62%)"/>`,
    );
    const fit = Math.floor((w - 6) / CHAR);
    if (fit >= 3) {
      const text = node.name.length > fit ? `${node.name.slice(0, fit - 1)}…` : node.name;
      parts.push(`<text x="${(x + 3).toFixed(2)}" y="${y + ROW - 5}">${escapeXml(text)}</text>`);
    }
    parts.push('</g>');
    let childX = x;
    const children = [...node.children.values()].sort((a, b) => b.total - a.total);
    for (const child of children) {
      pending.push({ node: child, x: childX, level: level + 1 });
      childX += child.total * scale;
    }
  }
  parts.push('</svg>');
  return `${parts.join('\n')}\n`;
}
